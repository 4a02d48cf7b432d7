"""A real loopback HTTP(S) server speaking chat-completions, standing in for a provider:
scripted replies in order, every request recorded (path, headers, decoded body).

A script step is a reply body (dict), a `Step` (status, delay, raw bytes, headers, a hang),
or a callable taking the recorded `Request` and returning either (to answer with what the
conversation holds, e.g. a run id from an earlier tool result).
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


@dataclass
class Step:
    body: Any = None  # a dict (sent as JSON) or bytes (sent as they are)
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


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
              calls: list[tuple[str, Any]] | None = None) -> dict[str, Any]:
    """A reply asking for tool calls (`calls` for several); finish_reason is left `stop` on
    purpose: tool calls are recognized by their presence."""
    wanted = calls or [(name, arguments or {})]
    tool_calls = []
    for index, (tool, args) in enumerate(wanted):
        call: dict[str, Any] = {"type": "function", "function": {
            "name": tool, "arguments": args if as_object else json.dumps(args)}}
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
    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.script: list[Any] = []
        self.requests: list[Request] = []
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
                with provider._lock:
                    provider.requests.append(request)
                    step = provider.script.pop(0) if provider.script else Step(
                        {"error": {"message": "the test script has no more replies"}}, status=500)
                if callable(step):
                    step = step(request)
                if not isinstance(step, Step):
                    step = Step(step)
                if step.delay_s == float("inf"):
                    provider.release.wait(120)
                elif step.delay_s:
                    time.sleep(step.delay_s)
                data = step.body if isinstance(step.body, bytes) else json.dumps(step.body).encode()
                request.handled_s = time.monotonic() - started
                request.response_bytes = len(data)
                try:
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
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
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


Script = Callable[[dict[str, Any]], Any]
