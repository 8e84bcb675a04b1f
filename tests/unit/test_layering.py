"""Dependency rules of STYLE.md that imports can check."""

from __future__ import annotations

import subprocess
import sys


def _modules_loaded_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_the_switch_shares_only_the_wire_format_with_hostlib() -> None:
    loaded = _modules_loaded_by("import emulation.softswitch.server, emulation.softswitch.cli")
    assert {m for m in loaded if m.startswith("hostlib")} == {"hostlib", "hostlib.protocol"}


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
    assert "emulation.softswitch" not in loaded
