"""An independent check: `qledge ask` and an AI task replayed against a strict OpenAI-style
validator, configured with nothing but the AI guide's OpenAI example (its base_url pointed at
the validator, its key file made). The validator is written here from OpenAI's API reference
for chat completions (https://platform.openai.com/docs/api-reference/chat/create), on its
own: it shares no code with the conformance fakes (tests/conformance.py), so a rule both
got wrong the same way is less likely. Every request it refuses is answered as OpenAI does
(400, `{"error": {"message", "type": "invalid_request_error", "param", "code"}}`) and fails
the test."""

from __future__ import annotations

import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ai.md")

# The request body's fields (CreateChatCompletionRequest) and each message type's.
TOP = {"messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
       "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
       "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
       "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
       "top_logprobs", "top_p", "user", "verbosity", "web_search_options"}
ROLES = {"developer": {"content", "role", "name"}, "system": {"content", "role", "name"},
         "user": {"content", "role", "name"}, "tool": {"content", "role", "tool_call_id"},
         "assistant": {"role", "content", "refusal", "name", "audio", "tool_calls", "function_call"}}
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def violations(body: Any) -> list[str]:
    """Everything in one request body that the API reference does not allow."""
    found: list[str] = []
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    found += [f"unrecognized request argument {k!r}" for k in body if k not in TOP]
    if not isinstance(body.get("model"), str):
        found.append("model is required")
    if body.get("model", "").startswith(("o1", "o3", "o4", "gpt-5")) and "max_tokens" in body:
        found.append("max_tokens with a reasoning model")
    tools = body.get("tools", [])
    if len(tools) > 128:
        found.append("more than 128 tools")
    for tool in tools:
        fn = tool.get("function", {})
        if set(tool) - {"type", "function"} or tool.get("type") != "function":
            found.append(f"bad tool entry {tool!r:.80}")
        if not FUNCTION_NAME.match(fn.get("name", "")):
            found.append(f"function name {fn.get('name')!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
        if set(fn) - {"name", "description", "parameters", "strict"}:
            found.append(f"unknown function fields {sorted(set(fn) - {'name', 'description', 'parameters'})}")
        if not isinstance(fn.get("parameters", {}), dict) or fn.get("parameters", {}).get("type") != "object":
            found.append(f"parameters of {fn.get('name')!r} are not an object schema")
    names = {t.get("function", {}).get("name") for t in tools}
    if body.get("tool_choice") not in (None, "none", "auto", "required") and not isinstance(body["tool_choice"], dict):
        found.append("bad tool_choice")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*found, "messages must be a non-empty array"]
    open_calls: set[str] = set()
    answering = False
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            found.append(f"messages[{i}]: unknown role {role!r}")
            continue
        extra = set(message) - ROLES[role]
        if extra:
            found.append(f"messages[{i}]: additional properties {sorted(extra)}")
        content = message.get("content")
        calls = message.get("tool_calls") if role == "assistant" else None
        if content is None and not calls:
            found.append(f"messages[{i}]: content is null without tool_calls")
        if content is not None and not isinstance(content, (str, list)):
            found.append(f"messages[{i}]: content is neither a string nor parts")
        if role == "tool":
            if not answering or message.get("tool_call_id") not in open_calls:
                found.append(f"messages[{i}]: a tool message that answers no call of the preceding assistant message")
            open_calls.discard(message.get("tool_call_id"))
            continue
        if open_calls:
            found.append(f"messages[{i}]: tool calls {sorted(open_calls)} were not answered")
        open_calls, answering = set(), False
        for call in calls or ():
            fn = call.get("function", {})
            if call.get("type") != "function" or not call.get("id") or not isinstance(fn.get("arguments"), str):
                found.append(f"messages[{i}]: a tool call without id, type function and string arguments")
            if fn.get("name") not in names:
                found.append(f"messages[{i}]: a tool call of {fn.get('name')!r}, which is not offered")
            try:
                json.loads(fn.get("arguments", ""))
            except ValueError:
                found.append(f"messages[{i}]: arguments that are not JSON")
            open_calls.add(call.get("id"))
            answering = True
    if open_calls:
        found.append(f"tool calls {sorted(open_calls)} were not answered")
    return found


class Validator:
    """A loopback chat-completions server: validates, then answers from `replies` (callables
    of the request body, so an answer can use what the tools returned)."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.bodies: list[dict[str, Any]] = []
        self.refused: list[str] = []
        validator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                problems = violations(body) if self.path == "/v1/chat/completions" else [f"path {self.path}"]
                if self.headers.get("Authorization") != "Bearer sk-readme-example":
                    problems.append("no bearer key")
                if problems:
                    validator.refused += problems
                    status, reply = 400, {"error": {"message": problems[0], "type": "invalid_request_error",
                                                    "param": None, "code": None}}
                else:
                    validator.bodies.append(body)
                    status, reply = 200, validator.replies.pop(0)(body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(message: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1_700_000_000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "refusal": None, **message},
                         "logprobs": None, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}],
            "usage": {"prompt_tokens": 900 + n, "completion_tokens": 20, "total_tokens": 920 + n}}


def calling(name: str, arguments: dict[str, Any], n: int):
    """The model calls `name` as it was offered: the first offered name ending like it."""
    def reply(body: dict[str, Any]) -> dict[str, Any]:
        offered = [t["function"]["name"] for t in body["tools"]]
        wire = next(o for o in offered if o.replace("_", ".") == name or o == name.replace(".", "_"))
        return completion({"content": None, "tool_calls": [{"id": f"call_{n}abc", "type": "function", "function": {
            "name": wire, "arguments": json.dumps(arguments)}}]}, n)
    return reply


def readme_openai_example() -> str:
    """The AI guide's first configuration example, the OpenAI one, as it is printed."""
    with open(README) as f:
        text = f.read()
    section = text.split("## AI operator", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    example = block.split("# OpenAI\n", 1)[1].split("\n\n", 1)[0]
    assert example.startswith("[agent]\nenabled = true\n"), example
    return example


def test_ask_and_an_ai_task_pass_a_strict_openai_validator_with_the_readmes_example(home, daemon_factory):
    validator = Validator()
    key = os.path.join(home, "openai.key")
    with open(key, "w") as f:
        f.write("sk-readme-example\n")
    os.chmod(key, 0o600)
    example = readme_openai_example()
    config = re.sub(r'base_url = "[^"]*"', f'base_url = "{validator.url}"', example)
    config = re.sub(r'api_key_file = "[^"]*"', f'api_key_file = "{key}"', config)
    assert set(re.findall(r"^(\w+) =", config, re.M)) == {"enabled", "base_url", "model", "api_key_file"}
    try:
        d = daemon_factory(config=config + "\n").start()
        backup = "echo 'No space left on device'; exit 23"
        assert d.cli("task", "add", "backup", "--shell", "--", backup).returncode == 0
        assert d.cli("run", "start", "backup", "--wait").returncode == 1
        validator.replies += [
            calling("qinglong.task.runs.compare", {"taskId": "backup"}, 1),
            calling("specialist.ask", {"specialist": "log-analyst", "message": "exit 23: No space left"}, 2),
            lambda body: completion({"content": "the disk filled up (errno 28)."}, 3),  # the specialist's reply
            lambda body: completion({"content": "backup failed: the disk is full."}, 4),
        ]
        asked = d.cli("ask", "why did backup fail?", "--wait")
        assert asked.returncode == 0, (asked.stderr, validator.refused)
        assert asked.stdout == "backup failed: the disk is full.\n"
        validator.replies += [calling("qinglong.run.list", {"limit": 4}, 5),
                              lambda body: completion({"content": "one failure: backup."}, 6)]
        assert d.cli("agent", "add", "morning", "Say what failed last night").returncode == 0
        ran = d.cli("run", "start", "morning", "--wait")
        assert ran.returncode == 0, (ran.stdout, ran.stderr, validator.refused)
        assert validator.refused == [] and len(validator.bodies) == 6
        assert all(b["model"] == "gpt-4o-mini" for b in validator.bodies)
    finally:
        validator.close()
