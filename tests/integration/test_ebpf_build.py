"""Building and loading the eBPF program: clang's cache, the verifier, errors that say why.

Marked ``ebpf``: clang, libbpf and root (loading a program into the kernel).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation.softswitch.ebpf.build import EbpfBuildError, build_program, clang_command
from emulation.softswitch.ebpf.libbpf import BpfObject, LibbpfError

pytestmark = [pytest.mark.ebpf, pytest.mark.root]


@pytest.mark.slow
def test_builds_once_per_lanes_source_and_defines(tmp_path: Path) -> None:
    first = build_program(64, tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build_program(64, tmp_path) == first and first.stat().st_mtime_ns == mtime
    assert build_program(8, tmp_path) != first
    assert build_program(64, tmp_path, defines=("INA_NO_LOCK",)) != first
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".o", ".o", ".o"]  # no leftovers


@pytest.mark.parametrize("lanes", [1, 64, 2048])
def test_the_verifier_takes_the_program_at_every_width(tmp_path: Path, lanes: int) -> None:
    obj = BpfObject(build_program(lanes, tmp_path), {"slots": 32})
    try:
        assert obj.program_fd("ina_port") > 0
    finally:
        obj.close()


def test_what_the_kernel_refuses_is_an_error_naming_the_object(tmp_path: Path) -> None:
    path = build_program(64, tmp_path)
    with pytest.raises(LibbpfError, match=f"loading {path}"):
        BpfObject(path, {"slots": 0})  # an array map of no entries
    with pytest.raises(LibbpfError, match="no map nope"):
        BpfObject(path, {"nope": 4})


def test_clang_errors_quote_clang(tmp_path: Path) -> None:
    with pytest.raises(EbpfBuildError, match="error"):
        build_program(64, tmp_path, defines=("INA_LANES=oops",))
    assert "-DX" in clang_command(Path("clang"), tmp_path, tmp_path / "o", ("X",))
