"""INA's loss recovery from what arrives (fast retransmission), in virtual time.

A worker whose packet (or whose result) was lost learns it when results of packets it
sent later come back, and sends it again at once instead of waiting for its timer; the
timer stays the backstop for a call's last packets. The switch is the real pipeline, the
wire the fake network; a :class:`DropFirst` in front of the switch loses chosen packets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import FAKE_SWITCH, FakeJob, check_allreduce, expected, random_inputs

from emulation.softswitch.pipeline import Pipeline
from hostlib.ina import RetryPolicy, reorder_threshold
from hostlib.protocol import HEADER
from hostlib.transport.base import Addr
from hostlib.transport.memory import FakeNetwork, LinkModel

LANES = 8
# The timer can only fire after 10 ms; a round trip of the fake wire is 40 us.
POLICY = RetryPolicy(timeout=0.02, min_timeout=0.01, max_timeout=0.5, deadline=30.0)


@dataclass
class DropFirst:
    """The pipeline behind a filter: the first copy of each packet ``match(rank, seq)``
    names is lost on its way into the switch."""

    pipe: Pipeline
    match: Callable[[int, int], bool]

    def __post_init__(self) -> None:
        self.dropped: set[tuple[int, int]] = set()

    def process(self, data: memoryview, src: Addr):  # type: ignore[no-untyped-def]
        _vt, _f, _job, rank, _e, _l, _p, _x, seq = HEADER.unpack_from(data)
        if self.match(rank, seq) and (rank, seq) not in self.dropped:
            self.dropped.add((rank, seq))
            return None
        return self.pipe.process(data, src)


def _run(workers: int, inputs: np.ndarray, match: Callable[[int, int], bool], slots: int = 8):  # type: ignore[no-untyped-def]
    pipe = Pipeline(LANES, slots=32)
    job = FakeJob(pipe, 3, workers, POLICY, slots=slots)
    switch = DropFirst(pipe, match)
    net = FakeNetwork(switch, FAKE_SWITCH, LinkModel(), seed=0)
    engines = job.start(inputs)
    errors = net.run(engines)
    assert all(e is None for e in errors.values()), errors
    stats = [engines[a].stats for a in job.addrs]
    return job.finish(engines), stats, net.now, switch


def test_a_lost_packet_mid_call_is_sent_again_before_any_timer() -> None:
    rng = np.random.default_rng(0)
    inputs = random_inputs(rng, np.int32, 4, 40 * LANES)
    results, stats, elapsed, switch = _run(4, inputs, lambda rank, seq: (rank, seq) == (2, 5))
    check_allreduce(results, inputs)
    assert switch.dropped == {(2, 5)}
    assert stats[2].fast_retransmitted == stats[2].retransmitted == 1
    # Every worker's later results prove packet 5 missing: the others send it again
    # too (the switch ignores theirs), and nobody waited for a timer.
    assert all(s.fast_retransmitted == s.retransmitted for s in stats)
    assert elapsed < POLICY.min_timeout


def test_a_lost_retransmission_is_found_the_same_way() -> None:
    rng = np.random.default_rng(1)
    inputs = random_inputs(rng, np.int32, 2, 60 * LANES)
    dropped: list[int] = []

    def twice(rank: int, seq: int) -> bool:  # packet 7 of rank 1, and its first resend
        if rank == 1 and seq == 7 and len(dropped) < 2:
            dropped.append(seq)
            return True
        return False

    pipe = Pipeline(LANES, slots=32)
    job = FakeJob(pipe, 3, 2, POLICY, slots=8)
    # DropFirst drops a (rank, seq) once; wrap it to drop twice.
    switch = DropFirst(pipe, lambda r, s: False)
    switch.process = lambda data, src: (  # type: ignore[method-assign]
        None if twice(*HEADER.unpack_from(data)[3::5]) else pipe.process(data, src)
    )
    net = FakeNetwork(switch, FAKE_SWITCH, LinkModel(), seed=0)
    engines = job.start(inputs)
    assert all(e is None for e in net.run(engines).values())
    check_allreduce(job.finish(engines), inputs)
    assert dropped == [7, 7]
    assert engines[job.addrs[1]].stats.fast_retransmitted >= 2
    assert net.now < POLICY.min_timeout


def test_the_last_packet_of_a_call_waits_for_its_timer() -> None:
    rng = np.random.default_rng(2)
    inputs = random_inputs(rng, np.int32, 3, 16 * LANES)
    results, stats, elapsed, _ = _run(3, inputs, lambda rank, seq: (rank, seq) == (0, 16))
    check_allreduce(results, inputs)
    assert stats[0].retransmitted == 1 and stats[0].fast_retransmitted == 0
    assert elapsed >= POLICY.min_timeout


@pytest.mark.parametrize("window", [1, 2, 3, 4, 8])
def test_the_threshold_fits_the_window(window: int) -> None:
    assert 1 <= reorder_threshold(window) <= max(1, window - 1)
    assert reorder_threshold(window) <= 3


@pytest.mark.parametrize("seed", range(24))
def test_random_loss_recovers_mostly_without_timers(seed: int) -> None:
    # 5% loss on every link, each way, 8 workers: the results equal the lossless sums
    # and most retransmissions are fast ones.
    rng = np.random.default_rng(seed)
    dtype = (np.int32, np.float32)[seed % 2]
    inputs = random_inputs(rng, dtype, 8, 64 * LANES + seed)
    pipe = Pipeline(LANES, slots=32)
    job = FakeJob(pipe, 3, 8, POLICY, slots=16)
    net = FakeNetwork(pipe, FAKE_SWITCH, LinkModel(loss=0.05), seed=seed)
    engines = job.start(inputs)
    assert all(e is None for e in net.run(engines).values())
    results = job.finish(engines)
    want = expected(inputs, LANES)
    for got in results:
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    fast = sum(e.stats.fast_retransmitted for e in engines.values())
    total = sum(e.stats.retransmitted for e in engines.values())
    assert net.lost > 0 and fast > (total - fast)
