"""Controller layer: one INA switch, the object ``inalab ctl``, the benchmark and the
tests hold (one per switch, no module state).

It composes the managers, one per P4 control (jobs, workers, replicas, forwarder,
drop simulator, slots, stats) and the PRE's multicast groups, over one P4Runtime
client and one register access (P4Runtime on the soft switch, Thrift on bmv2, whose
P4Runtime server cannot read registers). Whole-job operations keep the switch
consistent and read their state from the switch, so a restarted controller tears down
a job another one installed:

- :meth:`SwitchController.add_job` clears the job's slot range, then writes the
  multicast group, the replicas, the workers and last the jobs entry, which turns the
  job on; if a write fails, what was written is removed before the error is raised.
- :meth:`SwitchController.remove_job` deletes the jobs entry first (the job's packets
  stop at once), then its upstream entry, workers, replicas and group, and clears its
  slots.

Hierarchical aggregation (``p4/upstream.p4``): a leaf switch aggregates its local
workers of a job and sends each completed slot up as one worker of the same job id on
the upstream (spine) switch. On the spine the leaf is an ordinary worker, bound to the
leaf's source address: ``WorkerAddress(leaf INA IPv4, 20033, leaf MAC, spine port toward
the leaf)`` on ports, the leaf's UDP socket address on loopback. On the leaf,
:meth:`SwitchController.set_upstream` (or ``add_job(upstream=...)``, which writes the
entry before the jobs entry turns the job on) names the spine's INA address and the
leaf's rank there. Slots are job-relative on both levels: the spine's job has the same
slot count as every leaf's (:meth:`SwitchController.check_upstream` compares them), and
every worker uses that count and the job's total number of workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType

from controller.bmv2_thrift import Bmv2Thrift
from controller.client import P4RuntimeClient
from controller.drop_simulator import DropSimulator
from controller.forwarder import Forwarder
from controller.jobs import JobEntry, Jobs
from controller.multicast import MulticastGroups
from controller.p4info import P4Info
from controller.registers import Bmv2Registers, P4RuntimeRegisters, RegisterAccess
from controller.replicas import ReplicaEntry, Replicas
from controller.roce import Roce
from controller.sharing import (
    JOB_COUNTERS,
    OWNER,
    Behind,
    Fallback,
    FallbackEntry,
    JobSharing,
    Shared,
    SharedEntry,
    SharingCounters,
    best_offset,
    free_cell,
    regions,
    served,
)
from controller.slots import SlotRead, Slots
from controller.stats import Stats
from controller.tables import roll_back
from controller.tls import TlsFiles
from controller.upstream import Upstream, UpstreamEntry
from controller.workers import WorkerEntry, Workers
from hostlib.protocol import MAX_WORKERS

__all__ = [
    "ControllerError",
    "InstalledJob",
    "JobExistsError",
    "JobNotFoundError",
    "NoFreeSlotsError",
    "SwitchController",
    "UpstreamNotFoundError",
    "WorkerAddress",
]

log = logging.getLogger(__name__)

_NO_MAC = "00:00:00:00:00:00"


class ControllerError(Exception):
    """A whole-job request the switch's state does not allow."""


class JobExistsError(ControllerError):
    """The job id is installed already."""


class JobNotFoundError(ControllerError):
    """No job with that id is installed."""


class NoFreeSlotsError(ControllerError):
    """No free slot range of the requested size (or the requested one is taken)."""


class UpstreamNotFoundError(ControllerError):
    """The job has no upstream entry (it is not aggregated hierarchically here)."""


@dataclass(frozen=True)
class WorkerAddress:
    """Where a worker sends from and receives results: its IPv4 address and UDP port,
    and, for a switch with ports (bmv2, Mininet), its MAC and the switch port it is on.
    The loopback soft switch has one UDP socket: port and MAC do not matter there."""

    ip: str
    udp_port: int
    mac: str = _NO_MAC
    port: int = 0


@dataclass(frozen=True)
class InstalledJob:
    """A job as the switch holds it."""

    entry: JobEntry
    workers: tuple[WorkerEntry, ...]
    replicas: tuple[ReplicaEntry, ...]
    group: tuple[tuple[int, int], ...]
    upstream: UpstreamEntry | None = None
    """Where the job's partial sums go (a leaf of hierarchical aggregation), or None."""
    shared: SharedEntry | None = None
    """The job's slots in the shared region (docs/sharing.md), or None."""
    fallback: FallbackEntry | None = None
    """The job's fallback aggregator, or None."""
    behind: bool = False
    """Whether this switch is the job's fallback aggregator, behind another switch."""

    @property
    def job_id(self) -> int:
        return self.entry.job_id


class SwitchController:
    """The control plane of one INA switch.

    Args:
        client: a P4Runtime client of the switch (this object closes it).
        p4info: the switch's P4Info (sizes: lanes, slots per set).
        registers: register access; by default over ``client`` (the soft switch).
    """

    def __init__(
        self, client: P4RuntimeClient, p4info: P4Info, registers: RegisterAccess | None = None
    ) -> None:
        self.client = client
        self.p4info = p4info
        self.registers = registers or P4RuntimeRegisters(client, p4info)
        self.jobs = Jobs(client, p4info)
        self.workers = Workers(client, p4info)
        self.replicas = Replicas(client, p4info)
        self.upstream = Upstream(client, p4info)
        self.forwarder = Forwarder(client, p4info)
        self.multicast = MulticastGroups(client)
        self.drop_simulator = DropSimulator(self.registers)
        self.slots = Slots(self.registers, p4info)
        self.stats = Stats(client, p4info)
        self.sharing = _Sharing(client, p4info, self.registers) if served(p4info) else None
        """The shared region, the fallback and their counters (p4/sharing.p4); None for
        a program without them (p4/tna/ yet)."""
        self.roce = Roce(client, p4info, self.registers) if Roce.served_by(p4info) else None
        """A job's RoCEv2 queue pairs (p4/roce.p4, p4/tna/roce.p4): install after
        :meth:`add_job`; :meth:`remove_job` removes them. None for a program without
        RoCEv2's tables."""

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        device_id: int = 0,
        election_id: tuple[int, int] = (0, 1),
        timeout: float = 10.0,
        thrift: str | None = None,
        pipeline: tuple[P4Info, bytes] | None = None,
        arbitrate: bool = True,
        tls: TlsFiles | None = None,
    ) -> SwitchController:
        """Connect to the switch at ``address`` (``host:port``) and become its primary.

        Args:
            address: the P4Runtime server.
            device_id: its device id.
            election_id: (high, low); the highest connected id is the primary.
            timeout: seconds for the connection and for each request.
            thrift: ``host:port`` of bmv2's Thrift server; registers go there.
            pipeline: (P4Info, bmv2 JSON) to push first; by default the switch's
                installed pipeline is read (the soft switch has its program built in).
            arbitrate: False for a read-only controller (no mastership, no writes).
            tls: mutual TLS files (needed for a switch that is not on loopback).

        Raises:
            SwitchUnreachableError: nothing answered.
            P4RuntimeError: the switch refused the arbitration or the pipeline.
            ThriftUnreachableError: nothing answered at ``thrift``.
        """
        client = P4RuntimeClient(address, device_id, election_id, timeout, arbitrate, tls)
        try:
            if pipeline is not None:
                client.set_pipeline(*pipeline)
                p4info = pipeline[0]
            else:
                p4info = client.get_pipeline()
            registers: RegisterAccess | None = None
            if thrift is not None:
                host, _, port = thrift.rpartition(":")
                registers = Bmv2Registers(Bmv2Thrift(host, int(port), timeout))
        except BaseException:
            client.close()
            raise
        return cls(client, p4info, registers)

    # ----------------------------------------------------------------- properties
    @property
    def lanes(self) -> int:
        """int32 lanes per packet of the switch's program."""
        return self.slots.lanes

    @property
    def slots_per_set(self) -> int:
        """Slots per set in the switch's pool."""
        return self.slots.slots_per_set

    @property
    def is_primary(self) -> bool:
        return self.client.is_primary

    # ----------------------------------------------------------------- jobs
    def add_job(
        self,
        job_id: int,
        workers: Sequence[WorkerAddress],
        slot_count: int,
        slot_base: int | None = None,
        *,
        upstream: tuple[int, WorkerAddress] | None = None,
        shared: int = 0,
        region: int | None = None,
        fallback: WorkerAddress | None = None,
    ) -> InstalledJob:
        """Install a job whose rank r is ``workers[r]``.

        Args:
            job_id: 0..65535, unused.
            workers: each rank's address, 1..MAX_WORKERS of them, all different.
            slot_count: slots per set the job gets.
            slot_base: the first slot of its range; by default the lowest free range.
            upstream: ``(rank, address)``: make this switch a leaf of hierarchical
                aggregation for the job, as :meth:`set_upstream` does, with the entry
                written before the jobs entry (no packet of the job finds it missing).
            shared: job slots after the reservation that are aggregated in the
                switch's shared region, best effort (docs/sharing.md).
            region: pool slots of the shared region (a power of two), made at the top
                of the pool if the switch has none; by default the switch's region, or
                the shared count rounded up to a power of two.
            fallback: the job's fallback aggregator: what collides in the region, or
                lies past it, goes there (a soft switch or one-armed eBPF aggregator
                with the job installed by :meth:`add_behind`).

        Raises:
            ValueError: a bad worker list, slot count, upstream or sharing request.
            JobExistsError: the job id is installed.
            NoFreeSlotsError: no free range, or ``slot_base``'s range is taken.
            AlreadyExistsError: ``upstream`` given and the job has an upstream entry.
            P4RuntimeError | ThriftError: the switch refused a write (nothing is left).
        """
        if not 1 <= len(workers) <= MAX_WORKERS:
            raise ValueError(f"{len(workers)} workers; a job has 1..{MAX_WORKERS}")
        if len({(w.ip, w.udp_port) for w in workers}) != len(workers):
            raise ValueError("two ranks share one address and port")
        least = 0 if shared or fallback is not None else 1
        if not least <= slot_count <= self.slots_per_set:
            raise ValueError(f"slot count {slot_count} outside {least}..{self.slots_per_set}")
        up = None if upstream is None else _upstream_entry(job_id, *upstream)
        if up is not None and (shared or fallback is not None):
            raise ValueError("a job aggregated hierarchically has no shared slots or fallback")
        jobs = self.jobs.read()
        if any(j.job_id == job_id for j in jobs):
            raise JobExistsError(f"job {job_id} is installed")
        sharing = self._sharing_plan(job_id, jobs, slot_count, shared, region, fallback)
        base = _place(jobs, slot_count, self.slots_per_set, slot_base, sharing.taken)
        entry = JobEntry(job_id, len(workers), base, slot_count, self._free_mgid(jobs))
        replicas = tuple(
            ReplicaEntry(job_id, rank, w.port, w.mac, w.ip, w.udp_port)
            for rank, w in enumerate(workers)
        )
        bindings = tuple(
            WorkerEntry(job_id, rank, w.ip, w.udp_port) for rank, w in enumerate(workers)
        )
        group = tuple((w.port, rank) for rank, w in enumerate(workers))

        def tables(undo: list[Callable[[], None]]) -> None:
            if up is not None:
                self.upstream.insert(up)
                undo.append(lambda: self.upstream.delete(job_id))
            sharing.insert(undo)

        self._install(entry, replicas, bindings, group, tables)
        log.info("job %d: %d workers, slots %d+%d%s", job_id, len(workers), base, slot_count,
                 sharing.describe())  # fmt: skip
        return InstalledJob(entry, bindings, replicas, group, up, sharing.shared,
                            sharing.fallback)  # fmt: skip

    def add_behind(
        self, job_id: int, num_workers: int, slot_count: int, switch: WorkerAddress
    ) -> InstalledJob:
        """Install ``job_id`` on this switch as the fallback aggregator of ``switch``,
        which passes on what it cannot aggregate: every rank is bound to ``switch``'s
        INA address (it passes packets on from its own), results go back to it, and
        the job's slots follow the rules of a use that may run at either place.

        Raises:
            ValueError: a worker count or slot count out of range.
            ControllerError: the program has no sharing tables.
            JobExistsError, NoFreeSlotsError, P4RuntimeError: as :meth:`add_job`.
        """
        if self.sharing is None:
            raise ControllerError("this switch's program has no sharing tables (p4/sharing.p4)")
        if not 1 <= num_workers <= MAX_WORKERS:
            raise ValueError(f"{num_workers} workers; a job has 1..{MAX_WORKERS}")
        if not 1 <= slot_count <= self.slots_per_set:
            raise ValueError(f"slot count {slot_count} outside 1..{self.slots_per_set}")
        jobs = self.jobs.read()
        if any(j.job_id == job_id for j in jobs):
            raise JobExistsError(f"job {job_id} is installed")
        taken = regions(self.sharing.shared.read())
        base = _place(jobs, slot_count, self.slots_per_set, None, taken)
        entry = JobEntry(job_id, num_workers, base, slot_count, self._free_mgid(jobs))
        replica = ReplicaEntry(job_id, 0, switch.port, switch.mac, switch.ip, switch.udp_port)
        bindings = tuple(WorkerEntry(job_id, r, switch.ip, switch.udp_port)
                         for r in range(num_workers))  # fmt: skip
        behind = self.sharing.behind

        def tables(undo: list[Callable[[], None]]) -> None:
            behind.insert(job_id)
            undo.append(lambda: behind.delete(job_id))

        self._install(entry, (replica,), bindings, ((switch.port, 0),), tables)
        log.info("job %d: fallback behind %s:%d, slots %d+%d", job_id, switch.ip,
                 switch.udp_port, base, slot_count)  # fmt: skip
        return InstalledJob(entry, bindings, (replica,), ((switch.port, 0),), behind=True)

    def _free_mgid(self, jobs: Sequence[JobEntry]) -> int:
        """The lowest multicast group id neither defined nor named by a job."""
        taken = set(self.multicast.read()) | {j.mgid for j in jobs}
        return next(m for m in range(1, 1 << 16) if m not in taken)

    def _install(
        self, entry: JobEntry, replicas: Sequence[ReplicaEntry], bindings: Sequence[WorkerEntry],
        group: tuple[tuple[int, int], ...], tables: Callable[[list[Callable[[], None]]], None],
    ) -> None:  # fmt: skip
        """Write a job (see the module docstring): clear its slots, then its multicast
        group, replicas, workers, the other tables' entries (``tables``, which appends
        how to undo each), and last the jobs entry, which turns the job on; if a write
        fails, what was written is removed before the error is raised."""
        undo: list[Callable[[], None]] = []
        try:
            if entry.slot_count:
                self.slots.clear(entry.slot_base, entry.slot_count)
            self.multicast.insert(entry.mgid, group)
            undo.append(lambda: self.multicast.delete(entry.mgid))
            for replica in replicas:
                self.replicas.insert(replica)
                undo.append(lambda r=replica: self.replicas.delete(r))  # type: ignore[misc]
            for binding in bindings:
                self.workers.insert(binding)
                undo.append(lambda b=binding: self.workers.delete(b))  # type: ignore[misc]
            tables(undo)
            self.jobs.insert(entry)
        except BaseException:
            roll_back(undo, f"job {entry.job_id}")
            raise

    def _sharing_plan(
        self, job_id: int, jobs: Sequence[JobEntry], reserved: int, shared: int,
        region: int | None, fallback: WorkerAddress | None,
    ) -> _Plan:  # fmt: skip
        """The shared and fallback entries ``add_job`` writes for a job.

        Raises:
            ValueError: a negative count, a region that is no power of two or differs
                from the switch's, or sharing on a program without its tables.
            NoFreeSlotsError: no room at the top of the pool for a new region.
        """
        if not shared and fallback is None:
            return _Plan(regions(self.sharing.shared.read()) if self.sharing else set())
        if self.sharing is None:
            raise ValueError("this switch's program has no sharing tables (p4/sharing.p4)")
        if shared < 0:
            raise ValueError(f"shared slot count {shared} < 0")
        entries = self.sharing.shared.read()
        taken = regions(entries)
        cell = free_cell(entries, self.sharing.fallback.read())
        fb = None if fallback is None else FallbackEntry(
            job_id, fallback.ip, fallback.udp_port, fallback.mac, fallback.port, cell)  # fmt: skip
        if not shared:
            return _Plan(taken, None, fb, self.sharing)
        base, size = self._region(jobs, taken, shared, region)
        offset = best_offset([e for e in entries if e.base == base], size, shared)
        entry = SharedEntry(job_id, shared, base, size, offset, cell)
        if reserved + shared - 1 > 0x7FFF:
            raise ValueError(f"{reserved} reserved + {shared} shared slots pass slot 32767")
        return _Plan(taken | {(base, size)}, entry, fb, self.sharing)

    def _region(
        self, jobs: Sequence[JobEntry], taken: set[tuple[int, int]], shared: int,
        region: int | None,
    ) -> tuple[int, int]:  # fmt: skip
        """The switch's shared region ``(base, size)``, made at the top of the pool if
        it has none."""
        if taken:
            (base, size), *others = sorted(taken)
            if others or (region is not None and region != size):
                raise ValueError(f"the switch's shared region is {size} slots at {base}; "
                                 f"one region a switch, not {region}")  # fmt: skip
            return base, size
        size = region if region is not None else 1 << max(shared - 1, 0).bit_length()
        if size < 1 or size & (size - 1) or size > self.slots_per_set:
            raise ValueError(f"shared region of {size} slots: a power of two up to the pool")
        base = self.slots_per_set - size
        _place(jobs, size, self.slots_per_set, base)  # NoFreeSlotsError if reserved
        self.slots.clear(base, size)
        return base, size

    def installed_jobs(self) -> list[InstalledJob]:
        """Every job on the switch, read from its tables."""
        workers = self.workers.read()
        replicas = self.replicas.read()
        groups = self.multicast.read()
        upstream = {u.job_id: u for u in self.upstream.read()}
        shared, fallback, behind = self._sharing_entries()
        return [
            InstalledJob(
                entry,
                tuple(w for w in workers if w.job_id == entry.job_id),
                tuple(r for r in replicas if r.job_id == entry.job_id),
                groups.get(entry.mgid, ()),
                upstream.get(entry.job_id),
                shared.get(entry.job_id),
                fallback.get(entry.job_id),
                entry.job_id in behind,
            )
            for entry in self.jobs.read()
        ]

    def _sharing_entries(
        self,
    ) -> tuple[dict[int, SharedEntry], dict[int, FallbackEntry], set[int]]:
        if self.sharing is None:
            return {}, {}, set()
        return (
            {e.job_id: e for e in self.sharing.shared.read()},
            {e.job_id: e for e in self.sharing.fallback.read()},
            set(self.sharing.behind.read()),
        )

    def job(self, job_id: int) -> InstalledJob:
        """One installed job.

        Raises:
            JobNotFoundError: no such job.
        """
        for job in self.installed_jobs():
            if job.job_id == job_id:
                return job
        raise JobNotFoundError(f"no job {job_id} on the switch")

    def remove_job(self, job_id: int) -> InstalledJob:
        """Tear a job down (see the module docstring); return what was removed.

        Raises:
            JobNotFoundError: no such job.
            P4RuntimeError | ThriftError: the switch refused a write.
        """
        job = self.job(job_id)
        if self.roce is not None and self.roce.remove(job_id):  # its RoCEv2 frames first
            log.info("job %d: RoCEv2 entries removed", job_id)
        self.jobs.delete(job_id)
        if job.upstream is not None:
            self.upstream.delete(job_id)
        if self.sharing is not None:
            self.sharing.remove(job, self.slots)
        for binding in job.workers:
            self.workers.delete(binding)
        for replica in job.replicas:
            self.replicas.delete(replica)
        if job.entry.mgid in self.multicast.read():
            self.multicast.delete(job.entry.mgid)
        if job.entry.slot_count:
            self.slots.clear(job.entry.slot_base, job.entry.slot_count)
        log.info("job %d removed", job_id)
        return job

    # ----------------------------------------------------------------- hierarchy
    def set_upstream(self, job_id: int, rank: int, address: WorkerAddress) -> UpstreamEntry:
        """Make this switch a leaf of hierarchical aggregation for ``job_id``: its
        completed slots go up to ``address`` as rank ``rank`` of the same job there, and
        only RESULTs from ``address`` are its results. Writes the upstream entry (or
        replaces it); the job need not be installed yet.

        Args:
            job_id: 0..65535.
            rank: this switch's rank in the upstream switch's job, 0..MAX_WORKERS-1.
            address: the upstream switch's INA address: IPv4, UDP port (20033 on
                ports; its data port on loopback), MAC, and this switch's port toward
                it (MAC and port do not matter on loopback).

        Raises:
            ValueError: a job id or rank out of range.
            P4RuntimeError: the switch refused the write.
        """
        entry = _upstream_entry(job_id, rank, address)
        if self.upstream.get(job_id) is None:
            self.upstream.insert(entry)
        else:
            self.upstream.modify(entry)
        log.info("job %d: upstream rank %d at %s:%d", job_id, rank, address.ip, address.udp_port)
        return entry

    def remove_upstream(self, job_id: int) -> UpstreamEntry:
        """Delete the upstream entry of ``job_id``: its completed slots are multicast to
        its workers here again. Return the entry removed.

        Raises:
            UpstreamNotFoundError: the job has no upstream entry.
            P4RuntimeError: the switch refused the write.
        """
        entry = self.upstream.get(job_id)
        if entry is None:
            raise UpstreamNotFoundError(f"job {job_id} has no upstream entry")
        self.upstream.delete(job_id)
        log.info("job %d: upstream removed", job_id)
        return entry

    def check_upstream(self, job_id: int, upstream: SwitchController) -> None:
        """Check that ``upstream`` (the upstream switch's controller) holds ``job_id`` as
        this switch's upstream entry needs: the job on both switches, the same slot
        count (slots are job-relative on both levels), and a worker bound to this
        switch's rank there.

        Raises:
            JobNotFoundError: the job is missing on either switch.
            UpstreamNotFoundError: the job has no upstream entry here.
            ControllerError: the slot counts differ, or the rank is not a worker there.
        """
        here = self.job(job_id)
        if here.upstream is None:
            raise UpstreamNotFoundError(f"job {job_id} has no upstream entry")
        there = upstream.job(job_id)
        if here.entry.slot_count != there.entry.slot_count:
            raise ControllerError(
                f"job {job_id}: {here.entry.slot_count} slots here, "
                f"{there.entry.slot_count} on the upstream switch"
            )
        if not any(w.rank == here.upstream.rank for w in there.workers):
            raise ControllerError(
                f"job {job_id}: rank {here.upstream.rank} is not a worker on the upstream switch"
            )

    def read_slot(self, job_id: int, slot: int, pool_set: int) -> SlotRead:
        """The registers of a job's slot in one set.

        Raises:
            JobNotFoundError: no such job.
            ValueError: slot or set out of range.
        """
        entry = self.jobs.get(job_id)
        if entry is None:
            raise JobNotFoundError(f"no job {job_id} on the switch")
        return self.slots.read(entry, slot, pool_set)

    def counters(self) -> dict[str, int]:
        """The switch's statistics and drop counts by name."""
        return self.stats.read()

    def job_counters(self, job_id: int) -> dict[str, int]:
        """The sharing counters of ``job_id`` (``shared_uses``, ``collisions``,
        ``to_fallback``, ``from_fallback``); zeros on a program without them."""
        if self.sharing is None:
            return dict.fromkeys(JOB_COUNTERS.values(), 0)
        return self._counters_of(self.job(job_id))

    def _counters_of(self, job: InstalledJob) -> dict[str, int]:
        """The sharing counters of an installed job (as read from the tables)."""
        if self.sharing is None:
            return dict.fromkeys(JOB_COUNTERS.values(), 0)
        return self.sharing.counters.read(job.shared, job.fallback)

    def job_sharing(self, job_id: int) -> JobSharing:
        """What ``job_id`` holds of the switch's memory and sees of its shared region
        now, with its sharing counters (what dynamiccl reads of contention).

        Raises:
            JobNotFoundError: no such job.
            P4RuntimeError | ThriftError: a read failed.
        """
        job = self.job(job_id)
        shared = job.shared
        region = None
        if shared is not None and self.sharing is not None:
            region = self.sharing.counters.region(shared)
        return JobSharing(job.entry.slot_count, 0 if shared is None else shared.count, region,
                          self._counters_of(job), job.fallback is not None)  # fmt: skip

    def region_owners(self) -> list[int] | None:
        """The owner register over the switch's shared region, wherever the controller
        made it: 0 for a free cell, else its holder's ``job << 16 | slot + 1``; None
        while no job shares (no region).

        Raises:
            P4RuntimeError | ThriftError: a read failed.
        """
        if self.sharing is None:
            return None
        taken = regions(self.sharing.shared.read())
        if not taken:
            return None
        (base, size), *_ = sorted(taken)
        return self.registers.read(OWNER, range(base, base + size))

    def set_drops(self, ingress: float, egress: float) -> None:
        """Simulated loss at ingress and per replica at egress (0 turns it off)."""
        self.drop_simulator.set(ingress, egress)

    # ----------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Close the register access and the P4Runtime client (mastership ends)."""
        try:
            self.registers.close()
        finally:
            self.client.close()

    def __enter__(self) -> SwitchController:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _upstream_entry(job_id: int, rank: int, address: WorkerAddress) -> UpstreamEntry:
    """The upstream entry of ``job_id`` for ``rank`` at ``address``.

    Raises:
        ValueError: a job id or rank out of range.
    """
    if not 0 <= job_id <= 0xFFFF:
        raise ValueError(f"job id {job_id} outside 0..65535")
    if not 0 <= rank < MAX_WORKERS:
        raise ValueError(f"upstream rank {rank} outside 0..{MAX_WORKERS - 1}")
    return UpstreamEntry(job_id, rank, address.ip, address.udp_port, address.mac, address.port)


def _place(
    jobs: Sequence[JobEntry], count: int, pool: int, base: int | None,
    regions: Collection[tuple[int, int]] = (),
) -> int:  # fmt: skip
    """The first slot of a free range of ``count`` slots (``base``'s, if given), outside
    every reservation and shared region.

    Raises:
        NoFreeSlotsError: no such range.
    """
    taken = [(j.slot_base, j.slot_count) for j in jobs] + sorted(regions)

    def free(start: int) -> bool:
        return (
            start >= 0
            and start + count <= pool
            and all(start + count <= lo or lo + n <= start for lo, n in taken)
        )

    if base is not None:
        if not free(base):
            raise NoFreeSlotsError(f"slots {base}..{base + count - 1} are not free")
        return base
    for start in sorted({0, *(lo + n for lo, n in taken)}):
        if free(start):
            return start
    raise NoFreeSlotsError(f"no free range of {count} slots in a pool of {pool}")


class _Sharing:
    """The sharing tables, counters and owner register of one switch."""

    def __init__(self, client: P4RuntimeClient, p4info: P4Info, registers: RegisterAccess):
        self.shared = Shared(client, p4info)
        self.fallback = Fallback(client, p4info)
        self.behind = Behind(client, p4info)
        self.counters = SharingCounters(client, p4info, registers)

    def remove(self, job: InstalledJob, slots: Slots) -> None:
        """Delete a job's sharing entries (its jobs entry is gone: its packets stop) and
        free the region's slots it holds, cleared first."""
        if job.shared is not None:
            self.shared.delete(job.job_id)
            held = self.counters.held(job.shared)
            for cell in held:
                slots.clear(cell, 1)
            self.counters.release(held)
            log.info("job %d: %d shared slots freed", job.job_id, len(held))
        if job.fallback is not None:
            self.fallback.delete(job.job_id)
        if job.behind:
            self.behind.delete(job.job_id)


@dataclass
class _Plan:
    """The sharing entries of a job being installed."""

    taken: set[tuple[int, int]]
    """Every shared region's ``(base, size)``: no reservation may overlap one."""
    shared: SharedEntry | None = None
    fallback: FallbackEntry | None = None
    tables: _Sharing | None = None

    def insert(self, undo: list[Callable[[], None]]) -> None:
        tables, job = self.tables, (self.shared or self.fallback)
        if tables is None or job is None:
            return
        tables.counters.zero(job.stats)  # the cell's last job counted there
        if self.fallback is not None:
            tables.fallback.insert(self.fallback)
            undo.append(lambda: tables.fallback.delete(job.job_id))
        if self.shared is not None:
            tables.shared.insert(self.shared)
            undo.append(lambda: tables.shared.delete(job.job_id))

    def describe(self) -> str:
        out = ""
        if self.shared is not None:
            e = self.shared
            out += f", {e.count} shared in {e.base}+{e.size} from {e.offset}"
        if self.fallback is not None:
            out += f", fallback {self.fallback.ip}:{self.fallback.udp_port}"
        return out
