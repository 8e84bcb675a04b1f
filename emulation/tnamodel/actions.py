"""The TNA program's RegisterActions, one Python function each, by their P4 names.

Each is (the stateful ALU, the stored value, the PHV) -> (the cell's new value, the
output), comparisons through ``salu.cond`` (:mod:`emulation.tnamodel.stateful` holds
them to Tofino's limits). The P4 source of each is named in its docstring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emulation.tnamodel.packet import ina_or_zero
from emulation.tnamodel.stateful import RegisterActionFn, Salu, SaluOut, TofinoLimitError

if TYPE_CHECKING:
    from emulation.tnamodel.phv import Phv

__all__ = [
    "advance",
    "below",
    "check",
    "exponent_max",
    "exponent_read",
    "exponent_write",
    "final_clear",
    "final_read",
    "final_take",
    "lane_op",
    "missing_join",
    "missing_peek",
    "missing_restart",
    "missing_start",
]

_M32 = 0xFFFFFFFF


def check(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """seq.p4 check (pass 1): 1 for an unused slot, else seq - stored."""
    if salu.cond(value == 0):
        return SaluOut(value, 1)
    return SaluOut(value, (ina_or_zero(phv.hdr).seq - value) & _M32)


def advance(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """seq.p4 advance (pass 2): a newer seq (or an unused slot) becomes the slot's."""
    seq = ina_or_zero(phv.hdr).seq
    diff = (seq - value) & _M32
    if salu.cond(value == 0) or salu.cond(0 < diff < 0x80000000):
        return SaluOut(seq, 1)
    return SaluOut(value, diff)


def missing_join(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """checks.p4: clear the sender's bit; the value before."""
    return SaluOut(value & phv.meta.not_bit, value)


def missing_peek(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """checks.p4: read."""
    return SaluOut(value, value)


def missing_start(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """checks.p4: a free slot's use starts: every other worker is missing."""
    return SaluOut(phv.meta.others if salu.cond(value == 0) else value, value)


def missing_restart(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """checks.p4: a loose slot's newer use takes it over: every other worker is missing."""
    return SaluOut(phv.meta.others, value)


def final_read(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """next_step.p4: read."""
    return SaluOut(value, value)


def final_clear(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """next_step.p4: 0, the value before."""
    return SaluOut(0, value)


def final_take(write: int, none: int) -> RegisterActionFn:
    """next_step.p4's final_take: the cell becomes 1; the output is the lanes' operation,
    ``write`` (LANE_OP_WRITE) if it was 0, else ``none`` (LANE_OP_NONE: a duplicate of
    the upstream switch's RESULT leaves the slot as the first copy wrote it)."""

    def take(salu: Salu, value: int, phv: Phv) -> SaluOut:
        return SaluOut(1, write if salu.cond(value == 0) else none)

    take.__name__ = take.__qualname__ = "final_take"
    return take


def exponent_write(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """values.p4: store the packet's exponent."""
    exponent = ina_or_zero(phv.hdr).exponent
    return SaluOut(exponent, exponent)


def exponent_max(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """values.p4: the signed (int8) max of stored and packet exponents."""
    exponent = ina_or_zero(phv.hdr).exponent
    if salu.cond(_int8(value) < _int8(exponent)):
        value = exponent
    return SaluOut(value, value)


def exponent_read(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """values.p4: read."""
    return SaluOut(value, value)


def below(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """drop_simulator.p4: 1 when the draw is below the probability register."""
    return SaluOut(value, 1 if salu.cond(value > phv.meta.draw) else 0)


def lane_op(n: int, write: int, add: int) -> RegisterActionFn:
    """values.p4's lane_NN_op for lane ``n``: write, add (wrapping) or read by
    meta.lane_op (``write`` and ``add``: LANE_OP_WRITE and LANE_OP_ADD); the output is
    the value after."""

    def op(salu: Salu, value: int, phv: Phv) -> SaluOut:
        meta, lanes = phv.meta, phv.hdr.lanes
        if lanes is None:
            raise TofinoLimitError("a lane RegisterAction on a packet without lanes")
        if salu.cond(meta.lane_op == write):
            value = lanes[n]
        elif salu.cond(meta.lane_op == add):
            value = (value + lanes[n]) & _M32
        return SaluOut(value, value)

    op.__name__ = op.__qualname__ = f"lane_{n:02d}_op"
    return op


def _int8(x: int) -> int:
    return x - 0x100 if x & 0x80 else x
