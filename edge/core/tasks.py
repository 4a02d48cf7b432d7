"""Tasks: a head row plus immutable revisions of a `qinglong/command@v1` spec."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec

from edge.core.text import EnvName, Name

SPEC_SCHEMA = "qinglong/command@v1"

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

Overlap = Literal["forbid", "allow", "replace"]
_Arg = Annotated[str, msgspec.Meta(max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]


class ArgvCommand(msgspec.Struct, tag="argv", tag_field="kind", forbid_unknown_fields=True):
    file: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")]
    args: Annotated[list[_Arg], msgspec.Meta(max_length=MAX_ARGS)] = []


class ShellCommand(msgspec.Struct, tag="shell", tag_field="kind", forbid_unknown_fields=True):
    command: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SHELL_CHARS, pattern=r"^[^\x00]*$")]
    shell: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ARG_CHARS, pattern=r"^[^\x00]*$")] = "/bin/sh"


Command = ArgvCommand | ShellCommand


class SecretRef(msgspec.Struct, forbid_unknown_fields=True):
    """An environment value taken from the secret store at run time."""

    secret: Name


EnvValue = Annotated[str, msgspec.Meta(max_length=MAX_ENV_VALUE_CHARS, pattern=r"^[^\x00]*$")] | SecretRef


class TaskSpec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    command: Command
    working_dir: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PATH_CHARS)] | None = None
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=MAX_ENV)] = {}
    timeout_ms: Annotated[int, msgspec.Meta(ge=MIN_TIMEOUT_MS, le=MAX_TIMEOUT_MS)] = DEFAULT_TIMEOUT_MS
    overlap: Overlap = "forbid"
    log_cap_bytes: Annotated[int, msgspec.Meta(ge=MIN_LOG_CAP, le=MAX_LOG_CAP)] | None = None


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
        return "argv" if isinstance(self.spec.command, ArgvCommand) else "shell"


_canonical = msgspec.json.Encoder(order="sorted")


def content_digest(spec: msgspec.Struct) -> str:
    """SHA-256 of the canonical JSON of a spec: equal specs, equal digests."""
    return "sha256:" + hashlib.sha256(_canonical.encode(spec)).hexdigest()
