"""Tasks: a head row plus immutable revisions of a `qinglong/command@v1` spec."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import msgspec

from edge.core.text import EnvName, Name

SPEC_SCHEMA = "qinglong/command@v1"
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


Command = ArgvCommand | ShellCommand


class SecretRef(msgspec.Struct, forbid_unknown_fields=True):
    """An environment value taken from the secret store at run time."""

    secret: Name


EnvValue = Annotated[str, msgspec.Meta(max_length=16384, pattern=r"^[^\x00]*$")] | SecretRef


class TaskSpec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True):
    command: Command
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
        return "argv" if isinstance(self.spec.command, ArgvCommand) else "shell"


_canonical = msgspec.json.Encoder(order="sorted")


def content_digest(spec: msgspec.Struct) -> str:
    """SHA-256 of the canonical JSON of a spec: equal specs, equal digests."""
    return "sha256:" + hashlib.sha256(_canonical.encode(spec)).hexdigest()
