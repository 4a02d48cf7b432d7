"""The layering ARCHITECTURE.md describes, checked on the source: which layer may import
which, optional capabilities reached only from composition, and every port documented."""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EDGE = os.path.join(ROOT, "edge")

# Each layer and the layers it may import (besides itself and the `edge` package root).
ALLOWED = {
    "core": set(),
    "storage": {"core"},
    "runner": {"core"},
    "scheduler": {"core"},
    "tools": {"core"},
    "transports": {"core", "tools"},
    "mcp": {"core", "tools", "transports"},
    # The child of an AI run: core shapes and the blocking socket client, nothing of the daemon.
    "agent": {"core", "transports", "cli"},
    "app": {"core", "storage", "runner", "scheduler", "tools", "transports", "mcp"},
    "cli": {"core", "tools", "transports", "app"},
}


def _imports() -> list[tuple[str, str, str]]:
    """(importing module path, its layer, imported edge module) for every edge import."""
    found = []
    for dirpath, _, files in os.walk(EDGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, EDGE)
            layer = rel.split(os.sep)[0] if os.sep in rel else ""
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edge"):
                    found.append((rel, layer, node.module))
                    # `from edge.tools import agent` imports edge.tools.agent too
                    if "." in node.module:
                        found += [(rel, layer, f"{node.module}.{a.name}") for a in node.names]
                elif isinstance(node, ast.Import):
                    found += [(rel, layer, a.name) for a in node.names if a.name.startswith("edge")]
    return found


def test_layers_import_only_inward():
    wrong = []
    for rel, layer, module in _imports():
        target = module.split(".")[1] if "." in module else ""
        if layer and target and target != layer and target not in ALLOWED[layer]:
            wrong.append(f"{rel} imports {module}")
    assert wrong == []


def test_optional_capabilities_are_imported_only_by_composition():
    importers = {rel for rel, _, module in _imports() if module.startswith("edge.mcp")}
    assert importers <= {"app/graph.py"} | {r for r in importers if r.startswith("mcp" + os.sep)}


def test_the_agent_child_is_imported_by_nothing_outside_it():
    importers = {rel for rel, _, module in _imports() if module == "edge.agent" or module.startswith("edge.agent.")}
    assert {r for r in importers if not r.startswith("agent" + os.sep)} == set()


def test_the_daemon_side_of_the_agent_is_reached_from_composition_and_the_cli_only():
    daemon_side = ("edge.tools.agent", "edge.storage.sqlite.evidence")
    importers = {rel for rel, _, module in _imports() if module in daemon_side}
    assert importers <= {"app/graph.py", "cli/commands.py"}
    assert "app/graph.py" in importers


def test_every_port_is_in_the_architecture_document():
    with open(os.path.join(ROOT, "ARCHITECTURE.md")) as f:
        doc = f.read()
    ports = []
    for name in os.listdir(os.path.join(EDGE, "core", "ports")):
        if name.endswith(".py"):
            with open(os.path.join(EDGE, "core", "ports", name)) as f:
                ports += re.findall(r"^class (\w+)\(.*Protocol\):", f.read(), re.M)
    assert len(ports) >= 18
    assert [p for p in ports if p not in doc] == []
