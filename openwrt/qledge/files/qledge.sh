#!/bin/sh
# qledge CLI: talks to the service's daemon unless told otherwise.
[ -n "${QLEDGE_SOCKET}${QLEDGE_HOME}" ] || export QLEDGE_SOCKET=/var/run/qledge/qledge.sock
exec /usr/bin/python3 -m edge "$@"
