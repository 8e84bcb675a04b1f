"""The sans-I/O INA engine against the soft switch pipeline on a lossless fake network.

Results are compared bit for bit with references computed without the engine
(``helpers.expected``): int32 as a wrapping sum, float32 by quantizing with the global
block exponents; float32 results are also checked against ``error_bound``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    FAKE_SWITCH,
    FakeJob,
    assert_within_bound,
    expected,
    random_inputs,
)

from emulation.softswitch.pipeline import Pipeline
from hostlib.ina import SEQ_MODULUS, InaAllreduce, InaError, JobSpec, RetryPolicy
from hostlib.protocol import (
    DEFAULT_SLOTS_PER_JOB,
    HEADER_SIZE,
    LANES_PER_PACKET,
    MAX_LANES,
    MAX_SLOT,
    MAX_WORKERS,
    Header,
    PacketType,
    pack_header,
    unpack_header,
)
from hostlib.transport.memory import FakeNetwork

POLICY = RetryPolicy()
SLOTS = 4  # a small window: every size above 4 packets takes several windows


def sizes_for(lanes: int) -> list[int]:
    """1, around one packet, several windows (odd), less than a window (odd), 1 again."""
    return [1, lanes - 1, lanes, lanes + 1, 3 * SLOTS * lanes + 5, 2 * lanes + 3, 1]


def check(results: list[np.ndarray], inputs: np.ndarray, lanes: int) -> None:
    want = expected(inputs, lanes)
    for got in results:
        assert got.dtype == inputs.dtype and got.shape == (inputs.shape[1],)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    if inputs.dtype == np.float32:
        assert_within_bound(results[0], inputs, lanes)


# ----------------------------------------------------------------- correctness
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("lanes", [8, 64])
@pytest.mark.parametrize("workers", [1, 2, 4, 8])
def test_consecutive_calls_of_many_sizes_are_exact(workers: int, lanes: int, dtype: type) -> None:
    rng = np.random.default_rng(workers * lanes)
    pipe = Pipeline(lanes, slots=64)
    job = FakeJob(pipe, 1, workers, POLICY, slots=SLOTS)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    seq = 1
    for size in sizes_for(lanes):
        inputs = random_inputs(rng, dtype, workers, size)
        check(job.allreduce(net, inputs), inputs, lanes)
        nblocks = -(-size // lanes)
        seq += nblocks + (min(SLOTS, nblocks) if dtype is np.float32 else 0)
        assert {w.next_seq for w in job.states} == {seq}
    c = pipe.counters()
    assert c["retransmits_answered"] == c["duplicates_ignored"] == 0
    assert sum(v for k, v in c.items() if k.startswith("drop_")) == 0


def test_int32_sums_wrap_at_the_limits() -> None:
    pipe = Pipeline(8, slots=16)
    job = FakeJob(pipe, 2, 3, POLICY)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    top, bottom = 2**31 - 1, -(2**31)
    rows = [
        [top, bottom, top, bottom, -1, 0, 1, top, 7],
        [top, bottom, 1, -1, -1, 0, 1, 0, 0],
        [top, bottom, 0, 0, bottom, 0, 1, 0, 0],
    ]
    inputs = np.array(rows, dtype=np.int32)
    got = job.allreduce(net, inputs)[0]
    assert got.tolist() == [2**31 - 3, -(2**31), -(2**31), 2**31 - 1, 2**31 - 2, 0, 3, top, 7]


def test_int32_and_float32_calls_interleave_on_one_state() -> None:
    rng = np.random.default_rng(5)
    pipe = Pipeline(8, slots=16)
    job = FakeJob(pipe, 3, 4, POLICY, slots=3)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    for i, size in enumerate([100, 3, 8, 57, 24, 1, 200, 9]):
        dtype = np.int32 if i % 2 else np.float32
        inputs = random_inputs(rng, dtype, 4, size)
        check(job.allreduce(net, inputs), inputs, 8)


def test_packet_numbers_wrap_around_skipping_zero() -> None:
    rng = np.random.default_rng(6)
    pipe = Pipeline(8, slots=16)
    first = SEQ_MODULUS - 5
    job = FakeJob(pipe, 4, 3, POLICY, slots=4, first_seq=first)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    for dtype in (np.int32, np.float32, np.int32, np.float32):
        inputs = random_inputs(rng, dtype, 3, 8 * 9 + 1)
        check(job.allreduce(net, inputs), inputs, 8)
    # 10 packets per int32 call, 14 per float32 call; 1..2**32-1 then back to 1.
    assert job.states[0].next_seq == (first - 1 + 48) % SEQ_MODULUS + 1 == 43


def test_all_zero_and_tiny_float_blocks() -> None:
    pipe = Pipeline(8, slots=16)
    job = FakeJob(pipe, 5, 2, POLICY)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    inputs = np.zeros((2, 30), dtype=np.float32)
    inputs[:, 8:16] = np.float32(2.0**-149) * np.arange(8)  # subnormal blocks
    inputs[0, 16] = np.float32(-(2.0**-126))
    inputs[1, 24:] = np.float32(np.finfo(np.float32).max / 4)
    check(job.allreduce(net, inputs), inputs, 8)


def test_window_larger_than_the_call_uses_only_its_first_slots() -> None:
    pipe = Pipeline(8, slots=DEFAULT_SLOTS_PER_JOB)
    job = FakeJob(pipe, 6, 2, POLICY, slots=DEFAULT_SLOTS_PER_JOB)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    inputs = random_inputs(np.random.default_rng(7), np.int32, 2, 8 * 5)
    check(job.allreduce(net, inputs), inputs, 8)
    uses = job.states[0].uses
    assert uses[:5].tolist() == [1] * 5 and not uses[5:].any()


# ----------------------------------------------------------------- the engine alone
def make_engine(data: np.ndarray, **spec: int) -> InaAllreduce:
    job = JobSpec(1, 0, 2, FAKE_SWITCH, lanes=spec.get("lanes", 8), slots=spec.get("slots", 4))
    return InaAllreduce(job, data, np.zeros(job.slots, dtype=np.int64), POLICY)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int64, np.int16, np.uint32, bool])
def test_engine_rejects_other_dtypes(dtype: type) -> None:
    with pytest.raises(TypeError, match="float32 and int32"):
        make_engine(np.zeros(8, dtype=dtype))


def test_engine_rejects_other_shapes_and_non_finite_floats() -> None:
    with pytest.raises(ValueError, match="1-D"):
        make_engine(np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        make_engine(np.zeros((), dtype=np.int32))
    for bad in (np.nan, np.inf, -np.inf):
        data = np.ones(20, dtype=np.float32)
        data[13] = bad
        with pytest.raises(ValueError, match="NaN or infinity"):
            make_engine(data)


@pytest.mark.parametrize("first_seq", [0, -1, SEQ_MODULUS + 1])
def test_engine_rejects_bad_first_seq(first_seq: int) -> None:
    job = JobSpec(1, 0, 2, FAKE_SWITCH)
    with pytest.raises(ValueError, match="first_seq"):
        InaAllreduce(
            job, np.zeros(4, np.int32), np.zeros(job.slots, np.int64), POLICY, None, first_seq
        )


def test_engine_has_no_result_before_it_is_done() -> None:
    engine = make_engine(np.arange(20, dtype=np.int32))
    packets = engine.start(0.0)
    assert len(packets) == 3 and not engine.done
    with pytest.raises(InaError, match="not completed"):
        engine.result()
    with pytest.raises(InaError, match="not completed"):
        engine.commit()


def test_engine_counts_foreign_and_stale_datagrams() -> None:
    engine = make_engine(np.arange(40, dtype=np.int32))  # 5 packets, a window of 4
    sent = [bytes(p) for p in engine.start(0.0)]
    assert len(sent) == 4
    assert engine.on_datagram(memoryview(b"short"), 0.001) is None
    as_data = memoryview(sent[0])  # a DATA packet, not a RESULT
    assert engine.on_datagram(as_data, 0.001) is None
    h = unpack_header(sent[0])
    payload = sent[0][HEADER_SIZE:]
    other_job = Header(PacketType.RESULT, 2, 0, h.slot, h.pool_set, h.seq, 8)
    assert engine.on_datagram(memoryview(pack_header(other_job) + payload), 0.001) is None
    assert engine.stats.foreign == 3
    unknown = Header(PacketType.RESULT, 1, 0, 0, 0, h.seq + 50, 8)
    assert engine.on_datagram(memoryview(pack_header(unknown) + payload), 0.001) is None
    result = Header(PacketType.RESULT, 1, 1, h.slot, h.pool_set, h.seq, 8)
    nxt = engine.on_datagram(memoryview(pack_header(result) + payload), 0.001)
    assert nxt is not None and unpack_header(nxt).seq == h.seq + 4
    assert engine.on_datagram(memoryview(pack_header(result) + payload), 0.002) is None
    assert engine.stats.stale == 2  # the unknown seq and the duplicate result


# ----------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"job_id": -1}, "job_id"),
        ({"job_id": 0x10000}, "job_id"),
        ({"num_workers": 0, "rank": 0}, "num_workers"),
        ({"num_workers": MAX_WORKERS + 1}, "num_workers"),
        ({"rank": -1}, "rank"),
        ({"rank": 4}, "rank"),
        ({"lanes": 0}, "lanes"),
        ({"lanes": MAX_LANES + 1}, "lanes"),
        ({"slots": 0}, "slots"),
        ({"slots": MAX_SLOT + 2}, "slots"),
    ],
)
def test_job_spec_validation(fields: dict[str, int], name: str) -> None:
    args = {"job_id": 1, "rank": 0, "num_workers": 4, "switch": FAKE_SWITCH, **fields}
    with pytest.raises(ValueError, match=name):
        JobSpec(**args)  # type: ignore[arg-type]


def test_job_spec_accepts_the_limits() -> None:
    spec = JobSpec(0xFFFF, MAX_WORKERS - 1, MAX_WORKERS, FAKE_SWITCH, MAX_LANES, MAX_SLOT + 1)
    assert spec.rank == MAX_WORKERS - 1
    assert JobSpec(0, 0, 1, FAKE_SWITCH).lanes == LANES_PER_PACKET


@pytest.mark.parametrize(
    "fields",
    [
        {"timeout": 0.0},
        {"min_timeout": -1.0},
        {"max_timeout": 0.0},
        {"deadline": 0.0},
        {"deadline": -5.0},
        {"min_timeout": 1.0, "max_timeout": 0.5},
        {"backoff": 0.5},
    ],
)
def test_retry_policy_validation(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**fields)


def test_retry_policy_defaults_are_valid() -> None:
    p = RetryPolicy()
    assert 0 < p.min_timeout <= p.timeout <= p.max_timeout < p.deadline
    assert RetryPolicy(backoff=1.0, min_timeout=0.1, max_timeout=0.1).backoff == 1.0
