"""Every fixed statement of the SQLite dialect, compiled against a migrated database: which
ones build a temporary B-tree (OpenEphemeral) at each execution. SQLite builds one for an IN
of three or more constants, for RETURNING, for `IN (SELECT …)` and for a sort; each costs an
87 KB page-cache allocation and about 6 us, on the worker thread, and what a run's life or an
audited call runs must not pay it (edge.storage.runs.FINISHED, UNSUCCESSFUL_OR)."""

from __future__ import annotations

import os
import re

import apsw
import msgspec
import pytest

from edge.storage.sqlite import sql
from edge.storage.sqlite.schema import migrate

# The statements that may: reads a person or an AI client asks for, sorted or gathered there,
# and rare writes whose rows come back (RETURNING). Named `DIALECT.field`.
ALLOWED = {
    "CATALOG.task_runs_delete",  # deleting a task: once
    "CATALOG.events_prune",  # a trigger's new kind of event (a repeat is merged into the last)
    "SECURITY.credential_revoke", "SECURITY.secret_set",  # a credential's or secret's change
    "RUNS.page_project", "RUNS.page_task", "RUNS.scan",  # history pages: one millisecond's runs in id order
    "SECURITY.audit_prune",  # the small classes' bound (changes of permissions, refusals), ranked
    "READS.run_page", "READS.window",  # the AI reads of the same
}


# What a statement built from a template is filled in with: the plainest of its forms.
FILLED = {"terms": "", "since": "", "cls": "change"}


def _statement(value: object) -> str | None:
    if isinstance(value, str) and re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", value):
        return value.format_map(FILLED) if "{" in value else value
    return None


def _statements() -> list[tuple[str, str]]:
    """(name, statement) once each: ADMISSION holds CATALOG and RUNS again."""
    found: list[tuple[str, str]] = []
    for dialect in ("CATALOG", "SECURITY", "RUNS", "ADMISSION", "READS"):
        struct = getattr(sql, dialect)
        for field in struct.__struct_fields__:
            value = getattr(struct, field)
            if (text := _statement(value)) is not None:
                found.append((f"{dialect}.{field}", text))
            elif isinstance(value, msgspec.Struct):
                for inner in value.__struct_fields__:
                    if (text := _statement(getattr(value, inner))) is not None:
                        found.append((f"{dialect}.{field}.{inner}", text))
    seen: set[str] = set()
    return [(name, text) for name, text in found if not (text in seen or seen.add(text))]


def _binding(statement: str) -> object:
    named = re.findall(r"(?<![:\w]):(\w+)", statement)
    if named:
        return {name: None for name in named}
    numbered = [int(n) for n in re.findall(r"\?(\d+)", statement)]
    return (None,) * (max(numbered) if numbered else statement.count("?"))


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    c = apsw.Connection(os.path.join(tmp_path_factory.mktemp("statements"), "plan.db"))
    migrate(c)
    yield c
    c.close()


def test_only_the_listed_statements_build_a_temporary_btree(conn):
    statements = _statements()
    assert len(statements) > 80  # the dialect was found
    building = set()
    for name, statement in statements:
        ops = [row[1] for row in conn.execute("EXPLAIN " + statement, _binding(statement))]
        if "OpenEphemeral" in ops:
            building.add(name)
    assert building <= ALLOWED, sorted(building - ALLOWED)


def test_a_finished_run_is_one_not_active():
    """FINISHED says `NOT IN` the active statuses (two constants: no temporary B-tree): that
    is the terminal ones only while every status is exactly one of the two."""
    from typing import get_args

    from edge.core.runs import ACTIVE, TERMINAL, RunStatus
    from edge.storage.runs import FINISHED

    assert set(get_args(RunStatus)) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert FINISHED == "status NOT IN ('queued', 'running')"
