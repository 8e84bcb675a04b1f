"""The end of a point-to-point call under loss, between real processes over UDP.

A call ends only when every packet it sent is acknowledged; the acknowledgement of its
last packet may be lost while the receiver, finished, waits at a barrier between calls.
These tests drop exactly those acknowledgements (and, separately, the last data packets,
acknowledgements at random, and everything at random with duplication and reordering) in
spawned rank processes that really stop calling into their session between calls, and
require every call of every rank to finish with exact int32 results.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import wrapping_sum
from lossy import Faults, RankReport, run_ranks

from hostlib import RetryPolicy
from hostlib.session import part_bounds

N = 4
# A deadline far below the tests' timeout: a rank left waiting fails within it.
POLICY = RetryPolicy(deadline=4.0)


def _inputs(operation: str, calls: int, size: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    per_rank = size // N if operation == "all_gather" else size
    return [
        [rng.integers(-(2**31), 2**31, per_rank, dtype=np.int64).astype(np.int32) for _ in range(N)]
        for _ in range(calls)
    ]


def _expected(operation: str, call: list[np.ndarray], rank: int) -> np.ndarray:
    if operation == "all_gather":
        return np.concatenate(call)
    total = wrapping_sum(np.stack(call))
    if operation == "reduce_scatter":
        lo, hi = part_bounds(total.size, N, rank)
        return total[lo:hi]
    return total


def _check(operation: str, inputs: list[list[np.ndarray]], reports: list[RankReport]) -> None:
    errors = {r.rank: r.error for r in reports if r.error}
    assert not errors, errors
    for report in reports:
        assert len(report.results) == len(inputs)
        for call, got in zip(inputs, report.results, strict=True):
            np.testing.assert_array_equal(got, _expected(operation, call, report.rank))


@pytest.mark.parametrize("operation", ["allreduce", "tree", "reduce_scatter", "all_gather"])
def test_lost_final_ack_of_every_call_hangs_no_rank(operation: str) -> None:
    # Every rank loses the first ack of its last packet to each peer in calls 2..6 and
    # then sits at a barrier: only a rank that answers while idle lets the sender finish.
    inputs = _inputs(operation, 6, 4 * 64, seed=1)
    reports = run_ranks(operation, inputs, Faults(final_ack=True), POLICY, lanes=64)
    _check(operation, inputs, reports)
    assert sum(r.counts.final_acks_dropped for r in reports if r.counts) >= 5 * (N - 1)
    # The lost acks were answered again by ranks that had finished the call.
    assert sum(r.late_answered for r in reports) > 0


@pytest.mark.parametrize("operation", ["allreduce", "tree"])
def test_lost_final_data_packet_of_every_call(operation: str) -> None:
    inputs = _inputs(operation, 5, 4 * 64 + 3, seed=2)
    reports = run_ranks(operation, inputs, Faults(final_data=True), POLICY, lanes=64)
    _check(operation, inputs, reports)
    assert sum(r.counts.final_data_dropped for r in reports if r.counts) >= 4 * (N - 1)


@pytest.mark.parametrize("operation", ["allreduce", "tree"])
def test_acknowledgements_lost_at_random(operation: str) -> None:
    inputs = _inputs(operation, 8, 20 * 64 + 5, seed=3)
    reports = run_ranks(operation, inputs, Faults(ack_loss=0.2), POLICY, lanes=64)
    _check(operation, inputs, reports)


@pytest.mark.parametrize("operation", ["allreduce", "tree", "reduce_scatter", "all_gather"])
def test_loss_duplication_and_reordering(operation: str) -> None:
    faults = Faults(loss=0.05, duplicate=0.05, reorder=0.1)
    inputs = _inputs(operation, 10, 40 * 64 + 7, seed=4)
    reports = run_ranks(operation, inputs, faults, POLICY, lanes=64, pause=0.01)
    _check(operation, inputs, reports)
    # Most losses in a window are found by later acks, not by the timer.
    assert sum(r.fast_retransmitted for r in reports) > 0
    # Duplicated DATA reached ranks twice: counted as late answers, not as losses.
    assert sum(r.late_answers for r in reports) > 0


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["allreduce", "tree", "reduce_scatter", "all_gather"])
def test_a_hundred_calls_under_loss_duplication_and_reordering(operation: str) -> None:
    faults = Faults(loss=0.05, duplicate=0.05, reorder=0.1, final_ack=True)
    inputs = _inputs(operation, 100, 8 * 64 + 1, seed=5)
    reports = run_ranks(operation, inputs, faults, POLICY, lanes=64, pause=0.0, timeout=600)
    _check(operation, inputs, reports)


# ----------------------------------------------------------------- INA's end of call
def _ina_run(calls: int, size: int, faults: Faults, drop: float, seed: int, pause: float):  # type: ignore[no-untyped-def]
    from helpers import switch_thread
    from lossy import InaJob

    from emulation.softswitch.pipeline import DropSimulator, JobConfig, Pipeline

    lanes, slots = 64, 8
    pipe = Pipeline(lanes, slots=64, drops=DropSimulator(drop, drop, seed=seed))
    inputs = _inputs("allreduce", calls, size, seed)
    with switch_thread(pipe) as server:

        def install(addrs: list[tuple[str, int]]) -> InaJob:
            job = JobConfig(5, tuple(addrs), slots)
            server.control.call(lambda: server.pipeline.add_job(job))
            return InaJob(5, server.data_addr, lanes, slots)

        reports = run_ranks("ina", inputs, faults, POLICY, pause=pause, install=install)
        counters = server.control.call(server.pipeline.counters)
    _check("allreduce", inputs, reports)
    return reports, counters


def test_ina_through_a_lossy_switch_and_hosts_that_duplicate_and_reorder() -> None:
    faults = Faults(loss=0.02, duplicate=0.05, reorder=0.1)
    reports, counters = _ina_run(12, 30 * 64 + 5, faults, drop=0.03, seed=6, pause=0.01)
    assert counters["retransmits_answered"] > 0 and counters["duplicates_ignored"] > 0
    assert sum(r.fast_retransmitted for r in reports) > 0
    assert sum(r.late_answers for r in reports) > 0  # results duplicated on the way


@pytest.mark.slow
def test_ina_a_hundred_calls_under_loss_duplication_and_reordering() -> None:
    faults = Faults(loss=0.05, duplicate=0.05, reorder=0.1)
    _ina_run(100, 8 * 64 + 1, faults, drop=0.0, seed=7, pause=0.0)
