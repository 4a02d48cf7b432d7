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
    "agent": {"core", "transports"},
    # Notifications: the notifier and its tools in the daemon, the sender child.
    "notify": {"core", "tools"},
    # The web panel: its own process, a client of the tool socket; nothing of the daemon.
    "web": set(),
    "app": {"core", "storage", "runner", "scheduler", "tools", "transports", "mcp", "notify"},
    "cli": {"core", "tools", "transports", "app", "notify", "web"},
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
    cluster = os.path.join("storage", "postgres") + os.sep
    importers = {rel for rel, _, module in _imports() if module.startswith("edge.storage.postgres")}
    assert importers <= {"app/graph.py"} | {r for r in importers if r.startswith(cluster)}
    importers = {rel for rel, _, module in _imports() if module.startswith("edge.notify")}
    # Its commands (edge/cli/notify*.py) ship with it too (packaging/build.py).
    assert importers <= {"app/graph.py", "cli/notify.py", "cli/notify_import.py"} | {
        r for r in importers if r.startswith("notify" + os.sep)}
    # The notifier's side of the SQLite queue ships with edge/notify/ (packaging/build.py).
    importers = {rel for rel, _, module in _imports() if module == "edge.storage.sqlite.notify"}
    assert importers <= {"app/graph.py"}
    importers = {rel for rel, _, module in _imports() if module == "edge.core.ports.cluster"}
    assert importers <= {"app/graph.py"} | {r for r in importers if r.startswith(cluster)}


def test_the_web_panel_is_reached_only_from_the_cli_entry_and_loads_nothing_heavy():
    importers = {rel for rel, _, module in _imports() if module == "edge.web" or module.startswith("edge.web.")}
    assert {r for r in importers if not r.startswith("web" + os.sep)} == {"cli/main.py"}
    heavy = {"msgspec", "apsw", "cronsim", "asyncio", "logging", "argparse", "dataclasses", "typing"}
    for name in os.listdir(os.path.join(EDGE, "web")):
        if name.endswith(".py"):
            with open(os.path.join(EDGE, "web", name)) as f:
                tree = ast.parse(f.read())
            found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            found |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            assert found & heavy == set(), (name, found & heavy)


def test_the_agent_child_is_imported_by_nothing_outside_it():
    importers = {rel for rel, _, module in _imports() if module == "edge.agent" or module.startswith("edge.agent.")}
    assert {r for r in importers if not r.startswith("agent" + os.sep)} == set()


# The AI operator's modules outside edge/agent: shipped by the profiles that include it, loaded
# by the daemon only when [agent] is enabled.
AGENT_SIDE = {"app/agent.py", "core/agent.py", "core/ledger.py", "core/ports/agent.py", "storage/sqlite/evidence.py",
              "storage/sqlite/ledger.py", "storage/postgres/evidence.py", "tools/agent.py", "tools/missions.py"}


def _eager_imports(tree: ast.Module) -> set[str]:
    """Modules imported when the module loads: not inside functions, not under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                visit(node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)

    visit(tree.body)
    return found


def test_nothing_the_default_daemon_loads_imports_the_agent_side_eagerly():
    agent = {"edge." + rel[:-3].replace(os.sep, ".") for rel in AGENT_SIDE}
    wrong = []
    for dirpath, _, files in os.walk(EDGE):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), EDGE)
            if not name.endswith(".py") or rel in AGENT_SIDE or rel.startswith("agent" + os.sep):
                continue
            with open(os.path.join(dirpath, name)) as f:
                eager = _eager_imports(ast.parse(f.read()))
            wrong += [f"{rel} imports {m}" for m in sorted(eager & agent)]
    assert wrong == []
    lazy = {rel for rel, _, module in _imports() if module in agent} - AGENT_SIDE
    assert {r for r in lazy if not r.startswith("agent" + os.sep)} == {
        "app/graph.py", "cli/agent.py", "runner/supervisor.py", "tools/chain.py", "storage/postgres/cluster.py",
        "storage/postgres/node.py"}


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


def _module_graph() -> dict[str, set[str]]:
    """Each edge module and the edge modules it imports anywhere in its text (in functions and
    under TYPE_CHECKING too: a lazy import still ties the two files together)."""
    modules: dict[str, str] = {}
    for dirpath, _, files in os.walk(EDGE):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
                module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
                modules[module] = os.path.relpath(os.path.join(dirpath, name), EDGE)

    def resolve(name: str) -> str:
        while name not in modules:  # `from edge.x import Name` is edge.x
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {module: set() for module in modules}
    by_rel = {rel: module for module, rel in modules.items()}
    for rel, _, imported in _imports():
        graph[by_rel[rel]].add(resolve(imported))
    for module, targets in graph.items():
        targets.discard(module)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


# Circles that remain outside the command line, each a pair of modules of one feature; no new
# one may form, and none may reach the command line or the transports.
KNOWN_CIRCLES = {"edge.notify.dispatch", "edge.notify.handle", "edge.notify.tools", "edge.tools.agent", "edge.tools.missions",
                 "edge.app.agent", "edge.app.graph"}


def test_no_import_circle_reaches_the_command_line_and_nothing_below_it_imports_it():
    graph = _module_graph()
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]  # the finder finds
    circles = _circles(graph)
    assert [sorted(c) for c in circles if not c <= KNOWN_CIRCLES] == []
    # The command line is the top: only the entry point imports it.
    importers = {m for m, targets in graph.items() if any(t.startswith("edge.cli") for t in targets)}
    assert {m for m in importers if not m.startswith("edge.cli.")} == {"edge.__main__"}


def test_the_exit_codes_of_a_command_are_defined_once():
    names = {"EXIT_OK", "EXIT_TOOL", "EXIT_USAGE", "EXIT_UNREACHABLE"}
    defined = []
    for dirpath, _, files in os.walk(EDGE):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name)) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Assign):
                        targets = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                        if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                            defined.append(os.path.relpath(os.path.join(dirpath, name), EDGE))
    assert defined == ["__init__.py"]
