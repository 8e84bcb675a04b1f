"""The soft switch's value parsers for argparse ``type=`` (``inalab switch``'s options and
its ``--link`` specs), and the delay grammar a topology file shares with them.

Switch-target layer (:mod:`emulation.softswitch`): it imports nothing of ours, so the
switch needs nothing of the Mininet emulation to parse its command line;
:mod:`emulation.argtypes`, the ``inalab`` subcommands' parsers, re-exports these. Each
parser raises :class:`argparse.ArgumentTypeError`, which argparse turns into a one-line
usage error (exit 2, no traceback).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

__all__ = ["int_in", "parse_delay_ms", "probability"]

_DELAY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s)?\s*$")
_DELAY_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, None: 1.0}  # a bare number is ms


def parse_delay_ms(text: str) -> float:
    """A delay in ms from ``250us``, ``2ms``, ``0.1s`` or a bare number (ms): the units of
    a topology file's ``delay``, ``inalab switch --link`` and ``inalab emulate --delay``.

    Raises:
        ValueError: not a non-negative number with an optional us/ms/s unit.
    """
    m = _DELAY.match(text)
    if not m:
        raise ValueError(f"delay {text!r} is not a number with us, ms or s (e.g. 2ms)")
    return float(m.group(1)) * _DELAY_MS[m.group(2)]


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """A parser of integers in ``lo..hi`` (no upper bound when ``hi`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{value} outside {bounds}")
        return value

    return parse


def probability(allow_one: bool = True) -> Callable[[str], float]:
    """A parser of probabilities in ``[0, 1]``, or ``[0, 1)`` without ``allow_one``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid probability {text!r}") from None
        if not (0.0 <= value <= 1.0 and (allow_one or value < 1.0)):
            bounds = "[0, 1]" if allow_one else "[0, 1)"
            raise argparse.ArgumentTypeError(f"probability {value} outside {bounds}")
        return value

    return parse
