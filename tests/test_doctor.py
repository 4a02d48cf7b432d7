"""`qledge doctor` against real daemons in test homes: a healthy home passes, and each fault
seeded into one is found, with its fix and the error table's exit code."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

from support import IS_ROOT, DaemonProcess

RESERVE_HUGE = 1 << 60  # more free space than any disk has: the reserve cannot be met


def doctor(d: DaemonProcess, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge", "doctor", *args], env={**d.env, **(env or {})},
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def by_name(done: subprocess.CompletedProcess) -> dict[str, dict]:
    report = json.loads(done.stdout)
    return {c["name"]: c for c in report["checks"]}


def failed(done: subprocess.CompletedProcess) -> set[str]:
    return {name for name, c in by_name(done).items() if c["status"] == "fail"}


@pytest.fixture
def running():
    d = DaemonProcess().start()
    yield d
    d.cleanup()


def test_a_healthy_home_passes(running):
    done = doctor(running)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("0 failed, ")
    assert any(line.startswith("ok    daemon ") and f"at {running.socket}" in line for line in lines)
    assert any(line.startswith("ok    state directory ") for line in lines)
    for name in ("clock", "time zone", "free space", "ballast", "flash writes", "capability mcp",
                 "capability agent", "capability notify", "capability cluster", "capability web", "service",
                 "python", "sqlite"):
        assert any(line[6:].startswith(name + " ") for line in lines), name
    as_json = doctor(running, "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["ok"] is True
    assert not failed(as_json)
    assert by_name(as_json)["ballast"]["status"] == "ok"


def test_a_daemon_that_is_not_running_is_found_and_exits_3(home):
    d = DaemonProcess(home=home)  # never started
    done = doctor(d, "--json")
    assert done.returncode == 3
    check = by_name(done)["daemon"]
    assert check["status"] == "fail" and "not running" in check["detail"] and "qledge serve" in check["fix"]


def test_a_state_directory_others_may_write_is_found(running):
    os.chmod(running.home, 0o777)
    try:
        done = doctor(running, "--json")
    finally:
        os.chmod(running.home, 0o700)
    assert done.returncode == 2, done.stdout
    assert failed(done) == {"state directory"}
    check = by_name(done)["state directory"]
    assert "mode 0777" in check["detail"] and check["fix"] == f"chmod go-w {os.path.realpath(running.home)}"


def test_a_state_file_others_may_write_is_found(running):
    db = os.path.join(running.home, "qledge.db")
    os.chmod(db, 0o666)
    done = doctor(running, "--json")
    assert done.returncode == 2 and failed(done) == {"state directory"}
    assert by_name(done)["state directory"]["fix"] == f"chmod go-w {os.path.realpath(db)}"


@pytest.mark.skipif(not IS_ROOT, reason="handing the home to another user needs root")
def test_a_state_directory_owned_by_another_user_is_found(running):
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(running.home, nobody, -1)
    try:
        done = doctor(running, "--json")
    finally:
        os.chown(running.home, 0, -1)
    assert done.returncode == 2 and failed(done) == {"state directory"}
    check = by_name(done)["state directory"]
    assert f"owned by uid {nobody}" in check["detail"] and check["fix"].startswith("chown 0 ")


def test_missing_time_zone_data_is_found(running, tmp_path):
    empty = tmp_path / "zoneinfo"
    empty.mkdir()
    done = doctor(running, "--json", env={"TZDIR": str(empty)})
    assert done.returncode == 2 and failed(done) == {"time zone"}
    check = by_name(done)["time zone"]
    assert str(empty) in check["detail"] and "zoneinfo-core" in check["fix"] and "tzdata" in check["fix"]


def test_a_tz_the_system_does_not_know_is_one_failed_check(running):
    done = doctor(running, "--json", env={"TZ": "Nowhere/City"})
    assert done.returncode == 2 and failed(done) == {"time zone"}, done.stdout + done.stderr
    check = by_name(done)["time zone"]
    assert "TZ='Nowhere/City' is not a time zone this system knows" in check["detail"] and "unset TZ" in check["fix"]


def test_a_capability_configured_but_not_importable_is_found(running, tmp_path):
    # psycopg that cannot load its libpq raises ImportError on import, as a broken install does.
    shadow = tmp_path / "shadow" / "psycopg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("no pq wrapper available.")\n')
    config = tmp_path / "qledge.toml"
    config.write_text(f'home = "{running.home}"\n[cluster]\ndsn = "postgresql://127.0.0.1:9/qledge"\n')
    done = doctor(running, "--json", "--config", str(config), env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert failed(done) == {"capability cluster"}
    check = by_name(done)["capability cluster"]
    assert "no pq wrapper available" in check["detail"] and "qledge[cluster]" in check["fix"]
    assert by_name(done)["daemon"]["status"] == "ok"  # the socket came from the same file
    # Without the shadow the same configuration imports: the check is of the import, not the file.
    assert "capability cluster" not in failed(doctor(running, "--json", "--config", str(config)))


def test_free_space_below_the_reserve_is_found(tmp_path):
    d = DaemonProcess(config=f"[runner]\ndisk_reserve_bytes = {RESERVE_HUGE}\n").start()
    try:
        done = doctor(d, "--json", "--config", d.config_path or "")
        assert done.returncode == 1, done.stdout + done.stderr
        assert failed(done) == {"free space"}
        check = by_name(done)["free space"]
        assert "below the reserve" in check["detail"] and "disk_reserve_bytes" in check["fix"]
        human = doctor(d, "--config", d.config_path or "")
        line = next(x for x in human.stdout.splitlines() if x.startswith("fail  free space"))
        assert "; fix: free some space" in line
    finally:
        d.cleanup()


def test_a_bad_configuration_file_is_found(running, tmp_path):
    config = tmp_path / "qledge.toml"
    config.write_text("[runner]\nconcurrency = 0\n")
    done = doctor(running, "--json", "--config", str(config))
    assert done.returncode == 2
    assert "configuration" in failed(done) and "runner.concurrency" in by_name(done)["configuration"]["detail"]


def test_beside_the_service_its_configuration_is_the_one_checked(running, tmp_path, monkeypatch):
    """With no --home, --socket or --config, the CLI reaches the service's socket in the
    system run directory by itself; doctor then reads the service's configuration file."""
    import argparse

    import edge
    from edge.cli import doctor as doctor_cli

    service_config = tmp_path / "qledge.toml"
    service_config.write_text(f"[runner]\ndisk_reserve_bytes = {RESERVE_HUGE}\n")
    for name in ("QLEDGE_HOME", "QLEDGE_SOCKET", "QLEDGE_CONFIG", "QLEDGE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "no-user-daemon"))
    monkeypatch.setattr(edge, "SYSTEM_RUN_DIR", running.home)  # the service's run directory, here
    monkeypatch.setattr(doctor_cli, "SERVICE_CONFIGS", (str(tmp_path / "absent.toml"), str(service_config)))
    found = {c.name: c for c in doctor_cli.checks(argparse.Namespace(json=True))}
    assert found["configuration"].status == "ok" and found["configuration"].detail == str(service_config)
    assert found["daemon"].status == "ok" and running.socket in found["daemon"].detail
    assert found["free space"].status == "fail"  # the service's reserve, not the default one
