"""`qledge export` / `qledge import` between real daemons, through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
from support import interrupt_once_written

from edge.cli.main import _import_file_alias


def _ok(result):
    assert result.returncode == 0, result.stderr
    return result


def _populate(d) -> None:
    _ok(d.cli("task", "add", "hello", "--", "echo", "hi"))
    _ok(d.cli("task", "add", "greet", "--env", "WHO=world", "--secret-env", "TOKEN=api", "--shell", "--",
              'echo "$WHO ${#TOKEN}"'))
    _ok(d.cli("task", "add", "off", "--timeout", "30", "--", "true"))
    _ok(d.cli("task", "disable", "off"))
    _ok(d.cli("trigger", "add", "hello", "--cron", "*/5 * * * *", "--tz", "UTC", "--id", "every5"))
    _ok(d.cli("trigger", "add", "greet", "--cron", "0 3 * * *", "--tz", "Europe/Berlin", "--misfire", "fire_once",
              "--jitter", "30", "--id", "nightly"))
    _ok(d.cli("trigger", "disable", "nightly"))
    _ok(d.cli("secret", "set", "api", input="s3cr3t-value-1\n"))


def _heads(d) -> tuple[dict, dict]:
    tasks = {t["id"]: t for t in json.loads(_ok(d.cli("task", "list", "--json")).stdout)}
    triggers = {t["id"]: t for t in json.loads(_ok(d.cli("trigger", "list", "--json")).stdout)}
    return tasks, triggers


def _comparable(tasks: dict, triggers: dict) -> tuple[dict, dict]:
    """What an import must carry over: names, flags and specs (not ids of revisions or times)."""
    return ({k: (t["name"], t["enabled"], t["spec"]) for k, t in tasks.items()},
            {k: (t["taskId"], t["enabled"], t["spec"]) for k, t in triggers.items()})


def _unscheduled(tasks: dict, triggers: dict) -> tuple[dict, dict]:
    """The heads without the scheduler's cursor, which moves when a trigger fires (`*/5`
    does whenever the wall clock passes a fifth minute meanwhile), not with an import."""
    cursor = ("nextFireAtMs", "lastScheduledAtMs")
    return tasks, {k: {f: v for f, v in t.items() if f not in cursor} for k, t in triggers.items()}


def _audited(d, tool: str) -> list[tuple[str, str]]:
    rows = d.db().execute("SELECT principal, outcome FROM security_audit WHERE tool = ?", (tool,)).fetchall()
    return [(p, o) for p, o in rows]


def test_export_then_import_into_a_fresh_daemon_recreates_everything(daemon_factory, tmp_path):
    source = daemon_factory().start()
    _populate(source)
    plain, full = str(tmp_path / "plain.json"), str(tmp_path / "full.json")
    assert "exported 3 tasks, 2 triggers to" in _ok(source.cli("export", plain)).stdout
    _ok(source.cli("export", "--with-secrets", full))
    for path in (plain, full):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(plain) as f:
        text = f.read()
    assert "s3cr3t-value-1" not in text and '"secrets"' not in text
    with open(full) as f:
        doc = json.load(f)
    assert doc["format"] == "qledge-export" and doc["version"] == 1
    assert doc["secrets"] == [{"name": "api", "value": "s3cr3t-value-1"}]
    assert _audited(source, "qledge.secret.export") == [(f"uid:{os.getuid()}", "allowed")]

    target = daemon_factory().start()
    result = _ok(target.cli("import", full, "--json"))
    report = json.loads(result.stdout)
    assert sorted(report["created"]) == sorted(
        ["task hello", "task greet", "task off", "trigger every5", "trigger nightly", "secret api"])
    assert report["updated"] == report["skipped"] == report["conflicts"] == []
    assert _comparable(*_heads(target)) == _comparable(*_heads(source))

    # The imported task runs with the imported secret.
    run = _ok(target.cli("run", "start", "greet", "--wait", "--json"))
    assert _ok(target.cli("run", "log", json.loads(run.stdout)["id"])).stdout == "world 14\n"

    # Idempotent: a second import changes nothing and says so.
    before = _unscheduled(*_heads(target))
    again = _ok(target.cli("import", full))
    assert "0 created, 0 updated, 6 skipped" in again.stdout
    assert _unscheduled(*_heads(target)) == before


def test_import_refuses_what_differs_unless_replace(daemon_factory, tmp_path):
    source = daemon_factory().start()
    _populate(source)
    path = str(tmp_path / "x.json")
    _ok(source.cli("export", "--with-secrets", path))
    target = daemon_factory().start()
    _ok(target.cli("task", "add", "hello", "--", "echo", "changed here"))
    _ok(target.cli("secret", "set", "api", input="zzother-value\n"))

    refused = target.cli("import", path)
    assert refused.returncode == 1
    line = refused.stderr.strip()
    assert line.startswith("qledge: conflict: 2 item(s) differ") and "task hello" in line and "secret api" in line
    assert "--replace" in line and "zzother" not in line and "s3cr3t" not in line  # never a value
    tasks, triggers = _heads(target)
    assert list(tasks) == ["hello"] and triggers == {}  # nothing at all was written
    assert target.db().execute("SELECT value FROM secrets WHERE name = 'api'").fetchall() == [("zzother-value",)]

    dry = target.cli("import", path, "--dry-run", "--replace")
    assert dry.returncode == 0 and "would be updated: task hello, secret api" in dry.stdout
    assert list(_heads(target)[0]) == ["hello"]

    replaced = _ok(target.cli("import", path, "--replace", "--json"))
    report = json.loads(replaced.stdout)
    assert sorted(report["updated"]) == ["secret api", "task hello"]
    tasks, _ = _heads(target)
    assert tasks["hello"]["revision"] == 2  # an update: history kept, a new revision
    assert tasks["hello"]["spec"]["command"]["args"] == ["hi"]
    assert target.db().execute("SELECT value FROM secrets WHERE name = 'api'").fetchall() == [("s3cr3t-value-1",)]


def test_a_changed_trigger_is_replaced_and_a_pinned_one_is_reported(daemon_factory, tmp_path):
    source = daemon_factory().start()
    _ok(source.cli("task", "add", "t", "--", "true"))
    _ok(source.cli("trigger", "add", "t", "--cron", "0 * * * *", "--tz", "UTC", "--id", "old"))
    source.call("qledge.task.update", {"taskId": "t", "expectedRevision": 1,
                                       "spec": {"command": {"kind": "argv", "file": "false"}}})
    _ok(source.cli("trigger", "repin", "old", "--task-revision", "1"))
    path = str(tmp_path / "p.json")
    _ok(source.cli("export", path))

    target = daemon_factory().start()
    _ok(target.cli("task", "add", "t", "--", "false"))
    made = json.loads(_ok(target.cli("trigger", "add", "t", "--cron", "30 * * * *", "--tz", "UTC", "--id", "old",
                                     "--json")).stdout)
    with target.db() as db:  # a fire on record here, which an update keeps
        db.execute("INSERT INTO trigger_events (project_id, trigger_id, type, reason, scheduled_for_ms, fires,"
                   " created_at_ms) VALUES ('default', 'old', 'skipped', 'overlap', 1000, 1, 1000)")
    result = _ok(target.cli("import", path, "--replace"))
    assert "updated: trigger old" in result.stdout and "skipped (identical): task t" in result.stdout
    assert "note: trigger old ran revision 1 of task t" in result.stdout
    trigger = _heads(target)[1]["old"]
    assert trigger["spec"]["expression"] == "0 * * * *" and trigger["taskRevision"] == 1
    # Changed in place, by a new revision: the same trigger, its events kept.
    assert trigger["revision"] == 2 and trigger["createdAtMs"] == made["createdAtMs"]
    assert [e["reason"] for e in json.loads(_ok(target.cli("trigger", "events", "old", "--json")).stdout)] == [
        "overlap"]


def test_large_exports_page_and_batch(daemon_factory, tmp_path):
    source = daemon_factory().start()
    with source.client() as c:
        for i in range(70):
            c.call("qledge.task.create", {"taskId": f"t{i:02d}", "spec": {
                "command": {"kind": "shell", "command": "echo " + "x" * 3000}}})
    path = str(tmp_path / "big.json")
    assert "exported 70 tasks" in _ok(source.cli("export", path)).stdout
    target = daemon_factory().start()
    assert "70 created" in _ok(target.cli("import", path)).stdout
    assert len(_heads(target)[0]) == 70
    # 70 tasks of ~3 KB arrive in more than one import call (64 items, 128 KiB at most each).
    assert len(_audited(target, "qledge.import")) >= 4  # a dry pass and a real one, two batches each


def test_permissions_fail_closed_and_write_nothing(daemon_factory, tmp_path):
    source = daemon_factory().start()
    _populate(source)
    full = str(tmp_path / "full.json")
    _ok(source.cli("export", "--with-secrets", full))
    _, operator = source.token("operator")
    _, viewer = source.token("viewer")

    mine = str(tmp_path / "op.json")
    _ok(source.cli("export", mine, token=operator))  # operators may export tasks and triggers
    denied = source.cli("export", "--with-secrets", str(tmp_path / "no.json"), token=operator)
    assert denied.returncode == 1 and "requires permission secret.export" in denied.stderr
    assert not os.path.exists(tmp_path / "no.json")
    seen = source.cli("export", str(tmp_path / "v.json"), token=viewer)
    assert seen.returncode == 1 and "permission_denied" in seen.stderr

    target = daemon_factory().start()
    _, target_operator = target.token("operator")
    refused = target.cli("import", full, token=target_operator)  # secrets need secret.write
    assert refused.returncode == 1 and "requires permission secret.write" in refused.stderr
    assert _heads(target) == ({}, {})  # the dry pass found it before anything was written
    # Its tasks use a secret: an operator may write them only when its credential names it.
    refused = target.cli("import", mine, token=target_operator)
    assert refused.returncode == 1 and "requires permission secret.use:api" in refused.stderr
    assert _heads(target) == ({}, {})
    _, may_use = target.token("operator", ["*", "secret.use:api"])
    _ok(target.cli("import", mine, token=may_use))
    assert len(_heads(target)[0]) == 3


@pytest.mark.parametrize("content, expected", [
    ("{}", "is not a qledge export file"),
    ('{"format": "qledge-export", "version": 2}', "is not a qledge export file"),
    ("not json", "is not a qledge export file"),
])
def test_a_bad_file_is_one_line(daemon, tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = daemon.cli("import", str(path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr
    assert "Traceback" not in result.stderr


def test_import_file_coexists_with_import_sources():
    assert _import_file_alias(["import", "backup.json"]) == ["import", "file", "backup.json"]
    assert _import_file_alias(["--home", "/h", "import", "--replace", "b.json"]) == [
        "--home", "/h", "import", "file", "--replace", "b.json"]
    for words in (["import", "crontab", "/etc/crontabs/root"], ["import", "qinglong", "x"], ["import", "--help"],
                  ["import", "file", "b.json"], ["task", "list"], ["import"]):
        assert _import_file_alias(words) == words


def test_export_replaces_a_planted_link_and_never_writes_through_it(daemon, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    path = tmp_path / "export.json"
    path.symlink_to(victim)
    _ok(daemon.cli("task", "add", "t", "--", "true"))
    _ok(daemon.cli("export", "--with-secrets", str(path)))
    assert victim.read_text() == "untouched\n"
    info = os.lstat(path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert json.loads(path.read_text())["tasks"][0]["id"] == "t"


# -- all or nothing ---------------------------------------------------------------------


def _many(d, count: int, secret_at: tuple[int, ...] = (), root_at: tuple[int, ...] = ()) -> None:
    d.cli("secret", "set", "api", input="s3cr3t-value-1\n")
    for n in range(1, count + 1):
        spec: dict = {"command": {"kind": "argv", "file": "true"}}
        if n in secret_at:
            spec["env"] = {"K": {"secret": "api"}}
        if n in root_at:
            spec["user"] = "root"
        d.call("qledge.task.create", {"taskId": f"task-{n:02d}", "spec": spec})
        d.call("qledge.trigger.create", {"taskId": f"task-{n:02d}", "expression": "0 4 * * *", "timezone": "UTC",
                                         "triggerId": f"nightly-{n:02d}"})


def test_a_refusal_anywhere_writes_nothing_and_names_every_refused_entry(daemon_factory, tmp_path):
    from support import IS_ROOT

    source = daemon_factory().start()
    root_at = (23,) if IS_ROOT else ()  # a root daemon: a task as root is privileged
    _many(source, 31, secret_at=(16,), root_at=root_at)
    path = str(tmp_path / "export.json")
    _ok(source.cli("export", path))
    target = daemon_factory().start()
    perms = ["*"] if IS_ROOT else ["*", "task.privileged"]
    _, operator = target.token("operator", perms)
    refused = target.cli("import", path, token=operator)
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    line = refused.stderr
    assert line.startswith(f"qledge: permission_denied: {2 + 2 * len(root_at)} item(s) cannot be imported, so"
                           " nothing was: task task-16: task task-16: it uses secret 'api'")
    assert "trigger nightly-16: " in line
    if root_at:
        assert "task task-23: task task-23: runs as root; that requires permission task.privileged" in line
        assert "trigger nightly-23: " in line
    assert _heads(target) == ({}, {})  # not tasks 1-15, nor anything else
    # An owner imports all of it, in one transaction.
    _ok(target.cli("import", path))
    assert len(_heads(target)[0]) == 31 and len(_heads(target)[1]) == 31


def test_a_refusal_names_the_first_entries_and_counts_the_rest(daemon_factory, tmp_path):
    source = daemon_factory().start()
    _many(source, 40, secret_at=tuple(range(1, 41)))
    path = str(tmp_path / "export.json")
    _ok(source.cli("export", path))
    target = daemon_factory().start()
    _, operator = target.token("operator")
    refused = target.cli("import", path, token=operator)
    assert refused.returncode == 1 and "qledge: permission_denied: 80 item(s) cannot be imported" in refused.stderr
    assert refused.stderr.count("it uses secret 'api'") == 32 and refused.stderr.endswith("; and 48 more\n")
    assert len(refused.stderr) < 8192
    assert _heads(target) == ({}, {})


def test_a_changed_spec_is_refused_and_named(daemon_factory, tmp_path):
    source = daemon_factory().start()
    _populate(source)
    path = tmp_path / "export.json"
    _ok(source.cli("export", str(path)))
    doc = json.loads(path.read_text())
    hello = next(t for t in doc["tasks"] if t["id"] == "hello")
    hello["spec"]["command"]["args"] = ["pwned"]  # the digest still says what was exported
    off = next(t for t in doc["tasks"] if t["id"] == "off")
    del off["contentDigest"]
    path.write_text(json.dumps(doc))
    target = daemon_factory().start()
    refused = target.cli("import", str(path))
    assert refused.returncode == 2, refused.stderr  # invalid_argument
    assert "task hello: its spec does not match its contentDigest (the file was changed after the export)" \
        in refused.stderr
    assert "task off: it has no contentDigest" in refused.stderr
    assert "trigger every5: its task hello cannot be imported" in refused.stderr
    assert _heads(target) == ({}, {})
    dry = target.cli("import", "--dry-run", "--json", str(path))
    assert dry.returncode == 2 and json.loads(dry.stdout)["refusedCount"] == 3


# -- moving devices moves everything --------------------------------------------------------


def test_a_move_onto_a_fresh_device_runs_every_task_and_every_rule_notifies(daemon_factory, tmp_path):
    import shutil

    import qinglong_fixture as ql
    from notify_support import Loopback

    hooks = Loopback()
    homes: list[str] = []
    try:
        source = daemon_factory().start()
        homes.append(source.home)
        data = ql.make_data_dir(str(tmp_path / "ql"))
        _ok(source.cli("import", "qinglong", data, "--user", "nobody"))
        _ok(source.cli("secret", "set", "hooktoken", input="hook-token-value-1\n"))
        source.call("qledge.notify.channel.set", {"name": "all", "spec": {
            "kind": "webhook", "url": hooks.url + "/all", "headers": {"X-Token": {"secret": "hooktoken"}}}})
        source.call("qledge.notify.channel.set",
                    {"name": "own", "spec": {"kind": "webhook", "url": hooks.url + "/own"}})
        source.call("qledge.notify.rules.set", {"rules": [{"channels": ["all"], "on": ["every"]}]})
        source.call("qledge.task.create", {"taskId": "mine", "spec": {
            "command": {"kind": "argv", "file": "true"}, "notify": [{"channels": ["own"], "on": ["success"]}]}})
        plain, full = str(tmp_path / "plain.json"), str(tmp_path / "move.json")
        _ok(source.cli("export", plain))  # without secrets: the channels' secrets stay behind, and it says so
        with open(plain) as f:
            doc = json.load(f)
        assert "hook-token-value-1" not in json.dumps(doc) and doc["notify"]["rules"] == [
            {"channels": ["all"], "on": ["every"]}]
        assert any("the secrets they use are not in this file" in n for n in doc["notExported"])
        exported = _ok(source.cli("export", "--with-secrets", full)).stdout
        assert "2 notification channels" in exported and "move.json.scripts.tar.gz beside it" in exported
        assert stat.S_IMODE(os.stat(full + ".scripts.tar.gz").st_mode) == 0o600
        source.stop()

        target = daemon_factory().start()
        homes.append(target.home)
        fresh = daemon_factory().start()  # a device without the secret: the channel that needs it is refused
        refused = fresh.cli("import", plain)
        assert refused.returncode == 2 and "channel all: secret 'hooktoken' is neither in the file nor here" \
            in refused.stderr
        assert _heads(fresh) == ({}, {})
        _ok(target.cli("import", full))
        scripts = os.path.realpath(target.home) + "-scripts"
        assert sorted(os.listdir(os.path.join(scripts, "qinglong"))) == [
            "backup.sh", "boot_notify.sh", "jd_bean_change.js", "lib", "ql_checkin.py"]
        tasks, _ = _heads(target)
        bean = tasks["jd_bean_change"]["spec"]["command"]["args"][0]
        assert bean == os.path.join(scripts, "qinglong", "jd_bean_change.js")  # moved to this device's scripts
        assert {c["name"] for c in target.call("qledge.notify.channel.list")["channels"]} == {"all", "own"}
        assert target.call("qledge.notify.rules.get")["rules"] == [{"channels": ["all"], "on": ["every"]}]
        enabled = sorted(t for t, v in tasks.items() if v["enabled"])
        for task in enabled:
            run = json.loads(_ok(target.cli("run", "start", task, "--wait", "--json")).stdout)
            assert run["status"] == "succeeded", (task, run)
        got = hooks.wait(len(enabled))
        every = [r for r in got if r.path == "/all"]  # the project's rule; `mine` has a rule of its own
        assert sorted(r.json()["taskId"] for r in every) == [t for t in enabled if t != "mine"]
        assert {r.headers.get("X-Token") for r in every} == {"hook-token-value-1"}
        assert [r.json()["taskId"] for r in got if r.path == "/own"] == ["mine"]
    finally:
        hooks.close()
        for home in homes:
            shutil.rmtree(os.path.realpath(home) + "-scripts", ignore_errors=True)


# -- all or nothing across every part of an export ---------------------------------------------


def _export_with_everything(daemon_factory, tmp_path, hooks_url: str) -> tuple[str, str]:
    """A device with imported scripts, secrets, a channel using one, default rules and tasks,
    exported with its secrets; the file, and the source's scripts directory (to clean up)."""
    import qinglong_fixture as ql

    source = daemon_factory().start()
    data = ql.make_data_dir(str(tmp_path / "ql"))
    _ok(source.cli("import", "qinglong", data, "--user", "nobody"))
    _ok(source.cli("secret", "set", "hooktoken", input="hook-token-value-1\n"))
    source.call("qledge.notify.channel.set", {"name": "all", "spec": {
        "kind": "webhook", "url": hooks_url, "headers": {"X-Token": {"secret": "hooktoken"}}}})
    source.call("qledge.notify.rules.set", {"rules": [{"channels": ["all"], "on": ["every"]}]})
    full = str(tmp_path / "move.json")
    _ok(source.cli("export", "--with-secrets", full))
    source.stop()
    return full, os.path.realpath(source.home) + "-scripts"


def _nothing_imported(target) -> None:
    assert _heads(target) == ({}, {})
    assert target.call("qledge.secret.list")["secrets"] == []
    assert target.call("qledge.notify.channel.list")["channels"] == []
    assert target.call("qledge.notify.rules.get").get("rules") is None


def test_a_channel_the_daemon_would_refuse_stops_the_import_before_anything_is_written(daemon_factory, tmp_path):
    full, made = _export_with_everything(daemon_factory, tmp_path, "https://hooks.example/all")
    try:
        with open(full) as f:
            doc = json.load(f)
        # As a newer qledge might write it: a template field this one does not know.
        doc["notify"]["channels"][0]["spec"]["title"] = "{newField} failed"
        with open(full, "w") as f:
            json.dump(doc, f)
        target = daemon_factory().start()
        refused = target.cli("import", full)
        _nothing_imported(target)
        assert not os.path.exists(os.path.realpath(target.home) + "-scripts")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "channel all: invalid_argument: title template: unknown field {newField}" in refused.stderr
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None, reason="chattr +i needs root")
def test_a_part_failing_after_the_first_write_undoes_what_the_import_wrote(daemon_factory, tmp_path):
    """The scripts cannot be copied (a directory of the destination is immutable: only a
    write finds that out) after the secrets, the channel and the rules were written: they
    are taken back, and so are the scripts copied so far; no task was written."""
    import subprocess

    full, made = _export_with_everything(daemon_factory, tmp_path, "https://hooks.example/all")
    target = daemon_factory().start()
    scripts = os.path.realpath(target.home) + "-scripts"
    lib = os.path.join(scripts, "qinglong", "lib")
    os.makedirs(lib, 0o755)
    subprocess.run(["chattr", "+i", lib], check=True)
    try:
        failed = target.cli("import", full)
        _nothing_imported(target)
        assert os.listdir(scripts) == ["qinglong"] and os.listdir(os.path.join(scripts, "qinglong")) == ["lib"]
        assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
        line = failed.stderr
        assert f"cannot copy the scripts to {scripts}: Operation not permitted (importing the scripts);" \
               " the import stopped there, undone: secret " in line, line
        assert "channel all, the default rules, the scripts copied to" in line, line
        # Nothing left behind stands in the way of the next import.
        subprocess.run(["chattr", "-i", lib], check=True)
        _ok(target.cli("import", full))
        assert len(_heads(target)[0]) == 4 and target.call("qledge.notify.rules.get")["rules"]
    finally:
        subprocess.run(["chattr", "-i", lib], check=False)
        shutil.rmtree(made, ignore_errors=True)
        shutil.rmtree(scripts, ignore_errors=True)


def test_a_stop_signal_during_an_import_takes_back_what_it_wrote(daemon_factory, tmp_path):
    """SIGTERM while the secrets are being written: the import stops at the next point where
    its writes are on record, takes them all back, exits 143 with one line. Many secrets,
    so the signal lands mid-import; when a fast machine finished first, more of them."""
    import signal
    import sys

    source = daemon_factory().start()
    _populate(source)
    full = str(tmp_path / "full.json")
    _ok(source.cli("export", "--with-secrets", full))
    source.stop()
    with open(full) as f:
        doc = json.load(f)
    count = 1500
    for _ in range(4):
        doc["secrets"] = [{"name": "api", "value": "s3cr3t-value-1"}] + [
            {"name": f"bulk_{n:05d}", "value": f"value-{n}"} for n in range(count)]
        with open(full, "w") as f:
            json.dump(doc, f)
        target = daemon_factory().start()
        db = target.db()
        done = interrupt_once_written([sys.executable, "-m", "edge", "import", full], target.env,
                                      lambda db=db: db.execute("SELECT count(*) FROM secrets").fetchone()[0] > 0)
        if done is None:  # it finished before the signal: more secrets, a fresh daemon
            count *= 2
            target.stop()
            continue
        err = done.stderr
        assert done.returncode == 128 + signal.SIGTERM, err
        assert err.count("\n") == 1 and err.startswith("qledge: cancelled: stopped by SIGTERM (importing the"
                                                       " secrets); undone: secret "), err
        assert db.execute("SELECT count(*) FROM secrets").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM imports").fetchone()[0] == 0
        assert _heads(target) == ({}, {})
        return
    pytest.fail(f"every import of up to {count // 2} secrets finished before a signal could reach it")
