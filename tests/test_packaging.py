"""Artifacts: profile zipapps, the OpenWrt package, the systemd unit and the init script."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

import edge
from edge import home_socket
from edge.app import config as config_file
from edge.cli.main import client_socket
from support import DaemonProcess, short_tmpdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = os.path.join(ROOT, "packaging", "systemd", "qledge.service")
OPENWRT_FILES = os.path.join(ROOT, "openwrt", "qledge", "files")
INIT = os.path.join(OPENWRT_FILES, "qledge.init")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"qledge_{name}", os.path.join(ROOT, "packaging", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load("build")
build_openwrt = _load("build_openwrt")

# The dependencies (msgspec, apsw, cronsim) as if installed system-wide, but not this
# environment's own qledge: -S skips .pth files, so an editable install's finder (which
# would answer for any `edge.*` module, even one a build left out) is never set up.
SITE = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})


def system_python(*first: str) -> list[str]:
    """argv prefix running `python -c` with `first` ahead of the dependencies on sys.path."""
    code = f"import sys; sys.path[:0] = {list(first)!r}; sys.path += {SITE!r}; "
    return [sys.executable, "-I", "-S", "-c", code + "from edge.cli.main import main; sys.exit(main())"]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it as root)")
    return path


def _run_build(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def pyz_dir():
    out = short_tmpdir()
    for profile in build.PROFILES:
        result = _run_build("packaging/build.py", "--profile", profile, "--out", out)
        assert result.returncode == 0, result.stderr
    yield out
    shutil.rmtree(out, ignore_errors=True)


# -- profile zipapps -------------------------------------------------------------------


def test_profiles_ship_only_their_capabilities(tmp_path):
    agent = ["edge/airun/__main__.py", "edge/app/operator.py", "edge/core/agent.py", "edge/operator/runs.py",
             "edge/storage/sqlite/evidence.py", "edge/tools/agent.py"]
    for rel in ("edge/__init__.py", "edge/app/daemon.py", "edge/mcp/server.py", "edge/storage/sqlite/db.py",
                "edge/storage/sqlite/notify.py", "edge/notify/send.py", "edge/app/__pycache__/x.pyc", *agent):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    base = ["edge/__init__.py", "edge/app/daemon.py", "edge/storage/sqlite/db.py"]
    assert build.profile_files("edge", str(tmp_path)) == base
    assert build.profile_files("edge-mcp", str(tmp_path)) == sorted([*base, "edge/mcp/server.py"])
    assert build.profile_files("edge-notify", str(tmp_path)) == sorted(
        [*base, "edge/notify/send.py", "edge/storage/sqlite/notify.py"])
    assert build.profile_files("full", str(tmp_path)) == sorted(
        [*base, "edge/mcp/server.py", "edge/notify/send.py", "edge/storage/sqlite/notify.py", *agent])
    assert build.module_name("edge/__init__.py") == "edge"
    assert build.module_name("edge/app/daemon.py") == "edge.app.daemon"


def test_a_profile_exists_only_when_its_contents_differ(pyz_dir):
    # `full` is every optional capability: today that is MCP alone, the same as edge-mcp.
    assert build.distinct(build.WANTED, {"mcp": ("edge/mcp/",)}) == {"edge": (), "edge-mcp": ("mcp",)}
    more = {"mcp": ("edge/mcp/",), "agent": ("edge/airun/",)}
    assert build.distinct({**build.WANTED, "full": tuple(more)}, more) == {
        "edge": (), "edge-mcp": ("mcp",), "full": ("mcp", "agent")}
    digests = {}
    for profile in build.PROFILES:
        with open(os.path.join(pyz_dir, f"qledge-{profile}.json")) as f:
            digests[profile] = json.load(f)["sha256"]
    assert len(set(digests.values())) == len(digests), digests  # no two profiles are one archive
    with open(os.path.join(ROOT, "docs", "install-openwrt.md")) as f:
        readme = f.read()
    section = readme.split("## Build artifacts", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `([a-z-]+)` \| ([^|]+) \|", section, re.M))
    assert set(listed) == set(build.PROFILES), listed  # the install guide lists exactly the profiles that exist
    for profile, capabilities in build.PROFILES.items():
        for capability in capabilities:
            prefixes = build.OPTIONAL[capability]
            first = prefixes if isinstance(prefixes, str) else prefixes[0]
            assert f"`{first}`" in listed[profile], (profile, capability)


def test_zipapp_is_reproducible_and_its_manifest_is_true(pyz_dir):
    again = short_tmpdir()
    try:
        assert _run_build("packaging/build.py", "--profile", "edge", "--out", again).returncode == 0
        with open(os.path.join(pyz_dir, "qledge-edge.pyz"), "rb") as a, open(
                os.path.join(again, "qledge-edge.pyz"), "rb") as b:
            assert a.read() == b.read()
    finally:
        shutil.rmtree(again)
    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    with open(os.path.join(pyz_dir, "qledge-edge.json")) as f:
        manifest = json.load(f)
    with zipfile.ZipFile(pyz) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos if not i.is_dir()]
    dirs = [i.filename for i in infos if i.is_dir()]
    assert names[0] == "__main__.py" and names[1:] == sorted(names[1:])
    assert dirs == sorted(dirs) and "edge/app/" in dirs and "edge/storage/sqlite/" in dirs
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert manifest["bytes"] == os.path.getsize(pyz)
    assert manifest["sha256"] == build.sha256_file(pyz)
    assert manifest["files"] == len(names) - 1 == len(build.profile_files("edge"))
    assert "edge.app.daemon" in manifest["modules"] and "edge.cli.main" in manifest["modules"]
    assert not [m for m in manifest["modules"] if m.startswith("edge.mcp")]
    assert os.stat(pyz).st_mode & 0o111  # runnable as ./qledge-edge.pyz


def test_edge_zipapp_serves_and_answers_its_cli(pyz_dir, home):
    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    where = subprocess.run([sys.executable, "-I", pyz, "--help"], capture_output=True, text=True)
    assert where.returncode == 0 and "serve" in where.stdout  # the archive's own __main__
    origin = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = [{pyz!r}]; sys.path += {SITE!r}; "
         "import edge.app.daemon, edge; print(edge.__file__)"], capture_output=True, text=True)
    assert origin.stdout.startswith(pyz), origin  # the daemon's modules import from the archive
    daemon = DaemonProcess(home=home, argv=system_python(pyz)).start()
    try:
        status = subprocess.run([*system_python(pyz), "status", "--json"], env=daemon.env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == daemon.pid
    finally:
        assert daemon.stop() == 0


def test_the_smallest_zipapp_says_it_has_no_doctor_and_the_others_have_one(pyz_dir, home):
    """The edge zipapp's 64 files are the daemon's and the everyday commands': doctor and
    completion ship in every other build (the OpenWrt package's edge-notify among them)."""
    edge_pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    env = {**os.environ, "QLEDGE_HOME": home}
    for noun, *args in (("doctor",), ("completion", "bash")):
        result = subprocess.run([*system_python(edge_pyz), noun, *args], env=env, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            f"qledge: invalid_argument: qledge {noun} is not included in this build (the smallest zipapp):"
            " the packages and the other zipapps have it"]
    assert "edge/cli/doctor.py" in build.profile_files("edge-notify")
    result = subprocess.run([*system_python(os.path.join(pyz_dir, "qledge-edge-notify.pyz")), "completion", "bash"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "complete -F _qledge qledge" in result.stdout.splitlines()


def test_edge_zipapp_lists_only_the_commands_it_serves_and_says_why_of_the_others(pyz_dir):
    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    listed = subprocess.run([*system_python(pyz), "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    commands = set(re.findall(r"^    ([a-z]+) ", listed.stdout, re.M))
    assert {"task", "run", "trigger", "status"} <= commands
    assert not commands & {"ask", "agent", "web", "notify", "doctor", "completion"}, listed.stdout
    for noun, line in (("ask", "the AI operator is not included in this build"),
                       ("agent", "the AI operator is not included in this build")):
        called = subprocess.run([*system_python(pyz), noun, "--help"], capture_output=True, text=True, timeout=60)
        assert (called.returncode, called.stderr) == (2, f"qledge: invalid_argument: {line}\n"), called
    full = subprocess.run([*system_python(os.path.join(pyz_dir, "qledge-full.pyz")), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert {"ask", "agent", "notify"} <= set(re.findall(r"^    ([a-z]+) ", full.stdout, re.M)), full.stdout


def test_mcp_enabled_in_a_build_without_it_is_one_clear_line(pyz_dir, home):
    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write("[mcp]\nenabled = true\n")
    result = subprocess.run([*system_python(pyz), "serve", "--config", config],
                            env={**os.environ, "QLEDGE_HOME": home}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["qledge: invalid_argument: MCP is not included in this build"]


def test_a_build_without_notifications_runs_tasks_and_queues_nothing(pyz_dir):
    """The edge profile ships no edge/notify/ (nor its port and SQLite adapter): no channel
    tools, no `qledge notify`; a database that has channels (from another build) still runs
    its tasks, keeps the failing mark (so a later build knows a success is a recovery) and
    queues nothing, since nothing here could send it."""
    import json as _json

    from support import DaemonProcess

    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    d = DaemonProcess(argv=system_python(pyz)).start()
    try:
        from edge.cli.client import CallFailed

        with pytest.raises(CallFailed, match="unknown tool"):
            d.call("qledge.notify.channel.set", {"name": "w", "spec": {"kind": "webhook", "url": "http://x.invalid/"}})
        conn = d.db()
        conn.execute("INSERT INTO notify_channels VALUES ('default', 'w', 'webhook', ?, 0, 0)",
                     (_json.dumps({"kind": "webhook", "url": "http://x.invalid/"}),))
        conn.execute("INSERT INTO notify_rules VALUES ('default', ?, 0)", (_json.dumps([{"channels": ["w"]}]),))
        d.call("qledge.task.create", {"taskId": "t", "spec": {"command": {"kind": "argv", "file": "false"}}})
        run = d.call("qledge.run.start", {"taskId": "t"})
        done = d.call("qledge.run.wait", {"runId": run["id"], "timeoutMs": 10_000})
        assert done["done"] and done["run"]["status"] == "failed", (done, d.stderr())
        assert conn.execute("SELECT count(*) FROM notifications").fetchone() == (0,)
        assert conn.execute("SELECT task_id FROM failing_tasks").fetchall() == [("t",)]
        modules = d.call("qledge.status", {"includeModules": True})["modules"]
        assert not [m for m in modules if m.startswith(("edge.notify", "edge.storage.sqlite.notify"))]
        cli = subprocess.run([*system_python(pyz), "notify", "log"], env=d.env, capture_output=True, text=True,
                             timeout=60)
        assert cli.returncode == 2 and "invalid choice: 'notify'" in cli.stderr
    finally:
        d.cleanup()


def test_the_zipapp_without_its_packages_says_what_to_install(pyz_dir, home):
    """`python3 qledge-edge.pyz` on a Python that lacks msgspec: one line naming the package
    (-S: no site-packages, as on a router where python3-msgspec is not installed)."""
    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    for args in (["status"], ["serve"], ["cron", "next", "@daily"], ["task", "list"]):
        result = subprocess.run([sys.executable, "-I", "-S", pyz, *args], env={**os.environ, "QLEDGE_HOME": home},
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr == ("qledge: invalid_argument: the Python package msgspec is not installed:"
                                 " pip install msgspec"
                                 " (OpenWrt: opkg install python3-msgspec)\n"), args


# -- OpenWrt package -------------------------------------------------------------------


def _members(blob: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(blob: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return tar.extractfile(name).read()


@pytest.fixture(scope="module")
def ipks():
    """Every package the builder makes, by package name: (file name, bytes)."""
    out = short_tmpdir()
    result = _run_build("packaging/build_openwrt.py", "--format", "ipk", "--out", out)
    assert result.returncode == 0, result.stderr
    found = {}
    for name in os.listdir(out):
        with open(os.path.join(out, name), "rb") as f:
            found[name.split("_")[0]] = (name, f.read())
    yield found
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def ipk(ipks):
    return ipks["qledge"]


def test_the_builder_makes_qledge_its_add_ons_luci_app_qledge_and_python3_cronsim(ipks):
    from importlib.metadata import version as dist_version

    assert set(ipks) == {"qledge", "qledge-mcp", "qledge-web", "luci-app-qledge", "python3-cronsim"}
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = f"./usr/lib/python{py}/site-packages/"
    name, blob = ipks["python3-cronsim"]
    assert name == f"python3-cronsim_{dist_version('cronsim')}-r1_all.ipk"
    control = _read(_read(blob, "./control.tar.gz"), "./control").decode()
    assert "Architecture: all\n" in control
    assert f"Depends: python3-light (>= {py}), python3-light (<< 3.{sys.version_info.minor + 1})\n" in control
    data = _members(_read(blob, "./data.tar.gz"))
    assert f"{site}cronsim/__init__.pyc" in data or f"{site}cronsim/cronsim.pyc" in data
    assert all(n.endswith(".pyc") for n in data if data[n].isfile())
    mcp = _members(_read(ipks["qledge-mcp"][1], "./data.tar.gz"))
    shipped = sorted(n for n in mcp if mcp[n].isfile())
    assert shipped and all(n.startswith(f"{site}edge/mcp/") for n in shipped)
    assert "Depends: qledge (= " in _read(_read(ipks["qledge-mcp"][1], "./control.tar.gz"), "./control").decode()


def test_the_recorded_sizes_the_install_guide_shows_are_this_builds(ipks):
    """docs/install-openwrt.md's sizes are generated from bench/results/openwrt.json
    (build_openwrt.py --record): it names every package, and is refreshed when a package
    has grown or shrunk by a tenth (bytecode differs between Python versions: same one only)."""
    with open(os.path.join(ROOT, "bench", "results", "openwrt.json")) as f:
        recorded = json.load(f)
    assert set(recorded["packages"]) == set(build_openwrt.PACKAGES)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    if recorded["python"] != py or recorded["format"] != "ipk":
        pytest.skip(f"recorded from Python {recorded['python']} {recorded['format']}s; this is {py}")
    for name, (file, blob) in ipks.items():
        entry = recorded["packages"][name]
        assert abs(len(blob) - entry["bytes"]) <= entry["bytes"] / 10, (
            f"{file} is {len(blob)} bytes, recorded {entry['bytes']}: run python packaging/build_openwrt.py"
            " --format ipk --record bench/results/openwrt.json, then python packaging/docs.py")


def test_both_builds_ship_the_same_files_notifications_included(ipk, tmp_path):
    """The SDK's Makefile copies what `--sources` names; the .ipk holds the bytecode of that."""
    result = _run_build("packaging/build_openwrt.py", "--sources", "qledge", str(tmp_path / "q"))
    assert result.returncode == 0, result.stderr
    sources = sorted(os.path.relpath(os.path.join(d, f), tmp_path / "q")
                     for d, _, fs in os.walk(tmp_path / "q") for f in fs)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = f"./usr/lib/python{py}/site-packages/"
    data = _members(_read(ipk[1], "./data.tar.gz"))
    compiled = sorted(n[len(site):-1] for n in data if n.startswith(site) and data[n].isfile())
    assert compiled == sources
    assert "edge/notify/send.py" in sources and "edge/storage/sqlite/notify.py" in sources
    assert not [s for s in sources if s.startswith(("edge/mcp/", "edge/airun/", "edge/storage/postgres/"))]
    with open(os.path.join(ROOT, "openwrt", "qledge", "Makefile")) as f:
        makefile = f.read()
    assert "build_openwrt.py --sources" in makefile and "$(QLEDGE_SOURCES) qledge-mcp" in makefile


def _data_files(blob: bytes, under: str) -> list[str]:
    data = _members(_read(blob, "./data.tar.gz"))
    return sorted(n[len(under):] for n in data if n.startswith(under) and data[n].isfile())


def test_qledge_web_ships_the_panel_and_its_static_files_in_both_builds(ipks, tmp_path):
    result = _run_build("packaging/build_openwrt.py", "--sources", "qledge-web", str(tmp_path / "w"))
    assert result.returncode == 0, result.stderr
    sources = sorted(os.path.relpath(os.path.join(d, f), tmp_path / "w")
                     for d, _, fs in os.walk(tmp_path / "w") for f in fs)
    assert sources == sorted(set(build.profile_files("web")) - set(build.profile_files("edge-notify")))
    assert "edge/web/command.py" in sources and "edge/web/static/index.html" in sources
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    shipped = _data_files(ipks["qledge-web"][1], f"./usr/lib/python{py}/site-packages/")
    # bytecode for the Python files, the static files as they are
    assert shipped == sorted(s + "c" if s.endswith(".py") else s for s in sources)
    control = _read(_read(ipks["qledge-web"][1], "./control.tar.gz"), "./control").decode()
    assert f"Depends: qledge (= {edge.__version__}-r{build_openwrt.RELEASE})\n" in control
    with open(os.path.join(ROOT, "openwrt", "qledge", "Makefile")) as f:
        makefile = f.read()
    assert "$(QLEDGE_SOURCES) qledge-web" in makefile and "$(eval $(call BuildPackage,qledge-web))" in makefile
    assert _makefile_depends(os.path.join(ROOT, "openwrt", "qledge", "Makefile"), "qledge-web") == {"qledge"}


def _install(blobs: list[bytes]) -> str:
    """The packages' data trees unpacked into one scratch root, as opkg would lay them down."""
    root = short_tmpdir()
    for blob in blobs:
        with tarfile.open(fileobj=io.BytesIO(_read(blob, "./data.tar.gz")), mode="r:gz") as tar:
            tar.extractall(root, filter="data")
    return root


def test_qledge_and_qledge_web_together_serve_the_panel(ipks, daemon):
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    alone, both = _install([ipks["qledge"][1]]), _install([ipks["qledge"][1], ipks["qledge-web"][1]])
    try:
        without = subprocess.run([*system_python(os.path.join(alone, f"usr/lib/python{py}/site-packages")),
                                  "web", "--help"], capture_output=True, text=True, timeout=60)
        assert without.returncode == 2 and "the web panel is not included in this build" in without.stderr
        site = os.path.join(both, f"usr/lib/python{py}/site-packages")
        helped = subprocess.run([*system_python(site), "web", "--help"], capture_output=True, text=True, timeout=60)
        assert helped.returncode == 0, helped.stderr
        assert helped.stdout.startswith("usage: qledge web ")
        # The panel itself, from the unpacked packages alone (-I -S: not this checkout's edge).
        python = os.path.join(both, "python-from-packages")
        with open(python, "w") as f:
            f.write('#!/bin/sh\n[ "$1 $2" = "-m edge" ] && shift 2\n'
                    f'exec {" ".join(shlex.quote(a) for a in system_python(site))} "$@"\n')
        os.chmod(python, 0o755)
        from web_support import WebProcess

        web = WebProcess(daemon, python=python)
        try:
            status, _, body = web.request("GET", "/static/strings.js")
            with open(os.path.join(site, "edge", "web", "static", "strings.js"), "rb") as f:
                assert status == 200 and body == f.read()
            assert web.request("GET", "/")[0] == 200
        finally:
            web.stop()
    finally:
        shutil.rmtree(alone, ignore_errors=True)
        shutil.rmtree(both, ignore_errors=True)


LUCI = os.path.join(ROOT, "openwrt", "luci-app-qledge")


def test_luci_app_qledge_is_laid_out_as_luci_mk_does_and_needs_the_panel(ipks):
    name, blob = ipks["luci-app-qledge"]
    assert name == f"luci-app-qledge_{edge.__version__}-r{build_openwrt.RELEASE}_all.ipk"
    expected = {}
    for top, under in (("htdocs", "www/"), ("root", "")):
        for d, _, fs in os.walk(os.path.join(LUCI, top)):
            for f in fs:
                path = os.path.join(d, f)
                expected["./" + under + os.path.relpath(path, os.path.join(LUCI, top))] = (
                    0o755 if os.access(path, os.X_OK) else 0o644)
    data = _members(_read(blob, "./data.tar.gz"))
    assert {n: m.mode for n, m in data.items() if m.isfile()} == expected
    assert "./www/luci-static/resources/view/qledge/panel.js" in expected
    assert expected["./etc/init.d/qledge-web"] == 0o755
    control_blob = _read(blob, "./control.tar.gz")
    fields = dict(line.split(": ", 1) for line in _read(control_blob, "./control").decode().splitlines()
                  if not line.startswith(" "))
    assert fields["Depends"] == "luci-base, qledge-web" and fields["Architecture"] == "all"
    assert _read(control_blob, "./conffiles") == b"/etc/config/qledge-web\n"
    postinst = _read(control_blob, "./postinst").decode()
    assert "default_postinst" in postinst and "rm -f /tmp/luci-indexcache" in postinst
    # The SDK's build: luci.mk, the same dependencies.
    with open(os.path.join(LUCI, "Makefile")) as f:
        makefile = f.read()
    assert "include $(TOPDIR)/feeds/luci/luci.mk" in makefile
    assert re.search(r"^LUCI_DEPENDS:=(.*)$", makefile, re.M).group(1).split() == ["+luci-base", "+qledge-web"]
    assert "LUCI_PKGARCH:=all" in makefile
    tmp = short_tmpdir()
    try:
        tree, scripts = build_openwrt.stage_apk(tmp, "luci-app-qledge")
        info, _ = _mkpkg_info(build_openwrt.mkpkg_argv("apk", tree, scripts, os.path.join(tmp, "o.apk"),
                                                       "luci-app-qledge"))
        assert info["depends"].split() == ["luci-base", "qledge-web"] and info["arch"] == "noarch"
        with open(os.path.join(tree, "lib/apk/packages/luci-app-qledge.conffiles")) as f:
            assert f.read() == "/etc/config/qledge-web\n"
        with open(scripts["post-install"]) as f:
            assert "rm -f /tmp/luci-indexcache" in f.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_ipk_layout_control_fields_and_modes(ipk):
    name, blob = ipk
    version = f"{edge.__version__}-r{build_openwrt.RELEASE}"
    assert name == f"qledge_{version}_all.ipk"
    assert blob[:2] == b"\x1f\x8b" and gzip.decompress(blob)  # a gzip'd tar, as opkg reads it
    outer = _members(blob)
    assert list(outer) == ["./debian-binary", "./data.tar.gz", "./control.tar.gz"]
    assert _read(blob, "./debian-binary") == b"2.0\n"

    control_blob = _read(blob, "./control.tar.gz")
    control = _members(control_blob)
    assert set(control) == {".", "./control", "./conffiles", "./postinst", "./prerm"}  # tarfile reads "./" as "."
    assert control["./postinst"].mode == control["./prerm"].mode == 0o755
    fields = dict(line.split(": ", 1) for line in _read(control_blob, "./control").decode().splitlines()
                  if not line.startswith(" "))
    assert fields["Package"] == "qledge" and fields["Version"] == version
    assert fields["Architecture"] == "all"
    assert "Require-User" not in fields  # the daemon runs as root: no account to create
    depends = [d.split(" (")[0] for d in fields["Depends"].split(", ")]
    for dep in ("python3-light", "python3-asyncio", "python3-logging", "python3-msgspec", "python3-apsw"):
        assert dep in depends
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"python3-light (>= {py})" in fields["Depends"]  # bytecode is tied to the Python minor version
    assert _read(control_blob, "./conffiles") == b"/etc/config/qledge\n"
    assert b"default_postinst" in _read(control_blob, "./postinst")
    assert b"default_prerm" in _read(control_blob, "./prerm")

    data_blob = _read(blob, "./data.tar.gz")
    data = _members(data_blob)
    assert data["./etc/init.d/qledge"].mode == 0o755
    assert data["./usr/bin/qledge"].mode == 0o755
    assert data["./etc/config/qledge"].mode == 0o644
    completion = "./usr/share/bash-completion/completions/qledge"  # where bash-completion looks
    assert data[completion].mode == 0o644
    with open(os.path.join(ROOT, "openwrt", "qledge", "files", "qledge.bash-completion"), "rb") as f:
        assert _read(data_blob, completion) == f.read()  # that file is generated: tests/test_docs.py
    keep = _read(data_blob, "./lib/upgrade/keep.d/qledge").decode()
    assert [line for line in keep.splitlines() if line and not line.startswith("#")] == [
        "/srv/qledge/", "/srv/qledge-tasks/", "/srv/qledge-scripts/"]
    site = f"./usr/lib/python{py}/site-packages/edge/"
    code = [n for n in data if n.startswith(site) and data[n].isfile()]
    assert code and all(n.endswith(".pyc") and data[n].mode == 0o644 for n in code)
    assert all(m.mode == 0o755 for m in data.values() if m.isdir())
    assert f"{site}app/daemon.pyc" in data and f"{site}__main__.pyc" in data
    assert not [n for n in data if n.startswith(f"{site}mcp")]
    assert all(m.uid == 0 and m.gid == 0 and m.uname == "root" for m in data.values())
    assert int(fields["Installed-Size"]) == sum(m.size for m in data.values() if m.isfile())


def test_ipk_is_reproducible(ipk):
    out = short_tmpdir()
    try:
        assert _run_build("packaging/build_openwrt.py", "--format", "ipk", "--out", out).returncode == 0
        with open(os.path.join(out, ipk[0]), "rb") as f:
            assert f.read() == ipk[1]
    finally:
        shutil.rmtree(out)


def test_ipk_bytecode_serves(ipk, home):
    root = short_tmpdir()
    try:
        with tarfile.open(fileobj=io.BytesIO(_read(ipk[1], "./data.tar.gz")), mode="r:gz") as tar:
            tar.extractall(root, filter="data")
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        site = os.path.join(root, f"usr/lib/python{py}/site-packages")
        daemon = DaemonProcess(home=home, argv=system_python(site)).start()
        try:
            assert daemon.call("qledge.status")["pid"] == daemon.pid
        finally:
            assert daemon.stop() == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_apk_without_apk_mkpkg_is_a_clear_message():
    if shutil.which("apk"):
        probe = subprocess.run(["apk", "mkpkg", "--help"], capture_output=True)
        if probe.returncode == 0:
            pytest.skip("apk mkpkg is installed here: the .apk path is exercised instead by a manual build")
    out = short_tmpdir()
    try:
        result = _run_build("packaging/build_openwrt.py", "--format", "apk", "--out", out)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [result.stderr.strip()]
        assert "apk mkpkg" in result.stderr and "Traceback" not in result.stderr
        assert os.listdir(out) == []
    finally:
        shutil.rmtree(out)


# -- init script and UCI -----------------------------------------------------------------


@pytest.mark.parametrize("path", [INIT, os.path.join(OPENWRT_FILES, "qledge.sh")])
def test_shell_scripts_lint_as_posix_sh(path):
    result = subprocess.run([_tool("shellcheck"), "-s", "sh", path], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_maintainer_scripts_lint_as_posix_sh(tmp_path):
    shellcheck = _tool("shellcheck")
    for name, text in (("postinst", build_openwrt.POSTINST), ("prerm", build_openwrt.PRERM)):
        (tmp_path / name).write_text(text)
        # SC1091: /lib/functions.sh exists on the device, not here.
        result = subprocess.run([shellcheck, "-s", "sh", "-e", "SC1091", str(tmp_path / name)],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_init_script_has_the_procd_essentials():
    with open(INIT) as f:
        text = f.read()
    assert text.startswith("#!/bin/sh /etc/rc.common\n")
    for needle in ("USE_PROCD=1", "procd_open_instance", "procd_set_param respawn", "procd_set_param stdout 1",
                   "procd_set_param stderr 1", "procd_set_param file /etc/config/qledge",
                   "procd_set_param limits", "procd_set_param no_new_privs 1",
                   "procd_add_reload_trigger \"$NAME\"", "procd_send_signal \"$NAME\" \"$NAME\" HUP"):
        assert needle in text, needle
    # Root, like busybox crond: only a root daemon can run an owner's root tasks and switch
    # every other task to its own user.
    assert "procd_set_param user" not in text and "procd_set_param group" not in text


def _init_shell(script: str, **env: str) -> subprocess.CompletedProcess:
    shell = shutil.which("sh")
    assert shell is not None
    return subprocess.run([shell, "-c", f'. "{INIT}"; {script}'], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="re-owning files needs root")
def test_init_script_hands_a_legacy_state_directory_to_root(tmp_path):
    import pwd

    legacy = pwd.getpwnam("nobody")
    state, run, outside = tmp_path / "state", tmp_path / "run", tmp_path / "outside"
    (state / "logs").mkdir(parents=True)
    (state / "qledge.db").write_text("")
    outside.write_text("")
    (state / "logs" / "link").symlink_to(outside)
    for path in (state, state / "logs", state / "qledge.db", state / "logs" / "link"):
        os.lchown(path, legacy.pw_uid, legacy.pw_gid)
    os.chown(outside, legacy.pw_uid, legacy.pw_gid)
    result = _init_shell(f'RUN_DIR="{run}"; LEGACY_USER=nobody; prepare_dirs "{state}"')
    assert result.returncode == 0, result.stderr
    for path in (state, state / "logs", state / "qledge.db", state / "logs" / "link", run):
        assert os.lstat(path).st_uid == 0, path
    assert os.stat(outside).st_uid == legacy.pw_uid  # a link's target is never re-owned
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700 and stat.S_IMODE(os.stat(run).st_mode) == 0o750
    other = tmp_path / "other"  # a directory of some other user is left alone (only its mode)
    other.mkdir()
    (other / "f").write_text("")
    os.chown(other / "f", legacy.pw_uid, legacy.pw_gid)
    assert _init_shell(f'RUN_DIR="{run}"; LEGACY_USER=qledge-none; prepare_dirs "{other}"').returncode == 0
    assert os.stat(other / "f").st_uid == legacy.pw_uid


def test_uci_task_users_render_as_a_toml_list(tmp_path):
    values = {"state_dir": "/srv/qledge", "log_level": "info", "concurrency": "2", "queue_limit": "32",
              "log_cap_bytes": "262144", "log_quota_bytes": "8388608", "runs_per_task": "100",
              "run_max_age_days": "30", "synchronous": "NORMAL", "mcp_enabled": "0"}
    render = f'CONF_DIR="{tmp_path}"; CONF="$CONF_DIR/qledge.toml"; render_config'
    assert _init_shell(render, **values).returncode == 0
    assert "task_users" not in (tmp_path / "qledge.toml").read_text()  # unset: the daemon's default
    result = _init_shell(render, **values, task_users='nobody backup "x')
    assert result.returncode == 0, result.stderr
    import tomllib

    with open(tmp_path / "qledge.toml", "rb") as f:
        assert tomllib.load(f)["runner"]["task_users"] == ["nobody", "backup", '"x']
    if "task_users" in config_file.RunnerConfig.__struct_fields__:  # the daemon reads it as its [runner] key
        assert _init_shell(render, **values, task_users="nobody backup").returncode == 0
        assert list(config_file.load(str(tmp_path / "qledge.toml")).runner.task_users) == ["nobody", "backup"]


def test_uci_settings_render_a_config_the_daemon_accepts(tmp_path):
    """Source the init script (as ash would) with UCI-validated values; load what it writes."""
    shell = shutil.which("sh")
    assert shell is not None
    values = {
        "state_dir": '/mnt/usb "data"', "log_level": "debug", "concurrency": "3", "queue_limit": "7",
        "log_cap_bytes": "65536", "log_quota_bytes": "2097152", "runs_per_task": "80", "run_max_age_days": "9",
        "timezone": "Europe/Berlin", "synchronous": "FULL", "mcp_enabled": "1", "exclusive_lock": "1",
    }
    script = f'. "{INIT}"; CONF_DIR="{tmp_path}"; CONF="$CONF_DIR/qledge.toml"; render_config'
    result = subprocess.run([shell, "-c", script], env={**values, "PATH": os.environ["PATH"]},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    cfg = config_file.load(str(tmp_path / "qledge.toml"))
    assert cfg.home == '/mnt/usb "data"' and cfg.socket == "/var/run/qledge/qledge.sock"
    assert cfg.log_level == "debug" and cfg.timezone == "Europe/Berlin" and cfg.store.synchronous == "FULL"
    assert (cfg.runner.concurrency, cfg.runner.queue_limit, cfg.runner.log_cap_bytes) == (3, 7, 65536)
    assert (cfg.retention.runs_per_task, cfg.retention.run_max_age_days, cfg.retention.log_quota_bytes) == (
        80, 9, 2097152)
    assert cfg.mcp.enabled is True and cfg.mcp.socket == "/var/run/qledge/mcp.sock"
    assert cfg.store.exclusive_lock is True


def test_a_system_zone_without_its_zone_data_is_not_configured(tmp_path):
    """LuCI sets a zonename whether or not its zoneinfo-* package is installed; the daemon
    refuses a configured zone it cannot load, so the init script passes on only one it can."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uci").write_text('#!/bin/sh\necho "$ZONENAME"\n')
    (fake / "uci").chmod(0o755)
    zones = tmp_path / "zoneinfo"
    (zones / "Europe").mkdir(parents=True)
    (zones / "Europe" / "Berlin").write_text("TZif")
    values = {"state_dir": "/srv/qledge", "log_level": "info", "concurrency": "2", "queue_limit": "32",
              "log_cap_bytes": "262144", "log_quota_bytes": "8388608", "runs_per_task": "100",
              "run_max_age_days": "30", "synchronous": "NORMAL", "mcp_enabled": "0"}
    render = f'CONF_DIR="{tmp_path}"; CONF="$CONF_DIR/qledge.toml"; render_config'
    for zonename, expected in (("Europe/Berlin", "Europe/Berlin"), ("Asia/Shanghai", None), ("UTC", "UTC")):
        done = subprocess.run([shutil.which("sh") or "sh", "-c", f'. "{INIT}"; {render}'], capture_output=True,
                              text=True, env={**values, "PATH": f"{fake}:{os.environ['PATH']}",
                                              "ZONENAME": zonename, "ZONEINFO_DIR": str(zones)})
        assert done.returncode == 0, done.stderr
        assert config_file.load(str(tmp_path / "qledge.toml")).timezone == expected, zonename


def test_uci_defaults_are_the_validated_defaults():
    """Every option in the shipped /etc/config/qledge has the default the init script validates with."""
    with open(os.path.join(OPENWRT_FILES, "qledge.config")) as f:
        options = dict(line.split()[1:3] for line in f if line.strip().startswith("option"))
    with open(INIT) as f:
        text = f.read()
    for name, quoted in options.items():
        value = quoted.strip("'")
        default = f"'{name}:" in text and text.split(f"'{name}:", 1)[1].split("'", 1)[0].rsplit(":", 1)
        assert default, name
        if value:
            assert default[-1] == value, (name, default, value)


# -- systemd ---------------------------------------------------------------------------


def _readme_section(title: str) -> str:
    """A section of the installation guide that has it (docs/install-*.md)."""
    name = "install-systemd.md" if "systemd" in title else "install-openwrt.md"
    with open(os.path.join(ROOT, "docs", name)) as f:
        text = f.read()
    return text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def _commands(block: str) -> list[str]:
    """Shell lines of a docs block, continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [" ".join(line.split("#", 1)[0].split()) for line in joined.splitlines() if line.split("#", 1)[0].strip()]


def _debian_python() -> str:
    """The distribution's python3 where it can make a virtualenv (as on a stock Debian
    after `apt-get install python3-venv`), else this interpreter."""
    if not os.path.exists("/usr/bin/python3"):
        return sys.executable
    check = "import ensurepip, venv, sys; sys.exit(sys.version_info < (3, 11))"
    probe = subprocess.run(["/usr/bin/python3", "-c", check], capture_output=True)
    return "/usr/bin/python3" if probe.returncode == 0 else sys.executable


@pytest.fixture(scope="module")
def systemd_root():
    """packaging/systemd/install.sh run into a scratch root (DESTDIR), beside copies of the
    host's systemd units and /bin/kill, so `systemd-analyze verify --root` checks the unit
    exactly as installed, ExecStart included."""
    root = short_tmpdir()
    try:
        result = subprocess.run(["sh", os.path.join(ROOT, "packaging/systemd/install.sh")],
                                env={**os.environ, "DESTDIR": root, "PYTHON": _debian_python()},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        for units in ("/usr/lib/systemd/system", "/lib/systemd/system"):
            if os.path.isdir(units) and not os.path.exists(root + units):
                shutil.copytree(units, root + units, symlinks=True)
        if os.path.exists("/bin/kill"):
            os.makedirs(os.path.join(root, "bin"), exist_ok=True)
            shutil.copy2("/bin/kill", os.path.join(root, "bin/kill"))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _verify(root: str) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("systemd-analyze"), "verify", f"--root={root}", "qledge.service"],
                          capture_output=True, text=True)


def test_install_sh_lays_out_the_venv_the_unit_and_the_cli(systemd_root):
    unit = os.path.join(systemd_root, "etc/systemd/system/qledge.service")
    with open(unit) as f:
        lines = {line.strip() for line in f}
    assert "ExecStart=/opt/qledge/bin/qledge serve --config %E/qledge/qledge.toml" in lines
    assert os.access(os.path.join(systemd_root, "opt/qledge/bin/qledge"), os.X_OK)
    assert os.readlink(os.path.join(systemd_root, "usr/local/bin/qledge")) == "/opt/qledge/bin/qledge"
    for path, line in (("usr/local/share/bash-completion/completions/qledge", "complete -F _qledge qledge"),
                       ("usr/local/share/fish/vendor_completions.d/qledge.fish", "complete -c qledge -f")):
        with open(os.path.join(systemd_root, path)) as f:  # where bash-completion and fish look
            assert line in f.read().splitlines()
    assert config_file.load(os.path.join(systemd_root, "etc/qledge/qledge.toml")).mcp.socket == "/run/qledge/mcp.sock"
    with open(unit) as a, open(UNIT) as b:
        assert a.read() == b.read()


def test_installed_unit_verifies(systemd_root):
    result = _verify(systemd_root)
    assert result.returncode == 0, result.stderr
    assert "qledge.service" not in result.stderr, result.stderr  # no warnings about our unit either


def test_readme_drop_ins_verify(systemd_root):
    drop_ins = _blocks(_readme_section("Install with systemd"), "ini")
    assert len(drop_ins) >= 5  # files, memory, JIT, network, other users
    directory = os.path.join(systemd_root, "etc/systemd/system/qledge.service.d")
    os.makedirs(directory, exist_ok=True)
    for i, text in enumerate(drop_ins):
        path = os.path.join(directory, f"{i}.conf")
        with open(path, "w") as f:
            f.write(text)
        try:
            result = _verify(systemd_root)
            assert result.returncode == 0 and "qledge.service" not in result.stderr, (text, result.stderr)
        finally:
            os.unlink(path)


def test_unit_security_exposure_is_low(systemd_root):
    # --threshold is in tenths: the unit as installed must score 1.0 ("SAFE") or better.
    unit = os.path.join(systemd_root, "etc/systemd/system/qledge.service")
    result = subprocess.run([_tool("systemd-analyze"), "security", "--offline=yes", "--threshold=10", unit],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_readme_systemd_install_is_followed_command_by_command(systemd_root, home):
    """Each command of the systemd guide's block, done here as far as a machine without a booted
    systemd allows; a command this test does not know fails it, so the two stay in step."""
    (block,) = _blocks(_readme_section("Install with systemd"), "sh")[:1]
    commands = _commands(block)
    assert commands == ["apt-get install -y python3-venv", "sh packaging/systemd/install.sh",
                        "systemctl daemon-reload", "systemctl enable --now qledge", "qledge status"]
    # apt-get install -y python3-venv: the interpreter install.sh used can make a virtualenv.
    assert os.path.exists(os.path.join(systemd_root, "opt/qledge/pyvenv.cfg"))
    # sh packaging/systemd/install.sh: the fixture ran it (into DESTDIR).
    # systemctl daemon-reload: the unit as installed loads cleanly.
    if shutil.which("systemd-analyze"):
        assert _verify(systemd_root).returncode == 0
    # systemctl enable --now qledge: enabled for multi-user.target, then started as the unit
    # says (ExecStart, its --config, its QLEDGE_HOME); only the sandbox is not applied here.
    with open(os.path.join(systemd_root, "etc/systemd/system/qledge.service")) as f:
        unit = f.read()
    assert "\n[Install]\nWantedBy=multi-user.target\n" in unit
    exec_start = re.search(r"^ExecStart=(\S+) serve --config %E/(\S+)$", unit, re.M)
    assert exec_start is not None
    program = systemd_root + exec_start.group(1)
    config = os.path.join(systemd_root, "etc", exec_start.group(2))
    daemon = DaemonProcess(home=home, argv=[program]).start(["--config", config])
    try:
        # qledge status: the installed CLI answers from the running daemon.
        status = subprocess.run([program, "status", "--json"], env=daemon.env, capture_output=True, text=True,
                                timeout=60)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == daemon.pid
    finally:
        assert daemon.stop() == 0


def test_unit_has_the_required_settings():
    with open(UNIT) as f:
        lines = {line.strip() for line in f}
    for setting in ("Type=notify", "NotifyAccess=main", "Restart=on-failure", "DynamicUser=yes",
                    "RuntimeDirectory=qledge", "ConfigurationDirectory=qledge",
                    "ProtectSystem=strict", "CapabilityBoundingSet=", "SystemCallFilter=@system-service",
                    "RestrictAddressFamilies=AF_UNIX", "NoNewPrivileges=yes", "ExecReload=/bin/kill -HUP $MAINPID",
                    "After=time-sync.target", "Wants=time-sync.target", "OOMPolicy=continue"):
        assert setting in lines, setting
    assert any(line.startswith("WatchdogSec=") for line in lines)
    assert any(line.startswith("MemoryMax=") for line in lines)


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and not key.startswith(("#", "[")):
            settings.setdefault(key, []).append(value)
    return settings


def test_the_unit_lets_the_daemon_make_every_directory_a_run_needs():
    """Every run first makes its task's data directory, `<state dir>-tasks/<project>/<task>`
    (edge.runner.process.DATA_BESIDE), beside the state directory: under ProtectSystem=strict
    only the unit's state directories (and ReadWritePaths=) are writable, so that directory
    must be one of them, as the unit's QLEDGE_HOME names the state directory."""
    from edge.runner.process import DATA_BESIDE

    with open(UNIT) as f:
        unit = _unit_settings(f.read())
    assert unit["ProtectSystem"] == ["strict"]
    state = "/var/lib"  # %S for a system unit
    env = dict(item.split("=", 1) for value in unit["Environment"] for item in value.split())
    home = env["QLEDGE_HOME"].replace("%S", state)
    writable = [os.path.join(state, d) for value in unit.get("StateDirectory", []) for d in value.split()]
    writable += [p for value in unit.get("ReadWritePaths", []) for p in value.split()]
    for needed in (home, home.rstrip("/") + DATA_BESIDE):
        assert any(needed == w or needed.startswith(w.rstrip("/") + "/") for w in writable), (needed, writable)
    # The root drop-in (tasks as other users): handing a task its data directory is a chown.
    (drop_in,) = [b for b in _blocks(_readme_section("Install with systemd"), "ini") if "User=root" in b]
    caps = _unit_settings(drop_in)["CapabilityBoundingSet"][-1].split()
    assert {"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN"} <= set(caps), caps


def test_install_sh_lints_as_posix_sh():
    result = subprocess.run([_tool("shellcheck"), "-s", "sh", os.path.join(ROOT, "packaging/systemd/install.sh")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# -- OpenWrt install steps -------------------------------------------------------------------

LOCAL_PACKAGES = {"python3-msgspec", "python3-apsw", "python3-cronsim", "qledge"}


def _feed_needs() -> set[str]:
    """Everything the four packages depend on that they are not themselves (libsqlite3 only
    in the system-SQLite build, which the package manager then brings in by itself)."""
    needs: set[str] = set()
    for makefile, package in (("qledge", "qledge"), ("python-msgspec", "python3-msgspec"),
                              ("python-apsw", "python3-apsw"), ("python-cronsim", "python3-cronsim")):
        needs |= _makefile_depends(os.path.join(ROOT, "openwrt", makefile, "Makefile"), package)
    return needs - LOCAL_PACKAGES - {"$(APSW_DEPENDS)"}


# Every file the two builds write, as named on the device: (package, file), opkg's
# NAME_VERSION_ARCH.ipk and apk's NAME-VERSION.apk. A command's `./pattern` must name one.
BUILT_PACKAGES = {"python3-msgspec": ("0.20.0-r1", "mipsel_24kc"), "python3-apsw": ("3.53.3.1-r1", "mipsel_24kc"),
                  "python3-cronsim": ("2.8-r1", "all"), "qledge": ("0.1.0-r1", "all"),
                  "qledge-mcp": ("0.1.0-r1", "all"), "qledge-web": ("0.1.0-r1", "all"),
                  "luci-app-qledge": ("0.1.0-r1", "all")}


def _built_files(manager: str) -> dict[str, str]:
    return {(f"{n}_{v}_{arch}.ipk" if manager == "opkg" else f"{n}-{v}.apk"): n
            for n, (v, arch) in BUILT_PACKAGES.items()}


def _named_packages(manager: str, words: list[str]) -> set[str]:
    """The packages the `./pattern` words install, each pattern matching exactly one file."""
    import fnmatch

    files = _built_files(manager)
    named = set()
    for word in words:
        matched = sorted(files[f] for f in files if fnmatch.fnmatchcase(f, word[2:]))
        assert len(matched) == 1, f"{word} installs {matched or 'nothing'}"
        named.add(matched[0])
    return named


def test_the_built_files_check_would_catch_a_pattern_that_takes_more():
    assert set(BUILT_PACKAGES) == set(build_openwrt.PACKAGES) | {"python3-msgspec", "python3-apsw"}
    with pytest.raises(AssertionError, match="qledge-mcp"):
        _named_packages("apk", ["./qledge-*.apk"])
    assert _named_packages("apk", ["./qledge-[0-9]*.apk"]) == {"qledge"}
    assert _named_packages("opkg", ["./qledge_*_all.ipk"]) == {"qledge"}


def _install_words(block: str, install: str) -> list[str]:
    return [w for c in _commands(block) if c.startswith(install) for w in c[len(install):].split()
            if not w.startswith("-")]


@pytest.mark.parametrize("manager, update, install", [
    ("opkg", "opkg update", "opkg install"), ("apk", "apk update", "apk add")])
def test_openwrt_install_steps_list_every_package(manager, update, install):
    section = _readme_section("Install on OpenWrt")
    block = next(b for b in _blocks(section, "sh") if b.startswith(update))
    commands = _commands(block)
    assert commands[0] == update  # the lists first
    words = _install_words(block, install)
    feed = {w for w in words if not w.startswith("./")}
    assert _named_packages(manager, [w for w in words if w.startswith("./")]) == LOCAL_PACKAGES
    assert feed == _feed_needs(), feed ^ _feed_needs()
    assert commands[-1] == "qledge status"
    # The web panel's packages, each by its own name too.
    web = next(b for b in _blocks(section, "sh") if b.startswith(f"{install} ") and "qledge-web" in b)
    assert _named_packages(manager, _install_words(web, install)) == {"qledge-web", "luci-app-qledge"}


# -- CLI socket discovery --------------------------------------------------------------


def test_cli_falls_back_to_the_system_socket(tmp_path, monkeypatch):
    for name in ("QLEDGE_SOCKET", "QLEDGE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    run = tmp_path / "run"
    system = run / "qledge.sock"
    user = tmp_path / "state" / "qledge" / "qledge.sock"
    assert client_socket(None, None, str(run)) == str(user)  # neither exists: the per-user path
    run.mkdir()
    system.touch()
    assert client_socket(None, None, str(run)) == str(system)
    assert home_socket("mcp.sock", None, str(run)) == str(tmp_path / "state" / "qledge" / "mcp.sock")
    (run / "mcp.sock").touch()
    assert home_socket("mcp.sock", None, str(run)) == str(run / "mcp.sock")  # `qledge mcp` finds it too
    user.parent.mkdir(parents=True)
    user.touch()
    assert client_socket(None, None, str(run)) == str(user)  # a per-user daemon wins
    assert client_socket("/x.sock", None, str(run)) == "/x.sock"
    assert client_socket(None, "/h", str(run)) == "/h/qledge.sock"
    monkeypatch.setenv("QLEDGE_SOCKET", "/env.sock")
    assert client_socket(None, "/h", str(run)) == "/env.sock"


# -- OpenWrt dependencies ----------------------------------------------------------------

# Parts of the standard library that OpenWrt's python3 package splits out of python3-light.
OPENWRT_SPLIT = {
    "asyncio": "python3-asyncio", "logging": "python3-logging", "uuid": "python3-uuid",
    "decimal": "python3-decimal", "urllib": "python3-urllib", "email": "python3-email",
    "ctypes": "python3-ctypes", "sqlite3": "python3-sqlite3", "xml": "python3-xml",
    "multiprocessing": "python3-multiprocessing", "unittest": "python3-unittest", "lzma": "python3-lzma",
    "dbm": "python3-dbm", "curses": "python3-ncurses", "readline": "python3-readline",
    "ssl": "python3-openssl", "_hashlib": "python3-openssl", "pydoc": "python3-pydoc", "venv": "python3-venv",
    "cgi": "python3-cgi", "cgitb": "python3-cgi", "webbrowser": "python3-webbrowser",
    "distutils": "python3-distutils", "lib2to3": "python3-lib2to3",
}
THIRD_PARTY = {"msgspec": "python3-msgspec", "apsw": "python3-apsw", "cronsim": "python3-cronsim"}
# uvloop: used only when installed and chosen; ctypes: `qledge doctor` asks the kernel whether
# its clock is synchronised with it, and says it cannot tell without it.
OPTIONAL_IMPORTS = {"uvloop", "ctypes"}


def _imports(path: str) -> set[str]:
    import ast

    with open(path) as f:
        tree = ast.parse(f.read())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _makefile_depends(path: str, package: str) -> set[str]:
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    block = text.split(f"define Package/{package}\n", 1)[1].split("endef", 1)[0]
    line = next(line for line in block.splitlines() if "DEPENDS:=" in line and "EXTRA" not in line)
    return {d.lstrip("+").split(":")[-1] for d in line.split(":=", 1)[1].split()}


# The notification sender loads these only for the channels that need them: https
# (python3-openssl) and mail (smtplib and email: python3-email); the OpenWrt guide names them.
SENDER_OPTIONAL = {"ssl", "smtplib", "email"}


def test_openwrt_depends_cover_every_import_of_the_package():
    needed: set[str] = set()
    for _, rel in build_openwrt.qledge_sources("qledge"):
        optional = OPTIONAL_IMPORTS | (SENDER_OPTIONAL if rel == "edge/notify/send.py" else set())
        for name in _imports(os.path.join(ROOT, rel)) - {"edge", "__future__"} - optional:
            if name in OPENWRT_SPLIT:
                needed.add(OPENWRT_SPLIT[name])
            else:
                assert name in sys.stdlib_module_names or name in THIRD_PARTY, f"{rel} imports {name}"
                needed.add(THIRD_PARTY.get(name, "python3-light"))
    assert "python3-openssl" not in needed  # the daemon blocks ssl/_hashlib; shipping them costs MiBs
    # qledge-web (it depends on qledge) needs nothing qledge does not bring; ssl only for its own TLS.
    for _, rel in build_openwrt.qledge_sources("qledge-web"):
        for name in _imports(os.path.join(ROOT, rel)) - {"edge", "__future__", "ssl"}:
            assert name not in OPENWRT_SPLIT or OPENWRT_SPLIT[name] in needed, f"{rel} imports {name}"
            assert name in sys.stdlib_module_names or name in THIRD_PARTY, f"{rel} imports {name}"
    makefile = _makefile_depends(os.path.join(ROOT, "openwrt", "qledge", "Makefile"), "qledge")
    assert needed <= makefile, needed - makefile
    ipk = {d.split(" (")[0] for d in build_openwrt.DEPENDS}
    assert ipk == makefile, ipk ^ makefile
    # msgspec's C core imports these at load time (checked on the installed module below).
    msgspec_deps = _makefile_depends(os.path.join(ROOT, "openwrt", "python-msgspec", "Makefile"), "python3-msgspec")
    assert {"python3-uuid", "python3-decimal"} <= msgspec_deps


def test_msgspec_imports_what_its_openwrt_package_depends_on():
    code = (f"import sys; sys.path += {SITE!r}; import msgspec; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    found = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    loaded = set(found.stdout.split())
    assert "msgspec" in loaded
    split = {OPENWRT_SPLIT[m] for m in loaded if m in OPENWRT_SPLIT}
    msgspec_deps = _makefile_depends(os.path.join(ROOT, "openwrt", "python-msgspec", "Makefile"), "python3-msgspec")
    assert split == msgspec_deps - {"python3-light"}, split


def test_shipped_systemd_config_is_accepted():
    cfg = config_file.load(os.path.join(ROOT, "packaging", "systemd", "qledge.toml"))
    assert cfg.mcp.socket == "/run/qledge/mcp.sock"  # beside the tool socket, where the CLI looks


# -- apk (OpenWrt 25.12+) ------------------------------------------------------------------
# No apk-tools 3 here (Debian has none, nor PyPI/npm): the tree, scripts and `apk mkpkg`
# arguments are checked against apk-package(5), apk-tools' dependency parser and OpenWrt's
# include/package-pack.mk.

# apk-package(5): number{.number}...{letter}{_suffix{number}}...{~hash}{-r#}
APK_VERSION = re.compile(
    r"[0-9]+(\.[0-9]+)*[a-z]?(_(alpha|beta|pre|rc|cvs|svn|git|hg|p)[0-9]*)*(~[0-9a-f]+)?(-r[0-9]+)?")
APK_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._+-]*")
# The operators apk_version_op_string() prints: what a dependency can say and mean.
APK_OPS = ("<", "<=", "<~", "~", "=", ">=", ">~", ">", "><")
APK_INFO_FIELDS = {"name", "version", "description", "arch", "license", "origin", "maintainer", "url", "depends",
                   "provides", "replaces", "install-if", "provider-priority", "tags"}
APK_SCRIPT_TYPES = {"trigger", "pre-install", "post-install", "pre-deinstall", "post-deinstall", "pre-upgrade",
                    "post-upgrade"}


def apk_dependency_ok(dep: str) -> bool:
    """[!]name[op version], as apk_dep_parse() reads it, with an operator apk prints back."""
    m = re.fullmatch(r"(!?)([^<>=~]+)(?:([<>=~]+)(.+))?", dep)
    if m is None or not APK_NAME.fullmatch(m.group(2)):
        return False
    op, ver = m.group(3), m.group(4)
    return op is None or (op in APK_OPS and APK_VERSION.fullmatch(ver) is not None)


def test_the_apk_dependency_check_refuses_what_apk_refuses():
    for good in ("python3-light~3.11", "python3-light>=3.11", "libsqlite3-0>=3.53.0", "zoneinfo-core", "!foo"):
        assert apk_dependency_ok(good), good
    for bad in ("python3-light<<3.12", "python3-light (>= 3.11)", "python3-light>=", "python3-light=>3.1"):
        assert not apk_dependency_ok(bad), bad


@pytest.fixture(scope="module")
def apk_stage():
    tmp = short_tmpdir()
    tree, scripts = build_openwrt.stage_apk(tmp)
    yield tree, scripts, build_openwrt.mkpkg_argv("apk", tree, scripts, os.path.join(tmp, "out.apk"))
    shutil.rmtree(tmp, ignore_errors=True)


def _mkpkg_info(argv: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    info, scripts = {}, {}
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--info":
            key, _, val = value.partition(":")
            info[key] = val
        elif flag == "--script":
            kind, _, path = value.partition(":")
            scripts[kind] = path
    return info, scripts


def test_apk_mkpkg_metadata_is_what_apk_accepts(apk_stage):
    tree, scripts, argv = apk_stage
    assert argv[1] == "mkpkg" and argv[argv.index("--files") + 1] == tree
    info, given = _mkpkg_info(argv)
    assert set(info) <= APK_INFO_FIELDS, set(info) - APK_INFO_FIELDS
    assert APK_NAME.fullmatch(info["name"]) and info["name"] == "qledge"
    assert APK_VERSION.fullmatch(info["version"]) and info["version"] == f"{edge.__version__}-r1"
    assert info["arch"] == "noarch" and "\n" not in info["description"]
    deps = info["depends"].split()
    assert deps and all(apk_dependency_ok(d) for d in deps), deps
    names = [re.split(r"[<>=~]", d)[0] for d in deps]
    assert len(names) == len(set(names))  # apk keeps one constraint per name: a second would replace the first
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"python3-light~{py}" in deps  # any 3.N.x: the bytecode's minor version
    assert set(names) == {d.split(" (")[0] for d in build_openwrt.DEPENDS}  # the same packages as the .ipk
    assert set(given) <= APK_SCRIPT_TYPES and given == scripts


def test_apk_tree_has_openwrts_package_database_files(apk_stage):
    tree, _, _ = apk_stage
    db = os.path.join(tree, "lib/apk/packages")
    files = sorted("/" + os.path.relpath(os.path.join(d, f), tree) for d, _, fs in os.walk(tree) for f in fs)
    meta = {f"/lib/apk/packages/qledge{ext}" for ext in (".list", ".conffiles", ".conffiles_static")}
    assert meta <= set(files)
    with open(os.path.join(db, "qledge.list")) as f:
        listed = f.read().splitlines()
    assert listed == sorted(set(files) - meta)  # every file, as package-pack.mk lists them
    # default_postinst enables and starts what the list names under /etc/init.d/; sysupgrade keeps keep.d
    assert "/etc/init.d/qledge" in listed and "/lib/upgrade/keep.d/qledge" in listed and "/usr/bin/qledge" in listed
    with open(os.path.join(db, "qledge.conffiles")) as f:
        assert f.read() == "/etc/config/qledge\n"
    with open(os.path.join(db, "qledge.conffiles_static")) as f:
        path, digest = f.read().split()
    with open(os.path.join(tree, "etc/config/qledge"), "rb") as f:
        assert (path, digest) == ("/etc/config/qledge", hashlib.sha256(f.read()).hexdigest())
    assert not os.path.exists(os.path.join(db, "qledge.rusers"))  # no account to create: the daemon is root's
    assert stat.S_IMODE(os.stat(os.path.join(tree, "etc/init.d/qledge")).st_mode) == 0o755


def test_apk_scripts_are_package_pack_mk_s(apk_stage):
    _, scripts, _ = apk_stage
    texts = {}
    for kind, path in scripts.items():
        assert os.stat(path).st_mode & 0o111
        with open(path) as f:
            texts[kind] = f.read()
    install = texts["post-install"].splitlines()
    assert install[0] == "#!/bin/sh" and install[-3:] == ['export pkgname="qledge"', "add_group_and_user",
                                                          "default_postinst"]
    assert texts["post-upgrade"].splitlines() == ["#!/bin/sh", "export PKG_UPGRADE=1", *install[1:]]
    assert texts["pre-deinstall"].splitlines()[-2:] == ['export pkgname="qledge"', "default_prerm"]
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        for path in scripts.values():
            result = subprocess.run([shellcheck, "-s", "sh", "-e", "SC1091,SC2086", path], capture_output=True,
                                    text=True)
            assert result.returncode == 0, result.stdout


# -- python3-apsw: system SQLite or the bundled amalgamation --------------------------------

STUB_PACKAGE_MK = r"""
HOST_TAR:=tar
define Download
$$(eval $$(Download/$(1)))
$$(info download $(1) $$(FILE) $$(URL) $$(HASH))
endef
define BuildPackage
$$(eval $$(Package/$(1)))
$$(info package $(1) depends=$$(strip $$(DEPENDS)) extra=$$(EXTRA_DEPENDS))
$$(file >$(TOPDIR)/prepare.txt,$$(Build/Prepare))
$$(file >$(TOPDIR)/configure.txt,$$(Build/Configure))
endef
Build/Prepare/Default:=prepare-default
all:
	@:
"""


def _apsw_makefile(tmp_path, feed_version: str | None, *make_args: str) -> tuple[str, str, str]:
    make = _tool("make")
    top = tmp_path / "top"
    for rel in ("include", "feeds/packages/lang/python", "feeds/packages/libs/sqlite3"):
        (top / rel).mkdir(parents=True, exist_ok=True)
    (top / "rules.mk").write_text("INCLUDE_DIR:=$(TOPDIR)/include\nDL_DIR:=$(TOPDIR)/dl\n")
    (top / "include" / "package.mk").write_text(STUB_PACKAGE_MK)
    (top / "feeds/packages/lang/python/pypi.mk").write_text("")
    (top / "feeds/packages/lang/python/python3-package.mk").write_text("define Py3Package\nendef\n")
    feed = top / "feeds/packages/libs/sqlite3/Makefile"
    if feed_version is None:
        feed.unlink(missing_ok=True)
    else:
        feed.write_text(f"PKG_NAME:=sqlite\nPKG_SRC_VERSION:={feed_version}\n")
    result = subprocess.run([make, "-s", "-f", os.path.join(ROOT, "openwrt/python-apsw/Makefile"), f"TOPDIR={top}",
                             *make_args], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout, (top / "prepare.txt").read_text(), (top / "configure.txt").read_text()


def test_apsw_links_the_feeds_sqlite_when_it_is_new_enough(tmp_path):
    out, prepare, configure = _apsw_makefile(tmp_path, "3530000")
    assert "download" not in out  # nothing else is fetched
    assert "package python3-apsw depends=+python3-light +libsqlite3 extra=libsqlite3 (>=3.53.0)" in out
    assert "sqlite3.c" not in prepare and "fetch = False" in prepare
    assert "SQLITE_VERSION_NUMBER" in configure  # the staged header is checked too


@pytest.mark.parametrize("feed", ["3510100", None])
def test_apsw_builds_in_a_hashed_amalgamation_when_the_feeds_sqlite_is_older(tmp_path, feed):
    out, prepare, _ = _apsw_makefile(tmp_path, feed)
    hash_line = next(line for line in out.splitlines() if line.startswith("download "))
    name, file, url, digest = hash_line.split()[1:]
    assert (file, url) == ("sqlite-autoconf-3530300.tar.gz", "https://sqlite.org/2026/")
    assert re.fullmatch(r"[0-9a-f]{64}", digest)  # checked by the build like PKG_HASH
    assert "package python3-apsw depends=+python3-light extra=" in out  # statically in: no libsqlite3
    assert f"-xzf {tmp_path}/top/dl/sqlite-autoconf-3530300.tar.gz" in prepare
    assert "sqlite-autoconf-3530300/sqlite3.c" in prepare and "/sqlite3 --strip-components=1" in prepare
    forced, _, _ = _apsw_makefile(tmp_path, feed, "APSW_SQLITE=system")
    assert "+libsqlite3" in forced and "download" not in forced


# -- openwrt/sdk-build.sh, against a stand-in SDK ----------------------------------------------

FAKE_MAKE = """#!/bin/sh
echo "make $*" >> "$SDK_LOG"
case "$1" in
  package/*/compile)
    p=${1#package/}; p=${p%/compile}
    mkdir -p bin/packages/mipsel_24kc/qledge
    case "$p" in
      python-*) n=python3-${p#python-}_1.0-r1_mipsel_24kc ;;
      *) n=${p}_1.0-r1_all ;;
    esac
    touch "bin/packages/mipsel_24kc/qledge/$n.ipk"
    if [ "$p" = qledge ]; then
      touch bin/packages/mipsel_24kc/qledge/qledge-mcp_1.0-r1_all.ipk \\
        bin/packages/mipsel_24kc/qledge/qledge-web_1.0-r1_all.ipk
    fi
    ;;
esac
exit 0
"""
FAKE_FEEDS = """#!/bin/sh
echo "feeds $*" >> "$SDK_LOG"
"""


def _fake_sdk(tmp_path, setuptools="80.9.0", scm="8.3.1", sqlite="3510100"):
    sdk = tmp_path / "sdk"
    for rel in ("include", "scripts", "feeds/packages/lang/python/python-setuptools",
                "feeds/packages/lang/python/python-setuptools-scm", "feeds/packages/libs/sqlite3", "feeds/luci",
                "bin"):
        (sdk / rel).mkdir(parents=True, exist_ok=True)
    (sdk / "feeds/luci/luci.mk").write_text("")
    (sdk / "rules.mk").write_text("")
    (sdk / "include/package.mk").write_text("")
    (sdk / "feeds.conf.default").write_text("src-git packages https://example.invalid/packages.git\n")
    (sdk / "scripts/feeds").write_text(FAKE_FEEDS)
    (sdk / "scripts/feeds").chmod(0o755)
    py = sdk / "feeds/packages/lang/python"
    (py / "python-setuptools/Makefile").write_text(f"PKG_NAME:=setuptools\nPKG_VERSION:={setuptools}\n")
    (py / "python-setuptools-scm/Makefile").write_text(f"PKG_NAME:=setuptools-scm\nPKG_VERSION:={scm}\n")
    (sdk / "feeds/packages/libs/sqlite3/Makefile").write_text(f"PKG_SRC_VERSION:={sqlite}\n")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "make").write_text(FAKE_MAKE)
    (tools / "make").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "SDK_LOG": str(tmp_path / "log")}
    return sdk, env


def _sdk_build(sdk, env, *args):
    return subprocess.run(["bash", os.path.join(ROOT, "openwrt", "sdk-build.sh"), str(sdk), *args],
                          capture_output=True, text=True, env=env, timeout=60, cwd=sdk.parent)


def test_sdk_build_does_the_whole_route_and_prints_the_install_command(tmp_path):
    sdk, env = _fake_sdk(tmp_path)
    out = tmp_path / "out"
    done = _sdk_build(sdk, env, "--out", str(out))
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log").read_text().splitlines()
    packages = ["python-msgspec", "python-apsw", "python-cronsim", "qledge", "luci-app-qledge"]
    assert log[:2] == ["feeds update -a", "feeds install -a -p qledge"]
    assert log[2] == "make defconfig"
    assert log[3:8] == [f"make package/{p}/check APSW_SQLITE=bundled V=s" for p in packages]
    assert [line.split(" -j")[0] for line in log[8:]] == [f"make package/{p}/compile APSW_SQLITE=bundled"
                                                         for p in packages]
    assert f"src-link qledge {ROOT}/openwrt" in (sdk / "feeds.conf").read_text()
    assert "compiles in its pinned SQLite amalgamation" in done.stdout
    assert sorted(os.listdir(out)) == sorted([
        "python3-msgspec_1.0-r1_mipsel_24kc.ipk", "python3-apsw_1.0-r1_mipsel_24kc.ipk",
        "python3-cronsim_1.0-r1_mipsel_24kc.ipk", "qledge_1.0-r1_all.ipk", "qledge-mcp_1.0-r1_all.ipk",
        "qledge-web_1.0-r1_all.ipk", "luci-app-qledge_1.0-r1_all.ipk"])
    lines = done.stdout.splitlines()
    feed = next(line for line in lines if line.strip().startswith("opkg update && opkg install")).split()[5:]
    assert set(feed) == _feed_needs()
    local, web = [line.split()[2:] for line in lines if line.strip().startswith("opkg install ./")]
    assert local == ["./python3-msgspec_1.0-r1_mipsel_24kc.ipk", "./python3-apsw_1.0-r1_mipsel_24kc.ipk",
                     "./python3-cronsim_1.0-r1_mipsel_24kc.ipk", "./qledge_1.0-r1_all.ipk"]
    assert web == ["./qledge-web_1.0-r1_all.ipk", "./luci-app-qledge_1.0-r1_all.ipk"]
    assert "CONFIG_PACKAGE_qledge-web=m\nCONFIG_PACKAGE_luci-app-qledge=m\n" in (sdk / ".config").read_text()
    again = _sdk_build(sdk, env, "--out", str(out))  # a second run adds no second feed line
    assert again.returncode == 0 and (sdk / "feeds.conf").read_text().count("src-link qledge") == 1


def test_sdk_build_links_a_new_enough_feed_sqlite(tmp_path):
    sdk, env = _fake_sdk(tmp_path, sqlite="3530000")
    done = _sdk_build(sdk, env, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "links the feed's libsqlite3 (3530000" in done.stdout
    assert "APSW_SQLITE=system" in (tmp_path / "log").read_text()


@pytest.mark.parametrize("setuptools, scm, missing", [("69.0.3", "8.3.1", "setuptools >= 80"),
                                                      ("80.9.0", "7.1.0", "setuptools-scm >= 8")])
def test_sdk_build_refuses_a_feed_too_old_for_msgspec_before_compiling(tmp_path, setuptools, scm, missing):
    sdk, env = _fake_sdk(tmp_path, setuptools=setuptools, scm=scm)
    done = _sdk_build(sdk, env)
    assert done.returncode == 1
    assert f"python3-msgspec needs host {missing}" in done.stderr and "update the packages feed" in done.stderr
    assert "compile" not in (tmp_path / "log").read_text()


def test_sdk_build_refuses_an_sdk_without_the_luci_feed_before_compiling(tmp_path):
    sdk, env = _fake_sdk(tmp_path)
    (sdk / "feeds/luci/luci.mk").unlink()
    done = _sdk_build(sdk, env)
    assert done.returncode == 1 and "add the luci feed to feeds.conf" in done.stderr
    assert "compile" not in (tmp_path / "log").read_text()


def test_sdk_build_says_what_an_sdk_dir_lacks(tmp_path):
    done = subprocess.run(["bash", os.path.join(ROOT, "openwrt", "sdk-build.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("sdk-build: ") and "unpacked OpenWrt SDK" in done.stderr
