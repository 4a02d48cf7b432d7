#!/usr/bin/env python3
"""Build a profile's zipapp and its manifest: `python packaging/build.py --profile edge --out DIR`.

The zipapp holds only the profile's modules of `edge/` and a `__main__`, so
`python3 qledge-edge.pyz serve` works wherever msgspec, apsw and cronsim are installed. The
sources run on any Python >= 3.11; beside each one, every profile but `edge` carries its
bytecode for one Python (the one running this script, or `--python`), in the layout
zipimport reads: that Python then compiles nothing when a command starts, any other ignores
the bytecode (its magic number differs) and compiles the source. The `edge` profile carries
sources only: its bytecode is 2.4 times its 256 KiB budget and doubles its 64 files
(bench/test_budgets.py); the OpenWrt packages are bytecode (packaging/build_openwrt.py).

The output is byte-for-byte reproducible: fixed timestamps and modes, sorted entries,
bytecode compiled in a fresh interpreter with a fixed hash seed. The manifest records bytes,
file count, modules, the bytecode's Python and sha256 for the budget checks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "edge"


def _capabilities() -> dict[str, tuple[str, ...]]:
    """Each optional capability's files (edge/app/capabilities.py, the one list of them, which
    imports nothing: it is read from its file, whatever this interpreter could import)."""
    path = os.path.join(ROOT, PACKAGE, "app", "capabilities.py")
    spec = importlib.util.spec_from_file_location("qledge_capabilities", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {c.name: c.parts for c in module.CAPABILITIES}


# Optional capabilities, shipped only by the profiles that include them: path prefixes. The AI
# operator is its child (edge/airun/) and the daemon's side of it (edge/operator/ and what it
# shares with the child and the stores), which the daemon loads only when [agent] is enabled.
# Notifications: the notifier, its tools, the sender child (the one part that loads HTTP, TLS
# and SMTP), their port and the SQLite queue's adapter; without them the daemon keeps the
# failing marks and queues nothing (edge/storage/sqlite/runs.py). Cluster mode's notification
# adapter needs the notify port: a profile with the cluster has notify too. The web panel is a
# process of its own (`qledge web`), with its static files; the daemon never loads it.
OPTIONAL: dict[str, str | tuple[str, ...]] = dict(_capabilities())

# Kept in the source tree for callers of an older import path; no build ships it.
NOT_SHIPPED = ("edge/cli/client.py",)
# The commands about an installation itself (`qledge doctor`, `qledge completion`): every build
# ships them but the smallest, whose 64 files are the daemon's and the everyday commands'
# (its CLI says so when they are asked for: edge.cli.main's NOUNS).
NOT_IN_EDGE = ("edge/cli/completion.py", "edge/cli/doctor.py")
# The profiles one may ask for, and the capabilities each adds to the edge core.
WANTED: dict[str, tuple[str, ...]] = {
    "edge": (),
    "edge-mcp": ("mcp",),
    "edge-notify": ("notify",),
    "web": ("web",),
    "full": tuple(OPTIONAL),  # every optional capability
}


def distinct(
    wanted: dict[str, tuple[str, ...]], optional: dict[str, str | tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """The profiles that exist: each wanted one whose contents differ from every profile
    before it (capabilities not in `optional` count for nothing). Two names for one archive
    would be two artifacts to build, ship and measure for nothing."""
    found: dict[str, tuple[str, ...]] = {}
    seen: set[frozenset[str]] = set()
    for name, capabilities in wanted.items():
        contents = frozenset(c for c in capabilities if c in optional)
        if contents not in seen:
            seen.add(contents)
            found[name] = tuple(c for c in capabilities if c in optional)
    return found


PROFILES = distinct(WANTED, OPTIONAL)
# Profiles whose zipapp carries no bytecode, and why: see the module docstring.
SOURCES_ONLY = {"edge": "its bytecode would not fit its 256 KiB and 64-file budget"}

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
MAIN = b"from edge.cli.main import main\n\nraise SystemExit(main())\n"
SHEBANG = b"#!/usr/bin/env python3\n"


def profile_files(profile: str, root: str = ROOT) -> list[str]:
    """Sorted paths, relative to `root`, of the files under edge/ the profile ships."""
    excluded = tuple(prefix for name, prefixes in OPTIONAL.items() if name not in PROFILES[profile]
                     for prefix in ((prefixes,) if isinstance(prefixes, str) else prefixes))
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, PACKAGE)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith((".pyc", ".pyo", ".sql")):  # .sql: the schema snapshots, for reading only
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if profile == "edge" and rel in NOT_IN_EDGE:
                continue
            if not rel.startswith(excluded) and rel not in NOT_SHIPPED:
                found.append(rel)
    return sorted(found)


def module_name(path: str) -> str:
    """edge/app/config.py -> edge.app.config; edge/__init__.py -> edge."""
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _entry(name: str, mode: int = 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, ZIP_EPOCH)
    info.create_system = 3  # unix, so the mode below is honoured
    if name.endswith("/"):
        info.external_attr = (0o040000 | 0o755) << 16 | 0x10  # a directory (and MS-DOS's dir flag)
    else:
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _directories(files: list[str]) -> list[str]:
    """Every directory above the files, as "a/b/": zipimport finds namespace packages
    (our subpackages have no __init__.py) only through such entries."""
    dirs = {"/".join(parts[:i]) + "/" for parts in (f.split("/") for f in files) for i in range(1, len(parts))}
    return sorted(dirs)


def without_comments(source: bytes) -> bytes:
    """The module's source with its comments taken out and every line kept where it is, so
    tracebacks point at the same lines: what runs is the same code, in fewer bytes on flash."""
    import io
    import tokenize

    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            line = lines[row - 1]
            ending = line[len(line.rstrip("\r\n")):]
            lines[row - 1] = line[:col].rstrip() + ending
    return "".join(lines).encode("utf-8")


def without_docstrings(source: bytes) -> bytes:
    """The module's source with its module and function docstrings emptied and every line kept
    where it is: no code reads them, and on a router they cost flash and, once imported,
    memory. A class keeps its docstring: msgspec's JSON Schema of a tool's arguments takes
    its description from it. An emptied docstring stays as an empty string, so a body that
    was only a docstring stays a body."""
    import ast

    tree = ast.parse(source)
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                v = first.value
                assert v.end_lineno is not None and v.end_col_offset is not None
                spans.append((v.lineno, v.col_offset, v.end_lineno, v.end_col_offset))
    lines = source.splitlines(keepends=True)
    for l1, c1, l2, c2 in sorted(spans, reverse=True):  # ast's columns are byte offsets
        empty = b'""' if l1 == l2 else b'"""' + b"\n" * (l2 - l1) + b'"""'
        lines[l1 - 1:l2] = [lines[l1 - 1][:c1] + empty + lines[l2 - 1][c2:]]
    return b"".join(lines)


def shipped(files: list[str], root: str = ROOT) -> dict[str, bytes]:
    """What each file is in the zipapp: modules without their comments and docstrings, the
    rest as they are."""
    found = {}
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        found[rel] = without_docstrings(without_comments(data)) if rel.endswith(".py") else data
    return found


# Run by the target Python: compile each listed source (a temporary copy of what the zipapp
# ships) into the `.pyc` beside it; a source hash that is not checked, as OpenWrt's packages do,
# and the name tracebacks show. Prints the Python's cache tag (cpython-311).
_COMPILE = """
import json, py_compile, sys
for source, shown in json.load(sys.stdin):
    py_compile.compile(source, cfile=source + "c", dfile=shown, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
print(sys.implementation.cache_tag)
"""


def bytecode(sources: dict[str, bytes], python: str, shown_as: str) -> tuple[str, dict[str, bytes]]:
    """`python`'s cache tag and the bytecode of each `.py` in `sources` (path → source) as it
    compiles them, in a fresh interpreter (isolated, fixed hash seed: reproducible)."""
    modules = sorted(rel for rel in sources if rel.endswith(".py"))
    with tempfile.TemporaryDirectory(prefix="qledge-pyc-") as tmp:
        for rel in modules:
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "wb") as f:
                f.write(sources[rel])
        listed = json.dumps([[os.path.join(tmp, rel), f"{shown_as}/{rel}"] for rel in modules])
        done = subprocess.run([python, "-I", "-S", "-c", _COMPILE], input=listed, capture_output=True, text=True,
                              env={"PYTHONHASHSEED": "0", "PATH": os.environ.get("PATH", "")}, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{python} could not compile the sources: {done.stderr.strip()}")
        compiled = {}
        for rel in modules:
            with open(os.path.join(tmp, rel + "c"), "rb") as f:
                compiled[rel + "c"] = f.read()
    return done.stdout.strip(), compiled


def write_zipapp(path: str, files: list[str], root: str = ROOT, python: str | None = None) -> str | None:
    """The zipapp of `files`, with their bytecode for `python` unless it is None; the
    bytecode's cache tag (None: sources only)."""
    sources = shipped(files, root)
    tag, compiled = bytecode(sources, python, os.path.basename(path)) if python else (None, {})
    entries = {**sources, **compiled}
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw:
        raw.write(SHEBANG)
        with zipfile.ZipFile(raw, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
            zf.writestr(_entry("__main__.py"), MAIN)
            for rel in _directories(files):
                zf.writestr(_entry(rel), b"")
            for rel in sorted(entries):
                zf.writestr(_entry(rel), entries[rel])
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return tag


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(profile: str, out: str, root: str = ROOT, python: str | None = sys.executable) -> dict:
    """Write qledge-<profile>.pyz and qledge-<profile>.json into `out`; return the manifest.
    `python`: whose bytecode the zipapp carries beside the sources (None, or a profile in
    SOURCES_ONLY: none)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
    os.makedirs(out, exist_ok=True)
    files = profile_files(profile, root)
    artifact = os.path.join(out, f"qledge-{profile}.pyz")
    tag = write_zipapp(artifact, files, root, None if profile in SOURCES_ONLY else python)
    manifest = {
        "profile": profile,
        "artifact": os.path.basename(artifact),
        "bytes": os.path.getsize(artifact),
        "files": len(files),
        "bytecode": tag,  # the Python whose bytecode is beside the sources, e.g. cpython-311
        "source_bytes": sum(os.path.getsize(os.path.join(root, f)) for f in files),
        "modules": [module_name(f) for f in files if f.endswith(".py")],
        "sha256": sha256_file(artifact),
    }
    with open(os.path.join(out, f"qledge-{profile}.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a qledge profile zipapp and its manifest.")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="edge")
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"), help="output directory (default dist/)")
    parser.add_argument("--python", default=sys.executable, metavar="PATH",
                        help="the Python whose bytecode to ship beside the sources (default: this one)")
    parser.add_argument("--sources-only", action="store_true", help="ship no bytecode")
    args = parser.parse_args(argv)
    manifest = build(args.profile, args.out, python=None if args.sources_only else args.python)
    bytecode = f", bytecode for {manifest['bytecode']}" if manifest["bytecode"] else ""
    print(f"{manifest['artifact']}: {manifest['bytes']} bytes, {manifest['files']} files{bytecode},"
          f" sha256 {manifest['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
