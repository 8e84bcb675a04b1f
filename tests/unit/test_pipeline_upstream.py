"""Hierarchical aggregation in the soft switch pipeline: the leaf's upstream table.

A leaf sends each completed slot of a job with an upstream entry to the upstream switch
as ONE DATA packet, stores the upstream's RESULT as the slot's final value and multicasts
it; retransmissions before the final value re-send the partial. The last tests run real
worker engines (``hostlib.ina``) on two leaves and a spine over a seeded, lossy,
duplicating and reordering virtual-time network: results stay bit-exact.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from helpers import WorkerState, assert_within_bound, expected, random_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

from emulation.softswitch.pipeline import (
    Addr,
    DropReason,
    Emit,
    JobConfig,
    JobTableError,
    Pipeline,
    Upstream,
)
from hostlib.ina import InaAllreduce, JobSpec, RetryPolicy
from hostlib.protocol import (
    EXPONENT_MIN,
    FLAG_RESEND,
    HEADER_SIZE,
    INA_UDP_PORT,
    Header,
    PacketType,
    pack_header,
    unpack_header,
)
from hostlib.transport.memory import LinkModel

LANES = 8
SLOTS = 64
JOB = 7
WORKERS: tuple[Addr, ...] = (("10.0.0.1", 5001), ("10.0.0.2", 5002))
SPINE: Addr = ("10.0.9.1", INA_UDP_PORT)
SPINE_MAC = 0x020000000009
UP_RANK = 3
UP_PORT = 9


def packet(
    rank: int,
    slot: int = 0,
    pool_set: int = 0,
    values: list[int] | np.ndarray | None = None,
    *,
    ptype: PacketType = PacketType.DATA,
    job: int = JOB,
    exp: int = 0,
    seq: int = 1,
    flags: int = 0,
    lanes: int = LANES,
) -> memoryview:
    vals = np.full(lanes, rank + 1) if values is None else np.asarray(values)
    header = Header(ptype, job, rank, slot, pool_set, seq, lanes, exp, flags)
    return memoryview(pack_header(header) + vals.astype(">i4").tobytes())


def result(values: list[int] | np.ndarray, **kwargs: int) -> memoryview:
    """The spine's RESULT for slot 0, set 0, seq 1 unless told otherwise."""
    return packet(0, values=values, ptype=PacketType.RESULT, **kwargs)


def decode(emit: Emit) -> tuple[Header, np.ndarray]:
    data = bytes(emit.payload)
    return unpack_header(data), np.frombuffer(data, dtype=">i4", offset=HEADER_SIZE)


@pytest.fixture
def leaf() -> Pipeline:
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(JOB, WORKERS, slot_count=4))
    p.set_upstream(JOB, UP_RANK, SPINE, SPINE_MAC, UP_PORT)
    return p


def complete(p: Pipeline, slot: int = 0, pool_set: int = 0, seq: int = 1) -> Emit:
    """Both workers contribute (values 1 and 2, exponents -5 and 4); the completion's Emit."""
    assert p.process(packet(0, slot, pool_set, [1] * LANES, exp=-5, seq=seq), WORKERS[0]) is None
    emit = p.process(packet(1, slot, pool_set, [2] * LANES, exp=4, seq=seq), WORKERS[1])
    assert emit is not None
    return emit


def moved(p: Pipeline, before: dict[str, int]) -> dict[str, int]:
    """Counters that changed since ``before``, by how much."""
    return {k: v - before[k] for k, v in p.counters().items() if v != before[k]}


# ----------------------------------------------------------------- the leaf
def test_a_completed_slot_goes_up_as_one_data_packet(leaf: Pipeline) -> None:
    emit = complete(leaf, slot=2, pool_set=1, seq=9)
    header, values = decode(emit)
    assert (header.ptype, header.job_id, header.rank) == (PacketType.DATA, JOB, UP_RANK)
    assert (header.slot, header.pool_set, header.seq, header.exponent) == (2, 1, 9, 4)
    np.testing.assert_array_equal(values, [3] * LANES)
    assert (list(emit.dests), list(emit.links)) == ([SPINE], [(UP_PORT, SPINE_MAC)])
    c = leaf.counters()
    assert (c["completed"], c["sent_upstream"], c["results_sent"]) == (1, 1, 0)
    assert leaf.final[1 * SLOTS + 2] == 0


def test_the_upstream_result_is_stored_and_multicast(leaf: Pipeline) -> None:
    complete(leaf)
    before = leaf.counters()
    emit = leaf.process(result([10] * LANES, exp=6, flags=FLAG_RESEND), SPINE)
    assert emit is not None
    header, values = decode(emit)
    assert (header.ptype, header.seq, header.exponent) == (PacketType.RESULT, 1, 6)
    np.testing.assert_array_equal(values, [10] * LANES)
    assert list(emit.dests) == list(WORKERS)
    st = leaf.read_slot(JOB, 0, 0)
    assert (st.counter, st.exponent, st.bitmap) == (0, 6, 0b11)  # bitmaps untouched
    np.testing.assert_array_equal(st.values, [10] * LANES)
    assert leaf.final[0] == 1
    assert moved(leaf, before) == {"received": 1, "results_from_upstream": 1, "results_sent": 2}


def test_another_copy_of_the_upstream_result_is_ignored(leaf: Pipeline) -> None:
    complete(leaf)
    assert leaf.process(result([10] * LANES, exp=6), SPINE) is not None
    before = leaf.counters()
    assert leaf.process(result([99] * LANES, exp=1), SPINE) is None
    assert moved(leaf, before) == {"received": 1, "duplicates_ignored": 1}
    st = leaf.read_slot(JOB, 0, 0)
    assert st.exponent == 6
    np.testing.assert_array_equal(st.values, [10] * LANES)


def test_a_retransmission_before_the_final_value_resends_the_partial(leaf: Pipeline) -> None:
    complete(leaf)
    before = leaf.counters()
    emit = leaf.process(packet(1, values=[77] * LANES, flags=FLAG_RESEND), WORKERS[1])
    assert emit is not None
    header, values = decode(emit)
    assert (header.ptype, header.rank, header.exponent, header.seq) == (
        PacketType.DATA,
        UP_RANK,
        4,
        1,
    )
    np.testing.assert_array_equal(values, [3] * LANES)  # the stored partial, not the copy
    assert list(emit.dests) == [SPINE]
    assert moved(leaf, before) == {"received": 1, "upstream_resent": 1, "sent_upstream": 1}


def test_a_retransmission_after_the_final_value_is_answered_by_unicast(leaf: Pipeline) -> None:
    complete(leaf)
    assert leaf.process(result([10] * LANES), SPINE) is not None
    before = leaf.counters()
    emit = leaf.process(packet(0, flags=FLAG_RESEND), WORKERS[0])
    assert emit is not None
    header, values = decode(emit)
    assert header.ptype == PacketType.RESULT and list(emit.dests) == [WORKERS[0]]
    np.testing.assert_array_equal(values, [10] * LANES)
    assert moved(leaf, before) == {"received": 1, "retransmits_answered": 1, "results_sent": 1}


def test_a_new_use_clears_final(leaf: Pipeline) -> None:
    complete(leaf, seq=1)
    leaf.process(result([10] * LANES, seq=1), SPINE)
    assert leaf.final[0] == 1
    complete(leaf, pool_set=1, seq=2)  # the next use, in the other set, clears the bits
    # The use after next of the same slot and set (seq 3): its first contribution.
    assert leaf.process(packet(0, seq=3), WORKERS[0]) is None
    assert leaf.final[0] == 0
    leaf.process(packet(1, seq=3), WORKERS[1])
    emit = leaf.process(packet(1, seq=3, flags=FLAG_RESEND), WORKERS[1])
    assert emit is not None and decode(emit)[0].ptype == PacketType.DATA


@pytest.mark.parametrize(
    ("make", "src", "reason"),
    [
        (lambda: result([5] * LANES, job=8), SPINE, DropReason.MALFORMED),  # no upstream
        (lambda: result([5] * LANES), WORKERS[0], DropReason.BAD_SOURCE),
        (lambda: result([5] * LANES), (SPINE[0], 5000), DropReason.BAD_SOURCE),
        (lambda: result([5] * LANES, slot=4), SPINE, DropReason.BAD_SLOT),
        (lambda: result([5] * 4, lanes=4), SPINE, DropReason.BAD_LANES),
        (lambda: memoryview(bytes(result([5] * LANES))[:-4]), SPINE, DropReason.BAD_LENGTH),
        (lambda: result([5] * LANES, seq=2), SPINE, DropReason.STALE),  # another use
        (lambda: result([5] * LANES, seq=0, slot=3), SPINE, DropReason.STALE),  # unused slot
        (lambda: result([5] * LANES, slot=1), SPINE, DropReason.STALE),  # its use runs
        (lambda: result([5] * LANES, pool_set=1), SPINE, DropReason.STALE),  # other set
    ],
)
def test_bad_results_are_dropped_and_change_nothing(
    leaf: Pipeline, make: Callable[[], memoryview], src: Addr, reason: DropReason
) -> None:
    leaf.add_job(JobConfig(8, (("10.0.0.8", 5008),), slot_count=1))
    complete(leaf)
    leaf.process(packet(0, slot=1), WORKERS[0])  # slot 1: a use in progress
    arrays = (leaf.values, leaf.exponent, leaf.counter, leaf.seq, leaf.bitmap, leaf.final)
    registers = [a.copy() for a in arrays]
    before = leaf.counters()
    assert leaf.process(make(), src) is None
    assert moved(leaf, before) == {"received": 1, f"drop_{reason.value}": 1}
    for old, new in zip(registers, arrays, strict=True):
        np.testing.assert_array_equal(old, new)


def test_a_result_is_malformed_on_a_switch_without_upstream_entries() -> None:
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(JOB, WORKERS, slot_count=4))
    complete(p)
    assert p.process(result([5] * LANES), SPINE) is None
    assert p.counters()["drop_malformed"] == 1


def test_egress_loss_drops_the_partial_and_a_retransmission_recovers_it(leaf: Pipeline) -> None:
    leaf.drops.egress = 1.0
    assert leaf.process(packet(0), WORKERS[0]) is None
    assert leaf.process(packet(1), WORKERS[1]) is None
    c = leaf.counters()
    assert (c["completed"], c["sent_upstream"], c["drop_sim_egress"]) == (1, 0, 1)
    leaf.drops.egress = 0.0
    emit = leaf.process(packet(1, flags=FLAG_RESEND), WORKERS[1])
    assert emit is not None and list(emit.dests) == [SPINE]


def test_a_one_worker_leaf_sends_every_packet_up() -> None:
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(JOB, WORKERS[:1], slot_count=2))
    p.set_upstream(JOB, 0, SPINE)
    emit = p.process(packet(0, values=list(range(LANES)), exp=-7), WORKERS[0])
    assert emit is not None
    header, values = decode(emit)
    assert (header.ptype, header.exponent) == (PacketType.DATA, -7)
    np.testing.assert_array_equal(values, np.arange(LANES))
    assert list(emit.links) == [(0, 0)]


# ----------------------------------------------------------------- the table
def test_upstream_table_entries_come_and_go(leaf: Pipeline) -> None:
    assert leaf.upstream(JOB) == Upstream(UP_RANK, SPINE, SPINE_MAC, UP_PORT)
    leaf.set_upstream(JOB, 1, ("10.0.9.2", 7), 0, 2)  # modify
    assert leaf.upstream(JOB) == Upstream(1, ("10.0.9.2", 7), 0, 2)
    leaf.delete_upstream(JOB)
    assert leaf.upstream(JOB) is None
    emit = complete(leaf)  # back to a flat job: multicast to the workers
    assert decode(emit)[0].ptype == PacketType.RESULT and list(emit.dests) == list(WORKERS)
    with pytest.raises(JobTableError, match="no upstream entry"):
        leaf.delete_upstream(JOB)
    for bad in ((JOB, 256, SPINE, 0, 0), (JOB, 0, SPINE, 1 << 48, 0), (JOB, 0, SPINE, 0, 512)):
        with pytest.raises(JobTableError, match="out of range"):
            leaf.set_upstream(*bad)
    with pytest.raises(JobTableError, match="job id"):
        leaf.set_upstream(1 << 16, 0, SPINE)


def test_remove_job_and_reset_drop_the_upstream_entry(leaf: Pipeline) -> None:
    complete(leaf)
    leaf.process(result([1] * LANES), SPINE)
    leaf.remove_job(JOB)
    assert leaf.upstream(JOB) is None and not leaf.final.any()
    leaf.set_upstream(5, 0, SPINE)  # before its job: the tables are independent
    leaf.reset()
    assert leaf.upstream(5) is None


# ----------------------------------------------------------------- two levels, real engines
@dataclass(order=True)
class _Event:
    time: float
    order: int
    dest: Addr = field(compare=False)
    src: Addr = field(compare=False)
    data: bytes = field(compare=False)


class Fabric:
    """A spine, two leaves (two workers each) and one worker on the spine itself, in
    virtual time; every link traversal may lose, duplicate and reorder (seeded)."""

    LEAVES: tuple[Addr, ...] = (("10.1.1.254", INA_UDP_PORT), ("10.1.2.254", INA_UDP_PORT))
    SPINE: Addr = ("10.1.0.254", INA_UDP_PORT)

    def __init__(self, link: LinkModel, seed: int, lanes: int = LANES, slots: int = 4) -> None:
        self.link, self.random = link, random.Random(seed)
        self.now, self.order = 0.0, 0
        self.events: list[_Event] = []
        self.switches = {a: Pipeline(lanes, slots=32) for a in (self.SPINE, *self.LEAVES)}
        # worker address -> (its switch, its state across calls)
        self.workers: dict[Addr, tuple[Addr, WorkerState]] = {}
        total = 2 * len(self.LEAVES) + 1
        spine_members = list(self.LEAVES)
        for leaf_rank, leaf in enumerate(self.LEAVES):
            local = tuple((f"10.1.{leaf_rank + 1}.{r + 1}", 6000 + r) for r in range(2))
            self.switches[leaf].add_job(JobConfig(JOB, local, slots))
            self.switches[leaf].set_upstream(JOB, leaf_rank, self.SPINE)
            for r, addr in enumerate(local):
                spec = JobSpec(JOB, r, total, leaf, lanes, slots)
                self.workers[addr] = (leaf, WorkerState(spec, RetryPolicy()))
        direct: Addr = ("10.1.0.1", 6000)
        spine_members.append(direct)
        self.switches[self.SPINE].add_job(JobConfig(JOB, tuple(spine_members), slots))
        spec = JobSpec(JOB, len(self.LEAVES), total, self.SPINE, lanes, slots)
        self.workers[direct] = (self.SPINE, WorkerState(spec, RetryPolicy()))

    def allreduce(self, inputs: np.ndarray) -> list[np.ndarray]:
        """One call of every worker (``inputs``: one row each, in ``workers`` order)."""
        engines = {
            a: state.engine(x)
            for (a, (_, state)), x in zip(self.workers.items(), inputs, strict=True)
        }
        for addr, engine in engines.items():
            for data in engine.start(self.now):
                self._send(addr, self.workers[addr][0], data)
        live = dict(engines)
        while live:
            wake = min(e.next_wakeup() for e in live.values())
            if self.events and self.events[0].time <= wake:
                event = heapq.heappop(self.events)
                self.now = max(self.now, event.time)
                self._deliver(event, engines)
            else:
                self.now = max(self.now, wake)
            for addr, engine in list(live.items()):
                for data in engine.on_timer(self.now):  # raises InaTimeoutError: a failure
                    self._send(addr, self.workers[addr][0], data)
                if engine.done:
                    del live[addr]
        return [self.workers[a][1].finish(e) for a, e in engines.items()]

    def _deliver(self, event: _Event, engines: dict[Addr, InaAllreduce]) -> None:
        switch = self.switches.get(event.dest)
        if switch is None:
            data = engines[event.dest].on_datagram(memoryview(event.data), self.now)
            if data is not None:
                self._send(event.dest, self.workers[event.dest][0], data)
            return
        emit = switch.process(memoryview(event.data), event.src)
        if emit is not None:
            payload = bytes(emit.payload)  # the pipeline reuses its output buffer
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

    def counters(self, addr: Addr) -> dict[str, int]:
        return self.switches[addr].counters()


def test_two_levels_on_a_perfect_network_count_every_packet_once() -> None:
    fabric = Fabric(LinkModel(), seed=1)
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, np.int32, 5, 10 * LANES)
    for got in fabric.allreduce(inputs):
        np.testing.assert_array_equal(got, expected(inputs, LANES))
    for leaf in Fabric.LEAVES:
        c = fabric.counters(leaf)
        assert c["completed"] == c["sent_upstream"] == c["results_from_upstream"] == 10
        assert c["results_sent"] == 20 and c["upstream_resent"] == 0
    spine = fabric.counters(Fabric.SPINE)
    assert (spine["completed"], spine["aggregated"], spine["results_sent"]) == (10, 30, 30)
    assert all(v == 0 for k, v in spine.items() if k.startswith("drop_"))


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_two_levels_stay_exact_under_loss_duplication_and_reordering(
    dtype: type, seed: int
) -> None:
    link = LinkModel(loss=0.1, duplicate=0.05, reorder=0.2)
    fabric = Fabric(link, seed=seed)
    rng = np.random.default_rng(seed)
    for size in (1, 7 * LANES + 3, 3 * LANES):  # consecutive calls reuse slots and sets
        inputs = random_inputs(rng, dtype, 5, size)
        want = expected(inputs, LANES)
        for got in fabric.allreduce(inputs):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        if dtype is np.float32:
            assert_within_bound(want, inputs, LANES)
    for addr in (*Fabric.LEAVES, Fabric.SPINE):
        c = fabric.counters(addr)
        for reason in ("malformed", "bad_source", "bad_rank", "bad_slot", "unknown_job"):
            assert c[f"drop_{reason}"] == 0, (addr, reason)
    leaves = [fabric.counters(a) for a in Fabric.LEAVES]
    assert sum(c["upstream_resent"] for c in leaves) > 0  # loss was repaired through it
    assert fabric.counters(Fabric.SPINE)["retransmits_answered"] > 0


def test_exponents_reach_the_spine_as_the_leaves_maxima() -> None:
    fabric = Fabric(LinkModel(), seed=2)
    inputs = np.zeros((5, LANES), dtype=np.float32)
    inputs[1, 0] = 2.0**10  # a worker of the first leaf holds the largest value
    inputs[4, 1] = -(2.0**-3)  # the spine's own worker
    results = fabric.allreduce(inputs)
    for got in results:
        np.testing.assert_array_equal(got, expected(inputs, LANES))
    second_leaf = fabric.switches[Fabric.LEAVES[1]]
    assert second_leaf.read_slot(JOB, 0, 0).exponent == 10  # the spine's max, stored
    assert fabric.switches[Fabric.LEAVES[1]].read_slot(JOB, 0, 1).exponent == EXPONENT_MIN


# ----------------------------------------------------------------- hostile RESULTs
FUZZ = settings(max_examples=600, deadline=None, derandomize=True, database=None)
STRANGER: Addr = ("10.0.0.66", 5066)
result_sources = st.sampled_from([SPINE, SPINE, (SPINE[0], 5000), WORKERS[0], STRANGER])
result_jobs = st.sampled_from([JOB, JOB, JOB, 8, 99])  # 8: no upstream; 99: no job
result_lanes = st.sampled_from([LANES, LANES, LANES, LANES - 1])
length_changes = st.sampled_from([0, 0, 0, -1, 4])


def fuzz_leaf() -> Pipeline:
    """Slot 0 finished (final 0), 1 finished and final, 2 running, 3 unused; set 0."""
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(JOB, WORKERS, slot_count=4))
    p.add_job(JobConfig(8, (("10.0.0.8", 5008),), slot_count=1))
    p.set_upstream(JOB, UP_RANK, SPINE)
    p.set_upstream(99, 0, SPINE)
    complete(p, slot=0, seq=1)
    complete(p, slot=1, seq=2)
    p.process(result([4] * LANES, slot=1, seq=2), SPINE)
    p.process(packet(0, slot=2, seq=3), WORKERS[0])
    return p


@FUZZ
@given(
    src=result_sources,
    job=result_jobs,
    slot=st.integers(0, 5),
    pool_set=st.integers(0, 1),
    seq=st.integers(0, 4),
    lanes=result_lanes,
    change=length_changes,
    exp=st.integers(-128, 127),
)
@pytest.mark.slow
def test_hostile_results_change_only_the_slot_they_finish(
    src: Addr, job: int, slot: int, pool_set: int, seq: int, lanes: int, change: int, exp: int
) -> None:
    p = fuzz_leaf()
    data = bytes(result(list(range(lanes)), job=job, slot=slot, pool_set=pool_set, seq=seq,
                        exp=exp, lanes=lanes))  # fmt: skip
    data = data[:change] if change < 0 else data + bytes(change)
    i = pool_set * SLOTS + slot
    valid = src == SPINE and job == JOB and slot < 4 and lanes == LANES and change == 0
    takes = valid and seq != 0 and seq == p.seq[i] and p.counter[i] == 0
    arrays = (p.values, p.exponent, p.counter, p.seq, p.bitmap, p.final)
    before, counts = [a.copy() for a in arrays], p.counters()
    emit = p.process(memoryview(data), src)  # never raises
    moved = {k: v - counts[k] for k, v in p.counters().items() if v != counts[k]}
    moved.pop("received")
    if takes and not before[5][i]:
        assert emit is not None and list(emit.dests) == list(WORKERS)
        assert moved == {"results_from_upstream": 1, "results_sent": 2}
        assert (p.final[i], p.exponent[i]) == (1, exp)
        np.testing.assert_array_equal(p.values[i], np.arange(LANES))
        for old, new in zip(before, arrays, strict=True):
            if old.ndim == 2 and old.shape[0] == 2 * SLOTS:  # values: other rows unchanged
                old, new = np.delete(old, i, 0), np.delete(new, i, 0)
            elif old.shape == (2 * SLOTS,):
                old, new = np.delete(old, i), np.delete(new, i)
            np.testing.assert_array_equal(old, new)
        return
    assert emit is None
    assert len(moved) == 1, moved
    (name,) = moved
    assert name == "duplicates_ignored" if takes else name.startswith("drop_"), moved
    for old, new in zip(before, arrays, strict=True):
        np.testing.assert_array_equal(old, new)
