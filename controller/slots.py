"""Controller of the per-slot registers: what ``inalab ctl show-bitmap`` shows, and the
clearing a slot range needs before a job takes it.

The registers belong to several P4 controls (``seq_check.p4``'s seq and
``workers_counter.p4``'s remaining are in ina.p4's Ingress, ``bitmap.p4``,
``exponents.p4``, ``values.p4``); a slot is read across all of them, so one manager
reads it. Index layout as in ``p4/``: set * SLOTS + slot for the per-(set, slot)
registers, slot for each set's bitmap register, where SLOTS is a bitmap register's size.

The Tofino program (``p4/tna/``, a P4Info with ``Ingress.missing``) keeps a slot's
workers in one register per (set, slot), the workers its use still waits for, instead
of the two bitmaps and the count: the manager picks the registers by the P4Info it is
given, and a read presents them as the bitmap the v1model program would hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.jobs import JobEntry
from controller.p4info import P4Info
from controller.registers import RegisterAccess

__all__ = ["SlotRead", "Slots"]

SEQ = "Ingress.seq"
REMAINING = "Ingress.remaining"
MISSING = "Ingress.missing"
FINAL = "Ingress.final"
BITMAPS = ("Ingress.bitmap.bitmap_set0", "Ingress.bitmap.bitmap_set1")
EXPONENT = "Ingress.exponents.exponent"
LANE_PREFIX = "Ingress.values.lane_"


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) else value


@dataclass(frozen=True)
class SlotRead:
    """The registers of one job-relative slot in one set.

    Attributes:
        bitmap: workers whose contribution the set holds (bit = rank).
        other_bitmap: the other set's bitmap of the same slot (0 on the Tofino program,
            which keeps none).
        remaining: contributions still awaited (0: idle or finished).
        seq: the seq of the use the slot holds (0: never used).
        exponent: the largest block exponent contributed (int8).
        values: the lanes' int32 sums.
        final: 1 if the values are the upstream switch's result (a leaf of hierarchical
            aggregation), 0 if they are this switch's own sum.
    """

    job_id: int
    slot: int
    pool_set: int
    bitmap: int
    other_bitmap: int
    remaining: int
    seq: int
    exponent: int
    values: tuple[int, ...]
    final: int = 0

    def ranks(self) -> list[int]:
        """Ranks whose bit is set in :attr:`bitmap`."""
        return [r for r in range(32) if self.bitmap >> r & 1]


class Slots:
    """Read one slot's registers; clear a job's slot range."""

    def __init__(self, registers: RegisterAccess, p4info: P4Info) -> None:
        self.registers = registers
        self.p4info = p4info
        self.tofino = any(r.name == MISSING for r in p4info.registers)
        if self.tofino:
            self.slots_per_set = p4info.register(MISSING).size // 2
        else:
            self.slots_per_set = p4info.register(BITMAPS[0]).size
        self.lanes = sum(1 for r in p4info.registers if r.name.startswith(LANE_PREFIX))

    def read(self, job: JobEntry, slot: int, pool_set: int) -> SlotRead:
        """Registers of job-relative ``slot`` in ``pool_set`` (0 or 1).

        Raises:
            ValueError: a slot outside the job's range or a set other than 0 and 1.
            P4RuntimeError | ThriftError: the switch refused a read.
        """
        if not 0 <= slot < job.slot_count:
            raise ValueError(f"slot {slot} outside job {job.job_id}'s 0..{job.slot_count - 1}")
        if pool_set not in (0, 1):
            raise ValueError(f"set {pool_set} is not 0 or 1")
        s = job.slot_base + slot
        i = pool_set * self.slots_per_set + s
        read = self.registers.read
        values = tuple(
            _signed(read(f"{LANE_PREFIX}{lane:02d}", [i])[0], 32) for lane in range(self.lanes)
        )
        if self.tofino:
            missing, seq, exponent, final = (
                read(name, [i])[0] for name in (MISSING, SEQ, EXPONENT, FINAL)
            )
            everyone = (1 << job.num_workers) - 1
            bitmap = 0 if seq == 0 else everyone & ~missing
            return SlotRead(
                job.job_id, slot, pool_set, bitmap, 0, missing.bit_count(), seq,
                _signed(exponent, 8), values, final,
            )  # fmt: skip
        bitmap = read(BITMAPS[pool_set], [s])[0]
        other = read(BITMAPS[1 - pool_set], [s])[0]
        remaining, seq, exponent, final = (
            read(name, [i])[0] for name in (REMAINING, SEQ, EXPONENT, FINAL)
        )
        return SlotRead(
            job.job_id,
            slot,
            pool_set,
            bitmap,
            other,
            remaining,
            seq,
            _signed(exponent, 8),
            values,
            final,
        )

    def clear(self, slot_base: int, slot_count: int) -> None:
        """Zero seq, remaining and both bitmaps of slots ``slot_base..+slot_count`` in both
        sets (on the Tofino program: seq and missing): the state that tells a new use from
        an old one. Values and exponents need no clearing (a slot's first contribution
        writes them).

        Raises:
            P4RuntimeError | ThriftError: the switch refused a write.
        """
        end = slot_base + slot_count
        if self.tofino:
            for pool_set in (0, 1):
                offset = pool_set * self.slots_per_set
                for name in (SEQ, MISSING):
                    self.registers.fill(name, offset + slot_base, offset + end, 0)
            return
        for name in BITMAPS:
            self.registers.fill(name, slot_base, end, 0)
        for pool_set in (0, 1):
            offset = pool_set * self.slots_per_set
            for name in (SEQ, REMAINING):
                self.registers.fill(name, offset + slot_base, offset + end, 0)
