"""The AI run's credential, in-process: the daemon's own graph (a real SQLite file, or a
cluster node on a real PostgreSQL; real chain, real tool socket, the real runner starting
the real child against a scripted provider). The one double: the daemon's credential
registry, subclassed only to remember the tokens it mints, so the test can hold the very
credential the child holds. Every test that sends a request runs against each provider
family's conformance fake (configured with its family's profile and model): a refusal fails
it, naming the family."""

from __future__ import annotations

import asyncio
import functools
import json
import os

import msgspec
import pytest

from edge.app.config import Config
from edge.app.graph import (
    Cluster,
    DaemonFacts,
    Host,
    build_chain,
    build_services,
    build_stores,
    build_workers,
    operator_side,
    task_users,
)
from edge.cli.client import CallFailed, Client
from edge.core.clock import SystemClock
from edge.core.errors import ToolError
from edge.core.tasks import AgentInstruction, TaskSpec
from edge.storage.sqlite.db import Database
from edge.app.graph import ai_tools, builtin_tools
from edge.operator.credentials import RunCredentialRegistry
from edge.tools.context import Caller
from edge.tools.definition import Registry
from edge.transports.tool_socket import ToolServer
from agent_support import EVERY_FAMILY, served, wire
from fake_provider import FakeProvider, Step, answer

pytestmark = pytest.mark.e2e  # real children, real time


class RecordingCredentials(RunCredentialRegistry):
    def __init__(self, pepper: bytes) -> None:
        super().__init__(pepper)
        self.minted: dict[str, str] = {}

    def mint(self, run_id: str, permissions: frozenset[str]) -> str:
        token = super().mint(run_id, permissions)
        self.minted[run_id] = token
        return token


class Daemon:
    """The daemon's graph on SQLite, or as a cluster node on PostgreSQL (`dsn`): the node's
    claim loop hands the run to its runner, and its evidence and audit are PostgreSQL's."""

    def __init__(self, home: str, provider: FakeProvider, dsn: str | None = None) -> None:
        self.home = home
        self.provider = provider
        self.socket = os.path.join(home, "qledge.sock")
        self.dsn = dsn
        self.db: Database | None = None
        self.cluster: Cluster | None = None

    async def open(self) -> Daemon:
        keys: dict = {"agent": {"enabled": True, "base_url": self.provider.url, "model": self.provider.model,
                                "provider": self.provider.family.name}}
        if self.dsn is not None:
            keys["cluster"] = {"dsn": self.dsn, "node": "n1", "lease_s": 3, "heartbeat_s": 0.5, "poll_s": 0.5}
        config = msgspec.convert(keys, Config)
        clock, pepper = SystemClock(), b"p" * 32
        self.credentials = RecordingCredentials(pepper)
        users = task_users(config, self.home)
        distribute = None
        if self.dsn is None:
            self.db = await Database.open(os.path.join(self.home, "qledge.db"))
            stores = build_stores(self.db, config, self.home)
        else:
            self.cluster = cluster = Cluster(config, self.home)
            await cluster.open()
            assert cluster.stores is not None and cluster.clock is not None
            stores, clock = cluster.stores, cluster.clock
        own = [*builtin_tools(), *ai_tools()]
        host = Host(config=config, home=self.home, stores=stores, clock=clock, pepper=pepper, users=users,
                    infos=[t.info() for t in own],
                    ai_tools=lambda: self.registry.ai_tools(),
                    start_run=lambda task, actor: self.local.start(task, actor), connect=self._connect,
                    cluster=self.cluster)
        # The daemon's own builder of the operator's side, with the recording credentials.
        agent = operator_side(host, self.credentials)
        if self.cluster is not None:
            distribute = functools.partial(self.cluster.distribute, agents=agent.agents)
        workers = build_workers(config, self.home, stores, clock, distribute, agents=agent.agents, users=users)
        self.registry = Registry([*own, *agent.tools], agent.deferred)
        facts = DaemonFacts(stores.location, "asyncio", clock, stores.counts, workers.settings, "/")
        self.services = build_services(config, stores, workers, facts, self.registry, pepper, clock)
        self.chain = build_chain(config, self.services, self.registry, agent.credentials)
        self.local = workers.runner
        self.runner = workers.controller  # on a cluster node, the cluster's runner
        self.server = ToolServer(self.chain, self.socket, config.max_frame_bytes)
        if self.cluster is not None and self.cluster.node is not None:
            await self.cluster.node.start(workers.scheduler.changed)
        await self.server.start()
        return self

    def _connect(self, sock) -> None:
        self.server.attach(sock)

    async def close(self) -> None:
        await self.server.stop()
        node = self.cluster.node if self.cluster is not None else None
        if node is not None:
            await node.stop()
        await self.local.shutdown()
        if node is not None:
            await node.close()
        if self.cluster is not None:
            await self.cluster.close()
        if self.db is not None:
            await self.db.close()

    async def audit_count(self, principal: str, outcome: str) -> int:
        """Calls audited (a refused call may be one of the count on an aggregate row)."""
        await self.services.audit.flush()  # what is still counted in memory
        query = "SELECT coalesce(sum(count), 0) FROM security_audit WHERE principal = {0} AND outcome = {0}"
        if self.db is not None:
            return await self.db.run(lambda conn: conn.execute(query.format("?"), (principal, outcome)).fetchone()[0])
        import psycopg

        assert self.dsn is not None
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            cur = await conn.execute(query.format("%s"), (principal, outcome))
            found = await cur.fetchone()
            assert found is not None
            return int(found[0])

    async def recent_audit(self, count: int) -> list[str]:
        query = "SELECT principal FROM security_audit ORDER BY id DESC LIMIT {}"
        if self.db is not None:
            return await self.db.run(lambda conn: [r[0] for r in conn.execute(query.format("?"), (count,))])
        import psycopg

        assert self.dsn is not None
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            cur = await conn.execute(query.format("%s"), (count,))
            return [r[0] for r in await cur.fetchall()]

    async def owner(self, tool: str, args: dict) -> object:
        result = await self.chain.call(tool, json.dumps(args).encode(), "json", Caller("socket", peer_uid=os.getuid()))
        return json.loads(msgspec.json.encode(result))

    async def ai_run(self, task_id: str) -> str:
        spec = TaskSpec(command=AgentInstruction(instruction="What failed?"))
        task = await self.services.tasks.create("default", task_id, task_id, spec, 1000, privileged=False)
        return (await self.runner.start(task, "user")).id


def code_with(socket: str, token: str, tool: str, args: dict | None = None) -> str:
    """The error code a call with `token` gets ("ok" when it succeeds), from a blocking client."""
    with Client(socket, token=token, timeout_s=10) as client:
        try:
            client.call(tool, args or {})
        except CallFailed as exc:
            return exc.code
    return "ok"


@pytest.fixture
def provider(request):
    yield from served(request)


@pytest.fixture(params=["sqlite", "postgres"])
async def daemon(request, home, provider):
    dsn = request.getfixturevalue("pg_dsn") if request.param == "postgres" else None
    d = await Daemon(home, provider, dsn).open()
    yield d
    await d.close()


@pytest.fixture
async def local_daemon(home, provider):
    d = await Daemon(home, provider).open()
    yield d
    await d.close()


@pytest.fixture
async def cluster_daemon(home, pg_dsn, provider):
    d = await Daemon(home, provider, pg_dsn).open()
    yield d
    await d.close()


# The run's own tools: its reports and its mission's ledger (a cluster node keeps none).
REPORTS = {"qledge.agent.round", "qledge.agent.outcome"}
LEDGER = {f"qledge.agent.specialist.{op}" for op in ("delegate", "correct", "revoke", "items", "prepare", "commit",
                                                     "withdraw")}


@EVERY_FAMILY
async def test_the_run_credential_is_refused_every_write_tool_and_dead_after_the_run(daemon):
    OWN = REPORTS | (LEDGER if daemon.db is not None else set())  # noqa: N806
    seen: dict[str, str] = {}
    qinglong = sorted(t.name for t in daemon.registry.infos() if t.name.startswith("qinglong."))
    others = sorted(t.name for t in daemon.registry.infos() if not t.name.startswith("qinglong.") and t.name not in OWN)

    def while_running(request):  # in the provider's thread, while the child waits for this reply
        (run_id, token), = daemon.credentials.minted.items()
        for name in [*others, *qinglong, *OWN]:
            seen[name] = code_with(daemon.socket, token, name, {"taskId": "x", "runId": run_id})
        return answer("done")

    daemon.provider.add(while_running)
    run_id = await daemon.ai_run("probe")
    final = await daemon.runner.wait("default", run_id, 60)
    assert final is not None and final.status == "succeeded", final
    writes = {t.name for t in daemon.registry.infos() if t.effect == "write"} - OWN
    assert writes and all(seen[name] == "permission_denied" for name in writes), seen
    assert all(seen[name] == "permission_denied" for name in others), seen  # qledge.* reads too
    assert all(seen[name] != "permission_denied" for name in qinglong), seen  # exactly the qinglong.* reads
    assert all(seen[name] not in ("permission_denied", "unauthenticated") for name in OWN), seen  # and its own
    # Dead once the run has ended: for every tool, the reporting and ledger ones included.
    token = daemon.credentials.minted[run_id]
    for name in ("qinglong.run.list", *sorted(OWN)):
        assert await asyncio.to_thread(code_with, daemon.socket, token, name) == "unauthenticated"
    # The refusals were audited as the run's principal.
    assert await daemon.audit_count(f"agent:{run_id}", "denied") == len(others)


@EVERY_FAMILY
async def test_cancel_during_a_provider_call_revokes_the_credential(daemon):
    daemon.provider.add(Step(answer("never"), delay_s=float("inf")))
    run_id = await daemon.ai_run("hang")
    for _ in range(400):
        if daemon.provider.requests:
            break
        await asyncio.sleep(0.05)
    token = daemon.credentials.minted[run_id]
    assert await asyncio.to_thread(code_with, daemon.socket, token, "qinglong.run.list") == "ok"
    cancelled = await daemon.runner.cancel("default", run_id, "user")
    assert cancelled.status == "cancelled"
    assert await asyncio.to_thread(code_with, daemon.socket, token, "qinglong.run.list") == "unauthenticated"
    evidence = await daemon.owner("qinglong.agent.history.get", {"runId": run_id})
    assert evidence["record"]["state"] == "cancelled"


# No AI run, no request: one family (as the next test).
async def test_only_a_run_credential_may_report(daemon):
    for tool in ("qledge.agent.round", "qledge.agent.outcome"):
        with pytest.raises(ToolError) as err:
            await daemon.owner(tool, {"outcome": "succeeded"} if tool.endswith("outcome") else {
                "round": 1, "model": "m", "inputTokens": 1, "outputTokens": 1, "usageEstimated": False,
                "responseChars": 1})
        assert err.value.code == "permission_denied"


async def test_a_connection_made_for_a_child_trusts_its_token_only(daemon):
    """Both ends of a child's connection are the daemon's, so the kernel names the daemon (an
    owner by uid) as the peer: on such a connection, only a token counts."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon.server.attach(ours)
    daemon.credentials.mint("r-probe", frozenset({"tool.call:qinglong.run.list", "run.read"}))
    token = daemon.credentials.minted["r-probe"]

    def calls() -> tuple[str, str, str]:
        with Client("a child's connection", connected=theirs, timeout_s=10) as client:
            codes = []
            for tok, tool in ((None, "qinglong.run.list"), (None, "qledge.status"), (token, "qinglong.run.list")):
                client.token = tok
                try:
                    client.call(tool, {})
                    codes.append("ok")
                except CallFailed as exc:
                    codes.append(exc.code)
            return codes[0], codes[1], codes[2]

    assert await asyncio.to_thread(calls) == ("unauthenticated", "unauthenticated", "ok")
    # The two refusals share a row (one per peer, cause and minute) that counts both.
    assert await daemon.recent_audit(2) == ["agent:r-probe", "anonymous"]
    assert await daemon.audit_count("anonymous", "unauthenticated") == 2


@EVERY_FAMILY
async def test_a_run_credential_reaches_its_own_mission_only(local_daemon):
    daemon = local_daemon
    from fake_provider import tool_call

    daemon.provider.add(tool_call("specialist.delegate", {"specialist": "log-analyst", "instruction": "A-SCOPE"}),
                        answer("a done"))
    run_a = await daemon.ai_run("mission-a")
    final_a = await daemon.runner.wait("default", run_a, 60)
    assert final_a.status == "succeeded", final_a
    token_a = daemon.credentials.minted[run_a]
    seen: dict[str, object] = {}

    def while_b_runs(request):  # run B's child waits for its round 2 reply; B's credential is live
        token_b = daemon.credentials.minted[max(daemon.credentials.minted)]
        with Client(daemon.socket, token=token_b, timeout_s=10) as client:
            for cid in (1, 2):  # mission A's constraint is c1; B has none at all
                try:
                    client.call("qledge.agent.specialist.revoke", {"constraint": cid, "round": 1, "call": "x"})
                    seen[f"revoke c{cid}"] = "ok"
                except CallFailed as exc:
                    seen[f"revoke c{cid}"] = exc.code
            context = client.call("qledge.agent.specialist.prepare",
                                  {"child": "log-analyst", "message": "B-MSG", "round": 1, "call": "x"})
            seen["constraints"] = context["constraints"]
            seen["mission"] = context["missionId"]
        seen["a, ended"] = code_with(daemon.socket, token_a, "qledge.agent.specialist.prepare",
                                     {"child": "log-analyst", "message": "A-MSG", "round": 1, "call": "x"})
        return answer("b done")

    daemon.provider.add(tool_call("qinglong.run.list", {}), while_b_runs)  # round 1 reported: B may write
    run_b = await daemon.ai_run("mission-b")
    final_b = await daemon.runner.wait("default", run_b, 60)
    assert final_b.status == "succeeded", (final_b, seen)
    assert seen == {"revoke c1": "not_found", "revoke c2": "not_found", "constraints": [], "mission": run_b,
                    "a, ended": "unauthenticated"}
    status = await daemon.db.run(lambda conn: conn.execute("SELECT text, status FROM agent_constraints").fetchall())
    assert status == [("A-SCOPE", "active")]


@EVERY_FAMILY
async def test_a_cluster_node_keeps_no_missions(cluster_daemon):
    """No mission ledger in PostgreSQL: the model is offered no specialist, the ledger's tools
    do not exist, and retry and the mission view say why in one line."""
    from fake_provider import tool_call

    daemon = cluster_daemon
    daemon.provider.add(tool_call("specialist.delegate", {"specialist": "log-analyst", "instruction": "X"}),
                        answer("done"))
    run_id = await daemon.ai_run("no-mission")
    final = await daemon.runner.wait("default", run_id, 60)
    assert final is not None and final.status == "succeeded", final
    first, second = (r.body for r in daemon.provider.requests)
    offered = {t["function"]["name"] for t in first["tools"]}
    assert offered and not any(name.startswith(wire("specialist.")) for name in offered), offered
    assert "unknown_tool" in json.dumps(second["messages"][-1]), second["messages"][-1]  # answered, never run
    assert not any(t.name.startswith("qledge.agent.specialist.") for t in daemon.registry.infos())
    for tool in ("qledge.agent.retry", "qledge.agent.mission"):
        with pytest.raises(ToolError) as err:
            await daemon.owner(tool, {"runId": run_id})
        assert err.value.code == "unavailable" and "cluster node keeps no mission ledger" in err.value.message
