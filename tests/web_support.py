"""A real `qledge web` beside a real daemon, and what the browser tests share."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

READY_TIMEOUT_S = 20.0
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# What this closed network needs: without the background-networking flags Chromium's own
# connections are refused many at a time.
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--mute-audio"]


class WebProcess:
    """`python -m edge web --listen 127.0.0.1:0 …` (or the --listen in `args`) for a daemon; ready when
    it names its port."""

    def __init__(self, daemon: Any, args: list[str] | None = None, python: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.daemon = daemon
        self.stderr_path = os.path.join(daemon.home, "web.stderr")
        listen = [] if "--listen" in (args or []) else ["--listen", "127.0.0.1:0"]
        argv = [python or sys.executable, "-m", "edge", "web", *listen, *(args or [])]
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 (open while the panel runs)
        # nice: the machine's two cores are shared; the panel and the browser yield to others.
        self.proc = subprocess.Popen(["nice", "-n", "10", *argv], env={**daemon.env, **(env or {})},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            found = re.search(r"serving the panel on (https?)://([^/]+)/", self.stderr())
            if found:
                self.scheme, self.netloc = found.group(1), found.group(2)
                self.port = int(self.netloc.rpartition(":")[2])
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"qledge web did not start: {self.stderr()}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.netloc}/"

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    @property
    def pid(self) -> int:
        return self.proc.pid  # nice execs the panel: the same process

    def stderr(self) -> str:
        with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._err.close()
        return code

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            sent = {"Host": self.netloc, **(headers or {})}
            if data is not None and "Content-Type" not in sent:
                sent["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=sent)
            answer = conn.getresponse()
            return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
        finally:
            conn.close()

    def login(self, token: str) -> WebSession:
        status, headers, body = self.request("POST", "/api/login", {"token": token}, {"Origin": self.origin})
        assert status == 200, (status, body)
        cookie = headers["set-cookie"].split(";", 1)[0]
        return WebSession(self, cookie, json.loads(body)["csrf"])


class WebSession:
    """A signed-in client speaking to the panel as its page does (cookie, CSRF token, Origin)."""

    def __init__(self, web: WebProcess, cookie: str, csrf: str) -> None:
        self.web, self.cookie, self.csrf = web, cookie, csrf

    def call(self, tool: str, args: Any = None, csrf: str | None = None, origin: str | None = None
             ) -> tuple[int, Any]:
        """csrf None: the session's token; "": none sent."""
        headers = {"Cookie": self.cookie, "Origin": origin or self.web.origin}
        if csrf != "":
            headers["X-CSRF-Token"] = self.csrf if csrf is None else csrf
        status, _, body = self.web.request("POST", f"/api/call/{tool}", args or {}, headers)
        return status, json.loads(body)


def chromium_available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER) and shutil.which("nice") is not None
