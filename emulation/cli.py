"""The ``inalab`` command: one entry point, one module per subcommand.

Each subcommand module exports ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported only when chosen, so ``inalab switch`` does not pay for torch or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "switch": (
        "emulation.softswitch.cli",
        "run the software INA switch (UDP data, P4Runtime control)",
    ),
    "bench": (
        "emulation.bench.cli",
        "allreduce benchmark, INA vs ring, tree, auto and Gloo, nccl-tests style",
    ),
    "ctl": ("controller.cli", "inspect and configure a switch over P4Runtime"),
    "decide": (
        "dynamiccl.cli",
        "predict INA, ring and tree times for a collective and choose one",
    ),
    "calibrate": (
        "dynamiccl.calibrate",
        "measure INA, ring and tree briefly and fit a dynamiccl profile",
    ),
    "emulate": (
        "emulation.emulate",
        "a topology in Mininet (root): bench INA, CollNet and Gloo in its hosts, or keep it up",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inalab", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(sp)
        sp.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return its exit status."""
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return int(importlib.import_module(args._module).run(args))


if __name__ == "__main__":
    sys.exit(main())
