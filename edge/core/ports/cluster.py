"""Cluster ports: what a node of a PostgreSQL cluster needs beyond the storage ports.
Only composition wires them (edge.app.graph, when `[cluster] dsn` is set); a single
device never loads an adapter of these.

Times that order or expire across nodes are PostgreSQL's (`now()`), never a node's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from edge.core.ports.runtime import RunInputs
from edge.core.runs import Run


class RunClaims(Protocol):
    """Claims, leases and cancel requests of one node (its id is the adapter's)."""

    async def claim(self, limit: int, now_ms: int) -> list[Run]:
        """Claim at most `limit` of the project's queued, unclaimed runs whose jitter has
        passed and that are for any node or for this one (a `@reboot` fire), oldest
        first, in one statement that skips rows other nodes are claiming: each gets this
        node, a new fence and a lease, and a `run.claimed` event; it stays `queued` until
        the runner starts it. Later transitions of a claimed run through this node's
        RunStore are fenced: once the run is no longer this claim's (the lease expired
        and it was recorded `lost`) they change nothing but a `run.fence_refused` event,
        and raise conflict. Raises unavailable."""
        ...

    async def renew(self, run_ids: list[str]) -> list[str]:
        """One statement: extend the leases of those of `run_ids` this node holds and
        whose lease has not expired yet; returns the ids renewed (an expired lease is
        never renewed: its run is lost)."""
        ...

    async def reap(self) -> list[Run]:
        """Record `lost` (error code `lease_expired`, a `run.lost` event) every active run
        whose lease has expired (a claimed run, or one for a single node that did not claim
        it in time), at most a bounded batch; returns them as recorded. Never re-runs."""
        ...

    async def request_cancel(self, project: str, run_id: str, reason: str) -> bool:
        """Ask the node holding an active run to cancel it (its hint is sent on commit);
        False when the run is not active or no node holds it (a queued run nobody claimed:
        the caller cancels it itself)."""
        ...

    async def cancel_requests(self, run_ids: list[str]) -> dict[str, str]:
        """Cancel reasons asked for any of `run_ids` that are still active."""
        ...

    def inputs(self, run_id: str) -> RunInputs | None:
        """What was read with the claim of `run_id` for its runner (the task revision, the
        project's secret values), once: None after that, or for a run it did not claim."""
        ...

    def release(self, run_id: str) -> None:
        """Forget the claim of a run this node no longer holds (no I/O)."""
        ...


class NodeRegistry(Protocol):
    """The `nodes` table: one row per live daemon, kept fresh by its heartbeat."""

    async def heartbeat(self, slots: int) -> int:
        """Insert or refresh this node's row; returns PostgreSQL's time (epoch ms)."""
        ...

    async def alive(self) -> int:
        """How many nodes have sent a heartbeat within the lease."""
        ...

    async def leave(self) -> None:
        """Remove this node's row (a clean stop)."""
        ...


class ClusterNode(Protocol):
    """The background side of a cluster node, started and stopped by the daemon."""

    async def start(self, triggers_changed: Callable[[], None],
                    notices_queued: Callable[[], None] | None = None) -> None:
        """Start the heartbeat, the claim loop and the hint listener; `triggers_changed`
        is called when another node changed a trigger or scheduled a retry, and after every
        reconnect; `notices_queued` when a node queued notifications, and after every
        reconnect."""
        ...

    async def stop(self) -> None:
        """Stop claiming and listening; the runs this node holds keep their leases until
        the runner has recorded them."""
        ...

    async def close(self) -> None:
        """Leave the cluster and close the connections, after the runner has stopped."""
        ...

    def status(self) -> dict[str, str]:
        """Status lines: the node, PostgreSQL reachable or not, nodes alive."""
        ...
