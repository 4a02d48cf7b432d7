"""The `[agent]` configuration as the daemon's side of the AI operator uses it (checked and
built by composition, edge.app.operator), and the provider an AI task names."""

from __future__ import annotations

import os
import sys

import msgspec

from edge.core.agent_settings import ChildUser, Limits, ProviderSettings, SpecialistSpec
from edge.core.errors import invalid
from edge.core.ports.runtime import TaskUsers


class OperatorSettings(msgspec.Struct, kw_only=True):
    provider: ProviderSettings
    profiles: dict[str, ProviderSettings]
    limits: Limits  # the configured budgets: defaults and maxima
    read_logs: bool
    concurrency: int
    user: str  # whom the child becomes where the daemon can switch users ([agent] user)
    specialists: list[SpecialistSpec] = []  # none on a daemon without a mission ledger
    attempts: int = 1  # a mission's attempts started by themselves after provider failures
    python: str = sys.executable

    def provider_for(self, profile: str | None) -> ProviderSettings:
        """The provider an AI task names ([agent], or one of its profiles). Raises
        invalid_argument for a profile that is not configured."""
        if profile is None:
            return self.provider
        found = self.profiles.get(profile)
        if found is None:
            raise invalid(f"profile {profile!r} is not configured (add [agent.profiles.{profile}])")
        return found


def child_user(users: TaskUsers, name: str) -> ChildUser | None:
    """Whom an AI run's child becomes: `name`, where this daemon can switch users (None: it
    cannot, and the child stays the daemon's user). Raises invalid_argument for a user that
    does not exist, or that could read the state directory (root, the daemon's own user,
    or a member of their groups)."""
    if not users.can_switch:
        return None
    run_as = users.resolve(name, None)
    if run_as.uid in (0, os.geteuid()) or {run_as.gid, *run_as.groups} & {0, os.getegid()}:
        raise invalid(f"[agent] user {name} could read the state directory (root, the daemon's user or one of"
                      " their groups): name an unprivileged user, e.g. nobody")
    return ChildUser(uid=run_as.uid, gid=run_as.gid, groups=sorted(set(run_as.groups)))
