"""The child of an AI run: `... -c "...main()" --job-fd N --tool-fd M`, started by the daemon's runner.

It reads its job (the run's credential included) from the inherited descriptor N and closes
it, reads the provider's key from `api_key_file` (which must be 0600), loads every module it
will need, and only then becomes the job's user (`[agent] user`, when the daemon can switch
users): before it has read anything from the provider or a tool, and for good. From then on
it cannot read the state directory, and having changed credentials it is not dumpable, so
no other process of that user can trace it or read its memory. It calls tools (the mission
ledger's too, for its specialists) on the inherited connection M, runs the operator's loop,
writes the answer (or one line saying why there is none) to stdout, which is the run's log,
and exits 0 (answered), 1 (failed) or 2 (a budget ran out). A run of `qledge agent check`
sends one request instead and writes its diagnosis (edge.airun.check). It blocks: no event loop, and
`ssl` only when the endpoint is https.
"""

from __future__ import annotations

import os
import socket
import sys

# Before msgspec and the core modules load (as the daemon does, edge.app.lean): msgspec would
# take typing_extensions when installed (~1.3 MiB), and hashlib would map OpenSSL's libcrypto
# (~3.6 MiB) that an http endpoint never needs (an https one maps it for `ssl` anyway).
if "msgspec" not in sys.modules:
    sys.modules.setdefault("typing_extensions", None)  # type: ignore[arg-type]
if "hashlib" not in sys.modules:
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]

import msgspec  # noqa: E402

from edge.core.agent import AgentJob, ChildUser  # noqa: E402

EXIT_ANSWERED, EXIT_FAILED = 0, 1
JOB_MAX_BYTES = 1 << 20


def _read_job(fd: int) -> AgentJob:
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := os.read(fd, 65536):
            size += len(chunk)
            if size > JOB_MAX_BYTES:
                raise ValueError("the job is too large")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return msgspec.json.decode(b"".join(chunks), type=AgentJob)


def _api_key(path: str | None) -> str | None:
    """The key in `path` (first line), or None without a file; raises ValueError with one line."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"cannot read api_key_file {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o077:
            raise ValueError(f"api_key_file {path} has mode {mode & 0o777:04o}; it must be 0600")
        raw = os.read(fd, 8192)
    finally:
        os.close(fd)
    key = raw.decode("utf-8", "replace").strip().splitlines()[0].strip() if raw.strip() else ""
    if not key:
        raise ValueError(f"api_key_file {path} is empty")
    return key


def _become(user: ChildUser) -> None:
    """Drop to `user` for good (real, effective and saved ids; supplementary groups first)."""
    os.setgroups(user.groups)
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
    if os.getresuid() != (user.uid,) * 3 or os.getresgid() != (user.gid,) * 3:
        raise OSError(f"still uid {os.getresuid()} gid {os.getresgid()}")


def _arguments(args: list[str]) -> tuple[int, int] | None:
    if len(args) != 4 or args[0] != "--job-fd" or args[2] != "--tool-fd" or not (args[1] + args[3]).isdigit():
        return None
    return int(args[1]), int(args[3])


def main(argv: list[str] | None = None) -> int:
    fds = _arguments(sys.argv[1:] if argv is None else argv)
    if fds is None:
        print("qledge agent: started by the daemon's runner only (--job-fd N --tool-fd M)", file=sys.stderr)
        return 2
    try:
        job = _read_job(fds[0])
        connection = socket.socket(fileno=fds[1])
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"qledge agent: agent_error: cannot read the job: {exc}")
        return EXIT_FAILED
    # Everything the run needs is imported now: once it is another user, it may not be
    # able to read the interpreter's or qledge's files any more.
    import encodings.idna  # noqa: F401  (socket names hosts through it, at the first connect)

    from edge.airun.budget import Budget
    from edge.airun.check import Check
    from edge.airun.operator import Operator, Stop
    from edge.airun.provider import ChatClient
    from edge.airun.specialists import Specialists
    from edge.airun.tools import DaemonTools
    from edge.transports.client import Client

    with Client(f"descriptor {fds[1]}", token=job.token, timeout_s=30.0, connected=connection) as client:
        tools = DaemonTools(client, job.tools)
        model: ChatClient | None = None
        specialists: Specialists | None = None
        problem: str | None = None
        try:
            model = ChatClient(job.provider, _api_key(job.provider.api_key_file))
            if job.mission is not None and job.mission.specialists:
                specialists = Specialists(job.mission, tools, job.provider)  # their ledger calls go on M
        except (ValueError, OSError) as exc:
            problem = str(exc)
        if job.user is not None:
            try:
                _become(job.user)
            except OSError as exc:
                print(f"qledge agent: agent_error: cannot become uid {job.user.uid}: {exc}")
                return EXIT_FAILED
        try:
            if model is None or problem is not None:
                operator = Operator(job, _NoModel(), tools, tools, Budget(job.limits, job.provider))
                return operator.fail(sys.stdout, Stop("agent_config", problem or "no provider"))
            if job.check:
                return Check(job, model, tools).main(sys.stdout)
            operator = Operator(job, model, tools, tools, Budget(job.limits, job.provider), specialists=specialists)
            return operator.main(sys.stdout)
        finally:
            if model is not None:
                model.close()


class _NoModel:
    def send(self, body: bytes, timeout_s: float) -> bytes:
        raise AssertionError("no request is sent without a key")


if __name__ == "__main__":
    sys.exit(main())
