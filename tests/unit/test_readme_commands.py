"""Every ``inalab`` command line in the README's code blocks is one the installed command
accepts, as written after the README's set-up: its flags parse, its files exist, root
lines use the virtual environment's ``inalab`` (``sudo`` resets ``PATH``).

Running them is other tests' job (the marked examples, the CLI tests); this keeps the
README from drifting when a flag is renamed or a topology moves.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from emulation.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _command_lines() -> list[str]:
    """The lines of fenced code blocks that run inalab (continuations joined)."""
    lines, inside = [], False
    text = README.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        line = line.strip()
        if inside and re.match(r"(sudo )?(\S*/)?inalab ", line):
            lines.append(line)
    return lines


COMMANDS = _command_lines()


def test_the_readme_has_command_lines() -> None:
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("line", COMMANDS)
def test_a_readme_command_parses_as_written(line: str) -> None:
    words = shlex.split(line, comments=True)
    if words[-1] == "&":  # started in the background
        words.pop()
    if words[0] == "sudo":
        # sudo resets PATH: the set-up's inalab is .venv/bin/inalab, not a bare name.
        assert words[1] == ".venv/bin/inalab", f"{line}: use sudo .venv/bin/inalab"
        words = words[1:]
    else:
        assert words[0] == "inalab", line
        assert words[1:2] != ["emulate"], f"{line}: inalab emulate needs root (sudo)"
    argv = words[1:]
    args = build_parser().parse_args(argv)  # SystemExit (usage error) fails the test
    for value in vars(args).values():
        if isinstance(value, Path) and value.suffix in (".yaml", ".json") and "topolog" in str(
            value
        ):
            assert (REPO / value).exists(), f"{line}: no {value}"
    program = getattr(args, "program", None)  # emulate ... run -- COMMAND
    if program:
        scripts = [w for w in program if w.endswith(".py")]
        for script in scripts:
            made_by_readme = f"cat > {script}" in README.read_text()
            assert made_by_readme or (REPO / script).exists(), f"{line}: no {script}"
