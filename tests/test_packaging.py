"""Artifacts: profile zipapps, the OpenWrt package, the systemd unit and the init script."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import shutil
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
    for profile in ("edge", "full"):
        result = _run_build("packaging/build.py", "--profile", profile, "--out", out)
        assert result.returncode == 0, result.stderr
    yield out
    shutil.rmtree(out, ignore_errors=True)


# -- profile zipapps -------------------------------------------------------------------


def test_profiles_ship_only_their_capabilities(tmp_path):
    agent = ["edge/agent/__main__.py", "edge/app/agent.py", "edge/core/agent.py", "edge/storage/sqlite/evidence.py",
             "edge/tools/agent.py"]
    for rel in ("edge/__init__.py", "edge/app/daemon.py", "edge/mcp/server.py", "edge/storage/sqlite/db.py",
                "edge/app/__pycache__/x.pyc", *agent):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    base = ["edge/__init__.py", "edge/app/daemon.py", "edge/storage/sqlite/db.py"]
    assert build.profile_files("edge", str(tmp_path)) == base
    assert build.profile_files("edge-mcp", str(tmp_path)) == sorted([*base, "edge/mcp/server.py"])
    assert build.profile_files("full", str(tmp_path)) == sorted([*base, "edge/mcp/server.py", *agent])
    assert build.module_name("edge/__init__.py") == "edge"
    assert build.module_name("edge/app/daemon.py") == "edge.app.daemon"


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


def test_mcp_enabled_in_a_build_without_it_is_one_clear_line(pyz_dir, home):
    pyz = os.path.join(pyz_dir, "qledge-edge.pyz")
    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write("[mcp]\nenabled = true\n")
    result = subprocess.run([*system_python(pyz), "serve", "--config", config],
                            env={**os.environ, "QLEDGE_HOME": home}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["qledge: MCP is not included in this build"]


# -- OpenWrt package -------------------------------------------------------------------


def _members(blob: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(blob: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return tar.extractfile(name).read()


@pytest.fixture(scope="module")
def ipk():
    out = short_tmpdir()
    result = _run_build("packaging/build_openwrt.py", "--format", "ipk", "--out", out)
    assert result.returncode == 0, result.stderr
    (name,) = os.listdir(out)
    with open(os.path.join(out, name), "rb") as f:
        blob = f.read()
    yield name, blob
    shutil.rmtree(out, ignore_errors=True)


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
    assert fields["Architecture"] == "all" and fields["Require-User"] == "qledge:qledge"
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
                   "procd_set_param stderr 1", "procd_set_param user", "procd_set_param file /etc/config/qledge",
                   "procd_set_param limits", "procd_set_param no_new_privs 1",
                   "procd_add_reload_trigger \"$NAME\"", "procd_send_signal \"$NAME\" \"$NAME\" HUP"):
        assert needle in text, needle


def test_uci_settings_render_a_config_the_daemon_accepts(tmp_path):
    """Source the init script (as ash would) with UCI-validated values; load what it writes."""
    shell = shutil.which("sh")
    assert shell is not None
    values = {
        "state_dir": '/mnt/usb "data"', "log_level": "debug", "concurrency": "3", "queue_limit": "7",
        "log_cap_bytes": "65536", "log_quota_bytes": "2097152", "runs_per_task": "80", "run_max_age_days": "9",
        "timezone": "Europe/Berlin", "synchronous": "FULL", "mcp_enabled": "1",
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


@pytest.fixture
def unit_for_check(tmp_path):
    """The unit with ExecStart pointing at this environment's real qledge."""
    qledge = shutil.which("qledge", path=os.path.dirname(sys.executable)) or shutil.which("qledge")
    assert qledge, "the qledge console script is installed with the package"
    with open(UNIT) as f:
        text = f.read()
    assert "ExecStart=/usr/bin/qledge " in text
    path = tmp_path / "qledge.service"
    path.write_text(text.replace("ExecStart=/usr/bin/qledge ", f"ExecStart={qledge} "))
    return str(path)


def test_unit_verifies(unit_for_check):
    result = subprocess.run([_tool("systemd-analyze"), "verify", unit_for_check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "qledge.service" not in result.stderr, result.stderr  # no warnings about our unit either


def test_unit_security_exposure_is_low(unit_for_check):
    # --threshold is in tenths: the unit must score 1.0 ("SAFE") or better.
    result = subprocess.run([_tool("systemd-analyze"), "security", "--offline=yes", "--threshold=10",
                             unit_for_check], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_unit_has_the_required_settings():
    with open(UNIT) as f:
        lines = {line.strip() for line in f}
    for setting in ("Type=notify", "NotifyAccess=main", "Restart=on-failure", "DynamicUser=yes",
                    "StateDirectory=qledge", "RuntimeDirectory=qledge", "ConfigurationDirectory=qledge",
                    "ProtectSystem=strict", "CapabilityBoundingSet=", "SystemCallFilter=@system-service",
                    "RestrictAddressFamilies=AF_UNIX", "NoNewPrivileges=yes", "ExecReload=/bin/kill -HUP $MAINPID"):
        assert setting in lines, setting
    assert any(line.startswith("WatchdogSec=") for line in lines)
    assert any(line.startswith("MemoryMax=") for line in lines)


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
OPTIONAL_IMPORTS = {"uvloop"}  # used only when installed and chosen


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


def test_openwrt_depends_cover_every_import_of_the_edge_profile():
    needed: set[str] = set()
    for rel in build.profile_files("edge"):
        for name in _imports(os.path.join(ROOT, rel)) - {"edge", "__future__"} - OPTIONAL_IMPORTS:
            if name in OPENWRT_SPLIT:
                needed.add(OPENWRT_SPLIT[name])
            else:
                assert name in sys.stdlib_module_names or name in THIRD_PARTY, f"{rel} imports {name}"
                needed.add(THIRD_PARTY.get(name, "python3-light"))
    assert "python3-openssl" not in needed  # the daemon blocks ssl/_hashlib; shipping them costs MiBs
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
