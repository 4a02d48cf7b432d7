"""Tasks: a head row plus immutable revisions of a spec: `qinglong/command@v1` (a command
to run) or `qinglong/agent@v1` (an instruction for the AI operator, whose `command` is
`{kind: agent, instruction, budget?, profile?}`; the command spec's JSON is unchanged by
it). Also what the runner hands the child of an AI run (AgentJob)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec

from edge.core.text import EnvName, Name

SPEC_SCHEMA = "qinglong/command@v1"
AGENT_SPEC_SCHEMA = "qinglong/agent@v1"
INSTRUCTION_MAX = 2000
DEFAULT_TIMEOUT_MS = 3_600_000  # an hour: a hung job must not hold a slot forever
MAX_TIMEOUT_MS = 7 * 86_400_000

Overlap = Literal["forbid", "allow", "replace"]
_Arg = Annotated[str, msgspec.Meta(max_length=4096, pattern=r"^[^\x00]*$")]


class ArgvCommand(msgspec.Struct, tag="argv", tag_field="kind", forbid_unknown_fields=True):
    file: Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^[^\x00]*$")]
    args: Annotated[list[_Arg], msgspec.Meta(max_length=256)] = []


class ShellCommand(msgspec.Struct, tag="shell", tag_field="kind", forbid_unknown_fields=True):
    command: Annotated[str, msgspec.Meta(min_length=1, max_length=16384, pattern=r"^[^\x00]*$")]
    shell: Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern=r"^[^\x00]*$")] = "/bin/sh"


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


EnvValue = Annotated[str, msgspec.Meta(max_length=16384, pattern=r"^[^\x00]*$")] | SecretRef


class TaskSpec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    command: ArgvCommand | ShellCommand | AgentInstruction
    working_dir: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=128)] = {}
    timeout_ms: Annotated[int, msgspec.Meta(ge=1000, le=MAX_TIMEOUT_MS)] = DEFAULT_TIMEOUT_MS
    overlap: Overlap = "forbid"
    log_cap_bytes: Annotated[int, msgspec.Meta(ge=4096, le=1 << 30)] | None = None


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

    @property
    def kind(self) -> str:
        return kind(self.spec)


def kind(spec: TaskSpec) -> str:
    """`argv`, `shell` or `agent`: the tag of the spec's command."""
    command = spec.command
    return "argv" if isinstance(command, ArgvCommand) else "shell" if isinstance(command, ShellCommand) else "agent"


def spec_schema(spec: TaskSpec) -> str:
    """The schema a revision is stored under: an agent instruction makes it `qinglong/agent@v1`."""
    return AGENT_SPEC_SCHEMA if isinstance(spec.command, AgentInstruction) else SPEC_SCHEMA


_canonical = msgspec.json.Encoder(order="sorted")


def content_digest(spec: msgspec.Struct) -> str:
    """SHA-256 of the canonical JSON of a spec: equal specs, equal digests."""
    return "sha256:" + hashlib.sha256(_canonical.encode(spec)).hexdigest()
