"""The soft switch's pipeline: match-action state and per-packet logic of the INA data plane.

This is the reference semantics that ``p4/`` implements on bmv2. Everything here is what a
P4 program can hold and do: exact-match tables (jobs, workers), register arrays indexed by
slot (bitmaps, counters, exponents, seqs, one value array per lane), counters, and per-packet
logic that touches one slot and loops over nothing but the lanes. I/O lives elsewhere
(``server.py`` for UDP, the in-memory network in ``hostlib.transport.memory`` for tests),
so a second backend (XDP/eBPF) can implement :class:`Dataplane` and be held to the same
tests.

Per-slot algorithm: SwitchML's bitmap, counter, value and exponent registers (its
bitmap_checker, workers_counter, processor and exponents controls), plus a seq register.
Registers per (set, slot): the worker bitmap, a down-counter (0: idle or finished), the
max exponent, one int32 value per lane, and the seq of the use the slot holds (0: unused;
hosts number packets from 1, monotonically across the calls of a session, and every
worker's packet of one use of a slot carries the same seq). A DATA packet of rank r, set
k, seq q that passed the table checks goes through, in this order:

1. seq check, before anything is written. If q equals the stored seq of a slot holding a
   use (stored seq or counter non-zero), the packet belongs to that use: on a finished
   slot (counter 0) the stored result is unicast to the sender whatever its bitmap bit
   (``retransmits_answered``); on a slot in progress it goes on to 2. Otherwise, a slot in
   progress (another use is running) or a q older than the stored seq (serial-number
   order: bit 31 of (q - stored) mod 2**32) drops it as ``stale``. Anything else (a newer
   q on a finished slot, or an unused slot) starts a new use and goes on to 2.
2. bitmaps: OR the worker's bit into set k and clear it in set 1-k; the bit read before
   the update set means a duplicate within the running use: ignored
   (``duplicates_ignored``), never counted twice.
3. counter 0: the first contribution *writes* values, exponent and seq and sets the
   counter to workers-1 (no clearing between uses). Otherwise *add* (wrapping int32, as
   a switch ALU) and max the exponent, and count down.
4. counter reaching 0 finishes the slot: the result is multicast to every worker of the
   job (``completed``).

Why the seq register: a retransmission of use u delayed past the same worker's use u+1
finds its bit cleared by u+1, and SwitchML's bitmaps alone would take it as the first
contribution of use u+2, silently corrupting that sum. Here it matches the stored seq of
finished use u (answered by unicast), or meets u+2 in progress or finished (stale). In P4
it is one more register array. ``docs/protocol.md`` gives the exactly-once argument.

Hierarchical aggregation (SwitchML/CollNet's "reduce near, aggregate across"): a job with
an entry in the upstream table is aggregated by this switch (the leaf) over its local
workers, and the completed slot is not multicast but sent as ONE DATA packet (the
partial sum, rank = the leaf's rank in the upstream switch's job of the same id) to the
upstream switch (the spine), to which the leaf is an ordinary worker. One more register
per (set, slot), ``final`` (0/1), says whether the slot holds the spine's result or only
the local partial; a use's first contribution clears it. Then:

- a RESULT from the upstream address, for a (set, slot) that holds the use of its seq,
  finished locally (counter 0), is written into the slot (values, exponent; final = 1)
  and multicast to the local workers (``results_from_upstream``), once: a copy arriving
  when final is 1 already is ignored (``duplicates_ignored``); any other seq or a slot
  in progress: ``stale``; a RESULT from elsewhere: ``bad_source``; a RESULT for a job
  without an upstream entry: ``malformed``, as before;
- a local worker's retransmission of a finished use is answered by unicast when final
  is 1; when it is 0 the partial (or the spine's result) may have been lost, and the
  partial is sent up again (``upstream_resent``), which the spine ignores as a duplicate
  or answers with its result.
A job's slots past its reservation may be aggregated in a shared region of the pool, best
effort, and whatever the switch cannot hold goes to a fallback aggregator on a server
(``sharing.py``; ``docs/sharing.md`` has the rules and why each use stays exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from emulation.softswitch.dataplane_types import (
    REGISTER_ARRAYS,
    SIGNED_REGISTERS,
    Addr,
    Dataplane,
    DropReason,
    DropSimulator,
    Emit,
    JobConfig,
    JobTableError,
    RegisterCell,
    SlotState,
    Upstream,
    _Job,
    _Route,
)
from emulation.softswitch.register_file import RegisterFile
from emulation.softswitch.roce_tables import RoceTables, qp_registers
from emulation.softswitch.sharing import Sharing, SharingTables
from hostlib.protocol import (
    FLAG_RESEND,
    HEADER,
    HEADER_SIZE,
    LANE_BYTES,
    LANES_PER_PACKET,
    MAX_LANES,
    MAX_WORKERS,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    SLOT_MASK,
    SWITCH_SLOTS,
    PacketType,
)

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
    "Pipeline",
    "RegisterCell",
    "SlotState",
    "Upstream",
]

_DATA_VT = (PROTOCOL_VERSION << 4) | PacketType.DATA
_RESULT_VT = (PROTOCOL_VERSION << 4) | PacketType.RESULT


class Pipeline(RegisterFile, SharingTables):
    """The soft switch's data plane state and its per-packet logic.

    Args:
        lanes: int32 lanes per packet this switch aggregates (a P4 compile-time constant;
            here a start-up option up to ``MAX_LANES``).
        slots: slots per set in the switch pool.
        drops: the drop simulator; none by default.

    Raises:
        ValueError: lanes or slots out of range.
    """

    def __init__(
        self,
        lanes: int = LANES_PER_PACKET,
        slots: int = SWITCH_SLOTS,
        drops: DropSimulator | None = None,
    ) -> None:
        if not 1 <= lanes <= MAX_LANES:
            raise ValueError(f"lanes {lanes} outside 1..{MAX_LANES}")
        if not 1 <= slots <= SLOT_MASK + 1:
            raise ValueError(f"slots {slots} outside 1..{SLOT_MASK + 1}")
        self.lanes = lanes
        self.slots = slots
        self.drops = drops or DropSimulator()
        self._size = HEADER_SIZE + lanes * LANE_BYTES
        self._alloc_registers(slots, lanes)
        self.roce = RoceTables(lanes, qp_registers(slots))
        """The RoCEv2 tables and registers (p4/roce.p4), run by ``roce.RoceFront``."""
        self.sharing = Sharing(slots)
        """The shared region and fallback tables, and the owner register (#41)."""
        self._jobs: dict[int, _Job] = {}
        self._upstream: dict[int, _Route] = {}  # the upstream table, by job id
        self._workers: dict[int, dict[int, set[Addr]]] = {}  # job id -> rank -> sources
        self._groups: dict[int, tuple[tuple[int, int], ...]] = {}  # mgid -> (port, rid)
        # (job, rid, port) -> (destination, its MAC)
        self._replicas: dict[tuple[int, int, int], tuple[Addr, int]] = {}
        # The forwarder (non-INA frames, on a switch with ports): destination MAC ->
        # ("port", p) | ("flood", mgid) | ("drop", 0), and the action on a miss.
        self.forward: dict[int, tuple[str, int]] = {}
        self.forward_default: tuple[str, int] = ("drop", 0)
        self._out = bytearray(self._size)
        self._out_view = memoryview(self._out)
        self._framed = False  # in aggregate(): results unfiltered by the egress simulator
        self._out_values = np.frombuffer(self._out, dtype=">i4", offset=HEADER_SIZE)
        self.stats: dict[str, int] = {
            "received": 0,
            "aggregated": 0,
            "completed": 0,
            "results_sent": 0,
            "retransmits_answered": 0,
            "duplicates_ignored": 0,
            "sent_upstream": 0,
            "upstream_resent": 0,
            "results_from_upstream": 0,
        }
        for reason in DropReason:
            self.stats["drop_" + reason.value] = 0

    # ----------------------------------------------------------------- job table API
    # Whole jobs at once: what tests, --job and the load generator use. The controller
    # writes the same state entry by entry (the table API below), over P4Runtime.
    def add_job(self, job: JobConfig) -> int:
        """Install a job: its jobs entry, workers, multicast group and replicas (result
        destinations = the workers' addresses), with its slots cleared; return its base.

        Raises:
            JobTableError: duplicate job id, bad worker list, or no free slot range.
        """
        if job.job_id in self._jobs:
            raise JobTableError(f"job {job.job_id} already exists")
        if len(set(job.workers)) != job.num_workers:
            raise JobTableError("two ranks bound to one source address")
        if self._workers.get(job.job_id):
            raise JobTableError(f"job {job.job_id} has workers bound already")
        if not 0 <= job.slot_count <= self.slots:
            raise JobTableError(f"slot count {job.slot_count} outside 0..{self.slots}")
        base = self.free_range(job.slot_count) if job.slot_base is None else job.slot_base
        mgid = self.free_mgid()
        self.insert_job(job.job_id, job.num_workers, base, job.slot_count, mgid)
        for rank, addr in enumerate(job.workers):
            self.insert_worker(job.job_id, rank, addr)
            self.set_replica(job.job_id, rank, 0, addr)
        self.set_group(mgid, [(0, rank) for rank in range(job.num_workers)])
        self.clear_slots(base, job.slot_count)
        return base

    def remove_job(self, job_id: int) -> None:
        """Remove what :meth:`add_job` installed (entries, group, replicas) and the job's
        upstream entry if it has one; clear its slots.

        Raises:
            JobTableError: no such job.
        """
        job = self._job(job_id)
        self.delete_job(job_id)
        self._upstream.pop(job_id, None)
        self.roce.remove_job(job_id)
        for rank, addrs in list(job.sources.items()):
            for addr in sorted(addrs):
                self.delete_worker(job_id, rank, addr)
        for key in [k for k in self._replicas if k[0] == job_id]:
            self.delete_replica(*key)
        self._groups.pop(job.mgid, None)
        self.clear_slots(job.slot_base, job.slot_count)
        for x in self.sharing.release(job_id):
            self._clear(x, 1)
        self.sharing.forget(job_id)

    def jobs(self) -> list[JobConfig]:
        """Installed jobs; a rank's address is its bound source (the first if several)."""
        out = []
        for j in self._jobs.values():
            bound: dict[int, Addr] = {}
            for rank, addrs in j.sources.items():
                bound[rank] = min(addrs)
            workers = tuple(bound.get(r, ("0.0.0.0", 0)) for r in range(j.num_workers))
            out.append(JobConfig(j.job_id, workers, j.slot_count, j.slot_base))
        return out

    # ----------------------------------------------------------------- table API
    # One method per P4 table or PRE object, as P4Runtime writes them. Like a switch's
    # tables they are independent: a worker may be bound before its job exists. Unlike
    # bmv2, a job whose slot range leaves the pool or overlaps another job's is refused.
    def insert_job(
        self, job_id: int, num_workers: int, slot_base: int, slot_count: int, mgid: int
    ) -> None:
        """Insert a jobs-table entry (``set_job``); slots are not cleared.

        Raises:
            JobTableError: duplicate id, or a value or range that does not fit.
        """
        if job_id in self._jobs:
            raise JobTableError(f"job {job_id} already exists")
        self._jobs[job_id] = self._new_job(job_id, num_workers, slot_base, slot_count, mgid)
        self._refresh_dests()

    def modify_job(
        self, job_id: int, num_workers: int, slot_base: int, slot_count: int, mgid: int
    ) -> None:
        """Replace a jobs-table entry's action data.

        Raises:
            JobTableError: no such job, or a value or range that does not fit.
        """
        self._job(job_id)
        self._jobs[job_id] = self._new_job(job_id, num_workers, slot_base, slot_count, mgid)
        self._refresh_dests()

    def delete_job(self, job_id: int) -> None:
        """Delete a jobs-table entry; its packets then miss (``unknown_job``).

        Raises:
            JobTableError: no such job.
        """
        self._job(job_id)
        del self._jobs[job_id]

    def insert_worker(self, job_id: int, rank: int, addr: Addr) -> None:
        """Bind ``rank`` of ``job_id`` to a source address (a workers-table entry).

        Raises:
            JobTableError: the binding exists, or the job id is out of range.
        """
        self._check_job_id(job_id)
        bound = self._workers.setdefault(job_id, {}).setdefault(rank, set())
        if addr in bound:
            raise JobTableError(f"job {job_id} rank {rank} already bound to {addr}")
        bound.add(addr)

    def delete_worker(self, job_id: int, rank: int, addr: Addr) -> None:
        """Remove one binding.

        Raises:
            JobTableError: no such binding.
        """
        ranks = self._workers.get(job_id, {})
        if addr not in ranks.get(rank, ()):
            raise JobTableError(f"job {job_id} rank {rank} not bound to {addr}")
        ranks[rank].discard(addr)
        if not ranks[rank]:
            del ranks[rank]  # the per-packet lookup finds no empty set

    def set_group(self, mgid: int, replicas: Sequence[tuple[int, int]]) -> None:
        """Create or replace multicast group ``mgid``: its (egress port, rid) replicas.

        Raises:
            JobTableError: mgid 0 (no multicast in v1model) or out of range.
        """
        if not 1 <= mgid <= 0xFFFF:
            raise JobTableError(f"multicast group {mgid} outside 1..65535")
        self._groups[mgid] = tuple(replicas)
        self._refresh_dests()

    def delete_group(self, mgid: int) -> None:
        """Delete a multicast group.

        Raises:
            JobTableError: no such group.
        """
        if self._groups.pop(mgid, None) is None:
            raise JobTableError(f"no multicast group {mgid}")
        self._refresh_dests()

    def set_replica(self, job_id: int, rid: int, port: int, addr: Addr, mac: int = 0) -> None:
        """Set where replica (rid, egress port) of a job's result goes (replicas table)."""
        self._replicas[(job_id, rid, port)] = (addr, mac)
        self._refresh_dests()

    def group(self, mgid: int) -> tuple[tuple[int, int], ...]:
        """The (egress port, rid) replicas of multicast group ``mgid`` (none if undefined)."""
        return self._groups.get(mgid, ())

    def delete_replica(self, job_id: int, rid: int, port: int) -> None:
        """Delete a replicas-table entry.

        Raises:
            JobTableError: no such entry.
        """
        if self._replicas.pop((job_id, rid, port), None) is None:
            raise JobTableError(f"no replica ({job_id}, {rid}, {port})")
        self._refresh_dests()

    def set_upstream(self, job_id: int, rank: int, addr: Addr, mac: int = 0, port: int = 0) -> None:
        """Create or replace the upstream entry of ``job_id`` (``set_upstream``): its
        completed slots go as DATA of rank ``rank`` to ``addr`` (MAC ``mac``, out of
        switch port ``port``), and only RESULTs from ``addr`` are taken as its results.

        Raises:
            JobTableError: a job id, rank, MAC or port out of range.
        """
        self._check_job_id(job_id)
        # The widths of set_upstream's parameters (p4/upstream.p4): a rank the upstream
        # switch's job does not have is its bad_rank, as any worker's.
        if not 0 <= rank <= 0xFF or not 0 <= mac < 1 << 48 or not 0 <= port < 1 << 9:
            raise JobTableError(f"upstream rank {rank}, MAC {mac:#x} or port {port} out of range")
        if job_id in self.sharing.fallback:
            raise JobTableError(f"job {job_id} has a fallback: no upstream")
        self._upstream[job_id] = _Route(Upstream(rank, addr, mac, port), (addr,), ((port, mac),))

    def delete_upstream(self, job_id: int) -> None:
        """Delete the upstream entry of ``job_id``: its slots multicast locally again.

        Raises:
            JobTableError: no such entry.
        """
        if self._upstream.pop(job_id, None) is None:
            raise JobTableError(f"job {job_id} has no upstream entry")

    def upstream(self, job_id: int) -> Upstream | None:
        """The upstream entry of ``job_id``, or None."""
        route = self._upstream.get(job_id)
        return None if route is None else route.entry

    def set_forward(self, mac: int, action: tuple[str, int]) -> None:
        """Create or replace the forwarder entry of destination MAC ``mac``: ``("port",
        p)``, ``("flood", mgid)`` or ``("drop", 0)``."""
        self.forward[mac] = action

    def delete_forward(self, mac: int) -> None:
        """Delete the forwarder entry of ``mac``.

        Raises:
            JobTableError: no such entry.
        """
        if self.forward.pop(mac, None) is None:
            raise JobTableError(f"no forwarding entry for MAC {mac:#014x}")

    def set_forward_default(self, action: tuple[str, int]) -> None:
        """The forwarder's action for a destination MAC without an entry."""
        self.forward_default = action

    def set_drop_rates(self, ingress: float | None = None, egress: float | None = None) -> None:
        """Set the drop simulator's probabilities (None: leave as is).

        Raises:
            ValueError: a probability outside 0..1.
        """
        for name, p in (("ingress", ingress), ("egress", egress)):
            if p is not None and not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} drop probability {p} outside 0..1")
        if ingress is not None:
            self.drops.ingress = ingress
        if egress is not None:
            self.drops.egress = egress

    def free_mgid(self) -> int:
        """The lowest multicast group id neither defined nor named by a job."""
        used = set(self._groups) | {j.mgid for j in self._jobs.values()}
        return next(m for m in range(1, len(used) + 2) if m not in used)

    def reset(self) -> None:
        """Empty every table, clear every register and counter, stop the drop simulator
        (what loading a program into a switch does)."""
        self._jobs.clear()
        self._workers.clear()
        self._groups.clear()
        self._replicas.clear()
        self._upstream.clear()
        self.forward.clear()
        self.forward_default = ("drop", 0)
        self.roce.reset()
        self.sharing.reset()
        self._clear(0, self.slots)
        for name in self.stats:
            self.stats[name] = 0
        self.drops.ingress = self.drops.egress = 0.0

    def clear_slots(self, base: int, count: int) -> None:
        """Reset both sets of slots ``base..base+count-1`` (what a controller does before
        a job takes a range: a stale seq there would drop the new job's packets).

        Raises:
            JobTableError: the range leaves the pool.
        """
        if base < 0 or count < 0 or base + count > self.slots:
            raise JobTableError(f"slots {base}+{count} outside the pool of {self.slots}")
        self._clear(base, count)

    def _new_job(
        self, job_id: int, num_workers: int, slot_base: int, slot_count: int, mgid: int
    ) -> _Job:
        self._check_job_id(job_id)
        if not 1 <= num_workers <= MAX_WORKERS:
            raise JobTableError(f"{num_workers} workers outside 1..{MAX_WORKERS}")
        if not 0 <= slot_count <= self.slots:
            raise JobTableError(f"slot count {slot_count} outside 0..{self.slots}")
        if not self._range_free(slot_base, slot_count, ignore=job_id):
            raise JobTableError(f"slots {slot_base}..{slot_base + slot_count - 1} not free")
        if not 0 <= mgid <= 0xFFFF:
            raise JobTableError(f"multicast group {mgid} outside 0..65535")
        sources = self._workers.setdefault(job_id, {})
        return _Job(job_id, num_workers, slot_base, slot_count, mgid, sources)

    @staticmethod
    def _check_job_id(job_id: int) -> None:
        if not 0 <= job_id <= 0xFFFF:
            raise JobTableError(f"job id {job_id} outside 0..65535")

    def _job(self, job_id: int) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise JobTableError(f"no job {job_id}")
        return job

    def _refresh_dests(self) -> None:
        """Recompute every job's multicast destinations (the PRE and egress, folded)."""
        for job in self._jobs.values():
            group = self._groups.get(job.mgid, ())
            found = [(port, self._replicas.get((job.job_id, rid, port))) for port, rid in group]
            job.dests = tuple(r[0] for _, r in found if r is not None)
            job.links = tuple((port, r[1]) for port, r in found if r is not None)

    def read_slot(self, job_id: int, slot: int, pool_set: int) -> SlotState:
        """Read the registers of one job-relative slot and set.

        Raises:
            JobTableError: no such job, or slot/set out of range.
        """
        job = self._job(job_id)
        if not 0 <= slot < job.slot_count or pool_set not in (0, 1):
            raise JobTableError(f"slot {slot} set {pool_set} outside job {job_id}")
        s = job.slot_base + slot
        i = pool_set * self.slots + s
        return SlotState(
            int(self.bitmap[pool_set, s]),
            int(self.bitmap[1 - pool_set, s]),
            int(self.counter[i]),
            int(self.exponent[i]),
            self.values[i].copy(),
        )

    def counters(self) -> dict[str, int]:
        return dict(self.stats)

    def worker_rank(self, job_id: int, addr: Addr) -> int | None:
        """The rank of ``job_id`` bound to source ``addr`` in the workers table, if any."""
        for rank, bound in self._workers.get(job_id, {}).items():
            if addr in bound:
                return rank
        return None

    def set_counter(self, name: str, value: int) -> None:
        """Set statistic ``name`` (a key of :meth:`counters`) to ``value``, as a P4
        counter write does (a controller resetting a counter writes 0).

        Raises:
            ValueError: no such statistic, or a negative value.
        """
        if name not in self.stats:
            raise ValueError(f"no counter {name!r}")
        if value < 0:
            raise ValueError(f"counter {name}: negative value {value}")
        self.stats[name] = value

    # ----------------------------------------------------------------- data path
    def process(self, data: memoryview, src: Addr) -> Emit | None:
        """Run one datagram from ``src`` through the pipeline.

        Returns what to send, or ``None`` when the packet is consumed or dropped. Never
        raises on packet content: anything invalid is dropped and counted.
        """
        self.stats["received"] += 1
        if self.drops.ingress and self.drops.drop_ingress():
            return self._drop(DropReason.SIM_INGRESS)
        return self._process(data, src)

    def aggregate(self, data: memoryview, src: Addr) -> Emit | None:
        """An INA packet that arrived in another framing (RoCEv2: ``roce.py``), as the
        framing's parser rebuilt it: the caller counted it received and ran the ingress
        simulator. A result comes back for every replica, unfiltered and uncounted: the
        caller builds a frame per replica, runs the egress simulator on each, and counts
        ``results_sent`` and ``drop_sim_egress`` (:meth:`count`)."""
        self._framed = True
        try:
            return self._process(data, src)
        finally:
            self._framed = False

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to statistic ``name`` (``drop_<reason>`` for a drop), for a framing
        in front of the pipeline (:meth:`aggregate`)."""
        self.stats[name] += n

    def _process(self, data: memoryview, src: Addr) -> Emit | None:
        stats = self.stats
        n = len(data)
        if n < HEADER_SIZE:
            return self._drop(DropReason.TRUNCATED)
        vt, flags, job_id, rank, exp, lanes, pidx, _, seq = HEADER.unpack_from(data)
        if vt != _DATA_VT:
            if vt == _RESULT_VT and job_id in self.sharing.fallback:
                return self._from_fallback(data, src, job_id, lanes)
            if vt == _RESULT_VT and self._upstream:
                return self._from_upstream(data, src, job_id, exp, lanes, pidx, seq)
            return self._drop(DropReason.MALFORMED)
        job = self._jobs.get(job_id)
        if job is None:
            return self._drop(DropReason.UNKNOWN_JOB)
        if rank >= job.num_workers:
            return self._drop(DropReason.BAD_RANK)
        bound = job.sources.get(rank)
        if bound is None or src not in bound:
            return self._drop(DropReason.BAD_SOURCE)
        slot = pidx & SLOT_MASK
        reserved = slot < job.slot_count
        if not reserved and not self.sharing.covers(job_id):
            return self._drop(DropReason.BAD_SLOT)
        if lanes != self.lanes:
            return self._drop(DropReason.BAD_LANES)
        if n != self._size:
            return self._drop(DropReason.BAD_LENGTH)
        pool_set = 1 if pidx & POOL_SET_BIT else 0
        if reserved:
            s = job.slot_base + slot
        else:  # past the reservation: the shared region, else the fallback
            s = self.sharing.place(job_id, slot, job.slot_count)
            if s < 0:
                return self._to_fallback(data, job_id)
        i = pool_set * self.slots + s
        # A slot whose uses may also run at another place (sharing.py): each use starts
        # with a clear bitmap, and a packet touches only its own set's.
        loose = not reserved or job_id in self.sharing.behind
        left = int(self.counter[i])
        stored = int(self.seq[i])
        if seq == stored and (stored or left):  # a packet of the use held in the slot
            if left == 0:
                # Before the bitmaps: the sender's next use may have cleared its bit here.
                if self._upstream and not self._final[i]:
                    up = self._upstream.get(job_id)
                    if up is not None:  # no result from upstream yet: ask again
                        stats["upstream_resent"] += 1
                        return self._upward(data, i, up)
                stats["retransmits_answered"] += 1
                return self._result(data, i, (src,))
        elif stored and (seq - stored) & 0x80000000:
            return self._drop(DropReason.STALE)  # older than the use the slot holds
        elif left or loose:
            # A use starts where another runs, or where a use may run at another place
            # too: the shared region, a fallback's job (sharing.py).
            if not reserved and flags & FLAG_RESEND and job_id in self.sharing.fallback:
                return self._to_fallback(data, job_id)  # its use may be the fallback's
            if left and not loose:
                return self._drop(DropReason.STALE)
            # The uses before may have run at the other place: their bits and count go.
            self.bitmap[pool_set, s] = 0
            left = 0
        bit = 1 << rank
        bitmap = self.bitmap
        seen = int(bitmap[pool_set, s]) & bit
        bitmap[pool_set, s] |= bit
        if not loose:
            bitmap[1 - pool_set, s] &= ~bit & 0xFFFFFFFF
        if seen:
            if not reserved and flags & FLAG_RESEND and job_id in self.sharing.fallback:
                # Counted here, still unanswered: the others may have their result from
                # the fallback, and will not send this use here again (sharing.py).
                return self._to_fallback(data, job_id)
            stats["duplicates_ignored"] += 1
            return None
        payload = np.frombuffer(data, dtype=">i4", offset=HEADER_SIZE)
        if left == 0:
            if not reserved:
                self.sharing.count(job_id, "shared_uses")
            self.counter[i] = left = job.num_workers - 1
            self.seq[i] = seq
            self._final[i] = 0
            self.values[i] = payload
            self.exponent[i] = exp
        else:
            self.counter[i] = left = left - 1
            np.add(self.values[i], payload, out=self.values[i], casting="unsafe")
            if exp > self.exponent[i]:
                self.exponent[i] = exp
        stats["aggregated"] += 1
        if left != 0:
            return None
        stats["completed"] += 1
        if self._upstream:
            up = self._upstream.get(job_id)
            if up is not None:
                return self._upward(data, i, up)
        return self._result(data, i, job.dests, job.links)

    def _from_upstream(
        self, data: memoryview, src: Addr, job_id: int, exp: int, lanes: int, pidx: int, seq: int
    ) -> Emit | None:
        """A RESULT, on a switch with upstream entries: the upstream switch's answer for a
        slot whose partial sum this switch sent up; store it and multicast it locally."""
        up = self._upstream.get(job_id)
        if up is None:
            return self._drop(DropReason.MALFORMED)  # results never go to a switch, else
        job = self._jobs.get(job_id)
        if job is None:
            return self._drop(DropReason.UNKNOWN_JOB)
        if src != up.entry.addr:
            return self._drop(DropReason.BAD_SOURCE)
        slot = pidx & SLOT_MASK
        if slot >= job.slot_count:
            return self._drop(DropReason.BAD_SLOT)
        if lanes != self.lanes:
            return self._drop(DropReason.BAD_LANES)
        if len(data) != self._size:
            return self._drop(DropReason.BAD_LENGTH)
        i = (1 if pidx & POOL_SET_BIT else 0) * self.slots + job.slot_base + slot
        if seq != self.seq[i] or seq == 0 or self.counter[i]:
            # Not the use the slot holds, finished here: the slot moved on (a late copy),
            # or the partial of this seq was never sent (its use still runs).
            return self._drop(DropReason.STALE)
        if self._final[i]:
            # Another copy (the spine answers every re-sent partial): the first one was
            # multicast, and a worker that lost it is answered by unicast from the slot.
            self.stats["duplicates_ignored"] += 1
            return None
        self.values[i] = np.frombuffer(data, dtype=">i4", offset=HEADER_SIZE)
        self.exponent[i] = exp
        self._final[i] = 1
        self.stats["results_from_upstream"] += 1
        return self._result(data, i, job.dests, job.links)

    def _upward(self, data: memoryview, i: int, up: _Route) -> Emit | None:
        """Turn the packet into the DATA packet carrying slot ``i``'s partial sum to the
        upstream switch: the packet's header (seq, pool_index, job) with the leaf's
        upstream rank, the slot's exponent and values.

        The payload view is the pipeline's one output buffer, as in :meth:`_result`.
        """
        out = self._out
        out[:HEADER_SIZE] = data[:HEADER_SIZE]
        out[0] = _DATA_VT
        out[4] = up.entry.rank
        out[5] = int(self.exponent[i]) & 0xFF
        self._out_values[:] = self.values[i]
        drops = self.drops
        if drops.egress and drops.drop_egress():
            self.stats["drop_" + DropReason.SIM_EGRESS.value] += 1
            return None
        self.stats["sent_upstream"] += 1
        return Emit(self._out_view, up.dests, up.links)

    def _result(
        self,
        data: memoryview,
        i: int,
        dests: tuple[Addr, ...],
        links: tuple[tuple[int, int], ...] = (),
    ) -> Emit | None:
        """Turn the packet into a RESULT carrying slot ``i``'s registers, for ``dests``.

        The payload view is the pipeline's one output buffer: send it before the next
        call of :meth:`process`.
        """
        out = self._out
        out[:HEADER_SIZE] = data[:HEADER_SIZE]
        out[0] = _RESULT_VT
        out[5] = int(self.exponent[i]) & 0xFF
        self._out_values[:] = self.values[i]
        return self._multicast(self._out_view, dests, links)

    def _multicast(
        self, payload: memoryview, dests: tuple[Addr, ...], links: tuple[tuple[int, int], ...]
    ) -> Emit | None:
        """``payload`` to each of ``dests`` that the egress simulator lets through."""
        if self._framed:
            return Emit(payload, dests, links)
        drops = self.drops
        if drops.egress:
            keep = [not drops.drop_egress() for _ in dests]
            self.stats["drop_" + DropReason.SIM_EGRESS.value] += keep.count(False)
            links = tuple(x for x, k in zip(links, keep, strict=False) if k)
            dests = tuple(d for d, k in zip(dests, keep, strict=True) if k)
        if not dests:
            return None
        self.stats["results_sent"] += len(dests)
        return Emit(payload, dests, links)

    def _to_fallback(self, data: memoryview, job_id: int) -> Emit | None:
        """Pass a DATA packet on, unchanged, to the job's fallback aggregator (a
        collision in the shared region, or a slot past it); without a fallback entry it
        is dropped as a slot the switch does not hold."""
        fallback = self.sharing.fallback.get(job_id)
        if fallback is None:
            return self._drop(DropReason.BAD_SLOT)
        drops = self.drops
        if drops.egress and drops.drop_egress():
            return self._drop(DropReason.SIM_EGRESS)
        self.sharing.count(job_id, "to_fallback")
        return Emit(data, (fallback.addr,), ((fallback.port, fallback.mac),))

    def _from_fallback(self, data: memoryview, src: Addr, job_id: int, lanes: int) -> Emit | None:
        """A RESULT of the job's fallback aggregator: multicast it, unchanged, to the
        job's workers (the fallback sends every result to this switch)."""
        job = self._jobs.get(job_id)
        if job is None:
            return self._drop(DropReason.UNKNOWN_JOB)
        if src != self.sharing.fallback[job_id].addr:
            return self._drop(DropReason.BAD_SOURCE)
        if lanes != self.lanes:
            return self._drop(DropReason.BAD_LANES)
        if len(data) != self._size:
            return self._drop(DropReason.BAD_LENGTH)
        self.sharing.count(job_id, "from_fallback")
        return self._multicast(data, job.dests, job.links)

    def _drop(self, reason: DropReason) -> Emit | None:
        # Typed as process()'s result (always None) so `return self._drop(...)` type-checks.
        self.stats["drop_" + reason.value] += 1
        return None

    # ----------------------------------------------------------------- slot ranges
    def _range_free(self, base: int, count: int, ignore: int | None = None) -> bool:
        """Whether ``base..base+count-1`` lies in the pool, outside every reservation
        (``ignore``'s aside) and every shared region."""
        if base < 0 or base + count > self.slots:
            return False
        taken = [(j.slot_base, j.slot_count) for j in self._jobs.values() if j.job_id != ignore]
        return all(
            base + count <= lo or lo + n <= base for lo, n in (*taken, *self.sharing.regions())
        )

    def free_range(self, count: int) -> int:
        """The lowest pool slot where ``count`` slots are free (reservations and shared
        regions aside).

        Raises:
            JobTableError: no such range.
        """
        ends = [j.slot_base + j.slot_count for j in self._jobs.values()]
        for base in sorted([0, *ends, *(b + n for b, n in self.sharing.regions())]):
            if self._range_free(base, count):
                return base
        raise JobTableError(f"no free range of {count} slots")
