"""The layering ARCHITECTURE.md describes, checked on the source: which layer may import
which, optional capabilities reached only from composition, and every port documented."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from edge.app.capabilities import AGENT, CAPABILITIES, Capability

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
    # The AI operator's side of the daemon: it serves the child's tool calls, never imports the child.
    "operator": {"core", "tools"},
    # The child of an AI run: core shapes and the blocking socket client, nothing of the daemon.
    "airun": {"core", "transports"},
    # Notifications: the notifier and its tools in the daemon, the sender child.
    "notify": {"core", "tools"},
    # The web panel: its own process, a client of the tool socket; nothing of the daemon.
    "web": set(),
    "app": {"core", "storage", "runner", "scheduler", "tools", "transports", "mcp", "notify", "operator"},
    "cli": {"core", "tools", "transports", "app", "notify", "web"},
}


def _sources() -> list[tuple[str, ast.Module]]:
    """(path relative to edge/, its syntax tree) for every module."""
    found = []
    for dirpath, _, files in os.walk(EDGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    found.append((os.path.relpath(path, EDGE), ast.parse(f.read())))
    return found


def _imports() -> list[tuple[str, str, str]]:
    """(importing module path, its layer, imported edge module) for every edge import."""
    found = []
    for rel, tree in _sources():
        layer = rel.split(os.sep)[0] if os.sep in rel else ""
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


# Composition: the one module that builds every capability's daemon side (edge.app.graph.SIDES).
COMPOSITION = "app/graph.py"


def _of(capability: Capability, rel: str) -> bool:
    """Whether a file (relative to edge/) is one of the capability's parts."""
    return any(("edge/" + rel.replace(os.sep, "/")).startswith(part) for part in capability.parts)


def _reaches(capability: Capability, module: str) -> bool:
    return any(module == m or (m.endswith(".") and module.startswith(m)) or module.startswith(m + ".")
               for m in capability.modules())


def _optional(rel: str) -> bool:
    return any(_of(c, rel) for c in CAPABILITIES)


def test_optional_capabilities_are_imported_only_by_composition():
    """Each capability's modules (edge.app.capabilities: its parts) are imported by its own
    parts, by composition, by the command line where it serves nouns, by the adapters of an
    optional store (a cluster's, which stores what every capability keeps) and, for its
    shapes and ports in edge/core, under TYPE_CHECKING by the parts they describe."""
    typing_only = _typing_only_imports()
    wrong = []
    for rel, _, module in _imports():
        for capability in CAPABILITIES:
            if not _reaches(capability, module) or _of(capability, rel) or rel == COMPOSITION:
                continue
            if capability.cli_nouns and rel.startswith("cli" + os.sep):
                continue
            if rel.startswith("storage" + os.sep) and _optional(rel):
                continue
            if module.startswith("edge.core.") and (rel, module) in typing_only:
                continue
            wrong.append(f"{rel} imports {module} ({capability.name})")
    assert wrong == []
    # What only composition may reach: each capability's daemon side is built in one place,
    # from its entry, whatever else of it the command line or other capabilities use.
    sides = [c for c in CAPABILITIES if c.entry is not None]
    assert sides and all(_reaches(c, c.entry) for c in sides)  # an entry is one of its parts
    for capability in sides:
        entry = capability.entry
        importers = {rel for rel, _, module in _imports() if module == entry or module.startswith(f"{entry}.")}
        assert {r for r in importers if not _of(capability, r)} == {COMPOSITION}, capability.name
    cluster = os.path.join("storage", "postgres") + os.sep
    importers = {rel for rel, _, module in _imports() if module == "edge.core.ports.cluster"}
    assert importers <= {COMPOSITION} | {r for r in importers if r.startswith(cluster)}


def test_every_capability_with_a_daemon_side_is_built_by_composition():
    from edge.app.graph import SIDES

    assert set(SIDES) == {c.name for c in CAPABILITIES if c.daemon}
    for capability in CAPABILITIES:
        for part in capability.parts:  # each part exists, and each probe names a shipped part or a dependency
            assert os.path.exists(os.path.join(ROOT, part)), part
        shipped = [p for p in capability.probe if p.startswith("edge.")]
        assert all(p + "." in capability.modules() for p in shipped), capability.name


def test_the_capabilities_are_read_without_loading_anything():
    """The command line reads them on every call, packaging/build.py on the build host."""
    code = ("import sys; before = set(sys.modules); import edge.app.capabilities as c;"
            " print(sorted(set(sys.modules) - before - {'edge', 'edge.app', 'edge.app.capabilities', '__future__'}));"
            " print([x.available() for x in c.CAPABILITIES])")
    result = subprocess.run([sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "[]"


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
    importers = {rel for rel, _, module in _imports() if module == "edge.airun" or module.startswith("edge.airun.")}
    assert {r for r in importers if not r.startswith("airun" + os.sep)} == set()


def _eager_imports(tree: ast.Module) -> set[str]:
    """Modules imported when the module loads: not inside functions, not under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if _type_checking(node):
                assert isinstance(node, ast.If)
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


def _type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _typing_only_imports() -> set[tuple[str, str]]:
    """(module path, edge module) imported only under a module-level TYPE_CHECKING."""
    found: set[tuple[str, str]] = set()
    for rel, tree in _sources():
        for node in tree.body:
            if _type_checking(node):
                assert isinstance(node, ast.If)
                for sub in ast.walk(node):
                    if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("edge"):
                        found.add((rel, sub.module))
                        found.update((rel, f"{sub.module}.{a.name}") for a in sub.names)
    everything = {(rel, module) for rel, _, module in _imports()}
    eager_or_lazy = [(rel, m) for rel, tree in _sources() for m in _eager_imports(tree)]
    return {pair for pair in found if pair in everything} - set(eager_or_lazy)


def test_nothing_the_default_daemon_loads_imports_an_optional_capability_eagerly():
    """Outside the capabilities' own parts, their modules are imported only where they are
    used (inside functions) or for type checking: a daemon without them loads none."""
    wrong = []
    for rel, tree in _sources():
        if _optional(rel):
            continue
        for module in sorted(_eager_imports(tree)):
            wrong += [f"{rel} imports {module} ({c.name})" for c in CAPABILITIES if _reaches(c, module)]
    assert wrong == []


def test_the_ai_operators_shapes_and_ports_are_for_type_checking_elsewhere():
    """Outside the AI operator's parts, composition, the command line and a cluster's store
    adapters, its modules are imported under TYPE_CHECKING only: the runner, the chain and
    the cluster's node refer to its ports without loading them."""
    typing_only = _typing_only_imports()
    lazy = {(rel, module) for rel, _, module in _imports() if _reaches(AGENT, module) and not _optional(rel)
            and rel != COMPOSITION and not rel.startswith("cli" + os.sep)}
    assert {rel for rel, _ in lazy} >= {"runner/supervisor.py", "tools/chain.py"}  # the test sees them
    assert lazy - typing_only == set()


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


# No module imports itself through others, type-only imports included.
KNOWN_CIRCLES: set[str] = set()


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
