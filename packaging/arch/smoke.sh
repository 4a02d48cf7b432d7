#!/usr/bin/env bash
# The architecture tier: qledge on a router's CPU, under qemu-user.
#
#   bash packaging/arch/smoke.sh ARCH [prepare]   ARCH: arm64 | armhf | mipsel | amd64 (native)
#
# (`prepare`: only build the chroot and its dependencies.)
# Builds (or reuses) a Debian chroot of that CPU, installs this checkout into a virtualenv
# inside it and runs there: the `edge` zipapp (the artifact a router gets) serving a run, a
# daemon smoke (a task, a seconds trigger for 20 s, the history, `qledge status`, a restart),
# the idle memory of a daemon with 100 tasks and triggers, estimated for the guest alone
# (guest_memory.py), and on arm64 a core subset of the test suite.
#
# The chroot is cached under $QLEDGE_ARCH_CACHE (default /var/cache/qledge-arch), one per
# suite, architecture and package list; the virtualenv of the dependencies inside it is
# cached by the dependency list. Needs root; installs debootstrap, qemu-user-static and
# binfmt-support with apt-get when missing (waiting for the dpkg lock, never skipping).
#
# Settings (environment):
#   QLEDGE_ARCH_CACHE   where the chroots live (default /var/cache/qledge-arch)
#   QLEDGE_ARCH_MIRROR  the Debian mirror (default http://deb.debian.org/debian)
#   QLEDGE_ARCH_TESTS   1: run the test subset (default: on arm64 only), 0: never
#   QLEDGE_ARCH_IDLE_S  seconds the loaded daemon idles before its memory is read (default 15;
#                       the figures in docs/performance.md are read after 60, as bench/ does natively)
#   PYTHON              the host's Python, which builds the wheel and the zipapp (python3)
set -euo pipefail

ARCH=${1:-}
MODE=${2:-run}
case "$ARCH" in
    arm64) QEMU=aarch64 ;;
    armhf) QEMU=arm ;;
    mipsel) QEMU=mipsel ;;
    amd64) QEMU= ;;
    *) echo "usage: $0 arm64|armhf|mipsel|amd64 [prepare]" >&2; exit 2 ;;
esac
case "$MODE" in run|prepare) ;; *) echo "usage: $0 ARCH [prepare]" >&2; exit 2 ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
# A relative path (.venv/bin/python) works from anywhere (the venv's link itself is kept).
case "$PYTHON" in */*) PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON") ;; esac
SUITE=bookworm
# Python 3.11 (OpenWrt 24.10's), a compiler for the wheels PyPI lacks on a CPU, zone data.
PACKAGES="python3 python3-venv python3-dev gcc libc6-dev tzdata"
# Changing how a chroot is made changes this, and so the cache key.
LAYOUT=1
CACHE=${QLEDGE_ARCH_CACHE:-/var/cache/qledge-arch}
MIRROR=${QLEDGE_ARCH_MIRROR:-http://deb.debian.org/debian}
IDLE_S=${QLEDGE_ARCH_IDLE_S:-15}
if [ -z "${QLEDGE_ARCH_TESTS:-}" ]; then
    if [ "$ARCH" = arm64 ]; then QLEDGE_ARCH_TESTS=1; else QLEDGE_ARCH_TESTS=0; fi
fi
# mipsel: PyPI has no apsw wheel, and the sdist's build (even pip's metadata step) downloads
# SQLite from sqlite.org, which is no package registry. So apsw's source comes from Debian's
# source package of a newer suite (deb-src, checked by apt), and the SQLite amalgamation
# from the npm package better-sqlite3 (deps/sqlite3/, checked against the digests below);
# apsw is built against it with its download switched off.
APSW_SRC_SUITE=sid
APSW_MIN=3.53.3
SQLITE_NPM=better-sqlite3@13.2.0
SQLITE_C_SHA256=75a4760a7b9727a4c4c877aec92eacf39e52a8f2921ce00bd33be6d3a8e8e254
SQLITE_H_SHA256=d6c84557261893439b341d2e6c35187ae3ea24fbfd843ad94616f72d89242b8c

T0=$(date +%s)
say() { printf '[arch %s %4ss] %s\n' "$ARCH" "$(( $(date +%s) - T0 ))" "$*"; }
die() { say "error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"

# -- host tools ---------------------------------------------------------------------------

# apt-get, waiting for another apt or dpkg to finish (the dpkg lock and the lists lock).
apt_wait() {
    local err tries=0
    err=$(mktemp)
    while :; do
        if DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@" >/dev/null 2>"$err"; then
            rm -f "$err"; return 0
        fi
        if grep -q -i -E 'could not get lock|unable to lock|is another process using it' "$err" \
                && [ $tries -lt 60 ]; then
            tries=$((tries + 1)); sleep 10; continue
        fi
        cat "$err" >&2; rm -f "$err"; return 1
    done
}

host_tools() {
    local missing=
    command -v debootstrap >/dev/null || missing="$missing debootstrap"
    if [ -n "$QEMU" ]; then
        [ -x "/usr/bin/qemu-$QEMU-static" ] || missing="$missing qemu-user-static"
        command -v update-binfmts >/dev/null || missing="$missing binfmt-support"
    fi
    if [ -n "$missing" ]; then
        command -v apt-get >/dev/null || die "install$missing (no apt-get here)"
        say "installing$missing"
        apt_wait update
        # shellcheck disable=SC2086
        apt_wait install -y --no-install-recommends $missing
    fi
    [ -n "$QEMU" ] || return 0
    # The kernel runs the CPU's binaries through qemu once binfmt_misc knows the format;
    # the F flag (Debian's default) opens the emulator now, so the chroot needs no copy.
    [ -e /proc/sys/fs/binfmt_misc/status ] \
        || mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
    grep -q '^enabled' "/proc/sys/fs/binfmt_misc/qemu-$QEMU" 2>/dev/null \
        || update-binfmts --enable "qemu-$QEMU" >/dev/null 2>&1 || true
    grep -q '^enabled' "/proc/sys/fs/binfmt_misc/qemu-$QEMU" 2>/dev/null \
        || die "binfmt_misc has no enabled qemu-$QEMU handler (update-binfmts --enable qemu-$QEMU)"
}

# -- the chroot ---------------------------------------------------------------------------

KEY=$(printf '%s\n' "$SUITE" "$ARCH" "$PACKAGES" "$MIRROR" "$LAYOUT" | sha256sum | cut -c1-12)
ROOTFS=$CACHE/$SUITE-$ARCH-$KEY
MOUNTED=()

# Remove a chroot directory, but never through a mount into it (a /dev bound from the host
# would be emptied with it).
remove_rootfs() {
    local dir=$1
    [ -e "$dir" ] || return 0
    if findmnt -rn -o TARGET | grep -q -F "$dir"; then
        die "$dir still has mounts below it; not removing it"
    fi
    rm -rf --one-file-system "$dir"
}

build_rootfs() {
    [ -e "$ROOTFS/.complete" ] && { say "chroot $ROOTFS (cached)"; return 0; }
    local partial=$ROOTFS.partial
    remove_rootfs "$partial"
    for stale in "$CACHE/$SUITE-$ARCH"-*; do  # other package lists, older layouts
        [ -e "$stale" ] && [ "$stale" != "$ROOTFS" ] && { say "removing the stale chroot $stale"; remove_rootfs "$stale"; }
    done
    say "debootstrap $SUITE $ARCH ($PACKAGES) from $MIRROR into $ROOTFS"
    mkdir -p "$CACHE"
    local started
    started=$(date +%s)
    if ! nice -n 19 debootstrap --variant=minbase --arch="$ARCH" --include="${PACKAGES// /,}" \
            "$SUITE" "$partial" "$MIRROR" >"$CACHE/$SUITE-$ARCH.debootstrap.log" 2>&1; then
        tail -20 "$CACHE/$SUITE-$ARCH.debootstrap.log" >&2
        die "debootstrap failed (log: $CACHE/$SUITE-$ARCH.debootstrap.log)"
    fi
    rm -rf "$partial/var/cache/apt/archives/"*.deb
    touch "$partial/.complete"
    mv "$partial" "$ROOTFS"
    say "chroot built in $(( $(date +%s) - started ))s"
}

mount_one() {  # mount ARGS... TARGET (the target last), remembered for the unmount
    mount "$@"
    MOUNTED+=("${!#}")
}

# A private /dev (a tmpfs with the usual nodes and its own devpts), never the host's.
mount_rootfs() {
    local r=$ROOTFS
    mount_one -t proc proc "$r/proc"
    mount_one -t tmpfs -o mode=0755,size=1m tmpfs "$r/dev"
    mknod -m 666 "$r/dev/null" c 1 3
    mknod -m 666 "$r/dev/zero" c 1 5
    mknod -m 666 "$r/dev/full" c 1 7
    mknod -m 666 "$r/dev/random" c 1 8
    mknod -m 666 "$r/dev/urandom" c 1 9
    mknod -m 666 "$r/dev/tty" c 5 0
    ln -s /proc/self/fd "$r/dev/fd"
    ln -s /proc/self/fd/0 "$r/dev/stdin"
    ln -s /proc/self/fd/1 "$r/dev/stdout"
    ln -s /proc/self/fd/2 "$r/dev/stderr"
    mkdir "$r/dev/pts" "$r/dev/shm"
    mount_one -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$r/dev/pts"
    ln -s pts/ptmx "$r/dev/ptmx"
    mount_one -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
    # /tmp stays on the disk, as on the host: the flash-wear figures count block writes,
    # which a tmpfs never makes.
    find "$r/tmp" -mindepth 1 -delete
    # pip verifies PyPI's certificate against the host's bundle (which holds any CA the
    # network in between needs); names resolve as on the host.
    mkdir -p "$r/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
    cp -L /etc/resolv.conf "$r/etc/resolv.conf"
}

# shellcheck disable=SC2317  # called by the trap
cleanup() {
    local rc=$?
    # What this run started inside the chroot (a daemon a failed step left behind).
    local p
    for p in /proc/[0-9]*; do
        if [ "$(readlink "$p/root" 2>/dev/null)" = "$ROOTFS" ]; then kill -9 "${p#/proc/}" 2>/dev/null || true; fi
    done
    local i
    for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do
        umount "${MOUNTED[$i]}" 2>/dev/null || umount -l "${MOUNTED[$i]}" 2>/dev/null || true
    done
    MOUNTED=()
    exit "$rc"
}

# A command inside the chroot, in a clean environment (nothing of the host's leaks in).
guest() {
    local env=(PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin HOME=/root LANG=C.UTF-8
               TERM=dumb TZ=UTC PIP_CERT=/etc/ssl/certs/ca-certificates.crt
               SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1
               PIP_DEFAULT_TIMEOUT=180 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore)
    local name
    for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        [ -n "${!name:-}" ] && env+=("$name=${!name}")
    done
    env -i "${env[@]}" "$@"
}
in_chroot() { guest nice -n 19 /usr/sbin/chroot "$ROOTFS" "$@"; }

# -- the dependencies, in a cached virtualenv -----------------------------------------------

# What the daemon needs (pyproject's dependencies) and, for the tests, pytest and
# pytest-asyncio as the test extra pins them.
requirements() {
    "$PYTHON" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = list(project["dependencies"])
for req in project["optional-dependencies"]["test"]:
    if re.match(r"(pytest|pytest-asyncio)\b(?![-\w])", req):
        wanted.append(req)
print("\n".join(wanted))
EOF
}

# The SQLite amalgamation for apsw's source build (mipsel), from the npm registry.
sqlite_amalgamation() {
    local out=$1 tmp
    command -v npm >/dev/null || die "mipsel needs npm (Node.js) to fetch $SQLITE_NPM, which ships the SQLite amalgamation"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$SQLITE_NPM" >/dev/null) || die "npm pack $SQLITE_NPM failed"
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/deps/sqlite3
    mkdir -p "$out"
    cp "$tmp"/package/deps/sqlite3/sqlite3.c "$tmp"/package/deps/sqlite3/sqlite3.h \
       "$tmp"/package/deps/sqlite3/sqlite3ext.h "$out/"
    rm -rf "$tmp"
    echo "$SQLITE_C_SHA256  $out/sqlite3.c" | sha256sum -c --quiet \
        || die "$SQLITE_NPM's sqlite3.c is not the one pinned in $0"
    echo "$SQLITE_H_SHA256  $out/sqlite3.h" | sha256sum -c --quiet \
        || die "$SQLITE_NPM's sqlite3.h is not the one pinned in $0"
}

# apsw's source from Debian's $APSW_SRC_SUITE source package (apt verifies it), in DIR.
apsw_debian_source() {
    local out=$1 apt=$CACHE/apt-$APSW_SRC_SUITE-src
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
    printf 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
        "$MIRROR" "$APSW_SRC_SUITE" >"$apt/sources.list"
    local o=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
             -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
    apt_wait "${o[@]}" update || die "could not read the $APSW_SRC_SUITE source lists from $MIRROR"
    local version
    version=$(apt-cache "${o[@]}" showsrc python-apsw | sed -n 's/^Version: //p' | sort -V | tail -1)
    [ -n "$version" ] || die "$APSW_SRC_SUITE has no python-apsw source package"
    dpkg --compare-versions "$version" ge "$APSW_MIN" \
        || die "$APSW_SRC_SUITE's python-apsw is $version; qledge needs apsw >= $APSW_MIN"
    (cd "$out" && apt-get "${o[@]}" source --download-only "python-apsw=$version" >/dev/null 2>&1) \
        || die "apt-get source python-apsw=$version failed"
    tar -xJf "$out"/python-apsw_*.orig.tar.* -C "$out"
    rm -f "$out"/python-apsw_*
    APSW_SRC=$(echo "$out"/apsw-*)
    [ -d "$APSW_SRC" ] || die "python-apsw's source did not unpack to apsw-*/"
}

# apsw with SQLite compiled in from the amalgamation, nothing downloaded by its build.
apsw_from_source() {
    local venv=$1 build=$ROOTFS/opt/qledge/build
    rm -rf "$build"
    mkdir -p "$build"
    apsw_debian_source "$build"
    sqlite_amalgamation "$APSW_SRC/sqlite3"
    printf '[build]\nfetch = False\nenable_all_extensions = False\n' >"$APSW_SRC/setup.apsw"
    say "building ${APSW_SRC##*/} with SQLite $(sed -n 's/^#define SQLITE_VERSION  *"\(.*\)"/\1/p' "$APSW_SRC/sqlite3/sqlite3.h") compiled in (slow under emulation)"
    in_chroot "$venv/bin/pip" install --quiet "/opt/qledge/build/${APSW_SRC##*/}"
    rm -rf "$build"
}

deps_venv() {
    local reqs key
    reqs=$(requirements)
    [ "$ARCH" = mipsel ] && reqs="$reqs
# apsw: the source of $APSW_SRC_SUITE, SQLite of $SQLITE_NPM"
    key=$(printf '%s\n' "$reqs" | sha256sum | cut -c1-12)
    VENV=/opt/qledge/venv-$key
    if [ -e "$ROOTFS$VENV/.complete" ]; then
        say "dependencies: $VENV (cached)"
        return 0
    fi
    rm -rf "$ROOTFS"/opt/qledge/venv-*
    mkdir -p "$ROOTFS/opt/qledge"
    say "dependencies into $VENV: $(grep -v '^#' <<<"$reqs" | tr '\n' ' ')"
    in_chroot python3 -m venv "$VENV"
    [ "$ARCH" = mipsel ] && apsw_from_source "$VENV"
    local list=()
    while IFS= read -r line; do [ -n "$line" ] && [ "${line#\#}" = "$line" ] && list+=("$line"); done <<<"$reqs"
    in_chroot "$VENV/bin/pip" install --quiet "${list[@]}"
    touch "$ROOTFS$VENV/.complete"
}

# -- this checkout -------------------------------------------------------------------------

stage_checkout() {
    local run=$ROOTFS/opt/qledge/run
    rm -rf "$run"
    mkdir -p "$run/src" "$run/dist"
    # The files git knows and the ones it would add (what is being tested, uncommitted
    # changes included), without build output.
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
        | tar --null -T - -cf -) | tar -C "$run/src" -xf -
    cp "$HERE/guest_smoke.py" "$run/"
    "$PYTHON" "$ROOT/packaging/build.py" --profile edge --out "$run/dist" >/dev/null
    "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$run/dist" "$run/src" >/dev/null 2>&1 \
        || "$PYTHON" -m pip wheel --no-deps --wheel-dir "$run/dist" "$run/src"
    rm -rf "$run/src/build" "$run/src/"*.egg-info
}

# qledge out of the cached virtualenv again (the zipapp smoke runs on the dependencies alone).
uninstall_qledge() {
    if compgen -G "$ROOTFS$VENV/lib/python3*/site-packages/qledge-*.dist-info" >/dev/null; then
        in_chroot "$VENV/bin/pip" uninstall --quiet --yes qledge
    fi
}

# -- the run --------------------------------------------------------------------------------

main() {
    host_tools
    mkdir -p "$CACHE"
    # One run per chroot at a time (a second waits): the run installs into it.
    exec 9>"$CACHE/$SUITE-$ARCH.lock"
    if ! flock -n 9; then
        say "waiting for another run on this chroot"
        flock 9
    fi
    build_rootfs
    trap cleanup EXIT INT TERM
    mount_rootfs
    deps_venv
    [ "$MODE" = prepare ] && { say "prepared in $(( $(date +%s) - T0 ))s"; return 0; }
    uninstall_qledge
    stage_checkout
    local py=$VENV/bin/python
    local smoke=(/opt/qledge/run/guest_smoke.py)
    say "$(in_chroot "$py" -c 'import platform, sys, apsw, msgspec; print(f"{platform.machine()}: Python {sys.version.split()[0]}, apsw {apsw.apsw_version()} (SQLite {apsw.sqlite_lib_version()}), msgspec {msgspec.__version__}")')"

    local started
    started=$(date +%s)
    in_chroot "$py" "${smoke[@]}" zipapp "$py" /opt/qledge/run/dist/qledge-edge.pyz
    say "zipapp smoke passed in $(( $(date +%s) - started ))s"

    local wheel
    wheel=$(cd "$ROOTFS/opt/qledge/run/dist" && echo qledge-*.whl)
    in_chroot "$VENV/bin/pip" install --quiet --no-deps "/opt/qledge/run/dist/$wheel"
    started=$(date +%s)
    in_chroot "$py" "${smoke[@]}" daemon "$VENV/bin/qledge"
    say "daemon smoke passed in $(( $(date +%s) - started ))s"

    started=$(date +%s)
    memory
    say "memory read in $(( $(date +%s) - started ))s"

    if [ "$QLEDGE_ARCH_TESTS" = 1 ]; then
        started=$(date +%s)
        # The core: storage, scheduling, the runner's history, the security chain, the
        # protocol, configuration and reload, redaction. Tests that measure memory or tight
        # timings skip under emulation and say why (-rs).
        in_chroot sh -c "cd /opt/qledge/run/src && exec $py -m pytest -q -p no:cacheprovider -rs -m 'not e2e' \
            tests/test_store.py tests/test_scheduler.py tests/test_schedule.py tests/test_retention.py \
            tests/test_auth.py tests/test_clock.py tests/test_config.py tests/test_tool_registry.py \
            tests/test_excerpt.py tests/test_redaction.py tests/test_protocol.py tests/test_sdnotify.py \
            tests/test_audit.py tests/test_reload.py"
        say "tests passed in $(( $(date +%s) - started ))s"
    fi
    uninstall_qledge
    say "passed in $(( $(date +%s) - T0 ))s"
}

# The loaded daemon's idle memory, for the guest alone (guest_memory.py says how).
memory() {
    local home pidfile pid
    home=$(mktemp -d "$ROOTFS/tmp/qlmem.XXXXXX")
    pidfile=$home/pid
    in_chroot "$VENV/bin/python" /opt/qledge/run/guest_smoke.py loaded "$VENV/bin/qledge" "${home#"$ROOTFS"}" &
    local loader=$!
    local deadline=$(( $(date +%s) + 300 ))
    while [ ! -s "$pidfile" ]; do
        kill -0 "$loader" 2>/dev/null || die "the loaded daemon did not start"
        [ "$(date +%s)" -lt "$deadline" ] || die "the loaded daemon was not ready within 300s"
        sleep 1
    done
    pid=$(cat "$pidfile")
    sleep "$IDLE_S"
    local probe=()
    [ -n "$QEMU" ] && probe=(--probe -- env -i PATH=/usr/bin:/bin /usr/sbin/chroot "$ROOTFS" "$VENV/bin/python")
    "$PYTHON" "$HERE/guest_memory.py" --arch "$ARCH" --idle-s "$IDLE_S" "$pid" "${probe[@]}"
    touch "$home/stop"
    wait "$loader"
}

# Parsed whole before it runs, so an edit of this file during a run cannot change the run.
{ main; exit $?; }
