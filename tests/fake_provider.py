"""A real loopback HTTP(S) server speaking chat-completions, standing in for a provider of one
family (OpenAI, DeepSeek, Qwen/DashScope, Gemini's OpenAI-compatible endpoint, Ollama /v1,
llama.cpp server, vLLM): scripted replies in order, every request recorded (path, headers,
decoded body), and every request checked first against what that family refuses
(tests/conformance.py, whose docstring cites each rule's source). A refused request gets the
family's own status and error body, is recorded in `refused` (with the family named), and the
tests' fixtures fail on any refusal they did not ask for.

A script step is a reply body (dict), a `Step` (status, delay, raw bytes, headers, a hang, a
drip), or a callable taking the recorded `Request` and returning either (to answer with what
the conversation holds, e.g. a run id from an earlier tool result). Replies are shaped as the
family sends them (Gemini's empty call ids, DeepSeek's reasoning_content in thinking mode).
The helpers name tools as a model does: by the wire names it was offered.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from conformance import FAMILIES, MODELS, Family, family, tokens
from edge.core.agent import wire_name

__all__ = ["FAMILIES", "MODELS"]


@dataclass
class Step:
    body: Any = None  # a dict (sent as JSON) or bytes (sent as they are)
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    drip_s: float = 0.0  # > 0: the headers and body are sent one byte at a time, this far apart


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes
    received_at: float
    handled_s: float = 0.0  # how long the server spent on it (delays included)
    response_bytes: int = 0


def usage(prompt: int = 100, completion: int = 20) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tool_call(name: str, arguments: Any = None, *, call_id: str | None = "call_1", as_object: bool = False,
              content: str | None = "Plan: look at the runs.", usage_: dict | None = None, extra: dict | None = None,
              calls: list[tuple[str, Any]] | None = None, raw_names: bool = False) -> dict[str, Any]:
    """A reply asking for tool calls (`calls` for several), each named by its wire name as a
    model offered the tool would (`raw_names`: exactly as given); finish_reason is left `stop`
    on purpose: tool calls are recognized by their presence."""
    wanted = calls or [(name, arguments or {})]
    tool_calls = []
    for index, (tool, args) in enumerate(wanted):
        call: dict[str, Any] = {"type": "function", "function": {
            "name": tool if raw_names or not tool else wire_name(tool),
            "arguments": args if as_object else json.dumps(args)}}
        if call_id is not None:
            call["id"] = f"{call_id}_{index}" if len(wanted) > 1 else call_id
        tool_calls.append(call)
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": tool_calls, **(extra or {})}
    reply: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "model": "test-model",
                             "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    if usage_ is not False:
        reply["usage"] = usage_ or usage()
    return reply


def answer(text: str, *, usage_: dict | None | bool = None, extra: dict | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": text, **(extra or {})}
    reply: dict[str, Any] = {"id": "chatcmpl-2", "object": "chat.completion", "model": "test-model",
                             "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    if usage_ is not False:
        reply["usage"] = usage_ or usage()
    return reply


class FakeProvider:
    """`family` (tests/conformance.FAMILIES) decides what is refused and how replies look;
    `model` is the one the tests configure (MODELS[family] unless given); `flags` are the
    server's (e.g. jinja=False for a llama-server started without --jinja, auto_tool_choice=False
    for vLLM without its flags, n_ctx / max_model_len / num_ctx for the context it serves)."""

    def __init__(self, tls: tuple[str, str] | None = None, family: str = "openai", model: str | None = None,
                 **flags: Any) -> None:
        self.family: Family = _family(family, model, **flags)
        self.model = self.family.model
        self.script: list[Any] = []
        self.requests: list[Request] = []
        self.refused: list[str] = []  # "<family>: <why>" for each request the family refused
        self.truncated: list[int] = []  # Ollama: prompts cut to num_ctx without an error (their token counts)
        self._lock = threading.Lock()
        self.release = threading.Event()  # ends every hanging step
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                started = time.monotonic()
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {}
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw, started)
                refusal = provider.family.refuse(body, raw) if self.path.endswith("/chat/completions") else None
                with provider._lock:
                    provider.requests.append(request)
                    if refusal is not None:
                        provider.refused.append(f"{provider.family.name}: {refusal.why}")
                        step = Step(refusal.body, status=refusal.status)
                    else:
                        step = provider.script.pop(0) if provider.script else Step(
                            {"error": {"message": "the test script has no more replies"}}, status=500)
                        num_ctx = provider.family.flags.get("num_ctx")
                        if num_ctx is not None and tokens(raw) > num_ctx:
                            provider.truncated.append(tokens(raw))
                if callable(step):
                    step = step(request)
                if not isinstance(step, Step):
                    step = Step(step)
                if refusal is None and step.status == 200 and isinstance(step.body, dict):
                    step.body = provider.family.shape(json.loads(json.dumps(step.body)), body)
                if step.delay_s == float("inf"):
                    provider.release.wait(120)
                elif step.delay_s:
                    time.sleep(step.delay_s)
                data = step.body if isinstance(step.body, bytes) else json.dumps(step.body).encode()
                request.handled_s = time.monotonic() - started
                request.response_bytes = len(data)
                try:
                    if step.drip_s:
                        head = (f"HTTP/1.1 {step.status} OK\r\nContent-Type: application/json\r\n"
                                f"Content-Length: {len(data)}\r\n\r\n").encode()
                        for byte in head + data:
                            if provider.release.is_set():
                                return
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(step.drip_s)
                        return
                    self.send_response(step.status)
                    for key, value in step.headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client went away (timed out, killed)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        host = "localhost" if tls else "127.0.0.1"
        self.url = f"{scheme}://{host}:{self.server.server_address[1]}/v1"
        # Polled every 50 ms for shutdown (the default 0.5 s is half a second on every close).
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def add(self, *steps: Any) -> FakeProvider:
        with self._lock:
            self.script.extend(steps)
        return self

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def self_signed(directory: str) -> tuple[str, str]:
    """A certificate for `localhost` and its key, made with the openssl command."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def _family(name: str, model: str | None, **flags: Any) -> Family:
    return family(name, model, **flags)


Script = Callable[[dict[str, Any]], Any]
