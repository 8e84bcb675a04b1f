"""A best-effort shared region of switch memory and a fallback aggregator (issue #41).

Switch-target layer, part of the soft switch's :mod:`~emulation.softswitch.pipeline`: the
two tables and the register it adds, and the per-job counters they feed. ``docs/
sharing.md`` gives the design and its exactly-once argument; in short:

- **The shared table** (job id -> :class:`SharedEntry`). A job's slots beyond its
  reservation (``slot_count``) map into a region of the pool that jobs share: job slot
  ``slot_count + t`` (``t < count``) is aggregated in pool slot ``base + ((offset + t) &
  (size - 1))``. The offset is the controller's: it spreads jobs over the region.
- **The owner register**, one cell per pool slot: 0 while the slot is free, else ``job <<
  16 | (slot + 1)`` of the job slot that holds it (both sets: the pair is the unit, as
  SwitchML's shadow copy makes it). A packet that finds the cell free takes it; one that
  finds it held by another job slot is a **collision**. A job slot keeps what it took
  until its job is removed, because the switch answers a retransmission from the slot and
  only learns that every worker has a result when they move on to the slot's other set,
  which keeps the pair busy for as long as the job runs.
- **Per-job counters** (:data:`JOB_STATS`), in cells of their own: each entry names its
  job's cell (``stats``, the controller's choice), so that the counter arrays are sized
  by jobs on the switch, not by job ids.
- **The fallback table** (job id -> :class:`Fallback`). A collision, or a slot beyond the
  job's reservation and shared count, is passed on unchanged to the job's fallback
  aggregator (any INA aggregator on a server: a soft switch or the one-armed eBPF
  program, with the job installed behind this switch: :func:`~emulation.softswitch.fallback.
  install_behind`). Its
  RESULTs come back through this switch, which multicasts them to the job's workers.

Exactly once: each place (this switch, the fallback) counts a worker's contribution to a
use at most once (its bitmap and seq registers); a job slot moves from the fallback to
this switch at most once (when its holder leaves) and never back, so a use split between
them finishes here after the fallback's workers retransmit. A use that completes in both
places completes with every worker's contribution in each, so both results are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from emulation.softswitch.dataplane_types import Addr, JobTableError, _Job, _Route
from hostlib.protocol import MAX_SLOT

__all__ = [
    "JOB_STATS",
    "STATS_CELLS",
    "Fallback",
    "SharedEntry",
    "Sharing",
    "SharingTables",
    "owner_key",
]

STATS_CELLS = 1024
"""Cells of each per-job counter (configuration.p4's SHARING_STATS_SIZE: one a job of
the jobs table)."""

JOB_STATS = ("shared_uses", "collisions", "to_fallback", "from_fallback")
"""Per-job counters of sharing: uses started in the shared region, packets that found
their shared slot held by another job slot, packets passed on to the fallback (the
collisions among them, and slots beyond the job's reservation and shared count), and
RESULTs of the fallback multicast to the job's workers."""

SHARED_ENTRY_STATS = JOB_STATS[:2]
"""The counters in the shared entry's cell; the others are in the fallback entry's."""


def owner_key(job_id: int, slot: int) -> int:
    """The owner register's value for job slot ``slot`` of ``job_id`` (never 0)."""
    return (job_id << 16) | (slot + 1)


@dataclass(frozen=True, slots=True)
class SharedEntry:
    """A shared-table entry: where a job's slots past its reservation are aggregated.

    Attributes:
        count: job slots in the shared region (``slot_count .. slot_count + count - 1``).
        base: first pool slot of the region.
        size: pool slots in the region, a power of two (the index is masked, as a
            switch computes it).
        offset: where in the region the job's first shared slot lies.
        stats: the job's cell of the per-job counters (shared uses, collisions).
    """

    count: int
    base: int
    size: int
    offset: int = 0
    stats: int = 0


class Fallback(NamedTuple):
    """A fallback-table entry: the job's fallback aggregator (its INA address; its MAC
    and the egress port toward it, for a switch with ports)."""

    addr: Addr
    mac: int = 0
    port: int = 0
    stats: int = 0
    """The job's cell of the per-job counters (packets to and results from here)."""


class Sharing:
    """The shared and fallback tables, the owner register and the per-job counters.

    Args:
        slots: slots per set in the switch's pool (the owner register's cells).
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.owner = np.zeros(slots, dtype=np.uint32)
        self.shared: dict[int, SharedEntry] = {}
        self.fallback: dict[int, Fallback] = {}
        self.stats: dict[int, dict[str, int]] = {}
        """The per-job counters, by cell (an entry's ``stats``)."""
        self.behind: set[int] = set()
        """Jobs this pipeline aggregates as a fallback behind a switch."""

    # ----------------------------------------------------------------- tables
    def set_shared(self, job_id: int, entry: SharedEntry) -> None:
        """Create or replace the shared entry of ``job_id``.

        Raises:
            JobTableError: a region outside the pool or not a power of two, an offset
                outside it, or more shared slots than the header has slots.
        """
        size, base = entry.size, entry.base
        if size < 1 or size & (size - 1):
            raise JobTableError(f"shared region of {size} slots: not a power of two")
        if base < 0 or base + size > self.slots:
            raise JobTableError(f"shared region {base}+{size} outside the pool of {self.slots}")
        if not 0 <= entry.offset < size:
            raise JobTableError(f"shared offset {entry.offset} outside 0..{size - 1}")
        if not 1 <= entry.count <= MAX_SLOT + 1:
            raise JobTableError(f"{entry.count} shared slots outside 1..{MAX_SLOT + 1}")
        _check_stats(entry.stats)
        self.shared[job_id] = entry

    def set_fallback(self, job_id: int, entry: Fallback) -> None:
        """Create or replace the fallback entry of ``job_id``.

        Raises:
            JobTableError: a MAC or port out of range.
        """
        if not 0 <= entry.mac < 1 << 48 or not 0 <= entry.port < 1 << 9:
            raise JobTableError(f"fallback MAC {entry.mac:#x} or port {entry.port} out of range")
        _check_stats(entry.stats)
        self.fallback[job_id] = entry

    def covers(self, job_id: int) -> bool:
        """Whether ``job_id`` has a shared or a fallback entry (a slot past its
        reservation may then be aggregated here or passed on)."""
        return job_id in self.shared or job_id in self.fallback

    def delete(self, table: str, job_id: int) -> None:
        """Delete the ``table`` (``shared``, ``fallback`` or ``behind``) entry of a job;
        the owner cells it holds stay held until the controller frees them.

        Raises:
            JobTableError: no such entry.
        """
        entries: dict[int, object] | set[int] = getattr(self, table)
        if job_id not in entries:
            raise JobTableError(f"job {job_id} has no {table} entry")
        if isinstance(entries, set):
            entries.discard(job_id)
        else:
            del entries[job_id]

    def regions(self) -> set[tuple[int, int]]:
        """The ``(base, size)`` of every shared region an entry names."""
        return {(e.base, e.size) for e in self.shared.values()}

    def release(self, job_id: int) -> list[int]:
        """Free the owner cells ``job_id`` holds; return their pool slots (which the
        caller clears, both sets, before any job may take them)."""
        held = np.flatnonzero(((self.owner >> 16) == job_id) & (self.owner != 0))
        self.owner[held] = 0
        return [int(x) for x in held]

    def forget(self, job_id: int) -> None:
        """Drop ``job_id``'s entries and zero its counters (its job is gone), as the
        controller does for the next job that takes its cell."""
        for entry in (self.shared.pop(job_id, None), self.fallback.pop(job_id, None)):
            if entry is not None:
                self.stats.pop(entry.stats, None)
        self.behind.discard(job_id)

    def reset(self) -> None:
        self.owner[:] = 0
        self.shared.clear()
        self.fallback.clear()
        self.stats.clear()
        self.behind.clear()

    # ----------------------------------------------------------------- data path
    def place(self, job_id: int, slot: int, reserved: int) -> int:
        """The pool slot of job slot ``slot`` (``>= reserved``) in the shared region,
        taking its owner cell if free; -1 when the job has no shared entry or the slot
        lies past it; -2 on a collision (counted).
        """
        entry = self.shared.get(job_id)
        t = slot - reserved
        if entry is None or t >= entry.count:
            return -1
        x = entry.base + ((entry.offset + t) & (entry.size - 1))
        me = owner_key(job_id, slot)
        held = int(self.owner[x])
        if held == 0:
            self.owner[x] = me
        elif held != me:
            self.count(job_id, "collisions")
            return -2
        return x

    def count(self, job_id: int, name: str) -> None:
        """Add one to counter ``name`` in the cell of ``job_id``'s entry that counts it
        (the shared entry's for shared uses and collisions, else the fallback's)."""
        entries = self.shared if name in SHARED_ENTRY_STATS else self.fallback
        cell = entries[job_id].stats
        self.stats.setdefault(cell, dict.fromkeys(JOB_STATS, 0))[name] += 1


class SharingTables:
    """The pipeline's API of the shared and fallback tables (a base of ``Pipeline``)."""

    SHARING = True
    """Whether this data plane has the shared region and the fallback (#41)."""

    sharing: Sharing
    _jobs: dict[int, _Job]
    _upstream: dict[int, _Route]

    def set_shared(self, job_id: int, entry: SharedEntry) -> None:
        """Create or replace the shared entry of ``job_id`` (the shared table): its slots
        past its reservation are aggregated in the region ``entry`` names, best effort
        (:mod:`~emulation.softswitch.sharing`). Write it with the job and delete it with
        the job: the region's slots a running job holds are its until it leaves.

        Raises:
            JobTableError: this data plane has no shared region; a region that is not a
                power of two, leaves the pool or overlaps a reservation.
        """
        self._check_sharing()
        for j in self._jobs.values():
            if j.slot_base < entry.base + entry.size and entry.base < j.slot_base + j.slot_count:
                raise JobTableError(f"shared region {entry.base}+{entry.size} overlaps job "
                                    f"{j.job_id}'s slots {j.slot_base}+{j.slot_count}")  # fmt: skip
        self.sharing.set_shared(job_id, entry)

    def set_fallback(self, job_id: int, entry: Fallback) -> None:
        """Create or replace the fallback entry of ``job_id``: its packets this switch
        cannot aggregate go to ``entry.addr``, and RESULTs from there are multicast to its
        workers.

        Raises:
            JobTableError: this data plane has no fallback, the job has an upstream
                entry, or a MAC or port out of range.
        """
        self._check_sharing()
        if job_id in self._upstream:
            raise JobTableError(f"job {job_id} is aggregated hierarchically: no fallback")
        self.sharing.set_fallback(job_id, entry)

    def job_counters(self, job_id: int) -> dict[str, int]:
        """The sharing counters of ``job_id`` (:data:`~emulation.softswitch.sharing.
        JOB_STATS`), read from its entries' cells (:meth:`stats_cell`, where a data plane
        keeps them); zeros for a job without a shared or fallback entry."""
        out = dict.fromkeys(JOB_STATS, 0)
        for entry in (self.sharing.shared.get(job_id), self.sharing.fallback.get(job_id)):
            if entry is not None:
                names = SHARED_ENTRY_STATS if isinstance(entry, SharedEntry) else JOB_STATS[2:]
                cell = self.stats_cell(entry.stats)
                out.update({n: cell[n] for n in names})
        return out

    def stats_cell(self, cell: int) -> dict[str, int]:
        """Cell ``cell`` of the per-job counters (what a P4Runtime counter read sees)."""
        return dict(self.sharing.stats.get(cell, dict.fromkeys(JOB_STATS, 0)))

    def set_stats_cell(self, name: str, cells: Sequence[int], value: int) -> None:
        """Set counter ``name`` in ``cells`` to ``value`` (a P4 counter write)."""
        for cell in cells:
            if value or cell in self.sharing.stats:
                self.sharing.stats.setdefault(cell, dict.fromkeys(JOB_STATS, 0))[name] = value

    def set_behind(self, job_id: int) -> None:
        """Mark ``job_id`` as a job this pipeline aggregates as a fallback behind a
        switch (the behind table): its slots follow the rules of a use that may run at
        either place (docs/sharing.md).

        Raises:
            JobTableError: this data plane has no sharing.
        """
        self._check_sharing()
        self.sharing.behind.add(job_id)

    def delete_sharing(self, table: str, job_id: int) -> None:
        """Delete a job's ``shared``, ``fallback`` or ``behind`` entry.

        Raises:
            JobTableError: no such entry.
        """
        self.sharing.delete(table, job_id)

    def _check_sharing(self) -> None:
        if not self.SHARING:
            raise JobTableError(f"{type(self).__name__} has no shared region or fallback yet "
                                "(the Python pipeline has: --datapath python)")  # fmt: skip


def _check_stats(cell: int) -> None:
    if not 0 <= cell < STATS_CELLS:
        raise JobTableError(f"counter cell {cell} outside 0..{STATS_CELLS - 1}")
