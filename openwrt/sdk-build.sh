#!/usr/bin/env bash
# The SDK route: qledge's four OpenWrt packages built with the OpenWrt SDK of your device.
#
#   bash openwrt/sdk-build.sh SDK_DIR [--out DIR] [--sqlite system|bundled]
#
# SDK_DIR is the unpacked SDK of the release and target your device runs (the one
# firmware-selector or the release's targets/<target>/<subtarget>/ directory lists as
# openwrt-sdk-*.tar.*). It adds this repository's openwrt/ directory as a feed, updates and
# installs the feeds, checks what the packages need of the feeds, verifies the sources'
# hashes (`make package/<name>/check`), compiles python3-msgspec, python3-apsw,
# python3-cronsim, qledge with qledge-mcp and qledge-web, and luci-app-qledge (with the SDK's
# luci feed), copies the .ipk or .apk files to DIR (default ./dist/openwrt) and prints the
# commands that install them on the device.
#
# The checks, before anything is compiled:
#   - msgspec's build needs setuptools and setuptools-scm on the build host at the versions
#     its sdist asks for; the feed's host packages must have them (else: update the feed).
#   - luci-app-qledge is built with LuCI's luci.mk: the luci feed must be there.
#   - apsw needs SQLite >= 3.53.0: with the feed's libsqlite3 when it is that new, else with
#     the pinned SQLite amalgamation compiled in (--sqlite forces either; see
#     openwrt/python-apsw/Makefile). The mode chosen is printed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: $0 SDK_DIR [--out DIR] [--sqlite system|bundled]" >&2; exit 2; }
die() { echo "sdk-build: $*" >&2; exit 1; }

SDK=${1:-}
[ -n "$SDK" ] || usage
shift
OUT=$PWD/dist/openwrt
SQLITE=
# (qledge-mcp and qledge-web come from the qledge source package, with it.)
PACKAGES="python-msgspec python-apsw python-cronsim qledge luci-app-qledge"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || usage; OUT=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
        --sqlite) [ $# -ge 2 ] || usage; SQLITE=$2; shift 2
                  case "$SQLITE" in system|bundled) ;; *) usage ;; esac ;;
        *) usage ;;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

[ -d "$SDK" ] || die "$SDK is not a directory"
SDK=$(cd "$SDK" && pwd)
for f in rules.mk scripts/feeds feeds.conf.default include/package.mk; do
    [ -e "$SDK/$f" ] || die "$SDK has no $f: point SDK_DIR at an unpacked OpenWrt SDK (openwrt-sdk-*)"
done
cd "$SDK"

# Minimums this checkout's packages ask of the feed's build-host Python packages
# (msgspec 0.23.0's pyproject: build-system requires setuptools>=80, setuptools-scm>=8).
MSGSPEC_SETUPTOOLS=80
MSGSPEC_SETUPTOOLS_SCM=8
APSW_MIN_SQLITE_SRC=3530000

# -- the feed ---------------------------------------------------------------------------------
[ -e feeds.conf ] || cp feeds.conf.default feeds.conf
if ! grep -q "^src-link qledge " feeds.conf; then
    echo "src-link qledge $HERE" >>feeds.conf
fi
sed -i "s|^src-link qledge .*|src-link qledge $HERE|" feeds.conf
echo "sdk-build: feeds update and install (packages, qledge)"
./scripts/feeds update -a
./scripts/feeds install -a -p qledge

# -- what the packages need of the feed ------------------------------------------------------
[ -e feeds/luci/luci.mk ] || die "luci-app-qledge is built with LuCI's luci.mk, and there is no feeds/luci/luci.mk: add the luci feed to feeds.conf (feeds.conf.default has it)"
makefile_var() {  # makefile_var FILE NAME: NAME:=value from FILE, or nothing
    [ -e "$1" ] && sed -n "s/^$2:=//p" "$1" | head -1
}
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

py=feeds/packages/lang/python
setuptools=$(makefile_var "$py/python-setuptools/Makefile" PKG_VERSION)
[ -n "$setuptools" ] || setuptools=$(makefile_var "$py/python3-version.mk" PYTHON3_SETUPTOOLS_VERSION)
scm=$(makefile_var "$py/python-setuptools-scm/Makefile" PKG_VERSION)
echo "sdk-build: host setuptools ${setuptools:-missing}, setuptools-scm ${scm:-missing} in the packages feed"
if [ -z "$setuptools" ] || ! version_ge "$setuptools" "$MSGSPEC_SETUPTOOLS"; then
    die "python3-msgspec needs host setuptools >= $MSGSPEC_SETUPTOOLS; the feed has ${setuptools:-none}: update the packages feed (feeds.conf) to a newer branch"
fi
if [ -z "$scm" ] || ! version_ge "$scm" "$MSGSPEC_SETUPTOOLS_SCM"; then
    die "python3-msgspec needs host setuptools-scm >= $MSGSPEC_SETUPTOOLS_SCM; the feed has ${scm:-none}: update the packages feed (feeds.conf) to a newer branch"
fi

feed_sqlite=$(makefile_var feeds/packages/libs/sqlite3/Makefile PKG_SRC_VERSION)
if [ -z "$SQLITE" ]; then
    if [ -n "$feed_sqlite" ] && [ "$feed_sqlite" -ge "$APSW_MIN_SQLITE_SRC" ]; then SQLITE=system; else SQLITE=bundled; fi
fi
case "$SQLITE" in
    system) echo "sdk-build: python3-apsw links the feed's libsqlite3 (${feed_sqlite:-none}; it needs >= $APSW_MIN_SQLITE_SRC)" ;;
    bundled) echo "sdk-build: python3-apsw compiles in its pinned SQLite amalgamation (the feed's libsqlite3: ${feed_sqlite:-none})" ;;
esac

# -- configure, check, compile ----------------------------------------------------------------
{
    echo "CONFIG_PACKAGE_python3-msgspec=m"
    echo "CONFIG_PACKAGE_python3-apsw=m"
    echo "CONFIG_PACKAGE_python3-cronsim=m"
    echo "CONFIG_PACKAGE_qledge=m"
    echo "CONFIG_PACKAGE_qledge-mcp=m"
    echo "CONFIG_PACKAGE_qledge-web=m"
    echo "CONFIG_PACKAGE_luci-app-qledge=m"
} >>.config
make defconfig >/dev/null
JOBS=$(nproc 2>/dev/null || echo 1)
for p in $PACKAGES; do
    echo "sdk-build: make package/$p/check"
    make "package/$p/check" APSW_SQLITE="$SQLITE" V=s
done
for p in $PACKAGES; do
    echo "sdk-build: make package/$p/compile"
    make "package/$p/compile" APSW_SQLITE="$SQLITE" -j"$JOBS" V=s
done

# -- collect -------------------------------------------------------------------------------
found=()
while IFS= read -r -d '' f; do found+=("$f"); done < <(
    find bin/packages -path '*/qledge/*' \( -name '*.ipk' -o -name '*.apk' \) -print0 2>/dev/null)
[ ${#found[@]} -gt 0 ] || die "no packages under bin/packages/*/qledge/ after the build"
cp "${found[@]}" "$OUT/"
echo "sdk-build: packages in $OUT:"
names=()
for f in "${found[@]}"; do names+=("$(basename "$f")"); echo "  $(basename "$f")"; done

# The command that installs them (from the directory they are copied to on the device).
# Each file by its exact name: a pattern like qledge-* would take qledge-mcp and qledge-web too.
want() { printf '%s\n' "${names[@]}" | grep -E "^$1[-_][0-9]" | head -1; }
local_pkgs=()
for n in python3-msgspec python3-apsw python3-cronsim qledge; do
    pkg=$(want "$n")
    [ -n "$pkg" ] || die "no $n package among them"
    local_pkgs+=("./$pkg")
done
web_pkgs=()
for n in qledge-web luci-app-qledge; do
    pkg=$(want "$n")
    [ -n "$pkg" ] || die "no $n package among them"
    web_pkgs+=("./$pkg")
done
feed_pkgs="python3-light python3-asyncio python3-logging python3-urllib python3-uuid python3-decimal zoneinfo-core"
echo
echo "Copy them to the device (e.g. scp $OUT/* root@router:/tmp/), then there, in that directory:"
case "${names[0]}" in
    *.apk)
        echo "  apk update && apk add $feed_pkgs"
        echo "  apk add --allow-untrusted ${local_pkgs[*]}"
        echo "and for the web panel and its LuCI page (the panel stays off until enabled):"
        echo "  apk add --allow-untrusted ${web_pkgs[*]}" ;;
    *)
        echo "  opkg update && opkg install $feed_pkgs"
        echo "  opkg install ${local_pkgs[*]}"
        echo "and for the web panel and its LuCI page (the panel stays off until enabled):"
        echo "  opkg install ${web_pkgs[*]}" ;;
esac
