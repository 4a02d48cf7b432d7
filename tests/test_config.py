"""Configuration: defaults without a file, one clear line for every mistake."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edge.app import config
from edge.app.config import Config, ConfigError, load


def _serve(home: str, config_text: str) -> subprocess.CompletedProcess:
    path = os.path.join(home, "c.toml")
    with open(path, "w") as f:
        f.write(config_text)
    env = {**os.environ, "QLEDGE_HOME": home}
    return subprocess.run([sys.executable, "-m", "edge", "serve", "--config", path],
                          env=env, capture_output=True, text=True, timeout=30)


def test_no_file_means_defaults():
    cfg = load(None)
    assert cfg == Config()
    assert (cfg.runner.concurrency, cfg.runner.queue_limit, cfg.retention.runs_per_task) == (2, 32, 100)


@pytest.mark.parametrize(
    "text, message",
    [
        ("colour = 1\n", "unknown key `colour`"),
        ("[store]\nsynchronus = 'FULL'\n", "unknown key `store.synchronus`"),
        ("[retention]\nruns_per_task = 10\n", "`retention.runs_per_task`: expected `int` >= 65"),
        ("[runner]\nconcurrency = 'two'\n", "`runner.concurrency`: expected `int`, got `str`"),
        ("loop = 'tokio'\n", "`loop`: invalid enum value 'tokio'"),
        ("[store\n", "is not valid TOML"),
    ],
)
def test_bad_config_is_one_clear_line(home, text, message):
    path = os.path.join(home, "c.toml")
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_serve_with_bad_config_exits_2_without_traceback(home):
    result = _serve(home, "[mcp]\nenabeld = true\n")
    assert result.returncode == 2
    assert result.stderr == f"qledge: invalid_argument: config {home}/c.toml: unknown key `mcp.enabeld`\n"


def test_missing_config_file(home):
    env = {**os.environ, "QLEDGE_HOME": home}
    result = subprocess.run([sys.executable, "-m", "edge", "serve", "--config", f"{home}/nope.toml"],
                            env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.startswith("qledge: invalid_argument: cannot read config")


def test_second_daemon_on_the_same_socket_refuses(daemon):
    env = {**os.environ, "QLEDGE_HOME": daemon.home}
    result = subprocess.run([sys.executable, "-m", "edge", "serve"], env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2  # a daemon that cannot start as configured
    assert result.stderr == f"qledge: conflict: another qledge daemon is already running in {daemon.home}\n"
    assert daemon.call("qledge.status")["pid"] == daemon.pid


def test_pepper_with_loose_mode_refuses_to_start(home):
    pepper = os.path.join(home, "pepper")
    with open(pepper, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(pepper, 0o644)
    env = {**os.environ, "QLEDGE_HOME": home}
    result = subprocess.run([sys.executable, "-m", "edge", "serve"], env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert result.stderr == f"qledge: permission_denied: {pepper} has mode 0644; it must be 0600\n"


@pytest.mark.parametrize("text,zone", [
    ("config system\n\toption hostname 'OpenWrt'\n\toption zonename 'Asia/Shanghai'\n", "Asia/Shanghai"),
    ("config system\n\toption zonename 'America/New York'\n", "America/New_York"),  # LuCI writes spaces
    ("config system\n\toption timezone 'CST-8'\n", None),
])
def test_openwrt_zonename(text, zone):
    assert config._uci_zonename(text) == zone
