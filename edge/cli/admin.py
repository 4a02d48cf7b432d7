"""The daemon's own nouns: `qledge status`, `qledge call` (any tool, raw JSON), `qledge token …`
(API credentials), `qledge secret …` (values for task environments, never shown) and
`qledge audit` (the security audit log). Their tools live together in the daemon too
(edge.tools.builtin.status and .credentials).

`qledge status` is what a person or a script runs to see that the daemon is there, so it
starts like a shell tool: its reply is read without msgspec (edge.transports.client's `raw`
and `decode`), and decoded as the daemon's Status Struct only for --json or when the reply
is not what this version reads; the two print the same (tests/test_cli.py).
"""

from __future__ import annotations

import sys

from edge.cli import shared
from edge.cli.shared import EXIT_OK, UsageError, Verb, show

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from edge.core.auth import AuditEntry, Credential
    from edge.tools.builtin.status import Status
    from edge.transports.client import Client


# -- qledge status ----------------------------------------------------------------------


def _status_lines(s: Status) -> list[tuple[str, object]]:
    counts = s.counts
    return [
        ("qledge", f"{s.version} (pid {s.pid}, up {shared.duration(0, int(s.uptime_s * 1000))})"),
        ("loop", s.loop + (" (ssl loaded)" if s.ssl_loaded else " (ssl not loaded)")),
        ("memory", f"{shared.size(s.rss_bytes)} RSS, {shared.size(s.hwm_bytes)} peak,"
                   f" {shared.size(s.rss_anon_bytes)} anon"),
        ("modules", s.module_count), ("database", f"{s.db_path} ({shared.size(s.db_bytes)})"),
        ("project", s.project),
        ("tasks", f"{counts.tasks} tasks, {counts.triggers} triggers, {counts.credentials} credentials"),
        ("runs", f"{counts.runs} stored, {counts.active_runs} active"),
        ("written", _written(s)),
        *sorted(s.extra.items()),
    ]


# The count starts with the daemon (creating or converting the database included): a daily
# rate from the first minutes says more about the start than about the days that follow.
RATE_AFTER_S = 3600


def _written(s: Status) -> str:
    since = f"{shared.size(s.written_bytes)} since start"
    if s.uptime_s < RATE_AFTER_S:
        return f"{since} (a daily rate after {shared.span(RATE_AFTER_S)} up)"
    return (f"{since}, about {shared.size(s.written_bytes_per_day)} a day at the rate of the last"
            f" {shared.span(s.uptime_s, units=2)}")


class _Fields:
    """A reply read as plain values, attribute by attribute, with the types and defaults of
    the Struct it stands for: what `_status_lines` reads of edge.tools.builtin.status.Status
    (and its Counts), each field by its wire name. A missing field or one of another type is
    `_Mismatch`: the caller then decodes the reply as the Struct, which says what is wrong."""

    # field: (wire name, type, default; ... for required)
    SHAPES: dict[str, dict[str, tuple[str, type, object]]] = {
        "Status": {
            "version": ("version", str, ...), "pid": ("pid", int, ...), "uptime_s": ("uptimeS", float, ...),
            "loop": ("loop", str, ...), "ssl_loaded": ("sslLoaded", bool, ...), "rss_bytes": ("rssBytes", int, ...),
            "hwm_bytes": ("hwmBytes", int, ...), "rss_anon_bytes": ("rssAnonBytes", int, ...),
            "module_count": ("moduleCount", int, ...), "db_path": ("dbPath", str, ...),
            "db_bytes": ("dbBytes", int, ...), "project": ("project", str, ...), "counts": ("counts", dict, ...),
            "written_bytes": ("writtenBytes", int, 0), "written_bytes_per_day": ("writtenBytesPerDay", int, 0),
            "extra": ("extra", dict, {}),
        },
        "Counts": {
            "tasks": ("tasks", int, ...), "triggers": ("triggers", int, ...), "runs": ("runs", int, ...),
            "active_runs": ("activeRuns", int, ...), "credentials": ("credentials", int, ...),
        },
    }

    def __init__(self, shape: str, value: object) -> None:
        if not isinstance(value, dict):
            raise _Mismatch
        self._shape = self.SHAPES[shape]
        self._value = value

    def __getattr__(self, field: str) -> object:
        wire, kind, default = self._shape[field]
        found = self._value.get(wire, default)
        if kind is float and type(found) is int:
            found = float(found)  # msgspec takes an int for a float too
        if type(found) is not kind:  # a required field missing (...) too
            raise _Mismatch
        if field == "counts":
            return _Fields("Counts", found)
        if isinstance(found, dict) and field == "extra" and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
            raise _Mismatch
        return found


class _Mismatch(ValueError):
    """The reply is not what the plain reading expects."""


def status(c: Client, a: argparse.Namespace) -> int:
    from edge.transports.client import decode

    if a.json:
        from edge.tools.builtin import status as status_tools

        found = c.typed("qledge.status", status_tools.StatusArgs(), status_tools.Status)
        return show(a, found, lambda s: None)
    raw = c.raw("qledge.status")
    try:
        # A stand-in for the Status it reads, attribute by attribute.
        lines = _status_lines(_Fields("Status", decode(raw)))  # type: ignore[arg-type]
    except ValueError:  # the typed decode says what is wrong with it, in one line
        from edge.tools.builtin import status as status_tools

        lines = _status_lines(c.decoded("qledge.status", raw, status_tools.Status))
    shared.fields(lines)
    return EXIT_OK


# -- qledge call --------------------------------------------------------------------------


def call(c: Client, a: argparse.Namespace) -> int:
    """Untyped on purpose: any tool, any JSON args, whatever JSON the tool returned."""
    import msgspec

    try:
        args = msgspec.json.decode(a.args) if a.args else {}
    except msgspec.DecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    shared.json_out(c.call(a.tool, args))
    return EXIT_OK


def _call_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("tool", metavar="TOOL")
    p.add_argument("--args", metavar="JSON", help="arguments as a JSON object")


# -- qledge token -------------------------------------------------------------------------


def token_create(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import credentials as credential_tools

    args = credential_tools.CreateArgs(role=a.role, name=a.name or None, permissions=a.permission or None)
    created = c.typed("qledge.credential.create", args, credential_tools.Created)

    def human(v: credential_tools.Created) -> None:
        print(v.token)
        print(f"credential {v.credential.id} ({v.credential.role}): store this token now;"
              " it cannot be shown again", file=sys.stderr)

    return show(a, created, human)


def _credential_state(x: Credential) -> str:
    return "revoked " + shared.when(x.revoked_at_ms) if x.revoked_at_ms else "active"


def token_list(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import credentials as credential_tools
    from edge.tools.definition import Empty

    creds = c.typed("qledge.credential.list", Empty(), credential_tools.CredentialList).credentials
    hidden = 0 if a.all else sum(1 for x in creds if x.revoked_at_ms)
    if not a.all:
        creds = [x for x in creds if not x.revoked_at_ms]
    if a.json:
        shared.json_out(creds)
        return EXIT_OK
    if creds:
        shared.table(
            [[x.id, x.name, x.role, ",".join(x.permissions) if x.permissions else "-", shared.when(x.created_at_ms),
              _credential_state(x)] for x in creds],
            ["ID", "NAME", "ROLE", "PERMISSIONS", "CREATED", "STATE"],
        )
    elif not hidden:
        print("no credentials")
    if hidden:
        print(f"({hidden} revoked not shown: qledge token list --all)")
    return EXIT_OK


def token_revoke(c: Client, a: argparse.Namespace) -> int:
    from edge.core.auth import Credential
    from edge.tools.builtin import credentials as credential_tools

    # The daemon takes a whole token for its id and never says it back; neither does this.
    revoked = c.typed("qledge.credential.revoke", credential_tools.RevokeArgs(id=a.id), Credential)
    return show(a, revoked, lambda x: print(f"credential {x.id} ({x.name}) revoked"))


def _create_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", required=True, choices=("owner", "operator", "viewer"))
    p.add_argument("--name")
    p.add_argument("--permission", action="append", metavar="P",
                   help="restrict to this permission (repeatable; an unknown one is refused with the list)")


def _list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all", action="store_true", help="revoked ones too")


def _revoke_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID")


# -- qledge secret ------------------------------------------------------------------------


def _read_secret(secret: str) -> str:
    """From a prompt on a terminal, else all of stdin minus one trailing newline."""
    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"value for secret {secret}: ")
        if value != getpass.getpass("again: "):
            raise UsageError("the two values differ; nothing was stored")
    else:
        raw = sys.stdin.buffer.read()
        try:
            value = raw.decode()
        except UnicodeDecodeError as exc:
            raise UsageError(f"the value on stdin is not UTF-8 text (byte {exc.start}); nothing was stored"
                             " (encode binary values, e.g. base64)") from None
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise UsageError("empty value; nothing was stored")
    return value


def secret_set(c: Client, a: argparse.Namespace) -> int:
    from edge.core.auth import SecretInfo
    from edge.tools.builtin import credentials as secret_tools

    info = c.typed("qledge.secret.set", secret_tools.SetArgs(name=a.name, value=_read_secret(a.name)), SecretInfo)
    return show(a, info, lambda s: print(f"secret {s.name} stored"))


def secret_list(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import credentials as secret_tools
    from edge.tools.definition import Empty

    found = c.typed("qledge.secret.list", Empty(), secret_tools.SecretList).secrets
    if a.json:
        shared.json_out(found)
    elif not found:
        print("no secrets")
    else:
        shared.table([[s.name, shared.when(s.created_at_ms), shared.when(s.updated_at_ms)] for s in found],
                     ["NAME", "CREATED", "UPDATED"])
    return EXIT_OK


def secret_rm(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import credentials as secret_tools

    done = c.typed("qledge.secret.delete", secret_tools.NameArgs(name=a.name), secret_tools.Deleted)
    return show(a, done, lambda d: print(f"secret {d.name} deleted"))


def _secret_named(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")


# -- qledge audit -----------------------------------------------------------------------


def audit(c: Client, a: argparse.Namespace) -> int:
    from edge.tools.builtin import credentials as credential_tools
    from edge.transports.client import CallFailed

    entries: list[AuditEntry] = []
    before: int | None = None
    while len(entries) < a.limit:
        args = credential_tools.AuditArgs(since_ms=shared.plain(a.since), before=before,
                                          limit=min(64, a.limit - len(entries)))
        try:
            page = c.typed("qledge.audit.list", args, credential_tools.AuditList)
        except CallFailed as exc:
            if exc.code == "permission_denied":
                raise CallFailed(exc.code, exc.message + " (the audit is for owners)") from None
            raise
        entries += page.entries
        before = page.next
        if before is None:
            break
    if a.json:
        shared.json_out(entries)
        return EXIT_OK
    if not entries:
        print("no audit rows" + (" since then" if a.since else ""))
        return EXIT_OK
    shared.table(
        [[shared.when(e.at_ms), e.principal, e.tool, e.outcome,
          ", ".join(r for r in e.reasons if not r.startswith("tool_")) or "-", e.transport, _calls(e)]
         for e in entries],
        ["TIME", "WHO", "TOOL", "OUTCOME", "WHY", "VIA", "CALLS"],
    )
    return EXIT_OK


def _calls(e: AuditEntry) -> str:
    """1, or for an aggregate of refused calls how many and until when (TIME is the first)."""
    if e.count <= 1 or e.last_at_ms is None:
        return str(e.count)
    return f"{e.count} until {shared.when(e.last_at_ms)}"


def _audit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=shared.bounded_int("--limit", 1, 1000), default=20, metavar="N",
                   help="how many rows (1..1000, default 20)")
    p.add_argument("--since", type=shared.time_arg("--since"), metavar="WHEN",
                   help="only rows from then on: a duration back from now (30m, 12h, 7d) or a date/time")


VERBS = {
    "status": Verb("status", status),
    "call": Verb("call", call, options=_call_options),
    "audit": Verb("audit", audit, options=_audit_options),
    "token": (
        Verb("create", token_create, "create a credential; prints its token once", _create_options),
        Verb("list", token_list, "list credentials", _list_options),
        Verb("revoke", token_revoke, "revoke a credential (by id, or by the whole token)", _revoke_options),
    ),
    "secret": (
        Verb("set", secret_set, "store a secret; the value is read from stdin or a prompt, never argv"
             " (at most 16384 characters, no NUL)", _secret_named),
        Verb("list", secret_list, "list secret names and dates"),
        Verb("rm", secret_rm, "delete a secret", _secret_named),
    ),
}
