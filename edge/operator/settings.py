"""The `[agent]` configuration as the daemon's side of the AI operator uses it (checked and
built by composition, edge.app.operator), and the provider an AI task names."""

from __future__ import annotations

import sys

import msgspec

from edge.core.agent_settings import Limits, ProviderSettings, SpecialistSpec
from edge.core.errors import invalid


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
