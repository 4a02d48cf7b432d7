"""Benchmarks run real daemons on real databases; `pytest bench/` runs them.

`support` (DaemonProcess, the blocking client) comes from tests/, which pyproject puts on
the path.
"""

from __future__ import annotations

import os

from pg_support import pg_dsn, pg_server  # noqa: F401  (a real PostgreSQL, for the cluster benchmark)

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
