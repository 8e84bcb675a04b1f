"""Sharing in the TNA model: p4/tna/sharing.p4's tables, its owner register and the
per-job counters, and the pool slot ina_tna.p4 computes for a slot past a job's
reservation (docs/sharing.md).

Part of the executable TNA model (:mod:`emulation.tnamodel`): ``model.py`` calls
:meth:`SharingProgram.lookup` where ina_tna.p4 applies TnaSharing, :meth:`~SharingProgram.
pool_slot` for the steps that compute a shared slot's pool slot, and
:meth:`~SharingProgram.place` for a shared slot's pass 1 (the owner cell, and the verdict
the packet is resubmitted with).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emulation.tnamodel.packet import ina_or_zero
from emulation.tnamodel.phv import Fallback, Phv, Shared
from emulation.tnamodel.stateful import PassState, Register, RegisterAction, Salu, SaluOut

__all__ = [
    "COUNTERS",
    "Fallback",
    "Shared",
    "SharingProgram",
    "SharingTables",
    "owner_take",
    "registers",
]

OWNER = "Ingress.sharing.owner"
COUNTERS = (
    "Ingress.sharing.shared_uses",
    "Ingress.sharing.collisions",
    "Ingress.sharing.from_fallback",
    "Egress.sharing.to_fallback",
)
"""The per-job counters, each of SHARING_STATS_SIZE cells (a job's cell: its entries'
``stats``)."""

HELD_OTHER = 1
"""resubmit_h.held: the owner cell is another job slot's (a collision)."""
HELD_PAST = 2
"""resubmit_h.held: the slot is past the job's shared count."""


@dataclass
class SharingTables:
    """The shared, fallback and behind tables (job id -> entry)."""

    shared: dict[int, Shared] = field(default_factory=dict)
    fallback: dict[int, Fallback] = field(default_factory=dict)
    behind: set[int] = field(default_factory=set)


def owner_take(salu: Salu, value: int, phv: Phv) -> SaluOut:
    """sharing.p4 take: a free cell becomes this job slot's; 1 when another's holds it."""
    me = phv.meta.owner_me
    if salu.cond(value == 0):
        return SaluOut(me, 0)
    if salu.cond(value != me):
        return SaluOut(value, HELD_OTHER)
    return SaluOut(value, 0)


def registers(slots: int) -> list[Register]:
    """The owner register: one cell per pool slot (both sets)."""
    return [Register(OWNER, 32, slots, [RegisterAction("take", owner_take, 8)])]


class SharingProgram:
    """TnaSharing and TnaOwner over the model's registers.

    Args:
        regs: the model's registers by name (it holds :func:`registers`'s).
        slots: the pool's slots a set (the owner register's cells).
    """

    def __init__(self, regs: dict[str, Register], slots: int) -> None:
        self.regs = regs
        self.slots = slots
        self.tables = SharingTables()

    def lookup(self, phv: Phv, ipv4_src: int, udp_src: int) -> None:
        """TnaSharing: the shared, fallback and behind entries of the packet's job."""
        meta, job = phv.meta, ina_or_zero(phv.hdr).job_id
        shared = self.tables.shared.get(job)
        if shared is not None:
            meta.has_shared, meta.shared = 1, shared
        fallback = self.tables.fallback.get(job)
        if fallback is not None:
            meta.has_fallback, meta.fallback = 1, fallback
            meta.fallback_ip_diff = fallback.dst_ip ^ ipv4_src
            meta.fallback_port_diff = fallback.dst_port ^ udp_src
        meta.is_behind = int(job in self.tables.behind)

    def pool_slot(self, phv: Phv) -> None:
        """ina_tna.p4's steps after seq: t + offset and t - count (t = slot -
        slot_count), and the owner cell's value for this job slot."""
        meta = phv.meta
        if meta.has_shared and meta.shared is not None:
            meta.shared_rel = (meta.slot_diff + meta.shared.offset) & 0xFFFF
            meta.shared_left = (meta.slot_diff - meta.shared.count) & 0xFFFF
            meta.owner_me = ina_or_zero(phv.hdr).job_id << 16 | meta.slot_next

    def wrap(self, phv: Phv) -> None:
        """ina_tna.p4: (t + offset) & mask, before the checks."""
        meta = phv.meta
        if meta.is_data and meta.shared is not None:
            meta.shared_wrap = meta.shared_rel & meta.shared.mask

    def cell(self, phv: Phv) -> None:
        """ina_tna.p4: the pool slot, base + the wrapped offset (base is aligned)."""
        meta = phv.meta
        if meta.has_shared and meta.shared is not None:
            meta.cell = meta.shared_wrap | meta.shared.base

    def place(self, phv: Phv, state: PassState) -> None:
        """A shared slot's pass 1: the pool slot as its difference from the job slot
        (seq.p4's XOR16 index), and the owner cell's verdict, for pass 2."""
        meta = phv.meta
        rs = meta.resubmit_data
        rs.cell = (meta.cell ^ meta.abs_slot) & 0xFFFF
        if meta.shared_left >> 15 & 1:
            index = meta.cell & (self.slots - 1)
            rs.held = self.regs[OWNER].execute("take", index, phv, state)
        else:
            rs.held = HELD_PAST
