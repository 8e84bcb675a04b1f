"""One job striped across two aggregators (``hostlib.session.StripedInaSession``): two
soft switch processes on loopback, each holding the same job, and worker threads with
one socket per aggregator.

Results are bit-identical to one aggregator's (the stripes are cut on block
boundaries), each aggregator carries its share of the packets, and an aggregator that
stops mid-run ends every rank's call with an error naming it, within the deadline,
with no stripe left running.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import in_threads, worker_addresses
from test_ina_udp import SMALL_LANES, Switch, check_calls, make_calls, start_switch

from hostlib import InaError, InaSession, InaTimeoutError, JobSpec, RetryPolicy
from hostlib.native import native_unavailable
from hostlib.session import StripedInaSession, stripe_bounds
from hostlib.transport.udp import UdpTransport

SLOTS = 8
THREAD_TIMEOUT = 60.0
ENGINES = ["python", pytest.param("native", marks=pytest.mark.skipif(
    native_unavailable() is not None, reason="the native core was not built"))]  # fmt: skip


@pytest.fixture
def aggregators(tmp_path: Path) -> Iterator[list[Switch]]:
    made = [start_switch(tmp_path / f"agg{k}", SMALL_LANES) for k in range(2)]
    yield made
    for sw in made:
        if sw.proc.is_running():
            assert sw.stop() == 0, sw.proc.log_path.read_text()


def striped_job(
    aggregators: list[Switch], workers: int, engine: str, job_id: int, deadline: float = 10.0
) -> list[StripedInaSession]:
    """The job on every aggregator; per rank, one session per aggregator, striped."""
    per_rank: list[list[InaSession]] = [[] for _ in range(workers)]
    for sw in aggregators:
        transports = [UdpTransport(("127.0.0.1", 0)) for _ in range(workers)]
        sw.ctl.add_job(job_id, worker_addresses(t.local_addr for t in transports), SLOTS)
        for rank, t in enumerate(transports):
            spec = JobSpec(job_id, rank, workers, sw.data_addr, SMALL_LANES, SLOTS)
            policy = RetryPolicy(deadline=deadline)
            per_rank[rank].append(InaSession(spec, t, policy, engine=engine))
    return [StripedInaSession(stripes) for stripes in per_rank]


def test_stripes_are_cut_on_block_boundaries() -> None:
    assert [stripe_bounds(10 * 64 + 5, 64, 2, k) for k in range(2)] == [(0, 320), (320, 645)]
    assert [stripe_bounds(1, 64, 2, k) for k in range(2)] == [(0, 0), (0, 1)]
    assert [stripe_bounds(0, 64, 3, k) for k in range(3)] == [(0, 0)] * 3
    bounds = [stripe_bounds(5 * 64, 64, 3, k) for k in range(3)]
    assert bounds == [(0, 64), (64, 192), (192, 320)]
    with pytest.raises(ValueError, match="part 3 of 3"):
        stripe_bounds(5, 64, 3, 3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ENGINES)
def test_two_aggregators_give_one_aggregators_bits_and_share_the_packets(
    aggregators: list[Switch], engine: str
) -> None:
    workers = 3
    sizes = [1, SMALL_LANES, SMALL_LANES + 1, 2 * SMALL_LANES, 1000, 5 * SLOTS * SMALL_LANES + 17]
    plan = [(dtype, n) for n in sizes for dtype in (np.int32, np.float32)]
    calls = make_calls(11, workers, plan)
    sessions = striped_job(aggregators, workers, engine, job_id=7)
    try:

        def body(rank: int) -> list[np.ndarray]:
            return [sessions[rank].allreduce(x[rank]) for x in calls]

        bodies = [functools.partial(body, r) for r in range(workers)]
        check_calls(in_threads(bodies, THREAD_TIMEOUT), calls, SMALL_LANES)
        # Each aggregator took its stripes' packets from every worker, no more: float32
        # calls send one window of exponent packets ahead of the data.
        want = [0, 0]
        for dtype, n in plan:
            for k in range(2):
                lo, hi = stripe_bounds(n, SMALL_LANES, 2, k)
                blocks = -(-(hi - lo) // SMALL_LANES)
                extra = min(SLOTS, blocks) if dtype is np.float32 and blocks else 0
                want[k] += workers * (blocks + extra)
        got = [sw.ctl.counters()["received"] for sw in aggregators]
        retransmitted = sum(s.retransmissions for s in sessions)
        assert want[0] <= got[0] and want[1] <= got[1], (want, got)
        assert got[0] + got[1] <= want[0] + want[1] + retransmitted, (want, got)
    finally:
        for s in sessions:
            s.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("ina-stripe")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", ENGINES)
def test_an_aggregator_that_stops_fails_every_rank_naming_it(
    aggregators: list[Switch], engine: str
) -> None:
    workers, deadline = 3, 2.0
    calls = make_calls(12, workers, [(np.int32, 40 * SMALL_LANES)] * 200)
    sessions = striped_job(aggregators, workers, engine, job_id=8, deadline=deadline)
    dead = aggregators[1]
    dead_addr = "{}:{}".format(*dead.data_addr)
    done = [0] * workers

    def body(rank: int) -> BaseException | None:
        try:
            for x in calls:
                sessions[rank].allreduce(x[rank])
                done[rank] += 1
        except InaError as exc:
            return exc
        return None

    try:
        threads_out: list[BaseException | None] = []
        runner = threading.Thread(
            target=lambda: threads_out.extend(
                in_threads([functools.partial(body, r) for r in range(workers)], THREAD_TIMEOUT)
            )
        )
        runner.start()
        while min(done) < 3:  # a few calls through both aggregators first
            time.sleep(0.01)
            assert runner.is_alive()
        dead.proc.stop()
        stopped = time.monotonic()
        runner.join(THREAD_TIMEOUT)
        took = time.monotonic() - stopped
        assert not runner.is_alive()
        assert all(isinstance(e, InaTimeoutError) for e in threads_out), threads_out
        for exc in threads_out:
            assert f"aggregator 2 of 2 ({dead_addr})" in str(exc)
            assert "no result from switch" in str(exc)
        assert took < 3 * deadline, took  # a call already running, then one deadline
        with pytest.raises(InaError, match=f"unusable .*aggregator 2 of 2 \\({dead_addr}\\)"):
            sessions[0].allreduce(calls[0][0])
    finally:
        for s in sessions:
            s.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("ina-stripe")]


def test_stripes_of_different_jobs_are_refused(aggregators: list[Switch]) -> None:
    a = InaSession(
        JobSpec(1, 0, 2, aggregators[0].data_addr, 64, 8), UdpTransport(("127.0.0.1", 0))
    )
    b = InaSession(
        JobSpec(1, 0, 2, aggregators[1].data_addr, 64, 4), UdpTransport(("127.0.0.1", 0))
    )
    try:
        with pytest.raises(ValueError, match="lanes, slots"):
            StripedInaSession([a, b])
        with pytest.raises(ValueError, match="at least one aggregator"):
            StripedInaSession([])
    finally:
        a.close()
        b.close()
