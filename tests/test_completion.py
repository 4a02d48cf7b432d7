"""`qledge completion`: the scripts load in their shells, complete from the parser, and ask a
real daemon for task and run ids (quietly nothing when it is not there or does not answer)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from support import DaemonProcess, short_tmpdir

BIN = os.path.dirname(sys.executable)  # where the venv's `qledge` is


def env(**extra: str) -> dict[str, str]:
    found = {k: v for k, v in os.environ.items() if not k.startswith("QLEDGE_")}
    return {**found, "PATH": f"{BIN}{os.pathsep}{found.get('PATH', '')}", **extra}


def script(shell: str) -> str:
    done = subprocess.run([sys.executable, "-m", "edge", "completion", shell], capture_output=True, text=True,
                          timeout=60, env=env())
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def complete(line: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """What bash completes for the last word of `line`, the script loaded as a user would."""
    words = " ".join(f"'{w}'" for w in line)
    program = (f"source <(qledge completion bash) && COMP_WORDS=({words}) && COMP_CWORD={len(line) - 1}"
               ' && _qledge && printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=60, env=environ or env())
    assert done.returncode == 0 and not done.stderr, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_script_loads_without_errors():
    program = "source <(qledge completion bash); complete -p qledge"
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=60, env=env())
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == "complete -F _qledge qledge"


def test_bash_completes_nouns_verbs_options_and_choices():
    assert complete(["qledge", "ta"]) == ["task"]
    assert complete(["qledge", "--json", "tr"]) == ["trigger"]
    assert complete(["qledge", "task", "g"]) == ["get"]
    assert "--timeout" in complete(["qledge", "task", "add", "--ti"])
    assert complete(["qledge", "token", "create", "--role", "o"]) == ["owner", "operator"]
    assert "telegram" in complete(["qledge", "notify", "add", "tg", ""])
    assert set(complete(["qledge", "completion", ""])) == {"bash", "zsh", "fish"}
    assert complete(["qledge", "do"]) == ["doctor"]


def test_every_noun_and_verb_of_the_parser_is_offered():
    import argparse

    from edge.cli.main import build_parser

    def names(p: argparse.ArgumentParser) -> list[str]:
        return next(list(a.choices) for a in p._actions if isinstance(a, argparse._SubParsersAction))

    parser = build_parser()
    assert sorted(complete(["qledge", ""])) == sorted(names(parser))
    task = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["task"]
    assert sorted(complete(["qledge", "task", ""])) == sorted(names(task))


def test_task_and_run_ids_come_from_the_daemon():
    d = DaemonProcess().start()
    try:
        assert d.cli("task", "add", "hello", "--", "true").returncode == 0
        started = d.cli("run", "start", "hello", "--json")
        assert started.returncode == 0, started.stderr
        import json

        run_id = json.loads(started.stdout)["id"]
        assert complete(["qledge", "--home", d.home, "run", "start", "he"]) == ["hello"]
        assert complete(["qledge", "run", "get", ""], env(QLEDGE_HOME=d.home)) == [run_id]
        assert complete(["qledge", "--home", d.home, "run", "log", run_id[:4]]) == [run_id]
    finally:
        d.cleanup()


def test_listing_without_a_daemon_prints_nothing_and_succeeds(home):
    done = subprocess.run([sys.executable, "-m", "edge", "completion", "--list", "tasks", "--home", home],
                          capture_output=True, text=True, timeout=60, env=env())
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_listing_from_a_daemon_that_does_not_answer_gives_up_quietly():
    home = short_tmpdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.path.join(home, "qledge.sock"))
        listener.listen(4)  # accepts into its backlog, never answers
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "edge", "completion", "--list", "runs", "--home", home],
                              capture_output=True, text=True, timeout=60, env=env())
        took = time.monotonic() - started
    finally:
        listener.close()
        shutil.rmtree(home, ignore_errors=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert took < 10  # the one-second timeout, with room for a loaded machine's start-up


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_scripts_are_valid_syntax(shell, tmp_path):
    text = script(shell)
    assert "qledge" in text and "completion --list" in text
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed here: only generated, not syntax-checked")
    path = tmp_path / f"qledge.{shell}"
    path.write_text(text)
    done = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr


def test_no_shell_named_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "edge", "completion"], capture_output=True, text=True,
                          timeout=60, env=env())
    assert done.returncode == 2 and "name a shell" in done.stderr


def test_fish_completes_from_the_same_parser():
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed here")
    program = ('qledge completion fish | source; complete -C "qledge ta"; echo @@; complete -C "qledge task g";'
               ' echo @@; complete -C "qledge token create --role o"')
    done = subprocess.run(["fish", "--no-config", "-c", program], capture_output=True, text=True, timeout=60,
                          env=env())
    assert done.returncode == 0 and not done.stderr, done.stderr
    nouns, verbs, roles = (
        [line.split("\t")[0] for line in part.strip().splitlines()] for part in done.stdout.split("@@\n"))
    assert nouns == ["task"] and verbs == ["get"] and roles == ["operator", "owner"]
