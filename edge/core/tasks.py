"""Tasks: a head row plus immutable revisions of a spec: `qinglong/command@v1` (a command
to run) or `qinglong/agent@v1` (an instruction for the AI operator, whose `command` is
`{kind: agent, instruction, budget?, profile?}`; the command spec's JSON is unchanged by
it; an AI task names no user, group, working directory or environment)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Annotated, Literal

import msgspec

from edge.core.errors import ToolError, conflict, unavailable
from edge.core.ids import sha256
from edge.core.schedule import Misfire
from edge.core.text import Account, EnvName, Label, Name

SPEC_SCHEMA = "qinglong/command@v1"
AGENT_SPEC_SCHEMA = "qinglong/agent@v1"
INSTRUCTION_MAX = 2000

# Every limit of a task spec, named once: the types below enforce them, and the CLI states
# them (in its own units and flags) in its messages and its --help.
DEFAULT_TIMEOUT_MS = 3_600_000  # an hour: a hung job must not hold a slot forever
MIN_TIMEOUT_MS = 1000
MAX_TIMEOUT_MS = 7 * 86_400_000
MAX_ARGS = 256  # arguments after the program
MAX_ARG_CHARS = 4096  # each argument, and the program's path
MAX_SHELL_CHARS = 16384  # a --shell command
MAX_ENV = 128  # environment entries
MAX_ENV_VALUE_CHARS = 16384
MIN_LOG_CAP = 4096
MAX_LOG_CAP = 1 << 30
MAX_PATH_CHARS = 4096  # the working directory
DATA_DIR = "@data"  # as a working directory: the task's own data directory (TaskUsers.for_task)

Overlap = Literal["forbid", "allow", "replace"]
_Arg = Annotated[str, msgspec.Meta(max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]


class ArgvCommand(msgspec.Struct, tag="argv", tag_field="kind", forbid_unknown_fields=True):
    file: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]
    args: Annotated[list[_Arg], msgspec.Meta(max_length=MAX_ARGS)] = []


class ShellCommand(msgspec.Struct, tag="shell", tag_field="kind", forbid_unknown_fields=True):
    command: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SHELL_CHARS, pattern=r"^[^\x00]*$")]
    shell: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")] = "/bin/sh"


class AgentBudget(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """Per-task budget overrides; each is lowered to its configured maximum at run time."""

    rounds: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    input_tokens: Annotated[int, msgspec.Meta(ge=1, le=10**9)] | None = None
    output_tokens: Annotated[int, msgspec.Meta(ge=1, le=10**9)] | None = None
    cost_usd: Annotated[float, msgspec.Meta(ge=0, le=10_000)] | None = None
    wall_clock_s: Annotated[int, msgspec.Meta(ge=1, le=86_400)] | None = None


class AgentInstruction(msgspec.Struct, tag="agent", tag_field="kind", forbid_unknown_fields=True,
                       omit_defaults=True):
    """What an AI task does: an instruction for the operator, run in a child process."""

    instruction: Annotated[str, msgspec.Meta(min_length=1, max_length=INSTRUCTION_MAX, pattern=r"^[^\x00]*$")]
    budget: AgentBudget | None = None
    profile: Name | None = None  # an [agent.profiles.NAME] of the config; None: the [agent] defaults


Command = ArgvCommand | ShellCommand


class SecretRef(msgspec.Struct, forbid_unknown_fields=True):
    """An environment value taken from the secret store at run time."""

    secret: Name


EnvValue = Annotated[str, msgspec.Meta(max_length=MAX_ENV_VALUE_CHARS, pattern=r"^[^\x00]*$")] | SecretRef
# The runner sets these in every run (QLEDGE_RUN_ID is the marker crash recovery finds a
# run's processes by); a task may not set or override them.
RESERVED_ENV_PREFIX = "QLEDGE_"

MAX_RETRIES = 10
MAX_RETRY_DELAY_S = 86_400  # a day: a retry further off is a new schedule, not a retry


class RetryPolicy(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """A failed or timed-out run is run again, up to `count` times: the n-th retry
    `delay_s * backoff**(n-1)` seconds after the run it retries ended, at most `max_delay_s`."""

    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_RETRIES)]
    delay_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_RETRY_DELAY_S)] = 60.0
    backoff: Annotated[float, msgspec.Meta(ge=1, le=10)] = 1.0
    max_delay_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_RETRY_DELAY_S)] | None = None


# What a notification rule reacts to: `failure` (a failed or timed-out run that is not
# retried), `recovery` (the first success after a failure), `success`, `lost` (the daemon
# stopped while the run was active), `skipped` (a fire or retry that did not become a run),
# `every` (every run that ends).
NotifyEvent = Literal["failure", "recovery", "success", "lost", "skipped", "every"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("failure", "recovery", "success", "lost", "skipped", "every")
DEFAULT_NOTIFY_ON: tuple[NotifyEvent, ...] = ("failure", "recovery")


class NotifyRule(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """Send a message to each of `channels` when one of `on` happens."""

    channels: Annotated[list[Name], msgspec.Meta(min_length=1, max_length=16)]
    on: Annotated[list[NotifyEvent], msgspec.Meta(min_length=1, max_length=6)] = msgspec.field(
        default_factory=lambda: list(DEFAULT_NOTIFY_ON))


# The most telling event first: a channel two rules name gets one message, labelled so.
_NOTICE_ORDER: tuple[NotifyEvent, ...] = ("recovery", "failure", "lost", "skipped", "success", "every")


def run_notices(status: str, retrying: bool, was_failing: bool) -> frozenset[NotifyEvent]:
    """What the end of a run is, for notification rules: a failure only when no retry
    follows it; a success after a final failure is also a recovery."""
    kinds: set[NotifyEvent] = {"every"}
    if status == "succeeded":
        kinds.add("success")
        if was_failing:
            kinds.add("recovery")
    elif status in ("failed", "timed_out") and not retrying:
        kinds.add("failure")
    elif status == "lost":
        kinds.add("lost")
    return frozenset(kinds)


def notice_targets(rules: list[NotifyRule], kinds: frozenset[NotifyEvent] | set[NotifyEvent]) -> dict[str, str]:
    """Channel → the event its one message is about (`finished` when only `every` matched)."""
    chosen: dict[str, int] = {}
    for rule in rules:
        matched = [i for i, kind in enumerate(_NOTICE_ORDER) if kind in kinds and kind in rule.on]
        if matched:
            for channel in rule.channels:
                chosen[channel] = min(chosen.get(channel, len(_NOTICE_ORDER)), matched[0])
    return {ch: "finished" if _NOTICE_ORDER[i] == "every" else _NOTICE_ORDER[i] for ch, i in chosen.items()}


class TaskSpec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    command: ArgvCommand | ShellCommand | AgentInstruction
    working_dir: Annotated[
        str, msgspec.Meta(min_length=1, max_length=MAX_PATH_CHARS, pattern=r"^[^\x00]*$")] | None = None
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=MAX_ENV)] = {}
    timeout_ms: Annotated[int, msgspec.Meta(ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)] = DEFAULT_TIMEOUT_MS
    overlap: Overlap = "forbid"
    log_cap_bytes: Annotated[int, msgspec.Meta(ge=MIN_LOG_CAP, le=MAX_LOG_CAP)] | None = None
    # Who the run is: the user (and group; default the user's own) the runner switches to
    # before exec. None only in revisions written before tasks named one: the daemon's user.
    user: Account | None = None
    group: Account | None = None
    retry: RetryPolicy | None = None
    # None: the project's default rules; []: no notifications for this task.
    notify: Annotated[list[NotifyRule], msgspec.Meta(max_length=8)] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.command, AgentInstruction):
            given = [name for name, value in (("user", self.user), ("group", self.group),
                                              ("workingDir", self.working_dir), ("env", self.env)) if value]
            if given:
                raise ValueError(f"an AI task takes no {given[0]}: its runs are the daemon's [agent] user,"
                                 " with no environment of their own")
        for key in self.env:
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"environment variable {key}: names starting with {RESERVED_ENV_PREFIX} are"
                                 " set by qledge and cannot be given")

    def secrets(self) -> list[str]:
        """The names of the secrets its environment references."""
        return sorted({v.secret for v in self.env.values() if isinstance(v, SecretRef)})


class RunAs(msgspec.Struct, frozen=True, kw_only=True):
    """Who a task's runs are, resolved from its spec on this system (edge.core.ports.runtime.TaskUsers)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, set before exec
    switch: bool  # False: the run keeps the daemon's own user (a non-root daemon cannot switch)
    privileged: str | None  # why running as this needs task.privileged ("runs as root"); None: it does not
    data_dir: str | None = None  # for a run (TaskUsers.for_task): its task's data directory
    home: str | None = None  # set when `uid` is the task's own ([runner] dynamic_uids): its HOME


def next_uid(start: int, low: int, high: int, unavailable: set[int] | frozenset[int]) -> int:
    """The first uid from `start` to `high`, then from `low`, not in `unavailable`."""
    start = start if low <= start <= high else low
    for uid in itertools.chain(range(start, high + 1), range(low, start)):
        if uid not in unavailable:
            return uid
    raise ToolError("resource_exhausted", f"every uid of [runner] dynamic_uids ({low}-{high}) is taken: widen the"
                    " range, or delete tasks that use secrets")


class Task(msgspec.Struct, rename="camel"):
    id: str
    project_id: str
    name: str
    revision: int
    enabled: bool
    spec: TaskSpec
    content_digest: str
    created_at_ms: int
    updated_at_ms: int
    # The revision was written by a holder of task.privileged: only then may it run privileged.
    privileged: bool = False

    @property
    def kind(self) -> str:
        return kind(self.spec)


class TaskRef(msgspec.Struct, frozen=True):
    """A task named by id, for a manual start: the revision admitted is the one current
    in the admission's own transaction (read there, not before it)."""

    project_id: str
    id: str


def kind(spec: TaskSpec) -> str:
    """`argv`, `shell` or `agent`: the tag of the spec's command."""
    command = spec.command
    return "argv" if isinstance(command, ArgvCommand) else "shell" if isinstance(command, ShellCommand) else "agent"


def spec_schema(spec: TaskSpec) -> str:
    """The schema a revision is stored under: an agent instruction makes it `qinglong/agent@v1`."""
    return AGENT_SPEC_SCHEMA if isinstance(spec.command, AgentInstruction) else SPEC_SCHEMA


def unknown_schema(what: str, schema: object) -> ToolError:
    """A stored revision under a schema this qledge does not know (or not its spec's): it fails closed."""
    shown = repr(schema)[:80] if isinstance(schema, str) else type(schema).__name__
    return unavailable(f"storage holds a {what} revision under spec schema {shown}, which this qledge does not"
                       " know; nothing is returned")


def stored_spec(schema: object, raw: str | bytes) -> TaskSpec:
    """A stored task spec, only when stored under its own schema."""
    try:
        spec = _stored.decode(raw)
    except msgspec.DecodeError:
        raise unknown_schema("task", schema) from None
    if schema != spec_schema(spec):
        raise unknown_schema("task", schema)
    return spec


# What a name holding a credential would contain; a plain name never loads edge.core.redaction.
_SUSPECT = re.compile(
    r"[:@=/?&%+\\'\"]|pass|pwd|secret|token|key|auth|bearer|basic|cookie|session|sig|cred|[\w+/-]{16}|密|令牌|口令",
    re.IGNORECASE)


def redact_label(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` (a name) masked as run logs are: credential forms and the `secrets` values."""
    values = [s for s in secrets if len(s) >= 3]
    if _SUSPECT.search(text) is None and not any(v in text for v in values):
        return text
    from edge.core.redaction import Masker, apply, merge  # only for a name that may hold one

    found = Masker(values).spans(text, cut_at_end=False)
    return apply(text, merge(found)) if found else text


_NAMED = 5  # triggers a refusal names; the count covers the rest


def has_triggers(task_id: str, trigger_ids: list[str]) -> ToolError:
    """The refusal of deleting a task that has triggers without saying they go too (every
    TaskStore says it the same way: how many, and the first few by name)."""
    names = ", ".join(trigger_ids[:_NAMED]) + (", …" if len(trigger_ids) > _NAMED else "")
    what = "1 trigger" if len(trigger_ids) == 1 else f"{len(trigger_ids)} triggers"
    return conflict(f"task {task_id!r} has {what} ({names}), which would be deleted with it")


_canonical = msgspec.json.Encoder(order="sorted")
_stored = msgspec.json.Decoder(TaskSpec)


def content_digest(spec: msgspec.Struct) -> str:
    """SHA-256 of the canonical JSON of a spec: equal specs, equal digests."""
    return "sha256:" + sha256(_canonical.encode(spec)).hexdigest()


# -- imports (crond, qinglong): the shapes the daemon stores; the planning is edge.core.imports

ImportKey = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9:._@-]+$")]
MAX_TRIGGERS = 32


class ImportTrigger(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    expression: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    timezone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None  # None: the daemon's zone
    misfire: Misfire = "skip"
    enabled: bool = True


class ImportTask(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    """One task with its triggers, created together or not at all. `task_id` is a wish:
    when another task has it, the next free `<id>-2`, `<id>-3`… is taken."""

    key: ImportKey
    task_id: Name
    spec: TaskSpec
    name: Label | None = None
    enabled: bool = True
    triggers: Annotated[list[ImportTrigger], msgspec.Meta(max_length=MAX_TRIGGERS)] = []


class ImportedTask(msgspec.Struct, rename="camel", omit_defaults=True):
    """What an ImportTask did: `created`; `exists` (its key was on record: nothing new);
    `checked` (it would be created); `refused` (with the error)."""

    key: str
    status: Literal["created", "exists", "checked", "refused"]
    task_id: str
    trigger_ids: list[str] = []
    code: str | None = None
    message: str | None = None


SecretImport = Literal["created", "exists", "taken"]  # taken: a secret of that name was there, not imported


class ImportRecord(msgspec.Struct, rename="camel"):
    """An entry imported before: its key and what it became (a task id or a secret name)."""

    key: str
    kind: Literal["task", "secret"]
    target: str
    created_at_ms: int
