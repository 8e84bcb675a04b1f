"""The import graph of inalab's packages (issue #39): no circles, and every import goes
down the declared layer order (docs/architecture.md).

The graph is built from the sources with ``ast``: every ``import`` and ``from ... import``
anywhere in a module (function bodies and ``if TYPE_CHECKING:`` blocks too), relative
imports resolved, each name taken to the deepest module of ours it names. Two kinds of
edge are not counted: a module's import of its own package (``hostlib.session`` ->
``hostlib``: the package re-exports, it is not a dependency), and the imports inside a
module-level ``__getattr__`` (PEP 562), the form a deprecated name takes where it moved
up a layer: it imports on use, with a warning.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hostlib", "controller", "dynamiccl", "emulation")
"""In layer order: a package imports only those before it (and itself)."""

HOSTLIB_LAYERS: tuple[tuple[str, ...], ...] = (
    # the wire and what needs nothing else of ours
    ("hostlib.protocol", "hostlib.units", "hostlib.quantize", "hostlib.actions",
     "hostlib.scapy_layer", "hostlib.shmbarrier", "hostlib.p2pwire", "hostlib.errors",
     "hostlib.rocev2", "hostlib.congestion"),
    ("hostlib.transport",),  # and its modules
    # engines: one call's per-packet state machines (Python and native)
    ("hostlib.ina", "hostlib.native", "hostlib.p2p", "hostlib.ring", "hostlib.tree"),
    # sessions: a job's or a peer group's calls over a transport
    ("hostlib.session", "hostlib.collnet", "hostlib.peers"),
    ("hostlib.communicator",),
)  # fmt: skip
"""hostlib's floors, bottom first: a module imports only its own floor and those below.
``hostlib`` itself (the package, which re-exports) stands above them all."""

SWITCH_TARGETS = ("emulation.softswitch", "emulation.tnamodel")
"""Switch targets: they may import hostlib's wire format and the controller's P4Info
reader, never the Mininet emulation or the bench."""

EMULATION_LAYERS: tuple[tuple[str, ...], ...] = (
    # the switch targets, and the value parsers their command lines share
    ("emulation.softswitch", "emulation.tnamodel", "emulation.bmv2", "emulation.argtypes"),
    ("emulation.topology",),  # topologies as data
    ("emulation.bench",),
    ("emulation.mininet",),  # the network, and ``inalab emulate`` (which runs benches)
    ("emulation.cli",),
)
"""emulation's parts, bottom first, as for :data:`HOSTLIB_LAYERS`; ``emulation`` itself
and its ``_moved`` finder (old module paths) stand apart."""


def _modules(packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Module name -> source file, for every module of ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _lazy_getattr_nodes(tree: ast.Module) -> set[ast.AST]:
    """The nodes inside a module-level ``def __getattr__``."""
    return {
        node
        for top in tree.body
        if isinstance(top, ast.FunctionDef) and top.name == "__getattr__"
        for node in ast.walk(top)
    }


def _imported(module: str, path: Path) -> set[str]:
    """Every dotted name an import in ``module`` names (``from a import b``: ``a`` and
    ``a.b``), relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _lazy_getattr_nodes(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (see the module docstring)."""

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = {ours(name) for name in _imported(module, path)}
        graph[module] = {
            t for t in targets if t is not None and t != module and not module.startswith(t + ".")
        }
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _hostlib_floor(module: str) -> int:
    """The floor of a hostlib module (:data:`HOSTLIB_LAYERS`); the package: the top."""
    for floor, members in enumerate(HOSTLIB_LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return floor
    if module == "hostlib":
        return len(HOSTLIB_LAYERS)
    raise AssertionError(f"{module} has no floor in HOSTLIB_LAYERS: place it")


def _emulation_floor(module: str) -> int:
    """The floor of an emulation module (:data:`EMULATION_LAYERS`); the package: the top."""
    for floor, members in enumerate(EMULATION_LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return floor
    if module in ("emulation", "emulation._moved"):
        return len(EMULATION_LAYERS)
    raise AssertionError(f"{module} has no floor in EMULATION_LAYERS: place it")


def against_the_order(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import that goes up: between packages, between hostlib's or emulation's
    floors, or from a switch target into the rest of the emulation."""
    wrong = []
    for module, targets in sorted(graph.items()):
        top = module.split(".")[0]
        for target in sorted(targets):
            there = target.split(".")[0]
            if PACKAGES.index(there) > PACKAGES.index(top):
                wrong.append(f"{module} -> {target}: {top} is below {there}")
            elif top == there == "hostlib" and _hostlib_floor(target) > _hostlib_floor(module):
                wrong.append(f"{module} -> {target}: a floor up in hostlib")
            elif top == there == "emulation" and (
                _emulation_floor(target) > _emulation_floor(module)
            ):
                wrong.append(f"{module} -> {target}: a floor up in emulation")
            elif (
                any(module.startswith(t) for t in SWITCH_TARGETS)
                and there == "emulation"
                and not any(target.startswith(t) for t in SWITCH_TARGETS)
            ):
                wrong.append(f"{module} -> {target}: a switch target into the emulation")
    return wrong


GRAPH = import_graph(_modules())


def test_the_graph_sees_every_package_and_known_edges() -> None:
    assert {m.split(".")[0] for m in GRAPH} == set(PACKAGES)
    assert "hostlib.protocol" in GRAPH["hostlib.ina"]
    assert "dynamiccl.model" in GRAPH["dynamiccl.policy"]


def test_there_are_no_import_circles() -> None:
    assert cycles(GRAPH) == []


def test_every_import_goes_down_the_layer_order() -> None:
    assert against_the_order(GRAPH) == []


def test_the_emulation_folders_hold_its_parts() -> None:
    """The topology data and the switch targets need nothing of Mininet: no module of
    theirs imports ``mininet`` or ``emulation.mininet``."""
    below = [m for m in GRAPH if m.startswith("emulation.") and _emulation_floor(m) <= 1]
    assert "emulation.topology.load" in below and "emulation.softswitch.server" in below
    for module in below:
        imported = _imported(module, _modules(("emulation",))[module])
        assert not [n for n in imported if n.split(".")[0] == "mininet"], module
        assert not [n for n in GRAPH[module] if n.startswith("emulation.mininet")], module
    loose = sorted(p.name for p in (REPO / "emulation").glob("*.py"))
    assert loose == ["__init__.py", "_moved.py", "argtypes.py", "bmv2.py", "cli.py"]


def test_p4_compile_needs_no_emulator_module() -> None:
    scripts = {f"p4.{p.stem}": p for p in sorted((REPO / "p4").rglob("*.py"))}
    for module, path in scripts.items():
        assert not [n for n in _imported(module, path) if n.split(".")[0] == "emulation"], module


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
    ],
)
def test_cycles_finds_a_circle_and_only_a_circle(
    edges: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert cycles(edges) == expected


def test_a_circle_added_in_a_scratch_copy_fails(tmp_path: Path) -> None:
    """The protocol module importing the communicator closes a circle and goes up the
    floors: both checks see it."""
    copy = tmp_path / "hostlib"
    copy.mkdir()
    protocol = copy / "protocol.py"
    protocol.write_text((REPO / "hostlib" / "protocol.py").read_text()
                        + "\nfrom hostlib.communicator import Communicator\n")  # fmt: skip
    modules = _modules() | {"hostlib.protocol": protocol}
    graph = import_graph(modules)
    assert any("hostlib.protocol" in c and "hostlib.communicator" in c for c in cycles(graph))
    assert "hostlib.protocol -> hostlib.communicator: a floor up in hostlib" in (
        against_the_order(graph)
    )
