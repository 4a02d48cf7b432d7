"""`qledge agent check` in the child of its run: one request, the smallest that exercises tool
calling with the configured model, and a diagnosis in plain words.

The log gets one line per step, `qledge agent check: ok|failed: <step>: <what>`, a line
`qledge agent check: to fix: <what to change>` after a failure, and a last line `qledge agent
check: passed` or `qledge agent: <code>: <why>` (the run's error code). Each failure class has
a step name the CLI reports (`--json`): unreachable, tls, timeout, redirect, key, not_found,
reasoning_params, bad_request, rate_limited, server_error, malformed, no_tool_calls. The
round is reported like any, so the run's evidence record holds it.
"""

from __future__ import annotations

import contextlib
import time
from typing import TextIO

import msgspec

from edge.airun.budget import estimate_tokens
from edge.airun.operator import Model, Stop
from edge.airun.prompt import request_head
from edge.airun.provider import ProviderError, parse
from edge.airun.tools import DaemonGone, Reporter, ToolFailure
from edge.core.agent import PROFILES, AgentJob, OutcomeReport, RoundMeta, endpoint
from edge.core.excerpt import normalize
from edge import duration_text

CHECK_TOOL = "qledge_check"
PREFIX = "qledge agent check:"
_json = msgspec.json.Encoder()
SYSTEM = ("This request checks that tool calling works. Call the tool qledge_check once, with no arguments,"
          " and write nothing else.")


def request(job: AgentJob) -> bytes:
    provider = job.provider
    profile = PROFILES.get(provider.provider, PROFILES["generic"])
    body = request_head(provider.model, profile, provider.max_tokens_param, provider.max_output_tokens)
    body["messages"] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Call qledge_check."}]
    body["tools"] = [{"type": "function", "function": {
        "name": CHECK_TOOL, "description": "Says that tool calling works. Takes no arguments.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}]
    body["tool_choice"] = "auto"
    return _json.encode(body)


def failure_class(exc: ProviderError) -> str:
    """The check's name for what failed."""
    if exc.code != "provider_http":
        return {"provider_unreachable": "unreachable", "provider_tls": "tls", "provider_timeout": "timeout",
                "provider_redirect": "redirect"}.get(exc.code, "malformed")
    status = exc.status or 0
    if status in (401, 403):
        return "key"
    if status == 404:
        return "not_found"
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "server_error"
    if "max_completion_tokens" in exc.message or "enable_thinking" in exc.message:
        return "reasoning_params"
    return "bad_request"


class Check:
    def __init__(self, job: AgentJob, model: Model, reporter: Reporter) -> None:
        self.job = job
        self.model = model
        self.reporter = reporter

    def main(self, out: TextIO) -> int:
        """The steps to `out` (the run's log), the outcome to the daemon; the exit code."""
        provider = self.job.provider
        profile = PROFILES.get(provider.provider, PROFILES["generic"])
        target = endpoint(provider.base_url)
        where = target.where if target is not None else provider.base_url

        def say(status: str, step: str, text: str) -> None:
            out.write(f"{PREFIX} {status}: {step}: {text}\n")
            out.flush()

        say("ok", "configuration", f"{profile.label} (provider = \"{profile.name}\") at {where}, model"
            f" {provider.model}, replies bounded by {provider.max_tokens_param}")
        body = request(self.job)
        started = time.monotonic()
        try:
            data = self.model.send(body, provider.request_timeout_s)
            reply = parse(data, 1)
        except ProviderError as exc:
            kind = failure_class(exc)
            say("failed", kind, exc.message)
            hint = exc.hint or _FIX.get(kind)
            if hint:
                out.write(f"{PREFIX} to fix: {hint}\n")
            return self._end(out, Stop(exc.code, exc.message, hint=hint))
        say("ok", "connected", f"{where} answered in {duration_text((time.monotonic() - started) * 1000)}")
        self._round(reply.model, reply.prompt_tokens, reply.completion_tokens, len(body), reply.body_bytes,
                    len(reply.content))
        if reply.prompt_tokens is None:
            say("ok", "usage", "none reported: tokens will be estimated (one per two bytes) and the cost is unknown")
        else:
            say("ok", "usage", f"{reply.prompt_tokens} input and {reply.completion_tokens} output tokens reported")
        names = [c.name for c in reply.tool_calls]
        if CHECK_TOOL in names:
            say("ok", "tool calling", f"the model called {CHECK_TOOL}")
            out.write(f"{PREFIX} passed\n")
            out.flush()
            self._report(OutcomeReport(outcome="succeeded", answer_summary="the provider check passed"))
            return 0
        what = (f"the model called {names[0][:64]!r} instead of {CHECK_TOOL}" if names
                else "the model answered without calling the tool")
        say("failed", "no_tool_calls", f"{what}: {provider.model} may not support tool calling here")
        hint = _FIX["no_tool_calls"]
        out.write(f"{PREFIX} to fix: {hint}\n")
        return self._end(out, Stop("no_tool_calls", what, hint=hint))

    def _round(self, model: str | None, prompt: int | None, completion: int | None, sent: int, received: int,
               chars: int) -> None:
        estimated = prompt is None or completion is None
        name = " ".join(normalize(model or "").split())[:128] or self.job.provider.model
        meta = RoundMeta(round=1, model=name, usage_estimated=estimated,
                         input_tokens=estimate_tokens(sent) if prompt is None else prompt,
                         output_tokens=estimate_tokens(received) if completion is None else completion,
                         response_chars=chars)
        with contextlib.suppress(ToolFailure, DaemonGone):  # the diagnosis stands without its record
            self.reporter.round(meta)

    def _end(self, out: TextIO, stop: Stop) -> int:
        out.write(f"qledge agent: {stop.code}: {stop.message}\n")
        out.flush()
        why = f"{stop.message} (to fix: {stop.hint})" if stop.hint else stop.message
        self._report(OutcomeReport(outcome="failed", error_code=stop.code, message=" ".join(why.split())[:500]))
        return 1

    def _report(self, report: OutcomeReport) -> None:
        with contextlib.suppress(ToolFailure, DaemonGone):  # the runner records the exit either way
            self.reporter.outcome(report)


_FIX = {
    "unreachable": "check base_url's host and port, that the server runs, the network (under systemd the unit's"
                   " PrivateNetwork=yes keeps AI runs off it) and [agent] proxy",
    "tls": "the certificate is not trusted: set [agent] ca_file (OpenWrt: the ca-bundle package's"
           " /etc/ssl/certs/ca-certificates.crt), and check the device's clock",
    "timeout": "the provider did not answer within [agent] request_timeout_s: raise it, or check the server's load",
    "redirect": "set base_url to the address the provider answers on itself (redirects are never followed)",
    "malformed": "base_url must be the API root that serves /chat/completions (e.g. https://api.openai.com/v1)",
    "no_tool_calls": "choose a model that can call tools (Ollama: one under Tools; vLLM: start it with"
                     " --enable-auto-tool-choice and a --tool-call-parser; llama.cpp: --jinja)",
}
