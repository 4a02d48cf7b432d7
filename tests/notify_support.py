"""Real loopback servers standing in for the notification services, and a way to run the
real sender child on a job."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import msgspec

from edge.notify.channels import Delivery, Facts, Job, Result, job_encoder, render, result_decoder, spec_decoder
from edge.notify.dispatch import _BOOT, _ROOT


class Recorded(msgspec.Struct):
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Loopback:
    """An HTTP(S) server on 127.0.0.1 that records every request and answers with the next
    queued reply (status, JSON body), else 200 with `default`."""

    def __init__(self, default: Any = None, tls: tuple[str, str] | None = None) -> None:
        self.requests: list[Recorded] = []
        self.replies: list[tuple[int, Any, dict[str, str]]] = []
        self.default = default if default is not None else {}
        self.arrived = threading.Event()
        self.received = threading.Event()  # a request came in (before it is answered)
        self.delay = 0.0  # seconds before each answer
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                server.requests.append(Recorded(self.command, self.path, dict(self.headers.items()), body))
                server.received.set()
                time.sleep(server.delay)
                status, payload, headers = server.replies.pop(0) if server.replies else (200, server.default, {})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                server.arrived.set()

            do_POST = do_GET = do_PUT = do_PATCH = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, count: int = 1, timeout: float = 20.0) -> list[Recorded]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.requests

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def self_signed(directory: str) -> tuple[str, str] | None:
    """A certificate for 127.0.0.1 and its key, made by the openssl command (None without it)."""
    if shutil.which("openssl") is None:
        return None
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def message(event: str = "failure", **kw: Any) -> Any:
    facts = Facts(channel="c", event=event, device="router", task="backup", task_id="backup",
                  run_id="01a2b3c4-d5e6-7000-8000-000000000000", status="failed", exit_code=3, duration_ms=1500,
                  detail="exited with code 3", log="line 1\nline 2", **kw)
    return render(facts, "en")


def run_sender(specs: list[dict[str, Any]], secrets: dict[str, str] | None = None, timeout_s: float = 5.0,
               now_ms: int = 1_700_000_000_000, msg: Any = None) -> list[Result]:
    """The real sender child (as the notifier starts it) on one delivery per spec."""
    deliveries = [Delivery(id=i + 1, channel=f"c{i}", spec=spec_decoder.decode(json.dumps(spec)),
                           secrets=dict(secrets or {}), message=msg or message(), now_ms=now_ms)
                  for i, spec in enumerate(specs)]
    job = job_encoder.encode(Job(timeout_s=timeout_s, deliveries=deliveries))
    done = subprocess.run([sys.executable, "-I", "-c", _BOOT.format(root=_ROOT)], input=job, capture_output=True,
                          timeout=60, env={})
    assert done.returncode == 0, done.stderr
    return [result_decoder.decode(line) for line in done.stdout.splitlines()]


def tmpdir() -> str:
    return tempfile.mkdtemp(prefix="qln", dir="/tmp")


class TunnelProxy:
    """An HTTP proxy on 127.0.0.1 that knows CONNECT only: it records each request line and
    then relays bytes both ways, as a proxy in front of an HTTPS service does."""

    def __init__(self) -> None:
        import socket

        self.lines: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: Any) -> None:
        import socket

        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        self.lines.append(line)
        method, target, _ = line.split(" ", 2)
        if method != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            client.close()
            return
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=10)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

        def pump(src: Any, dst: Any) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
        pump(client, upstream)

    def close(self) -> None:
        self.sock.close()
