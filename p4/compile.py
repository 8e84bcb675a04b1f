"""Compile p4/ina.p4 with p4c-bm2-ss and hold p4/ina.p4info.txtpb to p4c's P4Info.

The committed P4Info is p4c's own output, byte for byte, not a hand-kept copy: p4c is
the authority on what P4Info a program has (the hand-kept file once lacked the
``initial_default_action`` p4c emits), and a byte comparison notices every difference
(names, ids, widths, sizes, annotations, order). It is committed so that the soft
switch and the controller need no compiler; where p4c is installed, this script (run by
``.ci/run``) and ``tests/unit/test_p4c.py`` check that it is current.

Usage::

    python p4/compile.py            # compile into p4/build/; exit 1 with a diff if
                                    # p4/ina.p4info.txtpb is not what p4c emits
    python p4/compile.py --write    # compile, then write p4c's P4Info over it

Warnings are errors (``--Werror``). It runs in the venv where inalab is installed (it takes
p4c's command line from ``controller.p4c``). The compiler is ``p4c-bm2-ss`` on PATH (``--p4c``
to name another); outputs go to ``p4/build/`` (not committed): ``ina.json``, the bmv2
program, and ``ina.p4info.txtpb``.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from controller.p4c import compile_command

__all__ = ["COMMITTED_P4INFO", "HERE", "CompileFailed", "Compiled", "compile_p4", "p4info_diff"]

HERE = Path(__file__).resolve().parent
"""The p4/ directory."""
PROGRAM = HERE / "ina.p4"
COMMITTED_P4INFO = HERE / "ina.p4info.txtpb"
BUILD_DIR = HERE / "build"
COMPILER = "p4c-bm2-ss"
_DIFF_LINES = 60


class CompileFailed(RuntimeError):
    """p4c-bm2-ss is missing, could not be run, or refused the program (its stderr)."""


@dataclass(frozen=True)
class Compiled:
    """What one compile wrote."""

    json: Path
    p4info: Path


def compile_p4(
    out_dir: Path = BUILD_DIR, program: Path = PROGRAM, compiler: str | None = None
) -> Compiled:
    """Compile ``program`` for bmv2 (v1model) into ``out_dir`` with warnings as errors.

    Raises:
        CompileFailed: no compiler, or p4c failed (the message holds its stderr).
    """
    found = shutil.which(compiler or COMPILER)
    if found is None:
        raise CompileFailed(f"{compiler or COMPILER} is not on PATH (p4/README.md: install)")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = Compiled(out_dir / f"{program.stem}.json", out_dir / f"{program.stem}.p4info.txtpb")
    command = compile_command(Path(found), program, out.json, out.p4info, werror=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CompileFailed(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr}")
    if done.stderr.strip():  # --Werror makes warnings fail; anything else is still news
        print(done.stderr, file=sys.stderr, end="")
    return out


def p4info_diff(p4c_text: str, committed_text: str, committed_name: str) -> list[str]:
    """A unified diff from ``committed_text`` to p4c's output (empty: identical)."""
    return list(
        difflib.unified_diff(
            committed_text.splitlines(keepends=True),
            p4c_text.splitlines(keepends=True),
            fromfile=committed_name,
            tofile="p4c's P4Info",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write p4c's P4Info over the file")
    parser.add_argument("--p4c", help=f"the compiler (default: {COMPILER} on PATH)")
    parser.add_argument("--out", type=Path, default=BUILD_DIR, help="output directory")
    args = parser.parse_args(argv)
    try:
        compiled = compile_p4(args.out, compiler=args.p4c)
    except CompileFailed as exc:
        print(f"compile.py: {exc}", file=sys.stderr)
        return 1
    p4c_text = compiled.p4info.read_text()
    if args.write:
        COMMITTED_P4INFO.write_text(p4c_text)
        print(f"wrote {COMMITTED_P4INFO}")
        return 0
    committed = COMMITTED_P4INFO.read_text() if COMMITTED_P4INFO.exists() else ""
    diff = p4info_diff(p4c_text, committed, "p4/ina.p4info.txtpb")
    if diff:
        sys.stderr.writelines(diff[:_DIFF_LINES])
        more = f" ({len(diff) - _DIFF_LINES} more diff lines)" if len(diff) > _DIFF_LINES else ""
        print(
            f"compile.py: p4/ina.p4info.txtpb is not p4c's P4Info{more}: if the .p4 change "
            "is intended, run python p4/compile.py --write",
            file=sys.stderr,
        )
        return 1
    print(f"{compiled.json}: compiled; p4/ina.p4info.txtpb is p4c's P4Info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
