"""Value parsers for argparse ``type=``, shared by the ``inalab`` subcommands.

Each raises :class:`argparse.ArgumentTypeError`, which argparse turns into a one-line
usage error (exit 2, no traceback).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

__all__ = [
    "delay",
    "int_in",
    "parse_delay_ms",
    "positive_float",
    "probability",
    "rates",
    "size",
]

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


def delay(text: str) -> float:
    """:func:`parse_delay_ms` for argparse."""
    try:
        return parse_delay_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def positive_float(text: str) -> float:
    """Parse a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def rates(text: str) -> tuple[float, ...]:
    """Parse link rates in Mbit/s: one number > 0 (``100``) or a comma list of distinct
    ones (``100,200,500,1000``), in the order given."""
    items = text.split(",")
    values = []
    for item in items:
        try:
            value = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid rate {item.strip()!r} in {text!r}: give Mbit/s as numbers, comma"
                " separated (e.g. 100,200,500,1000)"
            ) from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"rate {item.strip()} Mbit/s must be positive")
        if value in values:
            raise argparse.ArgumentTypeError(f"rate {value:g} Mbit/s given twice in {text!r}")
        values.append(value)
    return tuple(values)


def size(text: str) -> int:
    """An nccl-tests size (``4096``, ``4K``, ``1M``; :func:`hostlib.units.parse_size`)."""
    # Here, not at the top: the soft switch uses this module and shares only
    # hostlib.protocol with the hosts.
    from hostlib.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
