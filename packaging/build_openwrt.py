#!/usr/bin/env python3
"""Build the noarch OpenWrt package of qledge without the SDK.

    python packaging/build_openwrt.py --format ipk|apk --out DIR

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
($SOURCE_DATE_EPOCH when set).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import io
import os
import py_compile
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FILES = os.path.join(ROOT, "openwrt", "qledge", "files")

NAME = "qledge"
RELEASE = 1
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
SITE = f"usr/lib/python{PY}/site-packages"
PLAIN_DEPENDS = [
    "python3-asyncio", "python3-logging", "python3-msgspec", "python3-apsw", "python3-cronsim", "zoneinfo-core",
]
# opkg (Debian syntax): two constraints pin the Python minor version the bytecode is for.
DEPENDS = [
    f"python3-light (>= {PY})",
    f"python3-light (<< {sys.version_info.major}.{sys.version_info.minor + 1})",
    *PLAIN_DEPENDS,
]
# apk keeps one constraint per name (a second replaces the first) and knows = < > <= >= ~:
# `~3.11` is the fuzzy match, any 3.11.x.
APK_DEPENDS = [f"python3-light~{PY}", *PLAIN_DEPENDS]
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
APK_POST_INSTALL = f"""#!/bin/sh
[ "${{IPKG_NO_SCRIPT}}" = "1" ] && exit 0
[ -s ${{IPKG_INSTROOT}}/lib/functions.sh ] || exit 0
. ${{IPKG_INSTROOT}}/lib/functions.sh
export root="${{IPKG_INSTROOT}}"
export pkgname="{NAME}"
add_group_and_user
default_postinst
"""
APK_POST_UPGRADE = "#!/bin/sh\nexport PKG_UPGRADE=1\n" + APK_POST_INSTALL.split("\n", 1)[1]
APK_PRE_DEINSTALL = f"""#!/bin/sh
[ -s ${{IPKG_INSTROOT}}/lib/functions.sh ] || exit 0
. ${{IPKG_INSTROOT}}/lib/functions.sh
export root="${{IPKG_INSTROOT}}"
export pkgname="{NAME}"
default_prerm
"""
APK_SCRIPTS = {"post-install": APK_POST_INSTALL, "post-upgrade": APK_POST_UPGRADE,
               "pre-deinstall": APK_PRE_DEINSTALL}
APK_DB = "lib/apk/packages"

DESCRIPTION = (
    "Minimal-footprint task runtime: cron triggers, a bounded run history in SQLite,\n"
    " and low-sensitivity read tools for people and AI clients over a Unix socket."
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


def stage(dest: str, profile: str = "edge") -> None:
    """Lay out the installed tree under `dest`: bytecode, init script, config, launcher."""
    build = _load_build()
    site = os.path.join(dest, SITE)
    for rel in build.profile_files(profile, ROOT):
        if not rel.endswith(".py"):
            continue
        target = os.path.join(site, rel + "c")  # legacy sourceless layout: edge/x.pyc
        os.makedirs(os.path.dirname(target), exist_ok=True)
        py_compile.compile(
            os.path.join(ROOT, rel), cfile=target, dfile=f"/{SITE}/{rel}", doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        os.chmod(target, 0o644)
    for src, rel, mode in (
        ("qledge.init", "etc/init.d/qledge", 0o755),
        ("qledge.config", "etc/config/qledge", 0o644),
        ("qledge.sh", "usr/bin/qledge", 0o755),
        ("qledge.keep", f"lib/upgrade/keep.d/{NAME}", 0o644),
    ):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(FILES, src), target)
        os.chmod(target, mode)


def installed_size(tree: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tree) for f in fs)


def control_text(size: int) -> str:
    fields = {
        "Package": NAME,
        "Version": version(),
        "Depends": ", ".join(DEPENDS),
        "Source": "openwrt/qledge",
        "SourceName": NAME,
        "License": "MIT",
        "Section": "utils",
        "URL": URL,
        "Maintainer": MAINTAINER,
        "Architecture": "all",
        "Installed-Size": str(size),
        "Description": DESCRIPTION,
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


def build_ipk(out: str) -> str:
    with tempfile.TemporaryDirectory(prefix="qledge-ipk-") as tmp:
        tree = os.path.join(tmp, "root")
        stage(tree)
        data = targz(tree_members(tree))
        control = targz([
            ("./", None, 0o755),
            ("./conffiles", "".join(f"{c}\n" for c in CONFFILES).encode(), 0o644),
            ("./control", control_text(installed_size(tree)).encode(), 0o644),
            ("./postinst", POSTINST.encode(), 0o755),
            ("./prerm", PRERM.encode(), 0o755),
        ])
    package = targz([
        ("./debian-binary", b"2.0\n", 0o644),
        ("./data.tar.gz", data, 0o644),
        ("./control.tar.gz", control, 0o644),
    ])
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{NAME}_{version()}_all.ipk")
    with open(path, "wb") as f:
        f.write(package)
    return path


class Unavailable(Exception):
    """A tool this format needs is missing; one line for the user."""


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


def add_apk_metadata(tree: str) -> None:
    """/lib/apk/packages/<name>.list (every file and link, listed before this metadata
    exists, as package-pack.mk does), .conffiles and .conffiles_static ("path sha256", which
    sysupgrade reads to carry changed config files over)."""
    listed = sorted(
        "/" + os.path.relpath(os.path.join(d, f), tree) for d, _, fs in os.walk(tree) for f in fs)
    db = os.path.join(tree, APK_DB)
    os.makedirs(db, exist_ok=True)
    with open(os.path.join(db, f"{NAME}.list"), "w") as f:
        f.write("".join(f"{p}\n" for p in listed))
    with open(os.path.join(db, f"{NAME}.conffiles"), "w") as f:
        f.write("".join(f"{c}\n" for c in CONFFILES))
    with open(os.path.join(db, f"{NAME}.conffiles_static"), "w") as f:
        f.write("".join(f"{c} {_sha256(os.path.join(tree, c.lstrip('/')))}\n" for c in CONFFILES))
    for name in (".list", ".conffiles", ".conffiles_static"):
        os.chmod(os.path.join(db, NAME + name), 0o644)
    os.chmod(db, 0o755)
    os.chmod(os.path.dirname(db), 0o755)


def stage_apk(dest: str) -> tuple[str, dict[str, str]]:
    """The tree `apk mkpkg --files` packs and the scripts it attaches, under `dest`."""
    tree = os.path.join(dest, "root")
    stage(tree)
    add_apk_metadata(tree)
    scripts: dict[str, str] = {}
    for kind, text in APK_SCRIPTS.items():
        scripts[kind] = os.path.join(dest, kind)
        with open(scripts[kind], "w") as f:
            f.write(text)
        os.chmod(scripts[kind], 0o755)
    stamp = epoch()
    for d, dirs, files in os.walk(dest):
        for name in dirs + files:
            os.utime(os.path.join(d, name), (stamp, stamp), follow_symlinks=False)
    return tree, scripts


def mkpkg_argv(apk: str, tree: str, scripts: dict[str, str], output: str) -> list[str]:
    """`apk mkpkg` as package-pack.mk calls it for a PKGARCH:=all package."""
    argv = [
        apk, "mkpkg",
        "--info", f"name:{NAME}", "--info", f"version:{version()}",
        "--info", f"description:{' '.join(DESCRIPTION.split())}", "--info", "arch:noarch",
        "--info", "license:MIT", "--info", f"origin:{NAME}", "--info", f"url:{URL}",
        "--info", f"maintainer:{MAINTAINER}", "--info", f"depends:{' '.join(APK_DEPENDS)}",
    ]
    for kind, path in scripts.items():
        argv += ["--script", f"{kind}:{path}"]
    return [*argv, "--files", tree, "--output", output]


def build_apk(out: str, apk: str | None = None) -> str:
    tool = _apk_mkpkg(apk)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(os.path.abspath(out), f"{NAME}-{version()}.apk")
    # apk records owners by name: the files must be root's when packed (fakeroot otherwise).
    prefix: list[str] = []
    if os.geteuid() != 0:
        fakeroot = shutil.which("fakeroot")
        if fakeroot is None:
            raise Unavailable("packing an .apk as a user needs fakeroot (files must be root's); run as root"
                              " or install fakeroot")
        prefix = [fakeroot]
    with tempfile.TemporaryDirectory(prefix="qledge-apk-") as tmp:
        tree, scripts = stage_apk(tmp)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch())}
        subprocess.run([*prefix, *mkpkg_argv(tool, tree, scripts, path)], check=True, env=env)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the qledge OpenWrt package (noarch) without the SDK.")
    parser.add_argument("--format", choices=("ipk", "apk"), required=True)
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"), help="output directory (default dist/)")
    parser.add_argument("--apk", metavar="PATH", help="apk-tools 3 binary for --format apk (default: apk on PATH)")
    args = parser.parse_args(argv)
    try:
        path = build_ipk(args.out) if args.format == "ipk" else build_apk(args.out, args.apk)
    except Unavailable as exc:
        print(f"build_openwrt: {exc}", file=sys.stderr)
        return 2
    print(f"{os.path.basename(path)}: {os.path.getsize(path)} bytes (bytecode for Python {PY})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
