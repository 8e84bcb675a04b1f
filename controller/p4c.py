"""Controller layer: p4c's command line for the repository's bmv2 program and its P4Info.

The P4Info the controller reads (:data:`controller.p4info.DEFAULT_P4INFO_PATH`) is what
``p4c-bm2-ss`` derives from ``p4/ina.p4``; :func:`compile_command` is the one place that
says how p4c is asked for it and for the bmv2 JSON. A pure function: it runs nothing.
``p4/compile.py`` (the repository's own compile, held to the committed P4Info) and
:func:`emulation.bmv2.compile_program` (the emulation's cached compile) both call it; it
is here and not in the emulation so that the script needs no emulator module, and not
under ``p4/``, which is a folder of scripts and not a package (the name ``p4`` is
p4runtime's protobuf package).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["compile_command"]


def compile_command(
    compiler: Path, p4_path: Path, json_out: Path, p4info_out: Path, *, werror: bool = False
) -> list[str]:
    """The p4c-bm2-ss command writing ``p4_path``'s bmv2 JSON and its P4Info (text format:
    p4c picks the format by the ``.txt`` extension); ``werror`` makes warnings errors
    (``p4/compile.py``: the repository's own compile, not a user's p4c version)."""
    return [
        str(compiler), "--std", "p4-16", "--target", "bmv2", "--arch", "v1model",
        *(["--Werror"] if werror else []),
        "--p4runtime-files", str(p4info_out), "-o", str(json_out), str(p4_path),
    ]  # fmt: skip
