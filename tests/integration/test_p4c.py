"""p4/ on the real compiler: p4c-bm2-ss compiles it without warnings, and the committed
P4Info is exactly p4c's (``p4/compile.py``; ``.ci/run`` runs the script too).

Marked ``bmv2`` (the probe wants p4c-bm2-ss with simple_switch_grpc). The deliberate
mismatches below prove the comparison can fail: an id changed in a copy of the sources,
a size changed in a copy of the committed file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_script

pytestmark = [pytest.mark.bmv2, pytest.mark.slow]

P4_DIR = Path(__file__).resolve().parents[2] / "p4"


compile_py = load_script(P4_DIR / "compile.py", "p4_compile")


def _copy_sources(tmp_path: Path) -> Path:
    """The .p4 files in a scratch directory, for deliberate edits; return its ina.p4."""
    src = tmp_path / "p4"
    src.mkdir()
    for p in P4_DIR.glob("*.p4"):
        shutil.copy(p, src / p.name)
    return src / "ina.p4"


def test_the_committed_p4info_is_what_p4c_emits(tmp_path: Path) -> None:
    compiled = compile_py.compile_p4(tmp_path / "build")
    assert compiled.json.stat().st_size > 0
    committed = (P4_DIR / "ina.p4info.txtpb").read_text()
    assert compile_py.p4info_diff(compiled.p4info.read_text(), committed, "committed") == []


def test_a_changed_id_in_the_sources_is_a_difference(tmp_path: Path) -> None:
    program = _copy_sources(tmp_path)
    jobs = program.parent / "jobs.p4"
    text = jobs.read_text()
    assert "@id(0x02030001)" in text
    jobs.write_text(text.replace("@id(0x02030001)", "@id(0x02030009)"))
    compiled = compile_py.compile_p4(tmp_path / "build", program)
    committed = (P4_DIR / "ina.p4info.txtpb").read_text()
    diff = compile_py.p4info_diff(compiled.p4info.read_text(), committed, "committed")
    assert f"-    id: {0x02030001}\n" in diff and f"+    id: {0x02030009}\n" in diff


def test_a_changed_size_in_the_committed_file_is_a_difference(tmp_path: Path) -> None:
    p4c_text = compile_py.compile_p4(tmp_path / "build").p4info.read_text()
    edited = p4c_text.replace("size: 1024", "size: 512", 1)
    assert edited != p4c_text
    diff = compile_py.p4info_diff(p4c_text, edited, "committed")
    assert "-  size: 512\n" in diff and "+  size: 1024\n" in diff


def test_a_program_p4c_refuses_fails_with_its_message(tmp_path: Path) -> None:
    program = _copy_sources(tmp_path)
    ina = program.read_text()
    # The name clash p4c found in the first compile (v1model declares Deparser).
    program.write_text(ina.replace("InaDeparser()) main;", "Deparser()) main;"))
    parsers = program.parent / "parsers.p4"
    parsers.write_text(parsers.read_text().replace("control InaDeparser(", "control Deparser("))
    with pytest.raises(compile_py.CompileFailed, match="duplicates"):
        compile_py.compile_p4(tmp_path / "build", program)


def test_the_script_checks_the_repository(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(P4_DIR / "compile.py"), "--out", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "is p4c's P4Info" in done.stdout
    assert (tmp_path / "ina.json").stat().st_size > 0
