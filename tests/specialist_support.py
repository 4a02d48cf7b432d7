"""Shared by the specialists' tests and benchmark: reading specialist requests out of what the
scripted provider recorded, and the scripted end-to-end mission (delegate, correct twice,
revoke one, a daemon killed mid-request and restarted, a retry)."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from agent_support import agent_config, tool_messages, unmarked, until, wait
from fake_provider import FakeProvider, Request, Step, answer, tool_call
from support import DaemonProcess

LA = "log-analyst"


def is_specialist(request: Request) -> bool:
    """Specialist requests are the ones offered no tools at all."""
    return "tools" not in request.body and "tool_choice" not in request.body


def specialist_requests(provider: FakeProvider) -> list[Request]:
    return [r for r in provider.requests if is_specialist(r)]


def system(request: Request) -> str:
    return request.body["messages"][0]["content"]


def conversation(request: Request) -> list[str]:
    """The contents after the system message: recent history, then the current message(s)."""
    return [m["content"] for m in request.body["messages"][1:]]


def constraint_lines(request: Request) -> list[str]:
    text = system(request)
    block = text.split("Active constraints (all in force):\n", 1)[1].split("\n\nOpen work items:", 1)[0]
    return block.splitlines()


def last_result(request: Request) -> Any:
    """The operator request's last tool result, unmarked."""
    return unmarked(request, tool_messages(request)[-1]["content"])


def ask(message: str, call_id: str, specialist: str = LA) -> dict:
    return tool_call("specialist.ask", {"specialist": specialist, "message": message}, call_id=call_id,
                     content=f"Plan: ask the {specialist}.")


def reply(text: str) -> dict:
    return answer(text)


def rows(d: DaemonProcess, sql: str, params: tuple = ()) -> list[tuple]:
    conn = d.db()
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


DELEGATION = "Only look at the backup task's runs; keep the answer to the root cause."
ITEM = "Find the failing step"
CORR_1 = "Compare the failed run with the last good one."
CORR_2 = "Compare only with the last good run of this week."
CORR_3 = "Also check the free disk space of /mnt/usb."


@dataclass
class Mission:
    first: DaemonProcess
    second: DaemonProcess
    run_1: str
    run_2: str
    retry_out: str
    ids: dict[str, str] = field(default_factory=dict)


def mission(daemon_factory: Any, provider: FakeProvider) -> Mission:
    """The end-to-end mission through `qledge ask`: attempt 1 delegates, corrects twice (the
    second replacing the first), adds a third correction and revokes it, asks twice, and dies
    with the daemon (kill -9) while its third question is with the specialist; the restarted
    daemon has it `lost`; `qledge agent retry` runs attempt 2, which asks twice and answers."""
    ids: dict[str, str] = {}

    def remember(name: str, step: Any) -> Any:
        def run(request: Request) -> Any:
            ids[name] = last_result(request)["constraint"]["id"]
            return step(request) if callable(step) else step
        return run

    provider.add(
        tool_call("specialist.delegate", {"specialist": LA, "instruction": DELEGATION, "workItems": [
                      {"text": ITEM, "acceptance": "names the command and exit code"}]},
                  call_id="call_d1", content="Plan: hand the log reading to the log analyst."),
        remember("delegation", tool_call("specialist.correct", {"specialist": LA, "text": CORR_1},
                                         call_id="call_c1")),
        remember("corr_1", ask("ASK-1: backup run 7 failed, log: rsync: write failed: No space left on device (28)",
                               "call_a1")),
        reply("REPLY-1: the disk is full; rsync exited 23 after errno 28."),
        lambda req: tool_call("specialist.correct", {"specialist": LA, "text": CORR_2, "replaces": ids["corr_1"]},
                              call_id="call_c2"),
        remember("corr_2", tool_call("specialist.correct", {"specialist": LA, "text": CORR_3}, call_id="call_c3")),
        remember("corr_3", lambda req: tool_call("specialist.revoke", {"constraintId": ids["corr_3"]},
                                                 call_id="call_r3")),
        ask("ASK-2: the last good run of this week is run 5 (exit 0, 2.1 GB copied).", "call_a2"),
        reply("REPLY-2: run 5 copied 2.1 GB; run 7 stopped at 1.9 GB: the disk filled up."),
        ask("ASK-3-PENDING: what should the owner free first?", "call_a3"),
        Step(reply("never delivered"), delay_s=float("inf")),
    )
    first = daemon_factory(config=agent_config(provider)).start()
    asked = first.cli("ask", "why did the backup fail last night?", "--json")
    assert asked.returncode == 0, asked.stderr
    run_1 = json.loads(asked.stdout)["id"]
    until(lambda: len(specialist_requests(provider)) == 3, timeout_s=60, what="the third specialist request")
    first.stop(signal.SIGKILL)  # mid-request: the message it carried was never consumed
    provider.add(
        ask("ASK-4: after the restart, what should the owner free first?", "call_a4"),
        reply("REPLY-4: free /mnt/usb first: the old snapshots take 1.5 GB."),
        ask("ASK-5: and how much room does the next backup need?", "call_a5"),
        reply("REPLY-5: about 2.2 GB."),
        answer("The backup failed because /mnt/usb filled up (rsync errno 28); free the old snapshots first."),
    )
    second = daemon_factory(home=first.home, config=agent_config(provider)).start()
    lost = wait(second, run_1)
    assert lost["status"] == "lost", lost
    retried = second.cli("agent", "retry", run_1, "--wait")
    assert retried.returncode == 0, retried.stderr
    found = re.search(r"run (\S+) queued: attempt 2 of mission (\S+)", retried.stderr)
    assert found is not None and found.group(2) == run_1, retried.stderr
    return Mission(first=first, second=second, run_1=run_1, run_2=found.group(1), retry_out=retried.stdout, ids=ids)
