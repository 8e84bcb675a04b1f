"""Controller of ``p4/sharing.p4``: the shared region, the fallback aggregator and the
per-job counters of sharing (docs/sharing.md).

Three tables, keyed by job id:
- ``shared``: the job's slots past its reservation, and where they lie in a region of
  the pool that jobs share (``set_shared(count, base, mask, offset)``);
- ``fallback``: the aggregator on a server that takes what the switch cannot hold;
- ``behind``: on that fallback aggregator, the jobs it serves behind a switch.

Also the ``owner`` register (which job slot holds each pool slot of a region, freed
when its job leaves) and four per-job counters. Their arrays have a cell per job on the
switch, not per job id: each entry names its job's cell (``stats``), which the
controller picks free and zeroes when it installs the job. Installing a whole
job with them is :meth:`controller.switch.SwitchController.add_job`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from controller.client import P4RuntimeClient
from controller.entries import counter_entry, entity, modify
from controller.p4info import P4Info, mac_text
from controller.registers import RegisterAccess
from controller.tables import TableManager

__all__ = [
    "JOB_COUNTERS",
    "OWNER",
    "Behind",
    "Fallback",
    "FallbackEntry",
    "JobSharing",
    "RegionView",
    "Shared",
    "SharedEntry",
    "SharingCounters",
    "best_offset",
    "free_cell",
    "region_view",
    "regions",
    "served",
]

OWNER = "Ingress.sharing.owner"
"""The owner register: 0, or ``job << 16 | (slot + 1)`` of the job slot holding a cell."""

JOB_COUNTERS = {
    "Ingress.sharing.shared_uses": "shared_uses",
    "Ingress.sharing.collisions": "collisions",
    "Egress.sharing.to_fallback": "to_fallback",
    "Ingress.sharing.from_fallback": "from_fallback",
}
"""The per-job counters (index: the job's cell, an entry's ``stats``) and the statistic
each counts; the first two count at the shared entry's cell, the others at the
fallback entry's."""


def served(p4info: P4Info) -> bool:
    """Whether the program has the sharing tables (p4/ and p4/tna/ have)."""
    return any(t.name == Shared.table_name for t in p4info.tables)


@dataclass(frozen=True)
class SharedEntry:
    """A shared-table entry: job slots ``slot_count .. slot_count + count - 1`` lie in
    the region of ``size`` pool slots from ``base``, from ``offset`` on (modulo size)."""

    job_id: int
    count: int
    base: int
    size: int
    offset: int
    stats: int = 0

    def cells(self) -> list[int]:
        """The pool slots the job's shared slots map onto, in job-slot order."""
        return [self.base + ((self.offset + t) & (self.size - 1)) for t in range(self.count)]


@dataclass(frozen=True)
class FallbackEntry:
    """A fallback-table entry: the job's fallback aggregator at ``ip:udp_port`` (MAC
    ``mac``, out of switch port ``egress_port``)."""

    job_id: int
    ip: str
    udp_port: int
    mac: str
    egress_port: int
    stats: int = 0


class Shared(TableManager):
    """The ``Ingress.sharing.shared`` table."""

    table_name = "Ingress.sharing.shared"
    action = "Ingress.sharing.set_shared"

    def insert(self, entry: SharedEntry) -> None:
        """Raises: AlreadyExistsError for a job with an entry; P4RuntimeError otherwise."""
        params = {"count": entry.count, "base": entry.base, "mask": entry.size - 1,
                  "offset": entry.offset, "stats": entry.stats}  # fmt: skip
        self._insert({"job_id": entry.job_id}, self.action, params)

    def delete(self, job_id: int) -> None:
        """Raises: NotFoundError for a job without an entry; P4RuntimeError otherwise."""
        self._delete({"job_id": job_id})

    def read(self) -> list[SharedEntry]:
        """Every shared entry, by job id."""
        entries = [
            SharedEntry(m["job_id"], p["count"], p["base"], p["mask"] + 1, p["offset"], p["stats"])
            for m, _, p in self._read()
        ]
        return sorted(entries, key=lambda e: e.job_id)


class Fallback(TableManager):
    """The ``Ingress.sharing.fallback`` table."""

    table_name = "Ingress.sharing.fallback"
    action = "Ingress.sharing.set_fallback"

    def insert(self, entry: FallbackEntry) -> None:
        """Raises: AlreadyExistsError for a job with an entry; P4RuntimeError otherwise."""
        params: dict[str, int | str] = {"dst_ip": entry.ip, "dst_port": entry.udp_port,
                                        "dst_mac": entry.mac, "egress_port": entry.egress_port,
                                        "stats": entry.stats}  # fmt: skip
        self._insert({"job_id": entry.job_id}, self.action, params)

    def delete(self, job_id: int) -> None:
        """Raises: NotFoundError for a job without an entry; P4RuntimeError otherwise."""
        self._delete({"job_id": job_id})

    def read(self) -> list[FallbackEntry]:
        """Every fallback entry, by job id."""
        entries = [
            FallbackEntry(
                m["job_id"],
                str(ipaddress.IPv4Address(p["dst_ip"])),
                p["dst_port"],
                mac_text(p["dst_mac"]),
                p["egress_port"],
                p["stats"],
            )
            for m, _, p in self._read()
        ]
        return sorted(entries, key=lambda e: e.job_id)


class Behind(TableManager):
    """The ``Ingress.sharing.behind`` table: the jobs a fallback aggregator serves."""

    table_name = "Ingress.sharing.behind"
    action = "Ingress.sharing.set_behind"

    def insert(self, job_id: int) -> None:
        """Raises: AlreadyExistsError for a job with an entry; P4RuntimeError otherwise."""
        self._insert({"job_id": job_id}, self.action, {})

    def delete(self, job_id: int) -> None:
        """Raises: NotFoundError for a job without an entry; P4RuntimeError otherwise."""
        self._delete({"job_id": job_id})

    def read(self) -> list[int]:
        """The job ids with an entry."""
        return sorted(m["job_id"] for m, _, _ in self._read())


class SharingCounters:
    """The per-job counters of sharing and the owner register."""

    def __init__(self, client: P4RuntimeClient, p4info: P4Info, registers: RegisterAccess):
        self.client = client
        self.p4info = p4info
        self.registers = registers

    def read(self, shared: SharedEntry | None, fallback: FallbackEntry | None) -> dict[str, int]:
        """``shared_uses``, ``collisions``, ``to_fallback`` and ``from_fallback`` of the
        job of these entries (0 for a counter no entry of it counts).

        Raises:
            P4RuntimeError: the switch refused the read.
        """
        out = dict.fromkeys(JOB_COUNTERS.values(), 0)
        cells = {"shared_uses": shared, "collisions": shared, "to_fallback": fallback,
                 "from_fallback": fallback}  # fmt: skip
        wanted = [
            entity(counter_entry(self.p4info, c, entry.stats))
            for c, stat in JOB_COUNTERS.items()
            if (entry := cells[stat]) is not None
        ]
        for found in self.client.read(wanted) if wanted else ():
            entry = found.counter_entry
            out[JOB_COUNTERS[self.p4info.counter(entry.counter_id).name]] = entry.data.packet_count
        return out

    def zero(self, cell: int) -> None:
        """Zero every per-job counter's cell ``cell`` (for the job that takes it).

        Raises:
            P4RuntimeError: the switch refused the write.
        """
        updates = []
        for name in JOB_COUNTERS:
            entry = counter_entry(self.p4info, name, cell)
            entry.data.packet_count = 0
            updates.append(modify(entry))
        self.client.write(updates)

    def held(self, entry: SharedEntry) -> list[int]:
        """The pool slots of ``entry``'s cells that its job holds now.

        Raises:
            P4RuntimeError | ThriftError: the register read failed.
        """
        cells = sorted(set(entry.cells()))
        values = self.registers.read(OWNER, cells)
        return [c for c, v in zip(cells, values, strict=True) if v and v >> 16 == entry.job_id]

    def region(self, entry: SharedEntry) -> RegionView:
        """``entry``'s job's view of its region now.

        Raises:
            P4RuntimeError | ThriftError: the register read failed.
        """
        owners = self.registers.read(OWNER, range(entry.base, entry.base + entry.size))
        return region_view(entry, owners)

    def release(self, cells: Sequence[int]) -> None:
        """Free owner ``cells`` (the caller has cleared their slots first).

        Raises:
            P4RuntimeError | ThriftError: a register write failed.
        """
        for cell in cells:
            self.registers.fill(OWNER, cell, cell + 1, 0)


@dataclass(frozen=True)
class RegionView:
    """What one job sees of the region its shared slots lie in, read from the owner
    register: the cells it maps onto and who holds them now (what decides whether its
    next uses there aggregate on the switch or go to the fallback).

    Attributes:
        size: the region's cells.
        mine: the job's cells (its shared slot count).
        held: of those, the cells the job holds.
        blocked: of those, the cells another job holds: its uses there go to the fallback
            for as long as that job stays.
        free: the region's free cells.
    """

    size: int
    mine: int
    held: int
    blocked: int
    free: int


@dataclass(frozen=True)
class JobSharing:
    """A job's use of the switch's memory now (``SwitchController.job_sharing``).

    Attributes:
        reserved: the job's reserved slots (its own for its life).
        shared: its job slots in the shared region, past the reserved ones (0: none).
        region: what it sees of that region (None: no shared slots).
        counters: its sharing counters so far (``shared_uses``, ``collisions``,
            ``to_fallback``, ``from_fallback``).
        fallback: whether it has a fallback aggregator.
    """

    reserved: int
    shared: int
    region: RegionView | None
    counters: dict[str, int]
    fallback: bool


def region_view(entry: SharedEntry, owners: Sequence[int]) -> RegionView:
    """``entry``'s view of its region whose owner cells (from ``entry.base`` on) are
    ``owners``."""
    mine = set(entry.cells())
    held = blocked = 0
    for cell in mine:
        value = owners[cell - entry.base]
        if value and value >> 16 == entry.job_id:
            held += 1
        elif value:
            blocked += 1
    free = sum(1 for v in owners if not v)
    return RegionView(entry.size, len(mine), held, blocked, free)


def free_cell(shared: Sequence[SharedEntry], fallback: Sequence[FallbackEntry]) -> int:
    """The lowest counter cell no entry names."""
    used = {e.stats for e in shared} | {e.stats for e in fallback}
    return next(c for c in range(len(used) + 1) if c not in used)


def regions(entries: Sequence[SharedEntry]) -> set[tuple[int, int]]:
    """The ``(base, size)`` of every region the shared entries name."""
    return {(e.base, e.size) for e in entries}


def best_offset(entries: Sequence[SharedEntry], size: int, count: int) -> int:
    """Where in a region of ``size`` a job of ``count`` shared slots overlaps the jobs of
    ``entries`` (the region's) least: the offset whose window covers the fewest of their
    cells, the lowest of equals. Spreading jobs is the controller's part of best effort:
    a job slot keeps the cell it took until its job leaves, so two jobs collide only
    where their windows overlap."""
    taken = [0] * size
    for e in entries:
        for t in range(e.count):
            taken[(e.offset + t) & (size - 1)] += 1
    rest = count % size  # whole laps of the region cover every offset alike
    doubled = taken + taken
    window = sum(doubled[:rest])
    best, best_cost = 0, window
    for offset in range(1, size):
        window += doubled[offset + rest - 1] - doubled[offset - 1]
        if window < best_cost:
            best, best_cost = offset, window
    return best
