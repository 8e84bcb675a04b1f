"""p4/tna/ on p4c's Tofino backend: a program breaking Tofino's rules fails the check.

``.ci/run`` compiles the real program (``p4/compile_tna.py``: no error, 12 stages, the
committed P4Info, RegisterAction list and stage table current); tests/unit/test_p4_tna.py
holds those committed files to the budget. Here the compiler refuses deliberate
violations in copies of the sources, so a check that passed everything would fail.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import load_script

pytestmark = [pytest.mark.tofino]

P4_DIR = Path(__file__).resolve().parents[2] / "p4"


compile_tna = load_script(P4_DIR / "compile_tna.py", "p4_compile_tna")


def _copy_sources(tmp_path: Path) -> Path:
    """p4/*.p4 and p4/tna/*.p4 in a scratch tree (tna/ includes ../); return tna/."""
    root = tmp_path / "p4"
    (root / "tna").mkdir(parents=True)
    for path in P4_DIR.glob("*.p4"):
        shutil.copy(path, root / path.name)
    for path in (P4_DIR / "tna").glob("*.p4"):
        shutil.copy(path, root / "tna" / path.name)
    return root / "tna"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name}: the edit's anchor moved"
    path.write_text(text.replace(old, new))


_SEQ_CHECK = (
    "meta.seq_diff = check.execute(index.get({meta.abs_slot[15:15], meta.abs_slot[12:0]}));"
)


def test_a_register_executed_twice_in_one_pass_fails(tmp_path: Path) -> None:
    tna = _copy_sources(tmp_path)
    # The seq register once more, after its execute: two reads of one register a pass.
    _edit(
        tna / "seq.p4",
        _SEQ_CHECK + "\n        }",
        _SEQ_CHECK
        + "\n        }\n        meta.seq_diff = meta.seq_diff"
        + " + check.execute(index.get({meta.abs_slot[15:15], meta.abs_slot[12:0]}));",
    )
    with pytest.raises(compile_tna.CompileFailed, match="error: Table placement cannot make"):
        compile_tna.compile_tna(tmp_path / "out", tna / "ina_tna.p4")


def test_a_register_action_with_three_comparisons_fails(tmp_path: Path) -> None:
    tna = _copy_sources(tmp_path)
    # The exponent's write and max in one RegisterAction: the operation's two comparisons
    # and the signed max's third.
    _edit(
        tna / "values.p4",
        "            if ((int<8>)value < (int<8>)hdr.ina.exponent) {",
        "            if (meta.lane_op == (bit<8>)LANE_OP_WRITE"
        " || (meta.lane_op == (bit<8>)LANE_OP_ADD && (int<8>)value < (int<8>)hdr.ina.exponent)) {",
    )
    with pytest.raises(compile_tna.CompileFailed, match="comparisons"):
        compile_tna.compile_tna(tmp_path / "out", tna / "ina_tna.p4")
