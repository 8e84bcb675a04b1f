"""Compile p4/tna/ina_tna.p4 with p4c's Tofino backend and hold it to its budget.

``p4c-barefoot --target tofino --arch tna -g`` runs the Tofino front, mid and back end:
stateful-ALU rules, PHV allocation and table placement. It has no assembler, so nothing
here can be loaded on a switch (p4/README.md, "Tofino"); what it checks is that the
program fits Tofino 1. This script, run by ``.ci/run`` where ``p4c-barefoot`` is on PATH:

- fails on any ``error:`` (p4c's exit status);
- fails when the placement needs more than :data:`STAGE_BUDGET` stages: this p4c places
  a program into more stages than the device has without an error (a 23-stage placement
  compiled here with exit 0), so the budget is read from ``pipe/logs/resources.json``;
- prints the per-stage resources (stateful ALUs, SRAM, map RAM, TCAM, logical tables)
  and the PHV bits in use;
- holds three committed files to the compile, byte for byte, as ``compile.py`` does for
  the v1model program: ``ina_tna.p4info.txtpb`` (the P4Info with standard registers and
  counters, ``--p4runtime-force-std-externs``, what Stratum and PI-based P4Runtime
  servers on Tofino expect), ``ina_tna.stateful.txt`` (each register's RegisterActions,
  from the compiler's assembly: the P4Info does not list them) and
  ``ina_tna.resources.txt`` (the stage table below).

Usage::

    python p4/compile_tna.py            # compile into p4/build/tna/; exit 1 on an error,
                                        # an overrun budget or a stale committed file
    python p4/compile_tna.py --write    # compile, then write the committed files
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "COMMITTED_P4INFO",
    "COMMITTED_RESOURCES",
    "COMMITTED_STATEFUL",
    "STAGE_BUDGET",
    "CompileFailed",
    "CompiledTna",
    "StageBudgetExceeded",
    "StageUse",
    "check_stage_budget",
    "compile_tna",
    "render_resources",
    "stage_use",
    "stateful_actions",
]

HERE = Path(__file__).resolve().parent
TNA_DIR = HERE / "tna"
PROGRAM = TNA_DIR / "ina_tna.p4"
COMMITTED_P4INFO = TNA_DIR / "ina_tna.p4info.txtpb"
COMMITTED_STATEFUL = TNA_DIR / "ina_tna.stateful.txt"
COMMITTED_RESOURCES = TNA_DIR / "ina_tna.resources.txt"
BUILD_DIR = HERE / "build" / "tna"
COMPILER = "p4c-barefoot"

STAGE_BUDGET = 12
"""Match-action stages of a Tofino 1 pipe: the program must place into them (p4/README.md
gives the stage map)."""

_SRAMS_PER_STAGE = 80
_MAPRAMS_PER_STAGE = 48
_TCAMS_PER_STAGE = 24
_SALUS_PER_STAGE = 4

# "- tbl_seq51$salu..Ingress.seq(seq_check, $hash_dist)": the register, then the
# RegisterAction as "<control instance>_<name>" (p4c's naming in the assembly).
_SALU_RE = re.compile(
    r"^\s*- \S+\$salu\.\.(?P<register>[\w.]+)\((?P<action>\w+),", re.MULTILINE
)


class CompileFailed(RuntimeError):
    """p4c-barefoot is missing, could not be run, or refused the program (its errors)."""


class StageBudgetExceeded(RuntimeError):
    """The placement needs more match-action stages than :data:`STAGE_BUDGET`."""


@dataclass(frozen=True)
class CompiledTna:
    """What one compile wrote."""

    out_dir: Path
    p4info: Path
    assembly: Path
    resources: Path
    phv: Path


@dataclass(frozen=True)
class StageUse:
    """One match-action stage's resources, ingress and egress together."""

    stage: int
    salus: int
    srams: int
    maprams: int
    tcams: int
    tables: tuple[str, ...]


def compile_tna(
    out_dir: Path = BUILD_DIR, program: Path = PROGRAM, compiler: str | None = None
) -> CompiledTna:
    """Compile ``program`` for Tofino 1 (TNA) into ``out_dir``, with ``-g`` logs and the P4Info.

    Raises:
        CompileFailed: no compiler, or p4c failed (the message holds its ``error:`` lines).
    """
    found = shutil.which(compiler or COMPILER)
    if found is None:
        raise CompileFailed(f"{compiler or COMPILER} is not on PATH (p4/README.md: Tofino)")
    out_dir.mkdir(parents=True, exist_ok=True)
    p4info = out_dir / "ina_tna.p4info.txtpb"
    command = [
        found, "--target", "tofino", "--arch", "tna", "-g", "-o", str(out_dir),
        "--p4runtime-files", str(p4info), "--p4runtime-force-std-externs", str(program),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    if done.returncode != 0:
        shown = "\n".join(errors) or done.stderr[-4000:]
        raise CompileFailed(f"{' '.join(command)}: exit {done.returncode}\n{shown}")
    logs = out_dir / "pipe" / "logs"
    return CompiledTna(
        out_dir, p4info, out_dir / "pipe" / f"{program.stem}.bfa",
        logs / "resources.json", logs / "phv.json",
    )  # fmt: skip


def _count(stage: dict[str, Any], key: str, inner: str) -> int:
    return len(stage.get(key, {}).get(inner, []))


def stage_use(resources: dict[str, Any]) -> list[StageUse]:
    """Each placed stage's use, from p4c's ``resources.json``, in stage order."""
    stages = []
    for stage in resources["resources"]["mau"]["mau_stages"]:
        tables = tuple(
            str(t["table_name"]) for t in stage.get("logical_tables", {}).get("ids", [])
        )
        stages.append(
            StageUse(
                stage=int(stage["stage_number"]),
                salus=_count(stage, "meter_alus", "meters"),
                srams=_count(stage, "rams", "srams"),
                maprams=_count(stage, "map_rams", "maprams"),
                tcams=_count(stage, "tcams", "tcams"),
                tables=tables,
            )
        )
    return sorted(stages, key=lambda s: s.stage)


def check_stage_budget(stages: list[StageUse], budget: int = STAGE_BUDGET) -> None:
    """Raise when the placement uses a stage numbered ``budget`` or higher.

    Raises:
        StageBudgetExceeded: with the stages used and what the extra stages hold.
    """
    over = [s for s in stages if s.stage >= budget and s.tables]
    if over:
        used = max(s.stage for s in stages) + 1
        held = "; ".join(f"stage {s.stage}: {', '.join(s.tables)}" for s in over)
        raise StageBudgetExceeded(f"the program needs {used} stages, budget {budget}: {held}")


def phv_bits(phv: dict[str, Any]) -> dict[str, int]:
    """PHV container bits holding at least one field, per gress (Tofino 1 has 4,096 a pipe
    in normal containers, shared by ingress and egress)."""
    used: dict[str, int] = {}
    for container in phv["containers"]:
        if container.get("slices") and container.get("container_type") == "normal":
            gress = str(container["gress"])
            used[gress] = used.get(gress, 0) + int(container["bit_width"])
    return used


def render_resources(stages: list[StageUse], phv: dict[str, int]) -> str:
    """The stage table, as printed by CI and committed as ``ina_tna.resources.txt``."""
    lines = [
        f"stage  stateful ALUs  SRAM  map RAM  TCAM  logical tables"
        f"  (of {_SALUS_PER_STAGE}, {_SRAMS_PER_STAGE}, {_MAPRAMS_PER_STAGE}, "
        f"{_TCAMS_PER_STAGE}, 16 a stage)"
    ]
    for s in stages:
        lines.append(
            f"{s.stage:>5}  {s.salus:>13}  {s.srams:>4}  {s.maprams:>7}  {s.tcams:>4}"
            f"  {len(s.tables):>14}"
        )
    total = sum(s.salus for s in stages)
    lines.append(f"stages {len(stages)} of {STAGE_BUDGET}; stateful ALUs {total}")
    lines.append(
        "PHV bits in use: " + ", ".join(f"{g} {bits}" for g, bits in sorted(phv.items()))
    )
    return "\n".join(lines) + "\n"


def stateful_actions(assembly: str) -> dict[str, list[str]]:
    """Each register's RegisterActions, from the assembly (``<instance>_<name>`` as p4c
    names them there)."""
    found: dict[str, set[str]] = {}
    for match in _SALU_RE.finditer(assembly):
        found.setdefault(match["register"], set()).add(match["action"])
    return {register: sorted(actions) for register, actions in sorted(found.items())}


def render_stateful(actions: dict[str, list[str]]) -> str:
    return "".join(f"{register}: {' '.join(names)}\n" for register, names in actions.items())


def _stale(path: Path, text: str) -> bool:
    return not path.exists() or path.read_text() != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the committed files")
    parser.add_argument("--p4c", help=f"the compiler (default: {COMPILER} on PATH)")
    parser.add_argument("--out", type=Path, default=BUILD_DIR, help="output directory")
    args = parser.parse_args(argv)
    try:
        compiled = compile_tna(args.out, compiler=args.p4c)
    except CompileFailed as exc:
        print(f"compile_tna.py: {exc}", file=sys.stderr)
        return 1
    stages = stage_use(json.loads(compiled.resources.read_text()))
    resources = render_resources(stages, phv_bits(json.loads(compiled.phv.read_text())))
    print(resources, end="")
    outputs = {
        COMMITTED_P4INFO: compiled.p4info.read_text(),
        COMMITTED_STATEFUL: render_stateful(stateful_actions(compiled.assembly.read_text())),
        COMMITTED_RESOURCES: resources,
    }
    try:
        check_stage_budget(stages)
    except StageBudgetExceeded as exc:
        print(f"compile_tna.py: {exc}", file=sys.stderr)
        return 1
    if args.write:
        for path, text in outputs.items():
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    stale = [path for path, text in outputs.items() if _stale(path, text)]
    for path in stale:
        print(
            f"compile_tna.py: {path.relative_to(HERE.parent)} is not this compile's: if the "
            ".p4 change is intended, run python p4/compile_tna.py --write",
            file=sys.stderr,
        )
    if stale:
        return 1
    print(f"{compiled.out_dir}: compiled into {len(stages)} stages; committed files current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
