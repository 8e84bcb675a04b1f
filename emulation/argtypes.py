"""Value parsers for argparse ``type=``, shared by the ``inalab`` subcommands.

Each raises :class:`argparse.ArgumentTypeError`, which argparse turns into a one-line
usage error (exit 2, no traceback). Those the soft switch needs too (:func:`int_in`,
:func:`probability`, :func:`parse_delay_ms`) live in :mod:`emulation.softswitch.argtypes`,
so the switch target needs nothing of the emulation, and are re-exported here.
"""

from __future__ import annotations

import argparse

from emulation.softswitch.argtypes import int_in, parse_delay_ms, probability

__all__ = [
    "cc_target",
    "delay",
    "int_in",
    "parse_delay_ms",
    "positive_float",
    "probability",
    "rates",
    "size",
]


def delay(text: str) -> float:
    """:func:`parse_delay_ms` for argparse."""
    try:
        return parse_delay_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cc_target(text: str) -> float:
    """Parse a congestion target in milliseconds (> 0), or ``off``; return seconds
    (``math.inf`` for off: :attr:`hostlib.ina.RetryPolicy.cc_target`)."""
    if text.strip().lower() == "off":
        return float("inf")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid target {text!r}: milliseconds or off") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"target {value} ms must be positive (or off)")
    return value / 1000.0


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
