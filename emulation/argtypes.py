"""Value parsers for argparse ``type=``, shared by the ``inalab`` subcommands.

Each raises :class:`argparse.ArgumentTypeError`, which argparse turns into a one-line
usage error (exit 2, no traceback).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_in", "positive_float", "probability"]


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
