"""The shared argparse value parsers."""

from __future__ import annotations

import argparse

import pytest

from emulation.argtypes import int_in, positive_float, probability


def test_int_in_bounds() -> None:
    parse = int_in(1, 3)
    assert [parse(t) for t in ("1", "3")] == [1, 3]
    for bad in ("0", "4", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    assert int_in(0)("123456789012") == 123456789012


def test_probability_with_and_without_one() -> None:
    assert probability()("1") == 1.0
    with pytest.raises(argparse.ArgumentTypeError, match=r"outside \[0, 1\)"):
        probability(allow_one=False)("1")
    for bad in ("-0.1", "1.01", "nan", "p"):
        with pytest.raises(argparse.ArgumentTypeError):
            probability()(bad)


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "soon"])
def test_positive_float_rejects(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        positive_float(bad)
