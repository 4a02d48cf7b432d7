"""`@reboot`, `@once` and imports where several nodes share one real PostgreSQL: the
storage adapters of each node (edge.storage.postgres), as their daemons would hold them.
What holds for one backend alone is in tests/test_port_contracts.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from edge.app.graph import run_logs
from edge.core.runs import Run
from edge.core.tasks import ArgvCommand, ImportTask, ImportTrigger, TaskSpec
from edge.core.triggers import CronSpec

P = "default"
REBOOT = CronSpec(expression="@reboot", timezone="UTC")
ONCE = CronSpec(expression="@once", timezone="UTC")


def _rng() -> float:
    return 0.0


def spec(overlap: str = "allow") -> TaskSpec:
    return TaskSpec(command=ArgvCommand(file="true"), overlap=overlap)  # type: ignore[arg-type]


@pytest.fixture
async def node(pg_dsn, home):
    """`await node("gw-1")`: that node's adapters on the test's database."""
    from edge.storage.postgres.cluster import ClusterOptions, NodeSettings, Policy, open_cluster

    opened = []

    async def make(node_id: str, lease_s: float = 30.0):
        settings = NodeSettings(node_id=node_id, project=P, slots=2, lease_s=lease_s)
        pg = await open_cluster(ClusterOptions(dsn=pg_dsn, node=settings, capacity=34), Policy(), run_logs(home))
        opened.append(pg)
        return pg

    yield make
    for pg in opened:
        await pg.close()


def now_ms() -> int:
    # PostgreSQL's clock decides when a run may be claimed and when its lease ends
    return int(time.time() * 1000)


async def _fire(pg, trigger_id: str, at: int) -> list[Run]:
    return (await pg.admission.admit_fires(P, trigger_id, at, 30_000, _rng)).runs


async def test_reboot_is_once_per_boot_of_each_node_and_runs_on_that_node(node):
    a, b = await node("gw-1"), await node("gw-2")
    t = now_ms()
    await a.tasks.create(P, "t", "T", spec(), t, privileged=False)
    await a.triggers.create(P, "r", "t", None, REBOOT, t)
    # Each node's boot is its own: both arm, and neither start undoes the other's record.
    assert await a.admission.arm_boot(P, "boot-a1", t) == 1
    assert await b.admission.arm_boot(P, "boot-b1", t) == 1
    assert await a.admission.arm_boot(P, "boot-a1", t + 1) == 0
    assert await b.admission.arm_boot(P, "boot-b1", t + 1) == 0
    assert await a.admission.armed(P) == [(t, "r")] == await b.admission.armed(P)
    [ra] = await _fire(a, "r", t + 2)
    assert ra.idempotency_key == "boot:r:boot-a1"
    assert await a.admission.armed(P) == [] and await b.admission.armed(P) == [(t, "r")]
    assert await _fire(a, "r", t + 3) == []  # a's boot fired; b's is b's to fire
    [rb] = await _fire(b, "r", t + 3)
    assert rb.idempotency_key == "boot:r:boot-b1"
    # Each run is for its node alone: b claims its own, never a's.
    assert [r.id for r in await b.claims.claim(5, now_ms())] == [rb.id]
    assert await b.claims.claim(5, now_ms()) == []
    assert [r.id for r in await a.claims.claim(5, now_ms())] == [ra.id]
    # A third node's first start is a boot of its own; a restart of a within its boot is not.
    c = await node("gw-3")
    assert await c.admission.arm_boot(P, "boot-c1", t + 4) == 1
    a_again = await node("gw-1")
    assert await a_again.admission.arm_boot(P, "boot-a1", t + 5) == 0
    assert await a_again.admission.armed(P) == []


async def test_a_node_booting_again_loses_the_boot_run_it_never_took(node):
    a, b = await node("gw-1"), await node("gw-2")
    t = now_ms()
    await a.tasks.create(P, "t", "T", spec(), t, privileged=False)
    await a.triggers.create(P, "r", "t", None, REBOOT, t)
    await a.admission.arm_boot(P, "boot-1", t)
    [first] = await _fire(a, "r", t)
    await b.admission.arm_boot(P, "boot-b", t)
    [theirs] = await _fire(b, "r", t)
    # a's machine reboots before a took its run: that boot is over, so is its run.
    assert await a.admission.arm_boot(P, "boot-2", t + 10) == 1
    lost = await a.runs.get(P, first.id)
    assert lost is not None and (lost.status, lost.error_code) == ("lost", "node_rebooted")
    assert "gw-1 booted again" in (lost.error_summary or "")
    untouched = await a.runs.get(P, theirs.id)
    assert untouched is not None and untouched.status == "queued"  # b's run is b's
    [second] = await _fire(a, "r", t + 11)
    assert second.idempotency_key == "boot:r:boot-2"
    assert [r.id for r in await a.claims.claim(5, now_ms())] == [second.id]


@pytest.mark.e2e
async def test_a_boot_run_its_node_never_takes_is_lost_after_the_lease(node):
    a, b = await node("gw-1", lease_s=0.3), await node("gw-2", lease_s=0.3)
    t = now_ms()
    await a.tasks.create(P, "t", "T", spec(), t, privileged=False)
    await a.triggers.create(P, "r", "t", None, REBOOT, t)
    await a.admission.arm_boot(P, "boot-1", t)
    [run] = await _fire(a, "r", t)
    assert await b.claims.reap() == []  # within its lease
    deadline = time.monotonic() + 10
    while not (reaped := await b.claims.reap()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # PostgreSQL's clock, which no test can move
    assert [r.id for r in reaped] == [run.id]
    lost = await b.runs.get(P, run.id)
    assert lost is not None and (lost.status, lost.error_code) == ("lost", "lease_expired")
    assert "only node gw-1 may run this run" in (lost.error_summary or "")
    assert await a.claims.claim(5, now_ms()) == []


async def test_once_fires_on_one_node_only(node):
    a, b = await node("gw-1"), await node("gw-2")
    t = now_ms()
    await a.tasks.create(P, "t", "T", spec(), t, privileged=False)
    await a.triggers.create(P, "o", "t", None, ONCE, t)
    assert (t, "o") in await b.admission.armed(P)
    fired = await asyncio.gather(_fire(a, "o", t + 1), _fire(b, "o", t + 1))
    assert sorted(len(runs) for runs in fired) == [0, 1]
    [run] = [r for runs in fired for r in runs]
    assert run.idempotency_key == "once:o:1"
    head = await b.triggers.get(P, "o")
    assert head is not None and (head.enabled, head.revision) == (False, 2)
    # The run is anyone's to claim.
    claimed = await b.claims.claim(5, now_ms()) or await a.claims.claim(5, now_ms())
    assert [r.id for r in claimed] == [run.id]


async def test_the_same_import_on_two_nodes_at_once_creates_one_task(node):
    a, b = await node("gw-1"), await node("gw-2")
    t = now_ms()
    item = ImportTask(key="crontab:root:1", task_id="job", spec=spec(),
                      triggers=[ImportTrigger(expression="0 3 * * *")])
    daily = [CronSpec(expression="0 3 * * *", timezone="UTC")]
    results = await asyncio.gather(a.tasks.import_task(P, item, daily, t, privileged=False),
                                   b.tasks.import_task(P, item, daily, t, privileged=False))
    assert sorted(r.status for r in results) == ["created", "exists"]
    assert {(r.task_id, tuple(r.trigger_ids)) for r in results} == {("job", ("job-1",))}
    # Two keys wanting one id at once: the one that loses the id takes the next.
    other = [ImportTask(key=f"crontab:root:{n}", task_id="same", spec=spec()) for n in (2, 3)]
    made = await asyncio.gather(a.tasks.import_task(P, other[0], [], t, privileged=False),
                                b.tasks.import_task(P, other[1], [], t, privileged=False))
    assert sorted(m.task_id for m in made) == ["same", "same-2"]
    secrets = await asyncio.gather(a.secrets.import_secret(P, "ql:env:K", "K", "v", t),
                                   b.secrets.import_secret(P, "ql:env:K", "K", "v", t))
    assert sorted(secrets) == ["created", "exists"]
    assert [r.key for r in await b.tasks.imports(P, None, 10)] == [
        "crontab:root:1", "crontab:root:2", "crontab:root:3", "ql:env:K"]
