"""The README's two set-up commands (issue #38): the first installs and runs the main
job, the second is the quick test run, which leaves out the slow tests, and CI runs
exactly that command before the rest of the suite."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks of a Markdown text."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def _setup_commands() -> list[str]:
    """The commands of the README's "Set-up" section, in order."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## Set-up\n(.*?)(?=^## )", text, re.DOTALL | re.MULTILINE)
    assert section is not None, "the README has no '## Set-up' section"
    return [line.strip() for block in _blocks(section.group(1)) for line in block.splitlines()
            if line.strip()]  # fmt: skip


def _pytest_words(command: str) -> list[str]:
    """The words of ``command``'s pytest invocation (after ``&&``)."""
    for part in command.split("&&"):
        words = shlex.split(part)
        if words and words[0] == "pytest":
            return words
    raise AssertionError(f"no pytest in {command!r}")


def test_the_setup_is_two_commands_install_and_bench_then_the_quick_tests() -> None:
    first, second = _setup_commands()
    assert "pip install -e '.[dev]'" in first and first.endswith("inalab bench")
    words = _pytest_words(second)
    assert words[words.index("-m") + 1] == "not slow", second


def test_ci_runs_the_readmes_test_command_then_the_slow_tests() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert 'run_pytest -m "not slow"' in ci
    assert "run_pytest -m slow" in ci
    assert ci.index('run_pytest -m "not slow"') < ci.index("run_pytest -m slow")
