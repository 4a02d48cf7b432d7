#!/bin/sh
# Install qledge as a systemd service on Debian 12/13 or Ubuntu, from this checkout:
#   - a virtualenv in /opt/qledge with qledge and its dependencies (Debian's own Python
#     is "externally managed": pip does not install into it);
#   - /etc/systemd/system/qledge.service, whose ExecStart is /opt/qledge/bin/qledge;
#   - /etc/qledge/qledge.toml (kept when it exists);
#   - /usr/local/bin/qledge, the CLI, and its bash and fish completions under /usr/local/share
#     (where bash-completion and fish look);
#   - the system user and group `qledge`: the service's user, and the group whose members
#     may connect to the socket.
# Then: systemctl daemon-reload && systemctl enable --now qledge
#
# Run as root. PYTHON picks the interpreter (default python3, 3.11 or newer). DESTDIR
# installs into another root instead (packaging, tests): no user is created there.
set -eu

SRC=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
PREFIX=/opt/qledge
D=${DESTDIR:-}

fail() {
	echo "install.sh: $*" >&2
	exit 1
}

[ -n "$D" ] || [ "$(id -u)" = 0 ] || fail "run as root (or set DESTDIR)"
command -v "$PYTHON" >/dev/null || fail "$PYTHON not found: apt-get install python3"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	|| fail "qledge needs Python 3.11 or newer; $PYTHON is $("$PYTHON" -c 'import platform; print(platform.python_version())')"
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null \
	|| fail "$PYTHON cannot make a virtualenv: apt-get install python3-venv"

"$PYTHON" -m venv "$D$PREFIX"
"$D$PREFIX/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$SRC"

install -D -m 0644 "$SRC/packaging/systemd/qledge.service" "$D/etc/systemd/system/qledge.service"
# The web panel's unit, not enabled: systemctl enable --now qledge-web
install -D -m 0644 "$SRC/packaging/systemd/qledge-web.service" "$D/etc/systemd/system/qledge-web.service"
[ -e "$D/etc/qledge/qledge.toml" ] \
	|| install -D -m 0644 "$SRC/packaging/systemd/qledge.toml" "$D/etc/qledge/qledge.toml"
mkdir -p "$D/usr/local/bin"
ln -sf "$PREFIX/bin/qledge" "$D/usr/local/bin/qledge"
mkdir -p "$D/usr/local/share/bash-completion/completions" "$D/usr/local/share/fish/vendor_completions.d"
"$D$PREFIX/bin/qledge" completion bash >"$D/usr/local/share/bash-completion/completions/qledge"
"$D$PREFIX/bin/qledge" completion fish >"$D/usr/local/share/fish/vendor_completions.d/qledge.fish"

if [ -z "$D" ]; then
	# A static user of the unit's name: DynamicUser= then uses it, so the socket's group is
	# one people can be added to (usermod -aG qledge NAME).
	getent group qledge >/dev/null || groupadd --system qledge
	getent passwd qledge >/dev/null \
		|| useradd --system --gid qledge --no-create-home --home-dir /var/lib/qledge \
			--shell /usr/sbin/nologin qledge
fi
echo "installed qledge $("$D$PREFIX/bin/python" -c 'import edge; print(edge.__version__)') in $D$PREFIX;" \
	"now: systemctl daemon-reload && systemctl enable --now qledge"
