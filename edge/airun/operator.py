"""The operator's loop: one request per round until the model answers without tool calls.

Each round: build the request from the whole conversation (trimming the oldest tool results
if it would not fit the context window), check every budget against it, send it (retrying
what may pass, with backoff, each retry checked again), read the reply, report the round to
the daemon before anything else happens, then run the tool calls it asked for (at most the
per-round limit; the rest are answered as refused) and keep their results as data.

The loop knows the model, the tools and the daemon only through small interfaces (`Model`,
edge.airun.tools `Toolbox` and `Reporter`). Specialists (edge.airun.specialists) add their
tools beside the daemon's, and send their requests through `consult`: the same budgets,
retries, accounting and reports as the operator's own rounds, numbered in one sequence.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from edge.airun.budget import Budget, estimate_tokens
from edge.airun.prompt import Conversation, ToolResult, new_marker
from edge.airun.provider import ProviderError, Reply, ToolCall, parse
from edge.airun.specialists import Refused, Specialists
from edge.airun.tools import DaemonGone, Reporter, ToolFailure, Toolbox
from edge.core.excerpt import normalize
from edge.core.agent import (
    EVIDENCE_TEXT_MAX,
    PROFILES,
    ROUND_TOOLS_MAX,
    UNKNOWN_TOOL,
    AgentJob,
    BudgetName,
    OutcomeReport,
    RoundMeta,
    SpecialistRound,
    wire_name,
    wire_names,
)

RETRY_AFTER_MAX_S = 30.0


class Model(Protocol):
    def send(self, body: bytes, timeout_s: float) -> bytes:
        """One request body out, the body of a successful reply back; raises ProviderError."""
        ...


class Stop(Exception):
    """The run ends without an answer; `code` becomes the run's error code, `hint` (one line
    of what to change) follows the message in the log and the run's summary."""

    def __init__(self, code: str, message: str, budget: BudgetName | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.budget = budget
        self.hint = hint


def _line(text: str, limit: int = EVIDENCE_TEXT_MAX) -> str:
    return " ".join(normalize(text).split())[:limit]


class Operator:
    def __init__(
        self, job: AgentJob, model: Model, tools: Toolbox, reporter: Reporter, budget: Budget,
        sleep: Callable[[float], None] = time.sleep, specialists: Specialists | None = None,
    ) -> None:
        self.job = job
        self.model = model
        self.tools = tools
        self.reporter = reporter
        self.budget = budget
        self.specialists = specialists
        self._sleep = sleep
        self._offered = [*tools.offered(), *(specialists.offered() if specialists is not None else [])]
        self._names = {t.name for t in self._offered}
        # Offered under wire names (the daemon refused to start on a clash), mapped back on return.
        self._wire = wire_names(sorted(self._names))
        self._real = {wire: name for name, wire in self._wire.items()}
        self.profile = PROFILES.get(job.provider.provider, PROFILES["generic"])
        self._markers: set[str] = set()

    def main(self, out: TextIO) -> int:
        """Run to the end: the answer (or one line saying why there is none) goes to `out`,
        the run's log; the outcome to the daemon. Returns the exit code."""
        try:
            answer = self.answer()
        except Stop as stop:
            return self.fail(out, stop)
        except Exception as exc:  # a defect here: one line in the log, not a traceback
            return self.fail(out, Stop("agent_error", f"{type(exc).__name__}: {exc}"[:400]))
        out.write(answer.rstrip("\n") + "\n")
        out.flush()
        self._report(OutcomeReport(outcome="succeeded", answer_summary=_line(answer)))
        return 0

    def fail(self, out: TextIO, stop: Stop) -> int:
        """End without an answer: one line to the log (and one of what to change, when known),
        the outcome to the daemon."""
        out.write(f"qledge agent: {stop.code}: {stop.message}\n")
        if stop.hint:
            out.write(f"qledge agent: to fix: {stop.hint}\n")
        out.flush()
        exhausted = stop.code == "budget_exhausted"
        why = f"{stop.message} (to fix: {stop.hint})" if stop.hint else stop.message
        self._report(OutcomeReport(outcome="budget_exhausted" if exhausted else "failed", error_code=stop.code,
                                   budget=stop.budget, message=_line(why)))
        return 2 if exhausted else 1

    def _report(self, report: OutcomeReport) -> None:
        with contextlib.suppress(ToolFailure, DaemonGone):  # the runner records the exit either way
            self.reporter.outcome(report)

    def _unmarked(self, text: str) -> str:
        for marker in self._markers:
            text = text.replace(marker, " ")
        return text

    def answer(self) -> str:
        job = self.job
        conversation = Conversation(job.instruction, self._offered, job.limits.tool_calls_per_round, self.profile,
                                    self._wire)
        while True:
            number = self.budget.rounds + 1  # specialists' rounds count in the same sequence
            reply, request_tokens = self._send(lambda: self._body(conversation), number)
            self._account(number, reply, request_tokens)
            conversation.add_reply(reply)
            if not reply.tool_calls:
                answer = self._unmarked(reply.content).strip()
                if not answer:
                    raise Stop("empty_answer", "the model ended without an answer")
                return answer
            for index, call in enumerate(reply.tool_calls):
                conversation.add_result(ToolResult(call.id, self._call(index, call, number)))

    def consult(self, body: bytes, max_output: int, meta: SpecialistRound) -> tuple[int, Reply]:
        """A specialist's request as a round of this run (edge.airun.specialists.Consult)."""
        number = self.budget.rounds + 1
        key = f"specialist:{meta.child}"
        refused = self.budget.refuse(number, self.budget.estimate(key, len(body)), max_output)
        if refused is not None:
            raise Refused(refused[0], f"{refused[0]} budget exhausted: {refused[1]}; the request was not sent")
        reply, tokens = self._send(lambda: body, number, max_output, key)
        self._account(number, reply, tokens, meta)
        return number, reply

    def _body(self, conversation: Conversation) -> bytes:
        provider = self.job.provider
        while True:
            marker = new_marker()
            self._markers.add(marker)
            body = conversation.body(provider.model, provider.max_tokens_param, provider.max_output_tokens, marker)
            if estimate_tokens(len(body)) + provider.max_output_tokens <= provider.context_window_tokens:
                return body
            if not conversation.trim_oldest():
                raise Stop("context_window_exceeded", (
                    f"the request needs about {estimate_tokens(len(body)):,} tokens plus {provider.max_output_tokens:,}"
                    f" for the reply; the context window is {provider.context_window_tokens:,}"))

    def _send(self, build: Callable[[], bytes], number: int, max_output: int | None = None,
              conversation: str = "operator") -> tuple[Reply, int]:
        provider, budget = self.job.provider, self.budget
        attempts = 1 + provider.retries
        for attempt in range(1, attempts + 1):
            body = build()  # every operator request gets a marker of its own
            tokens = budget.estimate(conversation, len(body))
            refused = budget.refuse(number, tokens, max_output)
            if refused is not None:
                raise Stop("budget_exhausted", f"{refused[0]} budget exhausted: {refused[1]}", budget=refused[0])
            timeout = min(provider.request_timeout_s, budget.remaining_s())
            try:
                reply = self._resolved(parse(self.model.send(body, timeout), number))
                budget.counted(conversation, len(body), reply.prompt_tokens)
                return reply, tokens
            except ProviderError as exc:
                if exc.code == "provider_timeout" and timeout < provider.request_timeout_s:
                    raise Stop("budget_exhausted", "wall_clock budget exhausted: the provider had not answered",
                               budget="wall_clock") from None
                tried = f" (after {attempt} attempts)" if attempt > 1 else ""
                delay = exc.retry_after_s if exc.retry_after_s is not None else 2.0 ** (attempt - 1)
                if not exc.retryable or attempt == attempts or not 0 <= delay <= RETRY_AFTER_MAX_S:
                    raise Stop(exc.code, exc.message + tried, hint=exc.hint) from None
                if delay >= budget.remaining_s():
                    raise Stop(exc.code, exc.message + tried + "; no time left to retry", hint=exc.hint) from None
                self._sleep(delay)
        raise AssertionError("unreachable")

    def _resolved(self, reply: Reply) -> Reply:
        """Each call mapped back to the tool it names (its wire name; the tool's own name is
        taken too), and the name it is passed back under: a wire name whatever was sent."""
        for call in reply.tool_calls:
            call.tool = self._real.get(call.name) or (call.name if call.name in self._names else None)
            call.wire = self._wire[call.tool] if call.tool is not None else wire_name(call.name or UNKNOWN_TOOL)
        return reply

    def _account(self, number: int, reply: Reply, request_tokens: int, specialist: SpecialistRound | None = None
                 ) -> None:
        estimated = reply.prompt_tokens is None or reply.completion_tokens is None
        input_tokens = request_tokens if reply.prompt_tokens is None else reply.prompt_tokens
        output_tokens = reply.completion_tokens
        if output_tokens is None:
            output_tokens = estimate_tokens(reply.body_bytes)
        self.budget.charge(input_tokens, output_tokens, estimated)
        plan = None
        if reply.tool_calls and specialist is None:
            first = next((line for line in self._unmarked(reply.content).splitlines() if line.strip()), "")
            plan = _line(first) or None
        meta = RoundMeta(
            round=number, model=_line(reply.model or self.job.provider.model, 128) or self.job.provider.model,
            input_tokens=input_tokens, output_tokens=output_tokens, usage_estimated=estimated,
            response_chars=len(reply.content) + sum(len(c.arguments_json) for c in reply.tool_calls),
            # Names the model made up are not kept: the evidence holds offered names only. A
            # specialist is offered none: whatever it asks for is never called, nor recorded.
            tools=[] if specialist is not None else [
                c.tool if c.tool is not None else UNKNOWN_TOOL for c in reply.tool_calls[:ROUND_TOOLS_MAX]],
            plan=plan, specialist=specialist,
        )
        try:
            self.reporter.round(meta)
        except ToolFailure as exc:
            if exc.code == "unauthenticated":
                raise Stop("agent_revoked", "the run's credential was revoked: the run is ending") from None
        except DaemonGone as exc:
            raise Stop("daemon_unreachable", str(exc)) from None

    def _call(self, index: int, call: ToolCall, number: int) -> Any:
        limit = self.job.limits.tool_calls_per_round
        if index >= limit:
            return {"error": {"code": "refused", "message": f"at most {limit} tool calls per round; ask again"}}
        if call.tool is None:
            return {"error": {"code": "unknown_tool", "message": f"there is no tool {call.name[:64]!r} here"}}
        if call.arguments is None:
            return {"error": {"code": "invalid_argument", "message": "the arguments must be a JSON object"}}
        try:
            if self.specialists is not None and self.specialists.handles(call.tool):
                return self.specialists.call(call.tool, call.arguments, number, call.id, self)
            return self.tools.call(call.tool, call.arguments)
        except ToolFailure as exc:
            if exc.code == "unauthenticated":
                raise Stop("agent_revoked", "the run's credential was revoked: the run is ending") from None
            return {"error": {"code": exc.code, "message": exc.message}}
        except DaemonGone as exc:
            raise Stop("daemon_unreachable", str(exc)) from None
