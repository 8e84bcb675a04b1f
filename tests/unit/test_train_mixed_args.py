"""``examples/train_mixed.py``'s command lines: every one the docs show parses, and
bad ones are refused before any rank starts (running it is test_emulate_run's job)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_mixed.py"


def _example() -> ModuleType:
    return load_script(SCRIPT, "train_mixed")


def _shown() -> list[list[str]]:
    """The arguments after ``examples/train_mixed.py`` in the docs' code lines."""
    out = []
    for doc in (REPO / "docs" / "pytorch.md", REPO / "examples" / "README.md"):
        text = doc.read_text().replace("\\\n", " ")
        for m in re.finditer(r"examples/train_mixed\.py([^\n`]*)", text):
            out.append(shlex.split(m.group(1)))
    return out


def test_the_docs_show_it_and_their_lines_parse() -> None:
    shown = _shown()
    assert len(shown) >= 2
    example = _example()
    for argv in shown:
        args = example.parse_args(argv)
        assert args.change_at == (args.iterations // 2 if args.bw_after else None)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--strategies", "agent,ring"], "unknown ring"),
        (["--change-at", "3"], "without --bw-after"),
        (["--bw-after", "100", "--change-at", "20"], "outside 1..19"),
        (["--iterations", "1"], "at least 2"),
    ],
)
def test_bad_lines_are_refused(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _example().parse_args(argv)
    assert exc.value.code == 2 and why in capsys.readouterr().err
