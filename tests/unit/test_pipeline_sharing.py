"""The shared region and the fallback aggregator in the soft switch pipeline (#41).

First the tables and the per-packet steps (take, collide, pass on, relay, release); then
real worker engines (``hostlib.ina``) of two jobs at once on one switch with a shared
region smaller than their windows and a fallback aggregator behind it, over a seeded,
lossy, duplicating and reordering virtual-time network: every result stays bit-exact,
also when the job holding the region leaves in the middle of the other's call.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from helpers import WorkerState, expected, random_inputs

from emulation.softswitch.fallback import install_behind
from emulation.softswitch.pipeline import Addr, Emit, JobConfig, JobTableError, Pipeline
from emulation.softswitch.sharing import Fallback, SharedEntry, owner_key
from hostlib.ina import InaAllreduce, JobSpec, RetryPolicy
from hostlib.protocol import HEADER_SIZE, INA_UDP_PORT, Header, PacketType, pack_header
from hostlib.transport.memory import LinkModel

LANES = 8
SLOTS = 64
REGION = SharedEntry(count=4, base=32, size=4, stats=1)
A, B = 7, 8
WORKERS_A: tuple[Addr, ...] = (("10.0.0.1", 5001), ("10.0.0.2", 5002))
WORKERS_B: tuple[Addr, ...] = (("10.0.1.1", 5001), ("10.0.1.2", 5002))
FALLBACK: Addr = ("10.0.9.9", INA_UDP_PORT)
FALLBACK_MAC = 0x020000000909


def packet(
    rank: int, slot: int, *, job: int = A, seq: int = 1, pool_set: int = 0,
    ptype: PacketType = PacketType.DATA, value: int | None = None,
) -> memoryview:  # fmt: skip
    header = Header(ptype, job, rank, slot, pool_set, seq, LANES)
    values = np.full(LANES, rank + 1 if value is None else value, dtype=">i4")
    return memoryview(pack_header(header) + values.tobytes())


def lanes_of(emit: Emit) -> np.ndarray:
    return np.frombuffer(bytes(emit.payload), dtype=">i4", offset=HEADER_SIZE)


@pytest.fixture
def switch() -> Pipeline:
    """Jobs A and B, one reserved slot each, both shared over the same 4-slot region
    (B's offset 2), and a fallback for B only."""
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(A, WORKERS_A, slot_count=1))
    p.add_job(JobConfig(B, WORKERS_B, slot_count=1))
    p.set_shared(A, REGION)
    p.set_shared(B, SharedEntry(count=4, base=32, size=4, offset=2, stats=2))
    p.set_fallback(B, Fallback(FALLBACK, FALLBACK_MAC, 5, stats=2))
    return p


def finish(
    p: Pipeline, workers: tuple[Addr, ...], slot: int, job: int = A, seq: int = 1
) -> Emit | None:
    p.process(packet(0, slot, job=job, seq=seq), workers[0])
    return p.process(packet(1, slot, job=job, seq=seq), workers[1])


# ----------------------------------------------------------------- per packet
def test_a_shared_slot_is_taken_aggregated_and_multicast(switch: Pipeline) -> None:
    emit = finish(switch, WORKERS_A, 1)  # A's first shared slot: region slot 0 (pool 32)
    assert emit is not None and set(emit.dests) == set(WORKERS_A)
    np.testing.assert_array_equal(lanes_of(emit), np.full(LANES, 3))
    assert switch.sharing.owner[32] == owner_key(A, 1)
    assert switch.job_counters(A) == {
        "shared_uses": 1, "collisions": 0, "to_fallback": 0, "from_fallback": 0,
    }  # fmt: skip
    assert switch.counters()["completed"] == 1


def test_a_collision_passes_the_packet_on_unchanged_and_touches_nothing(
    switch: Pipeline,
) -> None:
    switch.process(packet(0, 3, seq=5), WORKERS_A[0])  # A slot 3 -> region 2 (pool 34), running
    data = packet(1, 1, job=B, seq=9)  # B slot 1 -> offset 2 -> pool 34: held by A's slot 3
    emit = switch.process(data, WORKERS_B[1])
    assert emit is not None and bytes(emit.payload) == bytes(data)
    assert list(emit.dests) == [FALLBACK] and list(emit.links) == [(5, FALLBACK_MAC)]
    assert switch.sharing.owner[34] == owner_key(A, 3)
    i = 34  # set 0
    assert (switch.seq[i], switch.counter[i], switch.bitmap[0, 34]) == (5, 1, 1)
    assert switch.job_counters(B)["collisions"] == switch.job_counters(B)["to_fallback"] == 1
    assert switch.job_counters(A)["collisions"] == 0


def test_a_collision_without_a_fallback_is_dropped_as_a_slot_the_switch_lacks(
    switch: Pipeline,
) -> None:
    switch.process(packet(0, 1, job=B), WORKERS_B[0])  # B slot 1 takes pool 34
    assert switch.process(packet(0, 3), WORKERS_A[0]) is None  # A slot 3 -> pool 34
    assert switch.job_counters(A)["collisions"] == 1
    assert switch.counters()["drop_bad_slot"] == 1


def test_slots_past_the_shared_count_go_to_the_fallback(switch: Pipeline) -> None:
    emit = switch.process(packet(0, 5, job=B), WORKERS_B[0])  # 1 reserved + 4 shared
    assert emit is not None and list(emit.dests) == [FALLBACK]
    assert switch.job_counters(B)["to_fallback"] == 1
    assert switch.job_counters(B)["collisions"] == 0
    assert switch.process(packet(0, 5), WORKERS_A[0]) is None  # A has no fallback
    assert switch.counters()["drop_bad_slot"] == 1


def test_the_fallbacks_results_are_multicast_and_only_from_it(switch: Pipeline) -> None:
    result = packet(0, 1, job=B, ptype=PacketType.RESULT, value=42)
    emit = switch.process(result, FALLBACK)
    assert emit is not None and set(emit.dests) == set(WORKERS_B)
    assert bytes(emit.payload) == bytes(result)
    assert switch.job_counters(B)["from_fallback"] == 1
    assert switch.process(result, WORKERS_B[0]) is None
    assert switch.process(packet(0, 1, ptype=PacketType.RESULT), FALLBACK) is None  # A: none
    drops = {k: v for k, v in switch.counters().items() if k.startswith("drop_") and v}
    assert drops == {"drop_bad_source": 1, "drop_malformed": 1}


def test_forged_packets_of_another_job_change_nothing(switch: Pipeline) -> None:
    before = switch.sharing.owner.copy()
    assert switch.process(packet(0, 1, job=A), WORKERS_B[0]) is None  # B's host, A's id
    assert switch.process(packet(0, 1, job=B), WORKERS_A[0]) is None
    np.testing.assert_array_equal(switch.sharing.owner, before)
    assert switch.counters()["drop_bad_source"] == 2


def test_removing_a_job_frees_and_clears_its_shared_slots(switch: Pipeline) -> None:
    finish(switch, WORKERS_A, 3, seq=1000)  # A slot 3 holds pool 34, seq 1000
    switch.remove_job(A)
    assert not switch.sharing.owner[34] and switch.seq[34] == 0
    # B's slot 1 takes pool 34 and its first use starts at seq 1: nothing of A's is left.
    emit = finish(switch, WORKERS_B, 1, job=B, seq=1)
    assert emit is not None and set(emit.dests) == set(WORKERS_B)
    assert switch.sharing.owner[34] == owner_key(B, 1)
    assert switch.job_counters(A) == dict.fromkeys(switch.job_counters(B), 0)  # forgotten


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (SharedEntry(count=4, base=32, size=3), "power of two"),
        (SharedEntry(count=4, base=62, size=4), "outside the pool"),
        (SharedEntry(count=4, base=32, size=4, offset=4), "offset"),
        (SharedEntry(count=0, base=32, size=4), "shared slots"),
        (SharedEntry(count=4, base=0, size=4), "overlaps job"),
    ],
)
def test_bad_shared_entries_are_refused(switch: Pipeline, entry: SharedEntry, match: str) -> None:
    with pytest.raises(JobTableError, match=match):
        switch.set_shared(A, entry)


def test_a_reservation_may_not_take_a_shared_region(switch: Pipeline) -> None:
    with pytest.raises(JobTableError, match="not free"):
        switch.add_job(JobConfig(9, (("10.0.2.1", 1),), slot_count=4, slot_base=30))
    assert switch.add_job(JobConfig(9, (("10.0.2.1", 1),), slot_count=30)) == 2  # up to 32
    assert switch.add_job(JobConfig(10, (("10.0.2.2", 1),), slot_count=20)) == 36


def test_a_data_plane_without_sharing_refuses_its_tables() -> None:
    class Plain(Pipeline):
        SHARING = False

    p = Plain(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(A, WORKERS_A, slot_count=1))
    with pytest.raises(JobTableError, match="no shared region"):
        p.set_shared(A, REGION)
    with pytest.raises(JobTableError, match="no shared region"):
        p.set_fallback(A, Fallback(FALLBACK))


# ----------------------------------------------------------------- two jobs, real engines
@dataclass(order=True)
class _Event:
    time: float
    order: int
    dest: Addr = field(compare=False)
    src: Addr = field(compare=False)
    data: bytes = field(compare=False)


class Fabric:
    """A switch with a 4-slot shared region, a fallback aggregator behind it, and two
    jobs of three workers with windows of 8 slots: A reserves 2, B none; both share the
    region (at offsets 0 and 1) and have the fallback. Every link traversal may lose,
    duplicate and reorder (seeded)."""

    SWITCH: Addr = ("10.1.0.254", INA_UDP_PORT)
    FALLBACK: Addr = ("10.1.0.253", INA_UDP_PORT)
    WINDOW = 8

    def __init__(self, link: LinkModel, seed: int) -> None:
        self.link, self.random = link, random.Random(seed)
        self.now, self.order = 0.0, 0
        self.events: list[_Event] = []
        self.switch = Pipeline(LANES, slots=SLOTS)
        self.fallback = Pipeline(LANES, slots=SLOTS)
        self.switches = {self.SWITCH: self.switch, self.FALLBACK: self.fallback}
        self.workers: dict[int, dict[Addr, WorkerState]] = {}
        for cell, (job, offset, reserved) in enumerate(((A, 0, 2), (B, 1, 0))):
            local = tuple((f"10.1.{job}.{r + 1}", 6000) for r in range(3))
            self.switch.add_job(JobConfig(job, local, reserved))
            count = self.WINDOW - reserved
            shared = SharedEntry(count, base=16, size=4, offset=offset, stats=cell)
            self.switch.set_shared(job, shared)
            self.switch.set_fallback(job, Fallback(self.FALLBACK, stats=cell))
            install_behind(self.fallback, job, 3, self.WINDOW, self.SWITCH)
            self.workers[job] = {
                addr: WorkerState(JobSpec(job, r, 3, self.SWITCH, LANES, self.WINDOW),
                                  RetryPolicy())
                for r, addr in enumerate(local)
            }  # fmt: skip
        self.leave: tuple[float, int] | None = None  # (time, job) the switch removes a job

    def allreduce(self, inputs: dict[int, np.ndarray]) -> dict[int, list[np.ndarray]]:
        """One call of every worker of each job in ``inputs`` (one row a worker), at once."""
        engines = {
            addr: (job, state.engine(row))
            for job, rows in inputs.items()
            for (addr, state), row in zip(self.workers[job].items(), rows, strict=True)
        }
        for addr, (_, engine) in engines.items():
            for data in engine.start(self.now):
                self._send(addr, self.SWITCH, data)
        live = dict(engines)
        while live:
            wake = min(e.next_wakeup() for _, e in live.values())
            if self.leave is not None and self.leave[0] <= min(wake, self._next_event()):
                self.switch.remove_job(self.leave[1])
                self.leave = None
            elif self.events and self.events[0].time <= wake:
                event = heapq.heappop(self.events)
                self.now = max(self.now, event.time)
                self._deliver(event, engines)
            else:
                self.now = max(self.now, wake)
            for addr, (_, engine) in list(live.items()):
                for data in engine.on_timer(self.now):  # raises InaTimeoutError: a failure
                    self._send(addr, self.SWITCH, data)
                if engine.done:
                    del live[addr]
        out: dict[int, list[np.ndarray]] = {job: [] for job in inputs}
        for addr, (job, engine) in engines.items():
            out[job].append(self.workers[job][addr].finish(engine))
        return out

    def _next_event(self) -> float:
        return self.events[0].time if self.events else float("inf")

    def _deliver(self, event: _Event, engines: dict[Addr, tuple[int, InaAllreduce]]) -> None:
        switch = self.switches.get(event.dest)
        if switch is None:
            if event.dest not in engines:
                return  # a worker of a job not in this call
            data = engines[event.dest][1].on_datagram(memoryview(event.data), self.now)
            if data is not None:
                self._send(event.dest, self.SWITCH, data)
            return
        emit = switch.process(memoryview(event.data), event.src)
        if emit is not None:
            payload = bytes(emit.payload)  # the pipeline reuses its buffers
            for dest in emit.dests:
                self._send(event.dest, dest, payload)

    def _send(self, src: Addr, dest: Addr, data: bytes | memoryview) -> None:
        link, rnd = self.link, self.random.random
        for _ in range(2 if rnd() < link.duplicate else 1):
            if rnd() < link.loss:
                continue
            delay = link.latency + (rnd() * link.reorder_delay if rnd() < link.reorder else 0)
            self.order += 1
            heapq.heappush(
                self.events, _Event(self.now + delay, self.order, dest, src, bytes(data))
            )


def check(fabric: Fabric, rng: np.random.Generator, sizes: tuple[int, ...]) -> None:
    for size in sizes:  # consecutive calls reuse slots, sets and shared slots
        inputs = {job: random_inputs(rng, np.int32, 3, size) for job in (A, B)}
        results = fabric.allreduce(inputs)
        for job, rows in inputs.items():
            want = expected(rows, LANES)
            for got in results[job]:
                np.testing.assert_array_equal(got, want)


def test_two_jobs_share_the_region_and_the_fallback_completes_the_rest() -> None:
    fabric = Fabric(LinkModel(), seed=1)
    check(fabric, np.random.default_rng(1), (20 * LANES, 3 * LANES + 1))
    for job in (A, B):
        counters = fabric.switch.job_counters(job)
        assert counters["to_fallback"] > 0 and counters["from_fallback"] > 0, (job, counters)
    assert fabric.switch.job_counters(A)["shared_uses"] > 0
    assert sum(fabric.switch.job_counters(j)["collisions"] for j in (A, B)) > 0
    for p in fabric.switches.values():
        assert all(v == 0 for k, v in p.counters().items() if k.startswith("drop_"))


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_two_jobs_stay_exact_under_loss_duplication_and_reordering(seed: int) -> None:
    fabric = Fabric(LinkModel(loss=0.08, duplicate=0.05, reorder=0.2), seed=seed)
    check(fabric, np.random.default_rng(seed), (1, 13 * LANES + 3, 4 * LANES))
    answered = sum(p.counters()["retransmits_answered"] for p in fabric.switches.values())
    assert answered > 0  # loss was repaired, on either path
    assert fabric.fallback.counters()["completed"] > 0


@pytest.mark.parametrize("seed", [6, 7])
def test_the_holder_leaving_mid_call_moves_the_other_job_onto_the_switch_exactly(
    seed: int,
) -> None:
    fabric = Fabric(LinkModel(loss=0.05, duplicate=0.05, reorder=0.2), seed=seed)
    rng = np.random.default_rng(seed)
    check(fabric, rng, (12 * LANES,))
    before = fabric.switch.job_counters(B)["shared_uses"]
    fabric.workers.pop(A)  # A's workers stop; the switch removes A while B's call runs
    fabric.leave = (fabric.now + 2e-4, A)
    for size in (30 * LANES, 9 * LANES):
        inputs = random_inputs(rng, np.int32, 3, size)
        for got in fabric.allreduce({B: inputs})[B]:
            np.testing.assert_array_equal(got, expected(inputs, LANES))
    assert fabric.leave is None
    assert not ((fabric.switch.sharing.owner >> 16) == A).any()
    assert fabric.switch.job_counters(B)["shared_uses"] > before
