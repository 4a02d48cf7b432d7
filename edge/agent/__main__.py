"""The child of an AI run: `... -c "...main()" --job-fd N`, started by the daemon's runner.

It reads its job (the run's credential included) from the inherited descriptor N and closes
it, reads the provider's key from `api_key_file` (which must be 0600), runs the operator's
loop, writes the answer (or one line saying why there is none) to stdout, which is the
run's log, and exits 0 (answered), 1 (failed) or 2 (a budget ran out). It blocks: no event
loop, and `ssl` only when the endpoint is https.
"""

from __future__ import annotations

import os
import sys

# Before msgspec and the core modules load (as the daemon does, edge.app.lean): msgspec would
# take typing_extensions when installed (~1.3 MiB), and hashlib would map OpenSSL's libcrypto
# (~3.6 MiB) that an http endpoint never needs (an https one maps it for `ssl` anyway).
if "msgspec" not in sys.modules:
    sys.modules.setdefault("typing_extensions", None)  # type: ignore[arg-type]
if "hashlib" not in sys.modules:
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]

import msgspec  # noqa: E402

from edge.core.agent import AgentJob  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--job-fd" or not args[1].isdigit():
        print("qledge agent: started by the daemon's runner only (--job-fd N)", file=sys.stderr)
        return 2
    try:
        job = _read_job(int(args[1]))
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"qledge agent: agent_error: cannot read the job: {exc}")
        return EXIT_FAILED
    from edge.agent.budget import Budget
    from edge.agent.operator import Operator, Stop
    from edge.agent.provider import ChatClient
    from edge.agent.tools import DaemonTools
    from edge.cli.client import Client, Unreachable

    try:
        client = Client(job.socket, token=job.token, timeout_s=30.0)
    except Unreachable as exc:
        print(f"qledge agent: daemon_unreachable: {exc}")
        return EXIT_FAILED
    with client:
        tools = DaemonTools(client, job.tools)
        try:
            model = ChatClient(job.provider, _api_key(job.provider.api_key_file))
        except ValueError as exc:
            operator = Operator(job, _NoModel(), tools, tools, Budget(job.limits, job.provider))
            return operator.fail(sys.stdout, Stop("agent_config", str(exc)))
        try:
            specialists = None
            if job.mission is not None and job.mission.specialists:
                from edge.agent.specialists import Specialists

                try:
                    specialists = Specialists(job.mission, tools, job.provider)
                except ValueError as exc:
                    operator = Operator(job, _NoModel(), tools, tools, Budget(job.limits, job.provider))
                    return operator.fail(sys.stdout, Stop("agent_config", str(exc)))
            operator = Operator(job, model, tools, tools, Budget(job.limits, job.provider), specialists=specialists)
            return operator.main(sys.stdout)
        finally:
            model.close()


class _NoModel:
    def send(self, body: bytes, timeout_s: float) -> bytes:
        raise AssertionError("no request is sent without a key")


if __name__ == "__main__":
    sys.exit(main())
