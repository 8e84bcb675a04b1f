"""The ``inalab`` command: one entry point, one module per subcommand.

Each subcommand module exports ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported only when chosen, so ``inalab switch`` does not pay for torch or matplotlib. A
lower layer's command gets what it may not import from here (``_injected``): ``inalab
decide`` (dynamiccl) reads ``--topology`` through emulation's reader.

SIGTERM and SIGHUP (what ``timeout``, schedulers, ``kill`` and a closed terminal send) stop
a run as Ctrl-C does: :class:`Interrupted` is raised in the main thread, so every
``with``/``finally`` that stops a switch, a worker or a Mininet network runs (a second
signal meanwhile does not cut that short); the command prints one line and exits with
128 + the signal's number.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

__all__ = ["DESCRIPTION", "EXIT_STATUS", "Interrupted", "main"]

DESCRIPTION = """\
inalab emulates in-network aggregation (INA): allreduce summed inside a switch, as
SwitchML and ATP do on Tofino, here in a software switch (a Python pipeline or an eBPF
program in the kernel) or in P4 on bmv2, on loopback or in an emulated network (Mininet,
shaped links), and compares it with ring, tree and Gloo allreduce in nccl-tests style
tables, JSON and plots. Start with `inalab bench` (loopback, no root). In an emulated
network (root: sudo resets PATH, so give the virtual environment's inalab, from the
repository root), `sudo .venv/bin/inalab emulate topologies/star4.yaml bench` runs the
same across its links, `sudo .venv/bin/inalab emulate topologies/star4.yaml run -- python
examples/ddp_digits.py` runs a program of yours once per rank in its hosts, and `inalab
emulate topologies/star4.yaml check` (no root) shows what it would build. `inalab compare
a.json b.json` puts bench runs (--json) side by side."""

EXIT_STATUS = """\
exit status: 0 done; 1 a run failed (wrong results, a timeout, a process that died);
2 bad input (flags, files, topologies, what this machine cannot run), with one line
"inalab ...: error: ..." on stderr; 128+N stopped by signal N (130: Ctrl-C)."""

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
        "emulation.bench.calibrate",
        "measure INA, ring and tree briefly and fit a dynamiccl profile",
    ),
    "replay": (
        "emulation.bench.replay",
        "replay a training iteration's collectives under static, model, agent and oracle",
    ),
    "emulate": (
        "emulation.mininet.emulate",
        "a topology in Mininet (root): bench INA, CollNet and Gloo in its hosts, or keep it up",
    ),
    "compare": (
        "emulation.bench.compare",
        "several bench JSON files in one table and plot, with speedups over a baseline",
    ),
    "pcap": (
        "emulation.bench.rocepcap",
        "check the RoCEv2 frames of captures with scapy's RoCE layer (ICRC, PSNs, R_Keys)",
    ),
}

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP; SIGINT arrives as a plain KeyboardInterrupt).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class CommandParser(argparse.ArgumentParser):
    """A parser that rejects arguments it does not know *itself*, with its own usage.

    argparse hands a subcommand's unknown arguments up to the top-level parser, whose
    usage then says nothing about the subcommand; here the innermost parser that got
    them reports them. ``hints`` maps an option to a sentence added to that error (e.g.
    why ``--workers`` does not exist under ``inalab emulate ... bench``).
    """

    hints: dict[str, str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hints = {}

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.unknown(extras)
        return parsed, extras

    def unknown(self, extras: list[str]) -> NoReturn:
        message = f"unrecognized arguments: {' '.join(extras)}"
        for option, hint in self.hints.items():
            if any(e == option or e.startswith(option + "=") for e in extras):
                message += f" ({hint})"
        self.error(message)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inalab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="inalab",
        description=DESCRIPTION,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        # -v after the subcommand too (inalab bench -v); SUPPRESS keeps the top-level count.
        sp.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="more logging (-vv: debug)")  # fmt: skip
        importlib.import_module(module).add_arguments(sp)
        sp.set_defaults(_module=module)
    return parser


class _StopHandler:
    """The first SIGINT, SIGTERM or SIGHUP stops the run; later ones while it cleans up
    only say so (a second Ctrl-C must not cut the removal of what the run started)."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            print("inalab: still stopping: removing what this run started", file=sys.stderr)
            return
        self.stopping = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; return its exit status."""
    # gRPC's C core prints its own lines for a failed TLS handshake (and other events a
    # command reports in its one-line error): errors only, unless the user asks for more.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, where a closed pipe is handled, not at interpreter exit
        return status
    except BrokenPipeError:
        # The reader went away (`inalab ctl jobs | head -1`): stop quietly, as Unix tools
        # do, and keep the interpreter's last flush of stdout from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + int(signal.SIGPIPE)


def _injected(module: str) -> dict[str, Any]:
    """Keyword arguments of ``module``'s ``run`` that this layer supplies: dynamiccl
    imports no emulation, so ``inalab decide --topology`` gets its reader from here."""
    if module == "dynamiccl.cli":
        from emulation.topology.summary import decide_summary

        return {"summarize": decide_summary}
    return {}


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    handler = _StopHandler()
    previous = {s: signal.signal(s, handler) for s in _STOP_SIGNALS}
    try:
        return int(importlib.import_module(args._module).run(args, **_injected(args._module)))
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"inalab {args.command}: stopped by {signal.Signals(signum).name}; what this run "
              "started is gone", file=sys.stderr)  # fmt: skip
        return 128 + int(signum)
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


if __name__ == "__main__":
    sys.exit(main())
