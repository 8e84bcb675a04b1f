"""The soft switch pipeline: per-slot aggregation, retransmission, drops, the job table."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from emulation.softswitch.pipeline import (
    Addr,
    DropReason,
    DropSimulator,
    Emit,
    JobConfig,
    JobTableError,
    Pipeline,
)
from hostlib.protocol import (
    EXPONENT_MIN,
    HEADER_SIZE,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    Header,
    PacketType,
    pack_header,
    unpack_header,
)

LANES = 8
SLOTS = 64
JOB = 7
WORKERS: tuple[Addr, ...] = (("10.0.0.1", 5001), ("10.0.0.2", 5002), ("10.0.0.3", 5003))
STRANGER: Addr = ("10.0.0.9", 5009)

Registers = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def packet(
    rank: int,
    slot: int,
    pool_set: int = 0,
    values: list[int] | np.ndarray | None = None,
    *,
    job: int = JOB,
    exp: int = 0,
    lanes: int = LANES,
    seq: int = 1,
) -> memoryview:
    """A DATA packet; values default to ``rank + 1`` in every lane.

    ``seq`` numbers the slot's use: hosts count from 1 (0 marks an unused slot), and a
    slot's next use carries a larger number.
    """
    vals = np.full(lanes, rank + 1) if values is None else np.asarray(values)
    header = pack_header(Header(PacketType.DATA, job, rank, slot, pool_set, seq, lanes, exp))
    return memoryview(header + vals.astype(">i4").tobytes())


def decode(emit: Emit) -> tuple[Header, np.ndarray]:
    data = bytes(emit.payload)
    return unpack_header(data), np.frombuffer(data, dtype=">i4", offset=HEADER_SIZE)


def registers(p: Pipeline) -> Registers:
    return p.bitmap.copy(), p.counter.copy(), p.exponent.copy(), p.values.copy()


def assert_registers_equal(a: Registers, b: Registers) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def only_counter(p: Pipeline, name: str, value: int = 1) -> None:
    """Exactly one packet was received and it moved only counter ``name``."""
    expected = {k: 0 for k in p.counters()}
    expected.update({"received": 1, name: value})
    assert p.counters() == expected


@pytest.fixture
def pipe() -> Pipeline:
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.add_job(JobConfig(JOB, WORKERS, slot_count=8))
    return p


def contribute_all(
    p: Pipeline, slot: int, pool_set: int, values: list[np.ndarray], seq: int = 1
) -> Emit:
    """Every worker contributes once to use ``seq``; return the completion's Emit."""
    emits = [
        p.process(packet(r, slot, pool_set, v, seq=seq), WORKERS[r]) for r, v in enumerate(values)
    ]
    assert emits[:-1] == [None] * (len(values) - 1)
    assert emits[-1] is not None
    return emits[-1]


# ----------------------------------------------------------------- aggregation
def test_first_contribution_writes_later_ones_add(pipe: Pipeline) -> None:
    pipe.values[:] = 12345  # stale garbage: the first packet must overwrite, not add
    assert pipe.process(packet(0, 3, values=list(range(LANES)), exp=2), WORKERS[0]) is None
    st = pipe.read_slot(JOB, 3, 0)
    assert (st.bitmap, st.other_bitmap, st.counter, st.exponent) == (0b001, 0, 2, 2)
    np.testing.assert_array_equal(st.values, np.arange(LANES))
    assert pipe.process(packet(1, 3, values=[10] * LANES), WORKERS[1]) is None
    st = pipe.read_slot(JOB, 3, 0)
    assert (st.bitmap, st.counter) == (0b011, 1)
    np.testing.assert_array_equal(st.values, np.arange(LANES) + 10)


def test_int32_addition_wraps_like_a_switch_alu(pipe: Pipeline) -> None:
    imax, imin = np.iinfo(np.int32).max, np.iinfo(np.int32).min
    values = [np.array([imax, imin, imax, -1] * 2), np.array([1, -1, imax, imin] * 2)]
    values.append(np.zeros(LANES, dtype=np.int64))
    _, result = decode(contribute_all(pipe, 0, 0, values))
    expected = (sum(v.astype(np.int64) for v in values) + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(result[:4], [imin, imax, -2, imax])


def test_exponent_is_the_max_over_workers(pipe: Pipeline) -> None:
    for rank, exp in enumerate((-5, 7, EXPONENT_MIN)):
        emit = pipe.process(packet(rank, 1, exp=exp), WORKERS[rank])
    assert emit is not None
    header, _ = decode(emit)
    assert header.exponent == 7
    assert pipe.read_slot(JOB, 1, 0).exponent == 7


def test_exponent_of_all_zero_blocks_stays_minimal(pipe: Pipeline) -> None:
    zeros = [np.zeros(LANES)] * 3
    for rank in range(3):
        emit = pipe.process(packet(rank, 2, values=zeros[rank], exp=EXPONENT_MIN), WORKERS[rank])
    assert emit is not None
    assert decode(emit)[0].exponent == EXPONENT_MIN


def test_completion_multicasts_result_to_every_worker(pipe: Pipeline) -> None:
    values = [np.arange(LANES) * (r + 1) for r in range(3)]
    emits = [pipe.process(packet(r, 5, 1, values[r], seq=99), WORKERS[r]) for r in range(3)]
    assert emits[:2] == [None, None]
    emit = emits[2]
    assert emit is not None
    assert tuple(emit.dests) == WORKERS
    header, result = decode(emit)
    assert (header.ptype, header.job_id, header.slot, header.pool_set) == (
        PacketType.RESULT,
        JOB,
        5,
        1,
    )
    assert (header.seq, header.num_lanes, header.version) == (99, LANES, PROTOCOL_VERSION)
    np.testing.assert_array_equal(result, np.arange(LANES) * 6)
    c = pipe.counters()
    assert (c["aggregated"], c["completed"], c["results_sent"]) == (3, 1, 3)
    assert pipe.read_slot(JOB, 5, 1).counter == 0


def test_retransmit_before_completion_is_ignored_and_not_counted_twice(pipe: Pipeline) -> None:
    pipe.process(packet(0, 4, values=[1] * LANES), WORKERS[0])
    before = registers(pipe)
    # Different values on purpose: a duplicate must not be added, whatever it carries.
    assert pipe.process(packet(0, 4, values=[100] * LANES), WORKERS[0]) is None
    assert_registers_equal(before, registers(pipe))
    assert pipe.counters()["duplicates_ignored"] == 1
    pipe.process(packet(1, 4, values=[2] * LANES), WORKERS[1])
    emit = pipe.process(packet(2, 4, values=[3] * LANES), WORKERS[2])
    assert emit is not None
    np.testing.assert_array_equal(decode(emit)[1], [6] * LANES)
    assert pipe.counters()["aggregated"] == 3


def test_retransmit_after_completion_is_answered_by_unicast(pipe: Pipeline) -> None:
    values = [np.full(LANES, r + 1) for r in range(3)]
    first = decode(contribute_all(pipe, 6, 0, values))
    before = registers(pipe)
    emit = pipe.process(packet(1, 6, values=[50] * LANES), WORKERS[1])
    assert emit is not None
    assert tuple(emit.dests) == (WORKERS[1],)
    header, result = decode(emit)
    np.testing.assert_array_equal(result, first[1])
    assert header.ptype == PacketType.RESULT
    assert_registers_equal(before, registers(pipe))
    c = pipe.counters()
    assert (c["retransmits_answered"], c["completed"], c["results_sent"]) == (1, 1, 4)


def test_retransmit_of_a_finished_use_is_answered_to_any_worker_of_it(pipe: Pipeline) -> None:
    contribute_all(pipe, 2, 1, [np.ones(LANES)] * 3, seq=4)
    # The bitmap bit is no longer needed: worker 0 moved on to set 0 and cleared it there.
    assert pipe.process(packet(0, 2, 0, seq=5), WORKERS[0]) is None
    assert pipe.read_slot(JOB, 2, 1).bitmap == 0b110
    emit = pipe.process(packet(0, 2, 1, seq=4), WORKERS[0])
    assert emit is not None
    assert tuple(emit.dests) == (WORKERS[0],)
    np.testing.assert_array_equal(decode(emit)[1], [3] * LANES)


def test_delayed_packet_of_an_older_use_never_joins_a_newer_one(pipe: Pipeline) -> None:
    # Uses 1 (set 0) and 2 (set 1) finish; worker 1's packet of use 1 then arrives late.
    # Use 2 cleared its bit in set 0: the bitmap alone would take the late packet as the
    # first contribution of use 3.
    contribute_all(pipe, 0, 0, [np.ones(LANES)] * 3, seq=1)
    contribute_all(pipe, 0, 1, [np.ones(LANES)] * 3, seq=2)
    late = packet(1, 0, 0, [50] * LANES, seq=1)
    before = registers(pipe)
    emit = pipe.process(late, WORKERS[1])  # set 0 still holds use 1: harmless re-send
    assert emit is not None
    np.testing.assert_array_equal(decode(emit)[1], [3] * LANES)
    assert_registers_equal(before, registers(pipe))
    pipe.process(packet(0, 0, 0, [2] * LANES, seq=3), WORKERS[0])  # use 3 starts
    before = registers(pipe)
    assert pipe.process(late, WORKERS[1]) is None
    assert_registers_equal(before, registers(pipe))
    assert pipe.counters()["drop_stale"] == 1
    for rank in (1, 2):
        emit = pipe.process(packet(rank, 0, 0, [2] * LANES, seq=3), WORKERS[rank])
    assert emit is not None
    np.testing.assert_array_equal(decode(emit)[1], [6] * LANES)
    before = registers(pipe)
    assert pipe.process(late, WORKERS[1]) is None  # older than the finished use 3
    assert_registers_equal(before, registers(pipe))
    assert pipe.counters()["drop_stale"] == 2


def test_packet_of_another_use_while_a_slot_runs_is_stale(pipe: Pipeline) -> None:
    pipe.process(packet(0, 1, seq=8), WORKERS[0])
    before = registers(pipe)
    assert pipe.process(packet(1, 1, seq=9), WORKERS[1]) is None
    assert pipe.process(packet(1, 1, seq=7), WORKERS[1]) is None
    assert_registers_equal(before, registers(pipe))
    assert pipe.counters()["drop_stale"] == 2


def test_sets_alternate_and_slots_are_reused_over_many_rounds(pipe: Pipeline) -> None:
    rng = np.random.default_rng(1)
    for rnd in range(40):
        pool_set = rnd % 2
        for slot in range(8):
            values = [rng.integers(-(2**31), 2**31, LANES) for _ in range(3)]
            _, result = decode(contribute_all(pipe, slot, pool_set, values, seq=rnd + 1))
            expected = (sum(values) + 2**31) % 2**32 - 2**31
            np.testing.assert_array_equal(result, expected)
            st = pipe.read_slot(JOB, slot, pool_set)
            # This set's bits are all set; contributing here cleared them in the other set.
            assert (st.bitmap, st.other_bitmap, st.counter) == (0b111, 0, 0)
    c = pipe.counters()
    assert (c["completed"], c["aggregated"], c["duplicates_ignored"]) == (320, 960, 0)


def test_single_worker_job_completes_on_every_packet() -> None:
    p = Pipeline(lanes=LANES, slots=4)
    p.add_job(JobConfig(1, (WORKERS[0],), slot_count=2))
    for rnd in range(6):
        emit = p.process(packet(0, 1, rnd % 2, [rnd] * LANES, job=1, seq=rnd + 1), WORKERS[0])
        assert emit is not None
        assert tuple(emit.dests) == (WORKERS[0],)
        np.testing.assert_array_equal(decode(emit)[1], [rnd] * LANES)
    # A resend of the last round is answered with the stored result.
    emit = p.process(packet(0, 1, 1, [99] * LANES, job=1, seq=6), WORKERS[0])
    assert emit is not None
    np.testing.assert_array_equal(decode(emit)[1], [5] * LANES)
    assert p.counters()["retransmits_answered"] == 1


# ----------------------------------------------------------------- drops
def _with_byte(data: memoryview, offset: int, value: int) -> memoryview:
    raw = bytearray(data)
    raw[offset] = value
    return memoryview(bytes(raw))


DROP_CASES: dict[DropReason, tuple[Callable[[], memoryview], Addr]] = {
    DropReason.TRUNCATED: (lambda: packet(0, 0)[: HEADER_SIZE - 1], WORKERS[0]),
    DropReason.MALFORMED: (lambda: _with_byte(packet(0, 0), 0, 0x21), WORKERS[0]),
    DropReason.UNKNOWN_JOB: (lambda: packet(0, 0, job=JOB + 1), WORKERS[0]),
    DropReason.BAD_RANK: (lambda: packet(3, 0), WORKERS[0]),
    DropReason.BAD_SOURCE: (lambda: packet(0, 0), WORKERS[1]),
    DropReason.BAD_SLOT: (lambda: packet(0, 8), WORKERS[0]),
    DropReason.BAD_LANES: (lambda: packet(0, 0, lanes=LANES + 1), WORKERS[0]),
    DropReason.BAD_LENGTH: (lambda: memoryview(bytes(packet(0, 0)) + b"\0"), WORKERS[0]),
    # Slot 0 runs use 1 (see the test): a packet of another use is stale.
    DropReason.STALE: (lambda: packet(0, 0, seq=2), WORKERS[0]),
}


@pytest.mark.parametrize("reason", list(DROP_CASES), ids=lambda r: r.value)
def test_every_drop_reason_is_counted_and_changes_no_state(
    pipe: Pipeline, reason: DropReason
) -> None:
    make, src = DROP_CASES[reason]
    pipe.process(packet(1, 0, seq=1), WORKERS[1])  # mid-aggregation state to protect
    pipe.stats = dict.fromkeys(pipe.stats, 0)
    before = registers(pipe)
    assert pipe.process(make(), src) is None
    assert_registers_equal(before, registers(pipe))
    only_counter(pipe, "drop_" + reason.value)


def test_result_packet_sent_to_the_switch_is_malformed(pipe: Pipeline) -> None:
    data = packet(0, 0)
    result = _with_byte(data, 0, (PROTOCOL_VERSION << 4) | PacketType.RESULT)
    assert pipe.process(result, WORKERS[0]) is None
    only_counter(pipe, "drop_malformed")


def test_ingress_drop_simulator_drops_before_any_state_change(pipe: Pipeline) -> None:
    pipe.drops = DropSimulator(ingress=1.0)
    before = registers(pipe)
    assert pipe.process(packet(0, 0), WORKERS[0]) is None
    assert_registers_equal(before, registers(pipe))
    only_counter(pipe, "drop_sim_ingress")


def test_egress_drop_simulator_drops_each_replica(pipe: Pipeline) -> None:
    pipe.drops = DropSimulator(egress=1.0)
    for rank in range(3):
        assert pipe.process(packet(rank, 0), WORKERS[rank]) is None
    c = pipe.counters()
    assert (c["completed"], c["results_sent"], c["drop_sim_egress"]) == (1, 0, 3)
    # The aggregate is kept: a resend once the loss clears gets it by unicast.
    pipe.drops = DropSimulator()
    emit = pipe.process(packet(2, 0), WORKERS[2])
    assert emit is not None
    np.testing.assert_array_equal(decode(emit)[1], [6] * LANES)


def _drop_pattern(seed: int, n: int = 400) -> tuple[list[bool], Registers, dict[str, int]]:
    p = Pipeline(lanes=LANES, slots=SLOTS, drops=DropSimulator(0.3, 0.3, seed))
    p.add_job(JobConfig(JOB, WORKERS, slot_count=8))
    outcomes = []
    for i in range(n):
        rank, slot, rnd = i % 3, (i // 3) % 8, i // 24
        emit = p.process(packet(rank, slot, rnd % 2, seq=rnd + 1), WORKERS[rank])
        outcomes.append(emit is None)
    return outcomes, registers(p), p.counters()


def test_drop_simulator_is_reproducible_by_seed() -> None:
    a, b, c = _drop_pattern(11), _drop_pattern(11), _drop_pattern(12)
    assert a[0] == b[0]
    assert a[2] == b[2]
    assert_registers_equal(a[1], b[1])
    assert a[0] != c[0]
    assert a[2]["drop_sim_ingress"] > 0
    assert a[2]["drop_sim_egress"] > 0
    sim1, sim2 = DropSimulator(0.5, 0.5, seed=3), DropSimulator(0.5, 0.5, seed=3)
    assert [sim1.drop_ingress() for _ in range(100)] == [sim2.drop_ingress() for _ in range(100)]


@pytest.mark.parametrize("kwargs", [{"ingress": -0.1}, {"egress": 1.5}])
def test_drop_simulator_rejects_bad_probabilities(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="drop probability"):
        DropSimulator(**kwargs)


# ----------------------------------------------------------------- jobs
OTHER = 8
OTHER_WORKERS: tuple[Addr, ...] = (("10.0.1.1", 6001), ("10.0.1.2", 6002))


@pytest.fixture
def two_jobs(pipe: Pipeline) -> Pipeline:
    pipe.add_job(JobConfig(OTHER, OTHER_WORKERS, slot_count=4))
    return pipe


def test_two_jobs_are_isolated(two_jobs: Pipeline) -> None:
    p = two_jobs
    base = {j.job_id: j.slot_base for j in p.jobs()}
    assert base == {JOB: 0, OTHER: 8}
    p.process(packet(0, 1, values=[5] * LANES), WORKERS[0])
    emit = None
    for rank in range(2):
        emit = p.process(packet(rank, 1, values=[7] * LANES, job=OTHER), OTHER_WORKERS[rank])
    assert emit is not None
    assert tuple(emit.dests) == OTHER_WORKERS
    np.testing.assert_array_equal(decode(emit)[1], [14] * LANES)
    mine = p.read_slot(JOB, 1, 0)
    assert (mine.bitmap, mine.counter) == (0b001, 2)
    np.testing.assert_array_equal(mine.values, [5] * LANES)


@pytest.mark.parametrize(
    ("src", "rank", "slot", "reason"),
    [
        # A worker of job JOB claims to be rank 0 / rank 2 of job OTHER.
        (WORKERS[0], 0, 0, DropReason.BAD_SOURCE),
        (WORKERS[0], 2, 0, DropReason.BAD_RANK),
        # OTHER's own worker reaches past its 4 slots (into JOB's range if unchecked).
        (OTHER_WORKERS[0], 0, 4, DropReason.BAD_SLOT),
        (OTHER_WORKERS[0], 0, 0x7FFF, DropReason.BAD_SLOT),
    ],
    ids=["wrong-source", "wrong-rank", "slot-past-range", "slot-max"],
)
def test_forged_packets_for_another_job_change_nothing(
    two_jobs: Pipeline, src: Addr, rank: int, slot: int, reason: DropReason
) -> None:
    p = two_jobs
    p.process(packet(0, 0, job=OTHER), OTHER_WORKERS[0])
    p.process(packet(1, 0), WORKERS[1])
    p.stats = dict.fromkeys(p.stats, 0)
    before = registers(p)
    assert p.process(packet(rank, slot, job=OTHER), src) is None
    assert_registers_equal(before, registers(p))
    only_counter(p, "drop_" + reason.value)


def test_remove_job_clears_its_slots_and_unbinds_it(pipe: Pipeline) -> None:
    pipe.process(packet(0, 2, exp=5), WORKERS[0])
    pipe.remove_job(JOB)
    assert pipe.jobs() == []
    assert pipe.process(packet(1, 2), WORKERS[1]) is None
    assert pipe.counters()["drop_unknown_job"] == 1
    assert not pipe.bitmap.any()
    assert not pipe.counter.any()
    assert not pipe.values.any()
    assert (pipe.exponent == EXPONENT_MIN).all()
    pipe.add_job(JobConfig(JOB, WORKERS, slot_count=8))
    st = pipe.read_slot(JOB, 2, 0)
    assert (st.bitmap, st.counter, st.exponent) == (0, 0, EXPONENT_MIN)


def test_add_job_places_at_the_lowest_free_range(pipe: Pipeline) -> None:
    assert pipe.add_job(JobConfig(2, OTHER_WORKERS, slot_count=4)) == 8
    assert pipe.add_job(JobConfig(3, (STRANGER,), slot_count=4, slot_base=20)) == 20
    pipe.remove_job(JOB)
    assert pipe.add_job(JobConfig(4, (STRANGER,), slot_count=8)) == 0
    assert pipe.add_job(JobConfig(5, (STRANGER,), slot_count=8)) == 12
    assert pipe.add_job(JobConfig(6, (STRANGER,), slot_count=9)) == 24


many = tuple(("10.0.2.1", 7000 + i) for i in range(MAX_WORKERS + 1))


@pytest.mark.parametrize(
    ("job", "match"),
    [
        (JobConfig(JOB, (STRANGER,), 4), "already exists"),
        (JobConfig(70000, (STRANGER,), 4), "job id"),
        (JobConfig(-1, (STRANGER,), 4), "job id"),
        (JobConfig(9, (), 4), "workers"),
        (JobConfig(9, many, 4), "workers"),
        (JobConfig(9, (STRANGER, STRANGER), 4), "one source"),
        (JobConfig(9, (STRANGER,), -1), "slot count"),
        (JobConfig(9, (STRANGER,), SLOTS + 1), "slot count"),
        (JobConfig(9, (STRANGER,), 4, slot_base=6), "not free"),
        (JobConfig(9, (STRANGER,), 4, slot_base=-1), "not free"),
        (JobConfig(9, (STRANGER,), 4, slot_base=SLOTS - 2), "not free"),
        (JobConfig(9, (STRANGER,), SLOTS - 7), "no free range"),
    ],
)
def test_add_job_errors(pipe: Pipeline, job: JobConfig, match: str) -> None:
    before = pipe.jobs()
    with pytest.raises(JobTableError, match=match):
        pipe.add_job(job)
    assert pipe.jobs() == before


def test_remove_and_read_errors(pipe: Pipeline) -> None:
    with pytest.raises(JobTableError, match="no job"):
        pipe.remove_job(99)
    with pytest.raises(JobTableError, match="no job"):
        pipe.read_slot(99, 0, 0)
    with pytest.raises(JobTableError, match="outside job"):
        pipe.read_slot(JOB, 8, 0)
    with pytest.raises(JobTableError, match="outside job"):
        pipe.read_slot(JOB, 0, 2)


@pytest.mark.parametrize(("lanes", "slots"), [(0, 4), (2049, 4), (4, 0), (4, 32769)])
def test_pipeline_rejects_bad_sizes(lanes: int, slots: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        Pipeline(lanes=lanes, slots=slots)


# ----------------------------------------------------------------- entry-by-entry tables
def test_tables_written_entry_by_entry_make_a_working_job() -> None:
    """What P4Runtime writes do: job entry, bindings, group and replicas, separately."""
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.insert_worker(JOB, 0, WORKERS[0])  # tables are independent: bind before the job
    p.insert_job(JOB, 2, 4, 8, mgid=5)
    p.insert_worker(JOB, 1, WORKERS[1])
    assert p.process(packet(0, 0), WORKERS[0]) is None
    # Completing without a group sends nothing (a multicast to no replica).
    assert p.process(packet(1, 0), WORKERS[1]) is None
    assert p.counters()["completed"] == 1
    p.set_group(5, [(0, 0), (0, 1), (3, 2)])  # rid 2 has no replica entry: skipped
    p.set_replica(JOB, 0, 0, ("10.9.9.1", 9001))  # results may go elsewhere than the source
    p.set_replica(JOB, 1, 0, WORKERS[1])
    p.process(packet(0, 1), WORKERS[0])
    emit = p.process(packet(1, 1), WORKERS[1])
    assert emit is not None and list(emit.dests) == [("10.9.9.1", 9001), WORKERS[1]]
    p.delete_replica(JOB, 0, 0)
    p.process(packet(0, 2), WORKERS[0])
    emit = p.process(packet(1, 2), WORKERS[1])
    assert emit is not None and list(emit.dests) == [WORKERS[1]]
    # Unbinding a rank's source makes its packets bad_source; a second source may be bound.
    p.delete_worker(JOB, 1, WORKERS[1])
    assert p.process(packet(1, 3), WORKERS[1]) is None
    assert p.counters()["drop_bad_source"] == 1
    p.insert_worker(JOB, 1, STRANGER)
    p.process(packet(0, 3), WORKERS[0])
    assert p.process(packet(1, 3), STRANGER) is not None
    # The job's slot range is where its registers live: base 4.
    assert p.seq[4 + 3] == 1
    p.delete_job(JOB)
    assert p.process(packet(0, 4), WORKERS[0]) is None
    assert p.counters()["drop_unknown_job"] == 1


def test_table_writes_are_checked() -> None:
    p = Pipeline(lanes=LANES, slots=SLOTS)
    p.insert_job(1, 2, 0, 16, 1)
    for args, match in [
        ((1, 2, 32, 8, 1), "already exists"),
        ((2, 2, 8, 16, 1), "not free"),  # overlaps job 1
        ((2, 2, 60, 8, 1), "not free"),  # leaves the pool
        ((2, 0, 32, 8, 1), "workers"),
        ((2, MAX_WORKERS + 1, 32, 8, 1), "workers"),
        ((70000, 2, 32, 8, 1), "job id"),
    ]:
        with pytest.raises(JobTableError, match=match):
            p.insert_job(*args)
    p.modify_job(1, 3, 8, 16, 2)  # may move within free space (its own range excepted)
    assert p.jobs()[0].slot_base == 8
    with pytest.raises(JobTableError, match="no job"):
        p.modify_job(9, 1, 0, 1, 1)
    p.insert_worker(1, 0, WORKERS[0])
    with pytest.raises(JobTableError, match="already bound"):
        p.insert_worker(1, 0, WORKERS[0])
    with pytest.raises(JobTableError, match="not bound"):
        p.delete_worker(1, 1, WORKERS[0])
    with pytest.raises(JobTableError, match="multicast group"):
        p.set_group(0, [])
    with pytest.raises(JobTableError, match="no multicast group"):
        p.delete_group(3)
    with pytest.raises(JobTableError, match="no replica"):
        p.delete_replica(1, 0, 0)
    with pytest.raises(JobTableError, match="outside the pool"):
        p.clear_slots(60, 8)
    p.insert_worker(5, 0, WORKERS[2])
    with pytest.raises(JobTableError, match="workers bound"):
        p.add_job(JobConfig(5, WORKERS[:1], 4))  # job 5 has no entry but a binding


def test_reset_empties_tables_registers_counters_and_drops() -> None:
    p = Pipeline(lanes=LANES, slots=SLOTS, drops=DropSimulator(0.0, 0.5, seed=1))
    p.add_job(JobConfig(JOB, WORKERS, 4))
    p.process(packet(0, 0), WORKERS[0])
    p.reset()
    assert p.jobs() == [] and p.free_mgid() == 1
    assert not p.bitmap.any() and not p.seq.any() and not p.counter.any()
    assert set(p.counters().values()) == {0}
    assert (p.drops.ingress, p.drops.egress) == (0.0, 0.0)
    p.add_job(JobConfig(JOB, WORKERS, 4))  # and the same job installs again
