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


@pytest.mark.parametrize(
    "text, message",
    [
        ("[agent]\nbase_urll = 'x'\n", "unknown key `agent.base_urll`"),
        ("[agent.profiles.local]\nmodle = 'x'\n", "unknown key `agent.profiles[...].modle`"),
        ("[agent]\nconcurrency = 0\n", "`agent.concurrency`: expected `int` >= 1"),
        ("[agent]\nmax_tokens_param = 'tokens'\n", "`agent.max_tokens_param`: invalid enum value 'tokens'"),
        ("[agent.specialists.log-analyst]\nsytem = 'x'\n", "unknown key `agent.specialists[...].sytem`"),
        ("[agent.specialists.Log_Analyst]\n", "a name in `agent.specialists`: expected `str` matching regex"),
        ("[agent]\nattempts = 0\n", "`agent.attempts`: expected `int` >= 1"),
    ],
)
def test_bad_agent_config_is_one_clear_line(home, text, message):
    path = os.path.join(home, "c.toml")
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "text, line",
    [
        ("[agent]\nenabled = true\n", "qledge: [agent] base_url is required (e.g. https://api.openai.com/v1)"),
        ("[agent]\nenabled = true\nbase_url = 'https://user:pw@api.example.com/v1'\nmodel = 'm'\n",
         "qledge: [agent] base_url 'https://user:pw@api.example.com/v1' must be http(s)://host[:port][/path]"),
        ("[agent]\nenabled = true\nbase_url = 'http://127.0.0.1:9/v1'\n",
         "qledge: [agent] model is required (e.g. gpt-4o-mini)"),
        ("[agent]\nenabled = true\nbase_url = 'http://127.0.0.1:9/v1'\nmodel = 'm'\nproxy = 'socks5://h:1'\n",
         "qledge: [agent] proxy 'socks5://h:1' must be http://host:port"),
        ("[agent]\nenabled = true\nbase_url = 'http://127.0.0.1:9/v1'\nmodel = 'm'\napi_key_file = '{home}/key'\n",
         "qledge: [agent] api_key_file {home}/key has mode 0644; it must be 0600"),
        ("[agent]\nenabled = true\nbase_url = 'http://127.0.0.1:9/v1'\nmodel = 'm'\n"
         "[agent.profiles.cloud]\nbase_url = 'ftp://x'\n",
         "qledge: [agent.profiles.cloud] base_url 'ftp://x' must be http(s)://host[:port][/path]"),
        ("[agent]\nenabled = true\nbase_url = 'http://127.0.0.1:9/v1'\nmodel = 'm'\n"
         "[agent.specialists.wifi]\ndescription = 'knows wireless'\n",
         "qledge: [agent.specialists.wifi] needs description and system (it is not a default one)"),
    ],
)
def test_an_enabled_agent_is_checked_at_start_in_one_line(home, text, line):
    key = os.path.join(home, "key")
    with open(key, "w") as f:
        f.write("sk-test\n")
    os.chmod(key, 0o644)
    result = _serve(home, text.format(home=home))
    assert result.returncode == 2
    expected = line.format(home=home).replace("qledge: ", "qledge: invalid_argument: ", 1)
    assert result.stderr.strip().splitlines() == [expected]


def _keys(struct: type, prefix: str = "") -> list[str]:
    import msgspec

    found = []
    for field in msgspec.structs.fields(struct):
        kind = field.type
        if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            found += _keys(kind, f"[{field.name}] ")
        elif field.name == "profiles":
            from edge.app.config import AgentProfile

            found += [f"[agent.profiles.NAME] {f.name}" for f in msgspec.structs.fields(AgentProfile)]
        elif field.name == "specialists":
            from edge.app.config import SpecialistConfig

            found += [f"[agent.specialists.NAME] {f.name}" for f in msgspec.structs.fields(SpecialistConfig)]
        else:
            found.append(prefix + field.name)
    return found


def test_every_key_is_in_the_readme_table():
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "reference", "configuration.md")) as f:
        readme = f.read()
    missing = [key for key in _keys(Config) if f"| `{key}` |" not in readme]
    assert missing == []
