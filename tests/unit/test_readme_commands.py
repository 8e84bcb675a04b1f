"""Every ``inalab`` command line in the code blocks of README.md and docs/*.md, and every
command an ``inalab ... --help`` text shows, is one the installed command accepts, as
written after the README's set-up: its flags parse, its files exist, root lines use the
virtual environment's ``inalab`` (``sudo`` resets ``PATH``).

Running them is other tests' job (the marked examples, the CLI tests); this keeps the
README, the docs and the help texts from drifting when a flag is renamed or a topology
moves.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
"""The README and every docs page: the text a user copies commands from."""

DOCS_TEXT = "\n".join(doc.read_text() for doc in DOCS)
"""All of them, for what one page's command needs from another (``cat > SCRIPT``)."""


def _command_lines(doc: Path) -> list[str]:
    """The lines of ``doc``'s fenced code blocks that run inalab (continuations joined)."""
    lines, inside = [], False
    text = doc.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        line = line.strip()
        if inside and re.match(r"(sudo )?(\S*/)?inalab ", line):
            lines.append(line)
    return lines


COMMANDS = [
    pytest.param(line, str(doc.relative_to(REPO)), id=f"{doc.relative_to(REPO)}: {line}")
    for doc in DOCS
    for line in _command_lines(doc)
]

_INALAB = r"(sudo )?(\S*/)?inalab "


def _parsers(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ("inalab",)
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``inalab``'s parser and every subcommand's and action's below it, by command."""
    yield " ".join(words), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*words, name))


HELP_TEXTS = {command: parser.format_help() for command, parser in _parsers(build_parser())}
"""``--help`` of inalab, every subcommand and every ``inalab emulate`` action, as printed."""


def _help_commands() -> list[tuple[str, str]]:
    """(help text's command, a command it shows): every span in backquotes or double
    quotes that runs inalab, with the help's line wrapping undone."""
    found = []
    for command, text in HELP_TEXTS.items():
        flat = " ".join(text.split())
        for match in re.finditer(r"`([^`]+)`|\"([^\"]+)\"", flat):
            span = match.group(1) or match.group(2)
            # "inalab ...: error: ..." shows what inalab prints, not a command line.
            if re.match(_INALAB, span) and ": error:" not in span:
                found.append((command, span))
    return found


HELP_COMMANDS = _help_commands()


def test_the_readme_and_docs_have_command_lines() -> None:
    assert len(COMMANDS) >= 20
    assert _command_lines(REPO / "README.md"), "README.md shows no inalab command"


def test_the_help_texts_show_commands() -> None:
    shown = {command for command, _ in HELP_COMMANDS}
    assert {"inalab", "inalab compare", "inalab emulate check", "inalab decide"} <= shown


@pytest.mark.parametrize("command", sorted(HELP_TEXTS))
def test_no_help_text_runs_a_bare_inalab_under_sudo(command: str) -> None:
    flat = " ".join(HELP_TEXTS[command].split())
    assert not re.search(r"sudo (?!\.venv/bin/inalab )(\S*/)?inalab\b", flat), (
        f"{command} --help: sudo resets PATH: write sudo .venv/bin/inalab"
    )


@pytest.fixture(scope="module")
def readme_certs(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """A directory holding ``certs/`` as the docs make them (``examples/make-certs.sh
    certs ...``), where its TLS lines' files then exist; None without openssl."""
    if shutil.which("openssl") is None:
        return None
    where = tmp_path_factory.mktemp("readme")
    subprocess.run(["bash", str(REPO / "examples" / "make-certs.sh"), "certs",
                    "switch:127.0.0.1", "ctl", "rank0"],
                   cwd=where, check=True, capture_output=True, timeout=60)  # fmt: skip
    return where


@pytest.mark.parametrize(("line", "where"), COMMANDS)
def test_a_docs_command_parses_as_written(
    line: str, where: str, readme_certs: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "certs/" in line:  # the files the docs' make-certs.sh line makes
        if readme_certs is None:
            pytest.skip("needs openssl to make the docs' certificates")
        monkeypatch.chdir(readme_certs)
    _check_command(line, DOCS_TEXT, where=where)


@pytest.mark.parametrize(("command", "line"), HELP_COMMANDS)
def test_a_help_texts_command_parses_as_written(command: str, line: str) -> None:
    _check_command(line, "", where=f"{command} --help")


def _check_command(line: str, docs_text: str, where: str = "README.md") -> None:
    """``line`` runs as written: sudo only with the virtual environment's inalab, root
    actions only under sudo, its flags parse, its topology files and scripts exist (a
    script may be one the docs' own ``cat > SCRIPT`` makes)."""
    shown = f"{where}: {line}"
    words = shlex.split(line, comments=True)
    if words[-1] == "&":  # started in the background
        words.pop()
    words = [w for w in words if not re.match(r"\d?>", w)]  # the shell's redirections
    sudo = words[0] == "sudo"
    if sudo:
        # sudo resets PATH: the set-up's inalab is .venv/bin/inalab, not a bare name.
        assert words[1] == ".venv/bin/inalab", f"{shown}: use sudo .venv/bin/inalab"
        words = words[1:]
    else:
        assert words[0] == "inalab", shown
    argv = words[1:]
    args = build_parser().parse_args(argv)  # SystemExit (usage error) fails the test
    if not sudo and argv[:1] == ["emulate"]:
        assert args.action == "check", f"{shown}: inalab emulate needs root (sudo) but to check"
    for value in vars(args).values():
        if isinstance(value, Path) and value.suffix in (".yaml", ".json") and "topolog" in str(
            value
        ):
            assert (REPO / value).exists(), f"{shown}: no {value}"
    program = getattr(args, "program", None)  # emulate ... run -- COMMAND
    if program:
        scripts = [w for w in program if w.endswith(".py")]
        for script in scripts:
            made_by_docs = f"cat > {script}" in docs_text
            assert made_by_docs or (REPO / script).exists(), f"{shown}: no {script}"
