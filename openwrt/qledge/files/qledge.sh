#!/bin/sh
# qledge CLI: talks to the service's daemon (sockets in /var/run/qledge) unless told otherwise.
RUN_DIR=/var/run/qledge
if [ -z "${QLEDGE_SOCKET}${QLEDGE_HOME}" ]; then
	export QLEDGE_SOCKET="$RUN_DIR/qledge.sock"
	if [ "$1" = mcp ]; then
		shift
		exec /usr/bin/python3 -m edge mcp --mcp-socket "$RUN_DIR/mcp.sock" "$@"
	fi
fi
exec /usr/bin/python3 -m edge "$@"
