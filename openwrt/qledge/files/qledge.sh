#!/bin/sh
# qledge CLI: talks to the service's daemon (sockets in /var/run/qledge) unless told otherwise.
RUN_DIR=/var/run/qledge
# -c rather than -m edge: runpy and what it imports would be a third of `qledge --version`.
MAIN='from edge.cli.main import main; raise SystemExit(main())'
if [ -z "${QLEDGE_SOCKET}${QLEDGE_HOME}" ]; then
	export QLEDGE_SOCKET="$RUN_DIR/qledge.sock"
	if [ "$1" = mcp ]; then
		shift
		exec /usr/bin/python3 -c "$MAIN" mcp --mcp-socket "$RUN_DIR/mcp.sock" "$@"
	fi
fi
exec /usr/bin/python3 -c "$MAIN" "$@"
