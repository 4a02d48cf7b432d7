"""The documentation as a reader meets it: the README a front page, every link inside the docs
pointing somewhere, the generated parts in sync with the code, no project history in the
user's pages, and every `qledge …` example of the docs' shell blocks run against one real
daemon (placeholders filled in, network targets on loopback)."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
import shutil
import sys

import pytest

from notify_support import TelegramApi
from qinglong_fixture import make_data_dir
from support import DaemonProcess, short_tmpdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(glob.glob("docs/*.md", root_dir=ROOT)), *sorted(glob.glob("docs/reference/*.md",
                                                                                       root_dir=ROOT))]
SHELL_BLOCKS = ("sh", "shell", "bash", "console")

# Examples that cannot run against a test daemon here, each with why (kept small; every entry
# must still be an example of the docs).
SKIP = {
    'qledge ask "why did backup fail last night?" --wait': "needs an AI provider (tests/test_agent_openai_replay.py "
                                                          "runs the operator against a strict loopback one)",
    "qledge agent get 01a2319d-…": "names a run of the reader's own history",
    "qledge web": "serves until stopped (tests/test_web_panel.py starts the panel)",
    "qledge web --listen 0.0.0.0:5700 --tls-cert /etc/qledge/web.crt --tls-key /etc/qledge/web.key "
    "--allow-host router.lan": "listens on the LAN with the router's certificate",
}


def _docs():
    spec = importlib.util.spec_from_file_location("qledge_docs", os.path.join(ROOT, "packaging", "docs.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(text: str) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#{1,6} (.*)$", _outside_fences(text), re.M)}


# -- structure --------------------------------------------------------------------------------


def test_the_readme_is_a_front_page_and_the_rest_is_in_docs_by_reader():
    readme = _read("README.md")
    assert readme.count("\n") <= 250
    for page in ("guide", "migrate", "security", "ai", "cluster", "install-openwrt", "install-systemd", "performance",
                 "reference/cli", "reference/configuration", "reference/tools", "reference/errors"):
        assert f"docs/{page}.md" in PAGES, page
        assert f"](docs/{page}.md)" in readme or page.startswith("reference/") and f"]({page[10:]}.md)" in readme, page


def test_every_link_between_the_pages_points_somewhere():
    broken = []
    for page in PAGES:
        text = _outside_fences(_read(page))
        here = os.path.dirname(page)
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)
        for target in targets:
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = os.path.normpath(os.path.join(here, path)) if path else page
            if not os.path.exists(os.path.join(ROOT, file)):
                broken.append(f"{page}: {target} (no {file})")
            elif anchor and (not file.endswith(".md") or anchor not in _anchors(_read(file))):
                broken.append(f"{page}: {target} (no heading #{anchor} in {file})")
    assert broken == []


def test_the_pages_speak_of_the_users_world():
    said = [f"{page}: {m.group(0)}" for page in PAGES
            for m in re.finditer(r"\b(seed \d+|decision \d+|issue #?\d+|review)\b", _read(page), re.I)]
    assert said == []


def test_the_generated_parts_are_what_the_code_generates():
    docs = _docs()
    for name in docs.PARTS:
        path, text = docs.rendered(name)
        assert _read(path) == text, f"{path} is out of date: run {docs.COMMAND}"


def test_the_generated_files_and_sentences_are_what_the_code_generates():
    """The files made whole (the bash completion) and the flash figures the OpenWrt
    configuration quotes, from the measured ones."""
    docs = _docs()
    for path, make in docs.FILES.items():
        assert _read(path) == make(), f"{path} is out of date: run {docs.COMMAND}"
    for path in docs.SENTENCES:
        assert _read(path) == docs.sentenced(path), f"{path} is out of date: run {docs.COMMAND}"


def test_the_cli_reference_has_every_command_of_the_parser():
    import argparse

    from edge.cli.main import build_parser

    reference = _read("docs/reference/cli.md")

    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += [f"{path} {name}", *walk(sub, f"{path} {name}")]
        return found

    commands = walk(build_parser(), "qledge")
    assert {"qledge task add", "qledge notify add", "qledge serve"} <= set(commands)
    assert [c for c in commands if f"### `{c}`" not in reference] == []


def test_the_configuration_table_has_every_key_with_its_type_and_default():
    table = _read("docs/reference/configuration.md")
    assert "| `[runner] concurrency` | integer 1..64 | 2 |" in table
    assert "| `[store] exclusive_lock` | boolean | false (OpenWrt: on) |" in table
    assert "| `loop` | `asyncio` \\| `auto` \\| `uvloop` | `auto` |" in table


# -- the examples -----------------------------------------------------------------------------


def _examples() -> list[tuple[str, str]]:
    """(where, command) of every `qledge …` line of a shell block, in reading order, and of the
    notification channels' table (one `qledge notify add` per kind)."""
    found = []
    for page in PAGES:
        text = _read(page)
        for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if block.group(1) not in SHELL_BLOCKS:
                continue
            line = text[:block.start()].count("\n") + 2
            body = block.group(2).replace("\\\n", " ")
            prompted = any(row.startswith("$ ") for row in body.splitlines())
            for offset, row in enumerate(body.splitlines()):
                if prompted and not row.startswith("$ "):
                    continue  # output
                command = row.removeprefix("$ ").split("  #", 1)[0].strip()
                if command.startswith("qledge "):
                    found.append((f"{page}:{line + offset}", " ".join(command.split())))
        for number, row in enumerate(text.splitlines(), 1):
            cell = re.match(r"^\| `\w+` \| `(qledge notify add [^`]+)` \|", row)
            if cell:
                found.append((f"{page}:{number}", cell.group(1)))
    return found


TG_TOKEN = "123456:doc-example"
CRONTAB = "*/5 * * * * /usr/bin/true\n0 3 * * * echo nightly\n"


@pytest.fixture(scope="module")
def world():
    """One daemon (the AI operator configured, its provider never reached), a strict
    Telegram stand-in, a crontab and a qinglong install, for all the examples."""
    scratch = short_tmpdir()
    key = os.path.join(scratch, "provider.key")
    with open(key, "w") as f:
        f.write("sk-doc-example\n")
    os.chmod(key, 0o600)
    config = ("[agent]\nenabled = true\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"doc-model\"\n"
              f"api_key_file = \"{key}\"\n")
    daemon = DaemonProcess(config=config).start()
    telegram = TelegramApi(TG_TOKEN)
    crontab = os.path.join(scratch, "root.crontab")
    with open(crontab, "w") as f:
        f.write(CRONTAB)
    qinglong = make_data_dir(os.path.join(scratch, "ql"))
    yield {"daemon": daemon, "telegram": telegram, "crontab": crontab, "qinglong": qinglong}
    telegram.close()
    daemon.cleanup()
    shutil.rmtree(scratch, ignore_errors=True)


def _filled(command: str, world) -> tuple[list[str], str | None]:
    """The example's argv (without `qledge`) with its placeholders filled, and its stdin."""
    argv = shlex.split(command)[1:]
    if argv[:2] == ["notify", "add"] and argv[3:4] == ["telegram"]:
        argv += ["--set", f"baseUrl={world['telegram'].url}"]  # the Bot API on loopback
    if argv[:2] == ["import", "crontab"] and all(a.startswith("--") for a in argv[2:]):
        argv.insert(2, world["crontab"])  # busybox's /etc/crontabs/root, here
    if argv[:2] == ["import", "qinglong"]:
        argv[2] = world["qinglong"]  # a qinglong install's data directory, here
    stdin = TG_TOKEN + "\n" if argv[:2] == ["secret", "set"] else None
    return argv, stdin


def test_skips_are_examples_of_the_docs():
    commands = {command for _, command in _examples()}
    assert [s for s in SKIP if s not in commands] == []


def test_every_example_of_the_docs_runs(world):
    daemon = world["daemon"]
    examples = [(where, command) for where, command in _examples() if command not in SKIP]
    assert len(examples) >= 30
    named = r'--secret \w+=(\w+)|"secret": "(\w+)"'
    secrets = {name for _, command in examples for pair in re.findall(named, command) for name in pair if name}
    for secret in sorted(secrets):
        daemon.call("qledge.secret.set", {"name": secret, "value": TG_TOKEN if secret == "TG_TOKEN" else "doc-value"})
    failed = []
    for where, command in examples:
        argv, stdin = _filled(command, world)
        done = daemon.cli(*argv, input=stdin)
        if done.returncode != 0:
            failed.append(f"{where}: {command}\n  -> exit {done.returncode}: {done.stderr.strip()}")
    assert failed == [], "\n".join(failed)
    # `qledge notify test phone` reached the (strict) Bot API with the chat id as typed.
    sent = [r.json() for r in world["telegram"].requests]
    assert any(body["chat_id"] == "123456789" for body in sent), sent


if __name__ == "__main__":
    for where, command in _examples():
        print(where, command, f"  (skipped: {SKIP[command]})" if command in SKIP else "", file=sys.stdout)
