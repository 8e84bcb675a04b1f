"""Dependency rules of STYLE.md that imports can check."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def _modules_loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_the_switch_shares_only_the_wire_format_with_hostlib() -> None:
    loaded = _modules_loaded_by("import emulation.softswitch.server, emulation.softswitch.cli")
    wire = {"hostlib", "hostlib.protocol", "hostlib.rocev2"}  # INA's, and INA over RoCEv2's
    assert {m for m in loaded if m.startswith("hostlib")} == wire


def test_hostlib_never_imports_controller_or_emulation() -> None:
    loaded = _modules_loaded_by("import hostlib, hostlib.session, hostlib.transport.memory")
    assert not {m for m in loaded if m.split(".")[0] in ("controller", "emulation")}


def test_package_names_still_resolve() -> None:
    loaded = _modules_loaded_by("from hostlib import InaSession, JobSpec, InaTimeoutError")
    assert {"hostlib.session", "hostlib.ina"} <= loaded


def test_a_topology_is_pure_data() -> None:
    # Loading and checking a topology needs no root: no Mininet, no switch, no gRPC.
    loaded = _modules_loaded_by("import emulation.topology")
    assert not {m for m in loaded if m.split(".")[0] in ("mininet", "grpc", "controller")}
    # Of the switch, only the value parsers it shares (a topology's delays): its package
    # imports nothing until a name is asked for.
    switch = {m for m in loaded if m.split(".")[:2] == ["emulation", "softswitch"]}
    assert switch <= {"emulation.softswitch", "emulation.softswitch.argtypes"}


DYNAMICCL = Path(__file__).resolve().parents[2] / "dynamiccl"


def test_dynamiccl_loads_no_emulation() -> None:
    # Every module, torch's too (torch_backend, ddp): the bench hands dynamiccl data.
    loaded = _modules_loaded_by(
        "import importlib, pkgutil, dynamiccl; "
        "[importlib.import_module(m.name) for m in "
        "pkgutil.walk_packages(dynamiccl.__path__, 'dynamiccl.')]"
    )
    assert {"dynamiccl.cli", "dynamiccl.model", "dynamiccl.torch_backend"} <= loaded
    assert not {m for m in loaded if m.split(".")[0] == "emulation"}


def _imported_names(tree: ast.AST) -> list[str]:
    """Every module an import anywhere in ``tree`` names: statements (in function bodies
    and ``if TYPE_CHECKING:`` blocks too) and ``import_module("...")``/``__import__``."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                names.append(str(first.value))
    return names


def test_no_dynamiccl_source_imports_emulation() -> None:
    sources = sorted(DYNAMICCL.rglob("*.py"))
    assert DYNAMICCL / "cli.py" in sources
    offending = [
        f"{path.relative_to(DYNAMICCL.parent)}: {name}"
        for path in sources
        for name in _imported_names(ast.parse(path.read_text(), str(path)))
        if name.split(".")[0] == "emulation"
    ]
    assert not offending
