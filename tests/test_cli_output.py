"""Errors and output people can act on: one error format and exit-code rule, messages in
the flags' own terms, every subcommand's --help, --version, time zones refused rather
than defaulted, --config for the CLI, the run environment, one time format, and token
handling — real daemons, the real CLI."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys

import pytest

from edge.cli.main import build_parser
from support import OWN_USER, DaemonProcess, short_tmpdir


def _cli(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=60, cwd=cwd, stdin=subprocess.DEVNULL)


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result


def test_version():
    import edge

    got = _ok(_cli("--version"))
    assert got.stdout == f"qledge {edge.__version__}\n"


def _leaves(parser, path=()):
    """Every command line that names one subcommand: ('task', 'add'), ('status',), …"""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*path, name))
            return
    yield path


def test_every_subcommand_has_help_with_its_limits(home):
    leaves = list(_leaves(build_parser()))
    assert len(leaves) >= 35 and ("task", "update") in leaves and ("next",) in leaves and ("audit",) in leaves
    texts = {}
    for path in leaves:
        got = _cli(*path, "--help", env={"QLEDGE_HOME": home})
        assert got.returncode == 0 and got.stderr == "", (path, got.stderr)
        lines = got.stdout.splitlines()
        assert lines[0].startswith(f"usage: qledge {' '.join(path)}"), (path, lines[0])
        description = lines[lines.index("") + 1]  # the paragraph after the usage lines
        assert description.strip() and not description.startswith(("positional", "options")), path
        texts[path] = got.stdout
    add = texts[("task", "add")]
    assert add.startswith("usage: qledge task add NAME [options] -- COMMAND [ARGS...]\n")
    for limit in ("1 second to 7 days", "4 KiB to 1 GiB", "at most 256 arguments", "of at most 4096 characters",
                  "16384 characters", "at most 128 entries", "letters, digits or '_', not starting with a digit",
                  "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"):
        assert limit in " ".join(add.split()), limit
    assert "[-- COMMAND [ARGS...]]" in texts[("task", "update")]
    assert "0 to 3600 seconds" in " ".join(texts[("trigger", "update")].split())
    assert "0..3600" in texts[("trigger", "add")] and "1..64" in texts[("trigger", "events")]
    assert "TASK:latest-failed" in texts[("run", "get")] and "1..1000" in texts[("run", "list")]
    assert "16384 characters" in texts[("secret", "set")] and "--with-triggers" in texts[("task", "rm")]


def test_errors_are_one_format_with_the_exit_code_of_their_code(home):
    env = {"QLEDGE_HOME": home}
    for argv, code, prefix in (
        (["status"], 3, f"qledge: unavailable: daemon not running at {home}/qledge.sock"),
        (["task", "frobnicate"], 2, "qledge: invalid_argument: argument ACTION: invalid choice: 'frobnicate'"),
        (["run", "list", "--limit", "x"], 2, "qledge: invalid_argument: --limit 'x' is not a whole number (1..1000)"),
        (["cron", "next", "* * *"], 2, "qledge: invalid_argument: invalid cron expression '* * *'"),
        (["task", "add", "t", "--timeout", "0.5", "--", "true"], 2,
         "qledge: invalid_argument: --timeout must be at least 1 second"),
    ):
        got = _cli(*argv, env=env)
        assert got.returncode == code and got.stderr.startswith(prefix) and got.stderr.count("\n") == 1, (argv, got)
        # --json: the same error as one JSON object on stderr, nothing on stdout.
        as_json = _cli("--json", *argv, env=env)
        assert as_json.returncode == code and as_json.stdout == ""
        error = json.loads(as_json.stderr)["error"]
        assert f"qledge: {error['code']}: {error['message']}" == got.stderr.rstrip("\n")


@pytest.mark.parametrize("argv,message", [
    (["--timeout", "0.5"], "--timeout must be at least 1 second"),
    (["--timeout", "8d"], "--timeout must be at most 7 days (604800 seconds)"),
    (["--timeout", "nan"], "--timeout 'nan' is not a duration (seconds, or e.g. 90s, 5m, 2h, 1d)"),
    (["--timeout", "inf"], "--timeout 'inf' is not a duration (seconds, or e.g. 90s, 5m, 2h, 1d)"),
    (["--log-cap", "100"], "--log-cap must be from 4 KiB (4096 bytes) to 1 GiB"),
    (["--log-cap", "lots"], "--log-cap 'lots' is not a size (bytes, or e.g. 64K, 1M)"),
    (["--env", "1A=x"], "--env '1A': a variable name is 1-128 letters, digits or '_', not starting with a digit"),
])
def test_task_flags_are_checked_in_their_own_terms(daemon, argv, message):
    got = daemon.cli("task", "add", "t", *argv, "--", "true")
    assert (got.returncode, got.stderr) == (2, f"qledge: invalid_argument: {message}\n")


def test_limits_of_names_and_commands(daemon):
    name = daemon.cli("task", "add", "my task", "--", "true")
    assert name.stderr == ("qledge: invalid_argument: task 'my task' is not a valid name: use 1-128 letters, digits,"
                           " '.', '_' or '-', starting with a letter or digit\n")
    many = daemon.cli("task", "add", "t", "--", "echo", *["x"] * 257)
    assert many.stderr == "qledge: invalid_argument: the command has 257 arguments; at most 256 are allowed\n"
    long = daemon.cli("task", "add", "t", "--shell", "--", "x" * 16385)
    assert long.stderr == "qledge: invalid_argument: the --shell command is longer than 16384 characters\n"
    # Units people use are accepted, and stored as the daemon's.
    _ok(daemon.cli("task", "add", "t", "--timeout", "90s", "--log-cap", "64K", "--", "true"))
    spec = daemon.call("qledge.task.get", {"taskId": "t"})["spec"]
    assert spec["timeoutMs"] == 90_000 and spec["logCapBytes"] == 65_536
    shown = _ok(daemon.cli("task", "get", "t")).stdout
    assert re.search(r"^timeout: +1m30s$", shown, re.M) and re.search(r"^log cap: +64 KiB$", shown, re.M)


def test_task_get_says_which_secret_gives_a_variable_its_value(daemon):
    _ok(daemon.cli("task", "add", "t", "--env", "USER_NAME=me", "--secret-env", "TOKEN=API_TOKEN", "--", "true"))
    shown = _ok(daemon.cli("task", "get", "t")).stdout
    assert re.search(r"^env: +TOKEN \(secret API_TOKEN\), USER_NAME$", shown, re.M), shown


def test_task_get_shows_the_effective_log_cap_and_working_directory(daemon_factory):
    d = daemon_factory(config="[runner]\nlog_cap_bytes = 2097152\n").start()
    _ok(d.cli("task", "add", "t", "--", "true"))
    shown = _ok(d.cli("task", "get", "t")).stdout
    assert re.search(r"^working dir: +/ \(the default\)$", shown, re.M), shown  # [runner] work_dir
    assert re.search(r"^log cap: +2 MiB \(the default\)$", shown, re.M), shown


def test_serve_refusals_are_exit_2_with_one_line(home):
    config = os.path.join(home, "c.toml")
    with open(config, "w") as f:
        f.write('timezone = "Mars/Olympus"\n')
    got = _cli("serve", "--config", config, env={"QLEDGE_HOME": home})
    assert got.returncode == 2 and got.stderr.count("\n") == 1
    assert got.stderr.startswith("qledge: invalid_argument: config `timezone`: unknown time zone 'Mars/Olympus'")
    got = _cli("serve", env={"QLEDGE_HOME": home, "TZ": "Nowhere/Special"})
    assert got.returncode == 2 and got.stderr.startswith(
        "qledge: invalid_argument: TZ='Nowhere/Special' is not a time zone this system knows")
    got = _cli("serve", "--socket", "/tmp/" + "s" * 120, env={"QLEDGE_HOME": home})
    assert got.returncode == 2 and got.stderr.count("\n") == 1 and "Traceback" not in got.stderr
    assert got.stderr.startswith("qledge: unavailable: cannot listen on /tmp/sss"), got.stderr
    assert not os.path.exists(os.path.join(home, "qledge.sock"))


def test_an_unknown_tz_is_an_error_and_a_posix_rule_is_fine(daemon):
    bad = subprocess.run([sys.executable, "-m", "edge", "run", "list"], env={**daemon.env, "TZ": "Foo/Bar"},
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.startswith(
        "qledge: invalid_argument: TZ='Foo/Bar' is not a time zone this system knows")
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    _ok(daemon.cli("run", "start", "t", "--wait"))
    for tz, zone in (("CET-1CEST,M3.5.0,M10.5.0/3", r"CES?T"), ("Asia/Tokyo", "JST"), (":Asia/Tokyo", "JST")):
        listed = subprocess.run([sys.executable, "-m", "edge", "run", "list"], env={**daemon.env, "TZ": tz},
                                capture_output=True, text=True, timeout=30)
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf" \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d {zone} ", listed.stdout), listed.stdout


def test_one_time_format_everywhere(daemon):
    env = {**daemon.env, "TZ": "Asia/Tokyo"}

    def cli(*args):
        return _ok(subprocess.run([sys.executable, "-m", "edge", *args], env=env, capture_output=True, text=True,
                                  timeout=30)).stdout

    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d JST"
    cli("task", "add", "t", "--", "true")
    cli("run", "start", "t", "--wait")
    cli("trigger", "add", "t", "--cron", "0 3 * * *", "--tz", "Asia/Tokyo")
    cli("token", "create", "--role", "viewer")
    for args in (("run", "list"), ("run", "get", "t:latest"), ("task", "get", "t"), ("token", "list"),
                 ("trigger", "get", "t-1"), ("trigger", "list"), ("next",), ("audit", "--limit", "1"),
                 ("secret", "list")):
        if args == ("secret", "list"):
            _ok(daemon.cli("secret", "set", "s", input="value1"))
        out = cli(*args)
        assert re.search(stamp, out), (args, out)
        assert not re.search(r"\d\d:\d\d:\d\d(?! [A-Z+])", out), (args, out)  # never a time without its zone
    status = cli("status")
    assert re.search(r"^qledge: +\S+ \(pid \d+, up [0-9.]+s\)$", status, re.M), status


def test_the_cli_finds_a_daemon_through_its_config_file(home):
    state, sock_dir = short_tmpdir(), short_tmpdir()
    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write(f'home = "{state}"\nsocket = "{sock_dir}/q.sock"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("QLEDGE_")}
    d = DaemonProcess(home=state)
    d.env = {**env}
    d.config_path = config
    try:
        d.start()
        plain = subprocess.run([sys.executable, "-m", "edge", "status"], env=env, capture_output=True, text=True,
                               timeout=30)
        assert plain.returncode == 3  # without the file, the CLI looks elsewhere
        by_flag = _ok(subprocess.run([sys.executable, "-m", "edge", "--config", config, "status", "--json"], env=env,
                                     capture_output=True, text=True, timeout=30))
        assert json.loads(by_flag.stdout)["pid"] == d.pid
        by_env = _ok(subprocess.run([sys.executable, "-m", "edge", "status", "--json"],
                                    env={**env, "QLEDGE_CONFIG": config}, capture_output=True, text=True, timeout=30))
        assert json.loads(by_env.stdout)["dbPath"] == os.path.join(state, "qledge.db")
        # The MCP bridge resolves the same file: it finds this daemon (whose MCP is off).
        bridge = subprocess.run([sys.executable, "-m", "edge", "mcp", "--config", config], env=env,
                                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert (bridge.returncode, bridge.stderr) == (
            3, "qledge: unavailable: MCP is not enabled on this daemon (set [mcp] enabled = true)\n")
        missing = subprocess.run([sys.executable, "-m", "edge", "--config", "/nope.toml", "status"], env=env,
                                 capture_output=True, text=True, timeout=30)
        assert (missing.returncode, missing.stderr) == (
            2, "qledge: invalid_argument: cannot read config /nope.toml: No such file or directory\n")
    finally:
        d.stop()
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_serve_reads_qledge_config_too(home):
    state = short_tmpdir()
    config = os.path.join(home, "qledge.toml")
    with open(config, "w") as f:
        f.write(f'home = "{state}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("QLEDGE_")}
    d = DaemonProcess(home=state)
    d.env = {**env, "QLEDGE_CONFIG": config}
    try:
        d.start()
        got = _ok(subprocess.run([sys.executable, "-m", "edge", "status", "--json"],
                                 env={**env, "QLEDGE_CONFIG": config}, capture_output=True, text=True, timeout=30))
        assert json.loads(got.stdout)["dbPath"] == os.path.join(state, "qledge.db")
    finally:
        d.stop()
        shutil.rmtree(state, ignore_errors=True)


def _login(name: str) -> dict[str, str]:
    entry = pwd.getpwnam(name)
    shell = entry.pw_shell if os.path.basename(entry.pw_shell) not in ("nologin", "false") else "/bin/sh"
    return {"HOME": entry.pw_dir or "/", "USER": name, "LOGNAME": name, "SHELL": shell}


def test_a_run_gets_the_environment_of_its_user(daemon_factory):
    """The login variables are those of the user the run executes as: the task's user (as
    root, the default task user, nobody), not the daemon's."""
    d = daemon_factory(config='timezone = "Europe/Berlin"\n', env={"LANG": "de_DE.UTF-8",
                                                                   "DAEMON_ONLY": "must-not-leak"}).start()
    default = "nobody" if os.geteuid() == 0 else OWN_USER
    for task, user, flags in (("env", default, []), ("env-own", OWN_USER, ["--user", OWN_USER])):
        _ok(d.cli("task", "add", task, *flags, "--env", "EXTRA=1", "--", "env"))
        run = json.loads(_ok(d.cli("run", "start", task, "--wait", "--json")).stdout)
        seen = dict(line.split("=", 1) for line in _ok(d.cli("run", "log", run["id"])).stdout.splitlines())
        assert {k: seen.get(k) for k in ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ")} == {
            **_login(user), "LANG": "de_DE.UTF-8", "TZ": "Europe/Berlin"}, task
        assert seen["PATH"].split(":")[:2] == ["/usr/local/sbin", "/usr/local/bin"]
        assert seen["QLEDGE_RUN_ID"] == run["id"] and seen["QLEDGE_TASK_ID"] == task and seen["EXTRA"] == "1"
        assert "DAEMON_ONLY" not in seen and "NOTIFY_SOCKET" not in seen and "QLEDGE_HOME" not in seen


def test_user_environment_without_a_passwd_entry():
    from edge.runner.process import user_environment

    uid = next(u for u in range(60_000, 65_000) if not _has_entry(u))
    assert user_environment(uid, "UTC") == {"HOME": "/", "USER": str(uid), "LOGNAME": str(uid), "SHELL": "/bin/sh",
                                            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                            "LANG": "C.UTF-8", "TZ": "UTC"}


def _has_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_tokens_never_echo_a_secret_and_revoked_ones_are_hidden(daemon):
    created = json.loads(_ok(daemon.cli("token", "create", "--role", "viewer", "--name", "old", "--json")).stdout)
    token, cid = created["token"], created["credential"]["id"]
    secret = token.split("_", 2)[2]
    revoked = _ok(daemon.cli("token", "revoke", token))  # the whole token, pasted: its id is used
    assert revoked.stdout == f"credential {cid} (old) revoked\n" and secret not in revoked.stdout + revoked.stderr
    again = daemon.cli("token", "revoke", "qle_ffffffffffff_" + secret)
    assert (again.returncode, again.stderr) == (1, "qledge: not_found: no credential ffffffffffff\n")
    odd = daemon.cli("token", "revoke", "not a token " + secret)
    assert odd.returncode == 1 and secret not in odd.stderr
    _ok(daemon.cli("token", "create", "--role", "operator", "--name", "live"))
    listed = _ok(daemon.cli("token", "list")).stdout
    assert "live" in listed and "old" not in listed and listed.endswith(
        "(1 revoked not shown: qledge token list --all)\n")
    everything = _ok(daemon.cli("token", "list", "--all")).stdout
    assert "old" in everything and "revoked" in everything
    assert len(json.loads(_ok(daemon.cli("token", "list", "--json")).stdout)) == 1
    bad = daemon.cli("token", "create", "--role", "viewer", "--permission", "run.reed")
    assert bad.returncode == 2 and bad.stderr.startswith(
        "qledge: invalid_argument: unknown permission 'run.reed'; valid: task.read, task.inspect, task.write,")
    assert "audit.read, secret.use:<secret>, tool.call:<tool>, tool.call:<prefix>*, *\n" in bad.stderr
