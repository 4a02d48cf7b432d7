"""Shared by the AI operator's tests: a daemon configured against a scripted provider, and
helpers to start AI runs and read what the provider was sent."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fake_provider import FAMILIES, FakeProvider, Request
from support import DaemonProcess

def wire(name: str) -> str:
    from edge.core.agent import wire_name

    return wire_name(name)


READ_TOOLS = {
    "qinglong.task.list", "qinglong.task.get", "qinglong.trigger.list", "qinglong.run.list", "qinglong.run.get",
    "qinglong.run.events.list", "qinglong.run.compare", "qinglong.task.runs.compare", "qinglong.run.log.excerpt",
    "qinglong.agent.history.list", "qinglong.agent.history.get",
}
# The operator model's own specialist tools (handled in the child; never on MCP or the socket).
SPECIALIST_TOOLS = {"specialist.delegate", "specialist.correct", "specialist.revoke", "specialist.ask",
                    "specialist.items"}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def agent_config(provider: FakeProvider | None, extra: str = "", /, **keys: Any) -> str:
    """[agent] against `provider`: its family's profile (`provider = …`, as its host is a
    loopback address that names none) and its model, unless `keys` say otherwise."""
    defaults: dict[str, Any] = {"model": provider.model if provider else "test-model"}
    if provider is not None:
        defaults["provider"] = provider.family.name
    lines = ["[agent]", "enabled = true", f'base_url = "{provider.url if provider else "http://127.0.0.1:9/v1"}"',
             *(f"{k} = {toml_value(v)}" for k, v in {**defaults, **keys}.items())]
    return "\n".join(lines) + "\n" + extra


def tokens_key(provider: FakeProvider) -> str:
    """The field that bounds the reply in what this family's profile sends."""
    return "max_completion_tokens" if provider.family.name == "openai" else "max_tokens"


# For a `provider` fixture that makes `fake(request.param)` ("openai" when not parametrized):
# the test runs once against each family's fake.
EVERY_FAMILY = pytest.mark.parametrize("provider", FAMILIES, indirect=True)
# The model of docs/ai.md's DeepSeek example: DeepSeek's non-thinking mode (the family's own
# model in FAMILIES, deepseek-reasoner, thinks).
DEEPSEEK_CHAT = "deepseek:deepseek-chat"


def fake(param: str, **flags: Any) -> FakeProvider:
    """A fake of a family ("deepseek") or of a family and a model ("deepseek:deepseek-chat")."""
    family, _, model = param.partition(":")
    return FakeProvider(family=family, model=model or None, **flags)


def no_refusals(provider: FakeProvider) -> None:
    """Every request was one the family accepts: a refusal fails the test, naming the family."""
    assert not provider.refused, f"the {provider.family.name} fake refused: " + "; ".join(provider.refused)


def served(request: pytest.FixtureRequest) -> Iterator[FakeProvider]:
    """A `provider` fixture's body: a fake of the test's family (its parameter, `openai` when it
    has none), closed after the test, which fails if the fake refused any request."""
    provider = fake(getattr(request, "param", "openai"))
    yield provider
    provider.close()
    no_refusals(provider)


def ai_task(d: DaemonProcess, task_id: str, instruction: str = "Why did backup fail?", **budget: Any) -> dict:
    command: dict[str, Any] = {"kind": "agent", "instruction": instruction}
    if budget:  # snake_case here, camelCase on the wire
        command["budget"] = {re.sub(r"_(.)", lambda m: m.group(1).upper(), k): v for k, v in budget.items()}
    return d.call("qledge.task.create", {"taskId": task_id, "spec": {"command": command}})


def start_and_wait(d: DaemonProcess, task_id: str, timeout_s: float = 60.0) -> dict:
    run = d.call("qledge.run.start", {"taskId": task_id})
    return wait(d, run["id"], timeout_s)


def wait(d: DaemonProcess, run_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waited = d.call("qledge.run.wait", {"runId": run_id, "timeoutMs": 30_000})
        if waited["done"]:
            return waited["run"]
    raise AssertionError(f"run {run_id} did not finish")


def record(d: DaemonProcess, run_id: str) -> dict:
    found = d.call("qinglong.agent.history.get", {"runId": run_id})
    assert found["found"], found
    found["record"]["toolSequence"] = [name for r in found["record"]["perRound"] for name in r["tools"]]
    return found["record"]


def log(d: DaemonProcess, run_id: str) -> str:
    return bytes(d.call("qledge.run.log.read", {"runId": run_id})["data"]).decode()


def marker(request: Request) -> str:
    system = request.body["messages"][0]["content"]
    found = re.search(r"marker (\^[0-9a-f]{6}\^)", system)
    assert found, system
    return found.group(1)


def tool_messages(request: Request) -> list[dict[str, Any]]:
    return [m for m in request.body["messages"] if m["role"] == "tool"]


def unmarked(request: Request, content: str) -> Any:
    """A tool message's content with this request's marker turned back into spaces, as JSON."""
    return json.loads(content.replace(marker(request), " ").split("\n[qledge:", 1)[0])


def until(predicate: Any, timeout_s: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
