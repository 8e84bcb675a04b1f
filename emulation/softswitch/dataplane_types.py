"""What every INA data plane of the soft switch offers, and what its tables hold: the
:class:`Dataplane` protocol, the job-table entry, the drop reasons, the register cells,
the drop simulator and what a processed packet asks to send.

:mod:`emulation.softswitch.pipeline` (the Python pipeline, the reference) and the eBPF
data plane implement :class:`Dataplane`; ``pipeline`` re-exports these names.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from emulation.softswitch.roce_tables import ROCE_ARRAYS

__all__ = [
    "REGISTER_ARRAYS",
    "SIGNED_REGISTERS",
    "Addr",
    "Dataplane",
    "DropReason",
    "DropSimulator",
    "Emit",
    "JobConfig",
    "JobTableError",
    "RegisterCell",
    "SlotState",
    "Upstream",
]

Addr = tuple[str, int]
"""A UDP endpoint ``(ip, port)``: what a P4 worker table matches on (IPv4 src, UDP src)."""

class DropReason(enum.StrEnum):
    """Why the pipeline dropped a packet; one counter each."""

    TRUNCATED = "truncated"  # shorter than the INA header
    MALFORMED = "malformed"  # unknown version or packet type (results never go to a switch)
    UNKNOWN_JOB = "unknown_job"  # job table miss
    BAD_RANK = "bad_rank"  # rank >= the job's number of workers
    BAD_SOURCE = "bad_source"  # rank not bound to this source address:port
    BAD_SLOT = "bad_slot"  # slot outside the job's slot range
    BAD_LANES = "bad_lanes"  # num_lanes differs from the switch's lanes
    BAD_LENGTH = "bad_length"  # datagram length disagrees with num_lanes
    STALE = "stale"  # older than the slot's current use (a delayed retransmission)
    SIM_INGRESS = "sim_ingress"  # drop simulator, switch ingress
    SIM_EGRESS = "sim_egress"  # drop simulator, per replica at egress
    UNKNOWN_QP = "unknown_qp"  # RoCEv2: a dest QP the request table does not hold
    BAD_PSN = "bad_psn"  # RoCEv2: out of sequence, or no open message (UC)
    BAD_ICRC = "bad_icrc"  # RoCEv2: the ICRC disagrees (software data planes)


class JobTableError(ValueError):
    """A job-table write that cannot be applied (duplicate id, no slots, bad worker)."""


@dataclass(frozen=True)
class JobConfig:
    """One job-table entry and its worker bindings (what P4Runtime writes map onto).

    Attributes:
        job_id: 16-bit job id carried in every packet.
        workers: source address of each rank, index = rank; results go to these too.
        slot_count: slots (per set) reserved for the job.
        slot_base: first slot of the job's range in the switch pool; ``None`` lets the
            switch pick the lowest free range.
    """

    job_id: int
    workers: tuple[Addr, ...]
    slot_count: int
    slot_base: int | None = None

    @property
    def num_workers(self) -> int:
        return len(self.workers)


@dataclass
class _Job:
    """A jobs-table entry, linked to its workers-table bindings and result destinations."""

    job_id: int
    num_workers: int
    slot_base: int
    slot_count: int
    mgid: int
    sources: dict[int, set[Addr]]  # rank -> sources bound in the workers table
    dests: tuple[Addr, ...] = ()  # where a completed slot is multicast (group + replicas)
    links: tuple[tuple[int, int], ...] = ()  # (egress port, MAC) of each of dests


class Emit(NamedTuple):
    """Packets the pipeline asks the I/O layer to send: one payload to each destination.

    ``links`` says, for a switch with ports, where each of ``dests`` is: (egress port,
    destination MAC as an integer), from the replicas table. It is empty for the
    unicast answer to a retransmission, which goes back whence it came.
    """

    payload: memoryview
    dests: Sequence[Addr]
    links: Sequence[tuple[int, int]] = ()


class Upstream(NamedTuple):
    """An upstream-table entry: where a leaf sends a job's partial sums (the upstream
    switch's INA address, its MAC, the egress port toward it; the leaf's rank in the
    upstream switch's job), and whence the job's results must come."""

    rank: int
    addr: Addr
    mac: int = 0
    port: int = 0


@dataclass(frozen=True, slots=True)
class _Route:
    """An upstream entry with its :class:`Emit` destination built once, not per packet."""

    entry: Upstream
    dests: tuple[Addr, ...]
    links: tuple[tuple[int, int], ...]


class SlotState(NamedTuple):
    """A register read of one (slot, set), as ``inalab ctl show-bitmap`` prints it."""

    bitmap: int
    other_bitmap: int
    counter: int
    exponent: int
    values: np.ndarray


class DropSimulator:
    """Seeded Bernoulli loss at switch ingress and egress (SwitchML's drop simulator).

    Args:
        ingress: probability of dropping a packet as it arrives, 0..1.
        egress: probability of dropping each replica as it leaves, 0..1.
        seed: seed of the simulator's own random stream.

    Raises:
        ValueError: a probability outside 0..1.
    """

    def __init__(self, ingress: float = 0.0, egress: float = 0.0, seed: int = 0) -> None:
        for name, p in (("ingress", ingress), ("egress", egress)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} drop probability {p} outside 0..1")
        self.ingress = ingress
        self.egress = egress
        self._random = random.Random(seed).random

    def drop_ingress(self) -> bool:
        return self.ingress > 0.0 and self._random() < self.ingress

    def drop_egress(self) -> bool:
        return self.egress > 0.0 and self._random() < self.egress


REGISTER_ARRAYS = (
    "seq", "remaining", "final", "exponent", "bitmap_set0", "bitmap_set1", "values", "owner",
    *ROCE_ARRAYS,
)  # fmt: skip
"""The register arrays of the pipeline, by the last part of their P4 names
(``Ingress.seq``, ``Ingress.bitmap.bitmap_set0``, ``Ingress.values.lane_NN``: ``values``
with a lane). The bitmaps and ``owner`` (``sharing.py``) are indexed by slot, the RoCEv2
ones (``roce_*``, ``roce_tables.py``) by queue pair register, the others by set * slots +
slot."""

SIGNED_REGISTERS = frozenset(["exponent", "values", "roce_exponent"])
"""Arrays whose cells hold signed numbers (int8 exponents, int32 lane sums); a P4Runtime
write of their unsigned bits is taken as two's complement."""


@dataclass(frozen=True, slots=True)
class RegisterCell:
    """One cell of a register array: the array (:data:`REGISTER_ARRAYS`), its index and,
    for ``values``, the lane."""

    array: str
    index: int
    lane: int = 0


class Dataplane(Protocol):
    """What any INA backend offers: the job API, per-packet processing, registers, counters."""

    lanes: int

    def add_job(self, job: JobConfig) -> int: ...
    def remove_job(self, job_id: int) -> None: ...
    def process(self, data: memoryview, src: Addr) -> Emit | None: ...
    def read_slot(self, job_id: int, slot: int, pool_set: int) -> SlotState: ...
    def counters(self) -> dict[str, int]: ...
