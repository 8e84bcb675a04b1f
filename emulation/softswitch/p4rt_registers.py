"""The P4Runtime server's registers and counters: P4 names to the pipeline's state.

Switch-target layer, part of :mod:`emulation.softswitch.p4runtime`. It owns the mapping of
the P4 program's register cells onto the :class:`Pipeline`'s register arrays, lanes, drop
rates and the Tofino program's ``Ingress.missing`` (:class:`_Registers`,
:func:`_register_cell`), and of each P4 counter's indices onto the pipeline's statistics
(:func:`_counter_names`).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from controller.p4info import P4Info
from controller.slots import MISSING
from controller.stats import OWN_COUNTERS
from emulation.softswitch.p4rt_p4info import _LANE_PREFIX, _check_index, _fail
from emulation.softswitch.pipeline import SIGNED_REGISTERS, Pipeline, RegisterCell
from hostlib.protocol import SWITCH_DROPS, SWITCH_STATS

__all__ = [
    "_EGRESS_DROPS",
    "_EGRESS_STATS",
    "_Registers",
    "_counter_names",
    "_register_cell",
]

_SIM_SCALE = 1 << 31  # configuration.p4: the drop probability register holds p * 2**31
_EGRESS_STATS = {"results_sent", "sent_upstream"}
_EGRESS_DROPS = {"sim_egress"}


class _Registers:
    """Register cells of the pipeline by P4Info register id: read and write as P4 does
    (unsigned values of the register's width; the pipeline's signed arrays hold the same
    bits)."""

    def __init__(self, pipeline: Pipeline, p4info: P4Info) -> None:
        self.pipeline = pipeline
        self.p4info = p4info

    def size(self, register_id: int) -> int:
        return int(self.p4info.register(register_id).size)

    def read(self, register_id: int, indices: Sequence[int]) -> list[int]:
        """The unsigned values of cells ``indices`` of one register, in one pipeline call."""
        reg = self.p4info.register(register_id)
        for index in indices:
            _check_index(reg.name, index, reg.size)
        width = int(reg.bitwidth)
        if reg.name == MISSING:
            return [self._missing(index) for index in indices]
        if _register_cell(reg.name, 0) is None:  # a drop simulator's probability
            return [round(self._drops(register_id) * _SIM_SCALE)] * len(indices)
        cells = [_register_cell(reg.name, i) for i in indices]
        values = self.pipeline.register_read([c for c in cells if c is not None])
        return [v & ((1 << width) - 1) for v in values]

    def write(self, register_id: int, index: int, value: int) -> None:
        reg = self.p4info.register(register_id)
        _check_index(reg.name, index, reg.size)
        width = int(reg.bitwidth)
        if reg.name == MISSING:
            self._clear_missing(index, value)
            return
        cell = _register_cell(reg.name, index)
        if cell is None:
            if value > _SIM_SCALE:
                raise _fail(grpc.StatusCode.OUT_OF_RANGE, f"drop probability {value} above 2**31")
            self._set_drops(register_id, value / _SIM_SCALE)
            return
        if cell.array in SIGNED_REGISTERS and value >> (width - 1):
            value -= 1 << width  # the same bits in a signed array
        self.pipeline.register_write(cell, value)

    def _missing(self, index: int) -> int:
        """``Ingress.missing[index]`` from the pipeline's state: the job's workers not in
        the set's bitmap while the use is in progress (its count not 0), else 0."""
        slots = self.pipeline.slots
        pool_set, slot = divmod(index, slots)
        remaining, bitmap = self.pipeline.register_read(
            [RegisterCell("remaining", index), RegisterCell(f"bitmap_set{pool_set}", slot)]
        )
        if remaining == 0:
            return 0
        workers = next(
            (
                len(job.workers)
                for job in self.pipeline.jobs()
                if job.slot_base is not None
                and job.slot_base <= slot < job.slot_base + job.slot_count
            ),
            32,
        )
        return ((1 << workers) - 1) & ~bitmap

    def _clear_missing(self, index: int, value: int) -> None:
        """A write of ``Ingress.missing[index]``: 0 (what the controller writes to free a
        slot) clears the use's count and the set's bitmap; the pipeline has no other
        value's meaning."""
        if value != 0:
            raise _fail(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{MISSING}: the soft switch keeps a bitmap and a count; it takes 0 (free "
                f"the slot), not {value}",
            )
        pool_set, slot = divmod(index, self.pipeline.slots)
        self.pipeline.register_write(RegisterCell("remaining", index), 0)
        self.pipeline.register_write(RegisterCell(f"bitmap_set{pool_set}", slot), 0)

    def _drops(self, register_id: int) -> float:
        drops = self.pipeline.drops
        return drops.ingress if self._is_ingress_sim(register_id) else drops.egress

    def _set_drops(self, register_id: int, p: float) -> None:
        if self._is_ingress_sim(register_id):
            self.pipeline.set_drop_rates(ingress=p)
        else:
            self.pipeline.set_drop_rates(egress=p)

    def _is_ingress_sim(self, register_id: int) -> bool:
        name = self.p4info.register(register_id).name
        if name not in (
            "Ingress.drop_simulator.probability",
            "Egress.drop_simulator.probability",
        ):
            raise _fail(grpc.StatusCode.UNIMPLEMENTED, f"register {name} has no binding")
        return name.startswith("Ingress.")


_REGISTER_ARRAYS = {
    "Ingress.seq": "seq",
    "Ingress.remaining": "remaining",
    "Ingress.final": "final",
    "Ingress.exponents.exponent": "exponent",
    "Ingress.bitmap.bitmap_set0": "bitmap_set0",
    "Ingress.bitmap.bitmap_set1": "bitmap_set1",
    "Ingress.sharing.owner": "owner",
    "Ingress.roce.open": "roce_open",
    "Ingress.roce.expect_psn": "roce_expect_psn",
    "Ingress.roce.base": "roce_base",
    "Ingress.roce.seq": "roce_seq",
    "Ingress.roce.exponent": "roce_exponent",
    "Ingress.roce.place": "roce_place",
    "Egress.roce.reply_psn": "roce_reply_psn",
}
"""P4 register names -> the pipeline's register arrays (the lanes: ``values``)."""


def _register_cell(name: str, index: int) -> RegisterCell | None:
    """The pipeline cell of P4 register ``name`` at ``index``; None for the drop
    simulator's probabilities, which are the pipeline's drop rates, not cells."""
    if name.startswith(_LANE_PREFIX):
        return RegisterCell("values", index, int(name[len(_LANE_PREFIX) :]))
    array = _REGISTER_ARRAYS.get(name)
    return None if array is None else RegisterCell(array, index)


def _counter_names(counter: str, own: frozenset[str] = frozenset()) -> list[str | None]:
    """Pipeline statistic at each index of a P4 counter (None: another counter counts it).

    configuration.p4 indexes Ingress/Egress.ina_stats by STAT_* and Ingress/Egress.drops
    by DROP_* (hostlib.protocol.SWITCH_STATS and SWITCH_DROPS); egress counts results
    sent and egress drops, ingress the rest, but for the statistics in ``own`` (the
    Tofino program's ``received`` and ``completed``, counters of their own).
    """
    if counter in OWN_COUNTERS:
        return [OWN_COUNTERS[counter]]
    egress = counter.startswith("Egress.")
    if counter.endswith(".ina_stats"):
        return [
            n if (n in _EGRESS_STATS) == egress and n not in own else None
            for n in SWITCH_STATS
        ]
    if counter.endswith(".drops"):
        return ["drop_" + r if (r in _EGRESS_DROPS) == egress else None for r in SWITCH_DROPS]
    return []
