"""Benchmarks run real daemons on real databases; `pytest bench/` runs them.

`support` (DaemonProcess, the blocking client) comes from tests/, which pyproject puts on
the path.
"""

from __future__ import annotations

import os

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
