#!/usr/bin/env python3
"""Build qledge's noarch OpenWrt packages without the SDK.

    python packaging/build_openwrt.py --format ipk|apk --out DIR [--package NAME]...
    python packaging/build_openwrt.py --sources NAME DIR
    python packaging/build_openwrt.py --format ipk --record bench/results/openwrt.json

The packages: `qledge` (the daemon with notifications, as the SDK's feed package ships it),
`qledge-mcp` (its MCP endpoint), `qledge-web` (the web panel, `qledge web`, with its static
files), `luci-app-qledge` (Services → qledge in LuCI and the panel's procd service, laid out
as LuCI's luci.mk does: htdocs/ under /www, root/ under /) and `python3-cronsim` (cronsim is
pure Python: the module installed beside the Python running this script). `--sources` copies
a qledge package's sources into DIR: the SDK's openwrt/qledge/Makefile takes them from here,
so both builds ship the same files.

`.ipk` (opkg): a gzip'd tar of `debian-binary`, `control.tar.gz` (control, conffiles,
postinst, prerm) and `data.tar.gz` (the edge profile as bytecode under
/usr/lib/pythonX.Y/site-packages, the procd init script, the UCI config, the sysupgrade
keep file and the /usr/bin/qledge launcher). Like OpenWrt's own Python packages it ships
bytecode only, compiled by the Python running this script, so the package depends on that
Python minor version.

`.apk` (apk v3, OpenWrt 25.12+): the same tree plus the metadata OpenWrt's
include/package-pack.mk adds (/lib/apk/packages/qledge.list, .conffiles,
.conffiles_static) and its post-install / post-upgrade / pre-deinstall scripts, packed by
`apk mkpkg` from apk-tools 3 (`--apk PATH`, e.g. the SDK's staging_dir/host/bin/apk).

The output is reproducible: sorted entries, root ownership, fixed mtimes
($SOURCE_DATE_EPOCH when set). `--record FILE` writes what was built (each package's file,
bytes and installed bytes) as JSON: docs/install-openwrt.md's sizes are generated from it
(packaging/docs.py).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import importlib.util
import io
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILES = os.path.join(ROOT, "openwrt", "qledge", "files")
LUCI = os.path.join(ROOT, "openwrt", "luci-app-qledge")

NAME = "qledge"
RELEASE = 1
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
SITE = f"usr/lib/python{PY}/site-packages"
# The qledge package ships the edge profile with notifications (their sender needs
# urllib); qledge-mcp adds edge/mcp/, qledge-web edge/web/. openwrt/qledge/Makefile ships the
# same (--sources).
PROFILE = "edge-notify"
ADD_ONS = {"qledge-mcp": "edge-mcp", "qledge-web": "web"}
PLAIN_DEPENDS = [
    "python3-asyncio", "python3-logging", "python3-urllib", "python3-msgspec", "python3-apsw", "python3-cronsim",
    "zoneinfo-core",
]
# opkg (Debian syntax): two constraints pin the Python minor version the bytecode is for.
PY_DEPENDS = [f"python3-light (>= {PY})", f"python3-light (<< {sys.version_info.major}.{sys.version_info.minor + 1})"]
DEPENDS = [*PY_DEPENDS, *PLAIN_DEPENDS]
# apk keeps one constraint per name (a second replaces the first) and knows = < > <= >= ~:
# `~3.11` is the fuzzy match, any 3.11.x.
APK_PY_DEPENDS = [f"python3-light~{PY}"]
APK_DEPENDS = [*APK_PY_DEPENDS, *PLAIN_DEPENDS]
CONFFILES = ["/etc/config/qledge"]
URL = "https://pypi.org/project/qledge/"
MAINTAINER = "qledge developers"

# OpenWrt's standard maintainer scripts: default_postinst enables and starts
# /etc/init.d/qledge; default_prerm stops and disables it. (No Require-User: the daemon
# runs as root, and tasks switch to their own users.)
POSTINST = """#!/bin/sh
[ "${IPKG_NO_SCRIPT}" = "1" ] && exit 0
[ -s "${IPKG_INSTROOT}/lib/functions.sh" ] || exit 0
. "${IPKG_INSTROOT}/lib/functions.sh"
default_postinst "$0" "$@"
"""
PRERM = """#!/bin/sh
[ -s "${IPKG_INSTROOT}/lib/functions.sh" ] || exit 0
. "${IPKG_INSTROOT}/lib/functions.sh"
default_prerm "$0" "$@"
"""


# What package-pack.mk generates for an apk package (CONFIG_USE_APK).
def apk_scripts(name: str) -> dict[str, str]:
    install = f"""#!/bin/sh
[ "${{IPKG_NO_SCRIPT}}" = "1" ] && exit 0
[ -s ${{IPKG_INSTROOT}}/lib/functions.sh ] || exit 0
. ${{IPKG_INSTROOT}}/lib/functions.sh
export root="${{IPKG_INSTROOT}}"
export pkgname="{name}"
add_group_and_user
default_postinst
"""
    deinstall = f"""#!/bin/sh
[ -s ${{IPKG_INSTROOT}}/lib/functions.sh ] || exit 0
. ${{IPKG_INSTROOT}}/lib/functions.sh
export root="${{IPKG_INSTROOT}}"
export pkgname="{name}"
default_prerm
"""
    upgrade = "#!/bin/sh\nexport PKG_UPGRADE=1\n" + install.split("\n", 1)[1]
    return {"post-install": install, "post-upgrade": upgrade, "pre-deinstall": deinstall}


APK_POST_INSTALL, APK_POST_UPGRADE, APK_PRE_DEINSTALL = apk_scripts(NAME).values()
APK_SCRIPTS = apk_scripts(NAME)
APK_DB = "lib/apk/packages"

DESCRIPTION = (
    "Minimal-footprint task runtime: cron triggers, a bounded run history in SQLite,\n"
    " notifications, and low-sensitivity read tools for people and AI clients over a Unix socket."
)


def _load_build():
    spec = importlib.util.spec_from_file_location("qledge_packaging_build", os.path.join(HERE, "build.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def version() -> str:
    about: dict[str, str] = {}
    with open(os.path.join(ROOT, "edge", "__init__.py")) as f:
        exec(f.read(), about)
    return f"{about['__version__']}-r{RELEASE}"


def epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01


def qledge_files(package: str = NAME) -> list[tuple[str, str]]:
    """(source path, path under site-packages) of the files a qledge package ships: `qledge`
    the edge-notify profile, an add-on (qledge-mcp, qledge-web) what its profile adds to it."""
    build = _load_build()
    if package == NAME:
        files = build.profile_files(PROFILE, ROOT)
    elif package in ADD_ONS:
        files = sorted(set(build.profile_files(ADD_ONS[package], ROOT)) - set(build.profile_files(PROFILE, ROOT)))
    else:
        raise ValueError(f"{package} is not a qledge package")
    return [(os.path.join(ROOT, rel), rel) for rel in files]


def qledge_sources(package: str = NAME) -> list[tuple[str, str]]:
    """The Python files of qledge_files(package), which ship as bytecode."""
    return [(src, rel) for src, rel in qledge_files(package) if rel.endswith(".py")]


def copy_data(site: str, package: str) -> None:
    """The files of a qledge package that are not Python (the panel's static files), as they are."""
    for src, rel in qledge_files(package):
        if not rel.endswith(".py"):
            target = os.path.join(site, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(src, target)
            os.chmod(target, 0o644)


def cronsim_sources() -> list[tuple[str, str]]:
    """The cronsim module installed beside this Python (pure Python: any CPU)."""
    try:
        dist = importlib.metadata.distribution("cronsim")
    except importlib.metadata.PackageNotFoundError:
        raise Unavailable("python3-cronsim is made from the cronsim beside this Python, and none is"
                          " installed: pip install cronsim") from None
    found = []
    for entry in dist.files or []:
        rel = str(entry)
        if rel.startswith("cronsim/") and rel.endswith(".py"):
            found.append((str(dist.locate_file(entry)), rel))
    if not found:
        raise Unavailable("the installed cronsim has no Python sources to package")
    return sorted(found, key=lambda pair: pair[1])


def cronsim_version() -> str:
    return f"{importlib.metadata.version('cronsim')}-r1"


def compile_into(site: str, sources: list[tuple[str, str]]) -> None:
    """Bytecode only, as OpenWrt's Python packages ship: site/x.pyc for each x.py."""
    for src, rel in sources:
        target = os.path.join(site, rel + "c")  # legacy sourceless layout: edge/x.pyc
        os.makedirs(os.path.dirname(target), exist_ok=True)
        py_compile.compile(
            src, cfile=target, dfile=f"/{SITE}/{rel}", doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        os.chmod(target, 0o644)


def stage(dest: str) -> None:
    """Lay out qledge's installed tree under `dest`: bytecode, init script, config, launcher."""
    compile_into(os.path.join(dest, SITE), qledge_sources(NAME))
    for src, rel, mode in (
        ("qledge.init", "etc/init.d/qledge", 0o755),
        ("qledge.config", "etc/config/qledge", 0o644),
        ("qledge.sh", "usr/bin/qledge", 0o755),
        ("qledge.keep", f"lib/upgrade/keep.d/{NAME}", 0o644),
        ("qledge.bash-completion", "usr/share/bash-completion/completions/qledge", 0o644),
    ):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(FILES, src), target)
        os.chmod(target, mode)


class Package:
    """One OpenWrt package this script builds (a plain class: the tests load this file
    without registering it as a module, which dataclasses need)."""

    def __init__(self, name: str, version: Callable[[], str], depends: list[str], apk_depends: list[str],
                 description: str, stage: Callable[[str], None], section: str = "utils", license: str = "MIT",
                 url: str = URL, conffiles: list[str] | None = None, postinst: str = "") -> None:
        self.name = name
        self.version = version
        self.depends = depends  # opkg syntax
        self.apk_depends = apk_depends
        self.description = description
        self.stage = stage
        self.section = section
        self.license = license
        self.url = url
        self.conffiles = conffiles or []
        self.postinst = postinst  # run after default_postinst, as a package's own postinst is


def _mcp_stage(dest: str) -> None:
    compile_into(os.path.join(dest, SITE), qledge_sources("qledge-mcp"))


def _web_stage(dest: str) -> None:
    compile_into(os.path.join(dest, SITE), qledge_sources("qledge-web"))
    copy_data(os.path.join(dest, SITE), "qledge-web")


def _copy_tree(src: str, dest: str) -> None:
    """src's files under dest, executables 0755 and the rest 0644 (as luci.mk's cp -pR of a checkout)."""
    for dirpath, _, filenames in os.walk(src):
        for name in filenames:
            path = os.path.join(dirpath, name)
            target = os.path.join(dest, os.path.relpath(path, src))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(path, target)
            os.chmod(target, 0o755 if os.access(path, os.X_OK) else 0o644)


def _luci_stage(dest: str) -> None:
    _copy_tree(os.path.join(LUCI, "htdocs"), os.path.join(dest, "www"))
    _copy_tree(os.path.join(LUCI, "root"), dest)


# What LuCI's apps do after an install: drop LuCI's menu cache and have rpcd reread the ACLs,
# so Services → qledge shows without a reboot.
LUCI_POSTINST = """[ -n "${IPKG_INSTROOT}" ] || {
	rm -f /tmp/luci-indexcache*
	rm -rf /tmp/luci-modulecache/
	killall -HUP rpcd 2>/dev/null
}
"""


def _cronsim_stage(dest: str) -> None:
    compile_into(os.path.join(dest, SITE), cronsim_sources())


PACKAGES = {
    NAME: Package(NAME, version, DEPENDS, APK_DEPENDS, DESCRIPTION, stage, conffiles=CONFFILES),
    "qledge-mcp": Package(
        "qledge-mcp", version, [f"{NAME} (= {version()})"], [f"{NAME}={version()}"],
        "MCP endpoint for qledge: AI clients over a second socket\n"
        " (enable it with `uci set qledge.main.mcp_enabled=1`).", _mcp_stage),
    "qledge-web": Package(
        "qledge-web", version, [f"{NAME} (= {version()})"], [f"{NAME}={version()}"],
        "Web panel for qledge (`qledge web`): tasks, runs with live logs, schedules, secrets,\n"
        " notifications, in English and Chinese; python3-openssl for its own TLS.", _web_stage),
    "luci-app-qledge": Package(
        "luci-app-qledge", version, ["luci-base", "qledge-web"], ["luci-base", "qledge-web"],
        "LuCI support for qledge: Services -> qledge (the daemon's status, the way into its web panel)\n"
        " and the panel's service, off until `uci set qledge-web.main.enabled=1`.", _luci_stage,
        section="luci", conffiles=["/etc/config/qledge-web"], postinst=LUCI_POSTINST),
    "python3-cronsim": Package(
        "python3-cronsim", cronsim_version, PY_DEPENDS, APK_PY_DEPENDS,
        "Cron expression parser and evaluator (cronsim), DST-correct with zoneinfo.", _cronsim_stage,
        section="lang", license="BSD-3-Clause", url="https://github.com/cuu508/cronsim"),
}


def with_postinst(script: str, extra: str) -> str:
    """A maintainer script ending in default_postinst, then `extra`, keeping its exit status."""
    if not extra:
        return script
    head, _, last = script.rstrip("\n").rpartition("\n")
    assert last.startswith("default_postinst"), last
    return f"{head}\n{last} || exit $?\n{extra}"


def installed_size(tree: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tree) for f in fs)


def control_text(size: int, package: Package | None = None) -> str:
    pkg = package or PACKAGES[NAME]
    fields = {
        "Package": pkg.name,
        "Version": pkg.version(),
        "Depends": ", ".join(pkg.depends),
        "Source": f"openwrt/{pkg.name}",
        "SourceName": pkg.name,
        "License": pkg.license,
        "Section": pkg.section,
        "URL": pkg.url,
        "Maintainer": MAINTAINER,
        "Architecture": "all",
        "Installed-Size": str(size),
        "Description": pkg.description,
    }
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def _tar_info(name: str, mode: int, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = mode
    info.size = size
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = epoch()
    return info


def targz(members: list[tuple[str, bytes | None, int]]) -> bytes:
    """A reproducible gzip'd GNU tar of (name, content or None for a dir, mode)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, content, mode in members:
            if content is None:
                tar.addfile(_tar_info(name, mode, directory=True))
            else:
                tar.addfile(_tar_info(name, mode, len(content)), io.BytesIO(content))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def tree_members(tree: str) -> list[tuple[str, bytes | None, int]]:
    members: list[tuple[str, bytes | None, int]] = [("./", None, 0o755)]
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, tree)
        for d in dirnames:
            members.append((f"./{os.path.normpath(os.path.join(rel_dir, d))}/", None, 0o755))
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                members.append((f"./{os.path.normpath(os.path.join(rel_dir, f))}", fh.read(),
                                os.stat(path).st_mode & 0o777))
    return sorted(members, key=lambda m: m[0])


def build_ipk(out: str, name: str = NAME) -> str:
    pkg = PACKAGES[name]
    with tempfile.TemporaryDirectory(prefix="qledge-ipk-") as tmp:
        tree = os.path.join(tmp, "root")
        pkg.stage(tree)
        data = targz(tree_members(tree))
        control_members: list[tuple[str, bytes | None, int]] = [("./", None, 0o755)]
        if pkg.conffiles:
            control_members.append(("./conffiles", "".join(f"{c}\n" for c in pkg.conffiles).encode(), 0o644))
        control_members += [
            ("./control", control_text(installed_size(tree), pkg).encode(), 0o644),
            ("./postinst", with_postinst(POSTINST, pkg.postinst).encode(), 0o755),
            ("./prerm", PRERM.encode(), 0o755),
        ]
        control = targz(control_members)
    package = targz([
        ("./debian-binary", b"2.0\n", 0o644),
        ("./data.tar.gz", data, 0o644),
        ("./control.tar.gz", control, 0o644),
    ])
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{pkg.name}_{pkg.version()}_all.ipk")
    with open(path, "wb") as f:
        f.write(package)
    return path


class Unavailable(Exception):
    """A tool or input this build needs is missing; one line for the user."""


def _apk_mkpkg(apk: str | None) -> str:
    found = apk or shutil.which("apk")
    if found is None:
        raise Unavailable("apk v3 packages need `apk mkpkg` (apk-tools 3), and `apk` is not installed;"
                          " point --apk at one (the OpenWrt SDK has staging_dir/host/bin/apk)")
    probe = subprocess.run([found, "mkpkg", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise Unavailable(f"{found} has no `mkpkg` (apk-tools 2?); apk v3 packages need apk-tools 3")
    return found


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def add_apk_metadata(tree: str, package: Package | None = None) -> None:
    """/lib/apk/packages/<name>.list (every file and link, listed before this metadata
    exists, as package-pack.mk does), .conffiles and .conffiles_static ("path sha256", which
    sysupgrade reads to carry changed config files over)."""
    pkg = package or PACKAGES[NAME]
    listed = sorted(
        "/" + os.path.relpath(os.path.join(d, f), tree) for d, _, fs in os.walk(tree) for f in fs)
    db = os.path.join(tree, APK_DB)
    os.makedirs(db, exist_ok=True)
    written = {".list": "".join(f"{p}\n" for p in listed)}
    if pkg.conffiles:
        written[".conffiles"] = "".join(f"{c}\n" for c in pkg.conffiles)
        written[".conffiles_static"] = "".join(
            f"{c} {_sha256(os.path.join(tree, c.lstrip('/')))}\n" for c in pkg.conffiles)
    for ext, text in written.items():
        with open(os.path.join(db, pkg.name + ext), "w") as f:
            f.write(text)
        os.chmod(os.path.join(db, pkg.name + ext), 0o644)
    os.chmod(db, 0o755)
    os.chmod(os.path.dirname(db), 0o755)


def stage_apk(dest: str, name: str = NAME) -> tuple[str, dict[str, str]]:
    """The tree `apk mkpkg --files` packs and the scripts it attaches, under `dest`."""
    pkg = PACKAGES[name]
    tree = os.path.join(dest, "root")
    pkg.stage(tree)
    add_apk_metadata(tree, pkg)
    scripts: dict[str, str] = {}
    for kind, text in apk_scripts(pkg.name).items():
        if kind != "pre-deinstall":
            text = with_postinst(text, pkg.postinst)
        scripts[kind] = os.path.join(dest, kind)
        with open(scripts[kind], "w") as f:
            f.write(text)
        os.chmod(scripts[kind], 0o755)
    stamp = epoch()
    for d, dirs, files in os.walk(dest):
        for entry in dirs + files:
            os.utime(os.path.join(d, entry), (stamp, stamp), follow_symlinks=False)
    return tree, scripts


def mkpkg_argv(apk: str, tree: str, scripts: dict[str, str], output: str, name: str = NAME) -> list[str]:
    """`apk mkpkg` as package-pack.mk calls it for a PKGARCH:=all package."""
    pkg = PACKAGES[name]
    argv = [
        apk, "mkpkg",
        "--info", f"name:{pkg.name}", "--info", f"version:{pkg.version()}",
        "--info", f"description:{' '.join(pkg.description.split())}", "--info", "arch:noarch",
        "--info", f"license:{pkg.license}", "--info", f"origin:{pkg.name}", "--info", f"url:{pkg.url}",
        "--info", f"maintainer:{MAINTAINER}", "--info", f"depends:{' '.join(pkg.apk_depends)}",
    ]
    for kind, path in scripts.items():
        argv += ["--script", f"{kind}:{path}"]
    return [*argv, "--files", tree, "--output", output]


def build_apk(out: str, apk: str | None = None, name: str = NAME) -> str:
    tool = _apk_mkpkg(apk)
    pkg = PACKAGES[name]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(os.path.abspath(out), f"{pkg.name}-{pkg.version()}.apk")
    # apk records owners by name: the files must be root's when packed (fakeroot otherwise).
    prefix: list[str] = []
    if os.geteuid() != 0:
        fakeroot = shutil.which("fakeroot")
        if fakeroot is None:
            raise Unavailable("packing an .apk as a user needs fakeroot (files must be root's); run as root"
                              " or install fakeroot")
        prefix = [fakeroot]
    with tempfile.TemporaryDirectory(prefix="qledge-apk-") as tmp:
        tree, scripts = stage_apk(tmp, name)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch())}
        subprocess.run([*prefix, *mkpkg_argv(tool, tree, scripts, path, name)], check=True, env=env)
    return path


def ipk_installed_size(path: str) -> int:
    """The Installed-Size of a built .ipk's control file."""
    with tarfile.open(path, mode="r:gz") as outer:
        control_tar = outer.extractfile("./control.tar.gz")
        assert control_tar is not None
        with tarfile.open(fileobj=io.BytesIO(control_tar.read()), mode="r:gz") as inner:
            control = inner.extractfile("./control")
            assert control is not None
            fields = dict(line.split(": ", 1) for line in control.read().decode().splitlines() if ": " in line)
    return int(fields["Installed-Size"])


def record(path: str, fmt: str, built: dict[str, str]) -> None:
    """What this run built, for the generated sizes of docs/install-openwrt.md."""
    packages = {}
    for name, file in built.items():
        entry: dict[str, object] = {"file": os.path.basename(file), "bytes": os.path.getsize(file)}
        if fmt == "ipk":
            entry["installed_bytes"] = ipk_installed_size(file)
        packages[name] = entry
    data = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "format": fmt, "python": PY,
            "packages": packages}
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def copy_sources(package: str, dest: str) -> None:
    """The sources a qledge package ships (Python and static files), under dest/ as under site-packages/."""
    for src, rel in qledge_files(package):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(src, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build qledge's noarch OpenWrt packages without the SDK.")
    parser.add_argument("--format", choices=("ipk", "apk"))
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"), help="output directory (default dist/)")
    parser.add_argument("--package", action="append", choices=sorted(PACKAGES),
                        help="build only this package (repeatable; default: all of them)")
    parser.add_argument("--apk", metavar="PATH", help="apk-tools 3 binary for --format apk (default: apk on PATH)")
    parser.add_argument("--sources", nargs=2, metavar=("PACKAGE", "DIR"),
                        help="copy the sources of qledge, qledge-mcp or qledge-web into DIR (for the SDK's Makefile)")
    parser.add_argument("--record", metavar="FILE",
                        help="write what was built (files, bytes, installed bytes) as JSON to FILE")
    args = parser.parse_args(argv)
    try:
        if args.sources:
            if args.sources[0] not in (NAME, *ADD_ONS):
                parser.error(f"--sources takes one of {', '.join((NAME, *ADD_ONS))}")
            copy_sources(args.sources[0], args.sources[1])
            return 0
        if args.format is None:
            parser.error("--format is required")
        built = {}
        for name in args.package or list(PACKAGES):
            path = build_ipk(args.out, name) if args.format == "ipk" else build_apk(args.out, args.apk, name)
            built[name] = path
            print(f"{os.path.basename(path)}: {os.path.getsize(path)} bytes (bytecode for Python {PY})")
        if args.record:
            record(args.record, args.format, built)
    except Unavailable as exc:
        print(f"build_openwrt: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
