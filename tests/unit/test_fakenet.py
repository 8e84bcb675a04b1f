"""Loss, duplication, reordering and dead workers, deterministically in virtual time.

The engines and the soft switch pipeline are the real ones; only the wire is simulated
(``hostlib.transport.memory.FakeNetwork``). "Identical" means bit-identical to the
lossless run of the same calls, which is itself checked against ``helpers.expected``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import FAKE_SWITCH, FakeJob, expected, random_inputs

from emulation.softswitch.pipeline import DropSimulator, Pipeline
from hostlib.ina import InaTimeoutError, RetryPolicy
from hostlib.transport.memory import FakeNetwork, LinkModel

LANES = 8
POLICY = RetryPolicy()
# A retransmission timer shorter than the reorder delay: originals arrive after their
# retransmission, often after the slot has moved on to its next use.
FAST_RETRY = RetryPolicy(timeout=0.0005, min_timeout=0.0002, max_timeout=0.002, deadline=5.0)
LOSSY = LinkModel(loss=0.1, duplicate=0.1, reorder=0.2, reorder_delay=0.001)
SEEDS = range(32)


def calls_for(seed: int) -> tuple[int, list[np.ndarray]]:
    """A worker count and a mixed int32/float32 sequence of calls of several sizes."""
    rng = np.random.default_rng(seed)
    workers = (2, 3, 4, 8)[seed % 4]
    plan = [(np.int32, 37), (np.float32, 8 * 4 * 3 + 5), (np.float32, 3), (np.int32, 70)]
    return workers, [random_inputs(rng, dtype, workers, size) for dtype, size in plan]


def run_calls(
    workers: int,
    calls: list[np.ndarray],
    link: LinkModel | None = None,
    seed: int = 0,
    drops: DropSimulator | None = None,
    policy: RetryPolicy = POLICY,
) -> tuple[list[list[np.ndarray]], Pipeline, FakeNetwork]:
    pipe = Pipeline(LANES, slots=32, drops=drops)
    job = FakeJob(pipe, 9, workers, policy, slots=4)
    net = FakeNetwork(pipe, FAKE_SWITCH, link, seed=seed)
    return [job.allreduce(net, inputs) for inputs in calls], pipe, net


def assert_identical(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> None:
    for call_got, call_want in zip(got, want, strict=True):
        for g, w in zip(call_got, call_want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


def lossless(seed: int) -> list[list[np.ndarray]]:
    workers, calls = calls_for(seed)
    results, _, net = run_calls(workers, calls)
    assert net.lost == 0
    for inputs, per_worker in zip(calls, results, strict=True):
        want = expected(inputs, LANES)
        for got in per_worker:
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    return results


# ----------------------------------------------------------------- an impaired wire
@pytest.mark.parametrize("seed", SEEDS)
def test_loss_duplication_and_reordering_give_the_lossless_result(seed: int) -> None:
    workers, calls = calls_for(seed)
    results, pipe, net = run_calls(workers, calls, LOSSY, seed)
    assert_identical(results, lossless(seed))
    assert net.lost > 0
    c = pipe.counters()
    assert c["drop_bad_source"] == c["drop_bad_slot"] == c["drop_malformed"] == 0


def test_delayed_retransmissions_after_the_slots_next_use_are_dropped_as_stale() -> None:
    link = LinkModel(loss=0.1, duplicate=0.2, reorder=0.3, reorder_delay=0.004)
    stale = []
    for seed in range(12):
        workers, calls = calls_for(seed)
        results, pipe, _ = run_calls(workers, calls, link, seed, policy=FAST_RETRY)
        assert_identical(results, lossless(seed))
        stale.append(pipe.counters()["drop_stale"])
    assert max(stale) > 0, stale  # the seq register did its job, and nothing went wrong


@pytest.mark.parametrize("seed", range(10))
def test_switch_drop_simulator_gives_the_lossless_result(seed: int) -> None:
    workers, calls = calls_for(seed)
    drops = DropSimulator(ingress=0.1, egress=0.1, seed=seed)
    results, pipe, net = run_calls(workers, calls, seed=seed, drops=drops)
    assert_identical(results, lossless(seed))
    c = pipe.counters()
    assert c["drop_sim_ingress"] > 0 and c["drop_sim_egress"] > 0
    assert c["retransmits_answered"] > 0  # lost results are re-sent from the slot
    assert net.lost == 0


def test_a_seed_replays_exactly() -> None:
    workers, calls = calls_for(3)
    runs = [run_calls(workers, calls, LOSSY, seed=77) for _ in range(2)]
    (r1, p1, n1), (r2, p2, n2) = runs
    assert_identical(r1, r2)
    assert (n1.now, n1.delivered, n1.lost) == (n2.now, n2.delivered, n2.lost)
    assert p1.counters() == p2.counters()


# ----------------------------------------------------------------- a dead worker
DEADLINE = 0.5
KILL_POLICY = RetryPolicy(timeout=0.01, min_timeout=0.005, max_timeout=0.05, deadline=DEADLINE)


def two_jobs() -> tuple[Pipeline, FakeJob, FakeJob, FakeNetwork]:
    pipe = Pipeline(LANES, slots=64)
    a = FakeJob(pipe, 1, 3, KILL_POLICY, slots=4)
    b = FakeJob(pipe, 2, 2, KILL_POLICY, slots=4)
    return pipe, a, b, FakeNetwork(pipe, FAKE_SWITCH, seed=1)


def run_with_a_dead_worker(
    a: FakeJob, b: FakeJob, net: FakeNetwork, dead: int, kill_at: float, size: int
) -> list[InaTimeoutError]:
    """One call of both jobs, with ``a``'s rank ``dead`` gone from ``kill_at`` on; job
    ``b`` must complete exactly, ``a``'s other ranks must time out."""
    rng = np.random.default_rng(size)
    in_a = random_inputs(rng, np.int32, 3, size)
    in_b = random_inputs(rng, np.float32, 2, size)
    engines_a, engines_b = a.start(in_a), b.start(in_b)
    net.kill(a.addrs[dead], kill_at)
    errors = net.run({**engines_a, **engines_b})
    assert [errors[x] for x in b.addrs] == [None, None]
    for got in b.finish(engines_b):
        np.testing.assert_array_equal(got, expected(in_b, LANES))
    assert errors[a.addrs[dead]] is None  # dead, not failed: it just stopped
    for rank, addr in enumerate(a.addrs):
        if rank != dead:
            assert isinstance(errors[addr], InaTimeoutError), errors[addr]
            assert "no result from switch" in str(errors[addr])
            assert not engines_a[addr].done
    return [e for e in errors.values() if isinstance(e, InaTimeoutError)]


def test_a_worker_dead_from_the_start_times_its_peers_out_at_the_deadline() -> None:
    _, a, b, net = two_jobs()
    errors = run_with_a_dead_worker(a, b, net, dead=2, kill_at=0.0, size=100)
    # No slot of job a ever completed: the last progress was the start, at t = 0, so the
    # silence each error reports is the virtual time at which that peer gave up.
    assert len(errors) == 2
    for exc in errors:
        match = re.search(r"for ([0-9.]+) s", str(exc))
        assert match is not None, exc
        assert DEADLINE <= float(match[1]) <= DEADLINE + KILL_POLICY.max_timeout
    assert DEADLINE <= net.now <= DEADLINE + KILL_POLICY.max_timeout


def test_a_worker_dying_mid_call_times_its_peers_out_and_the_other_job_goes_on() -> None:
    pipe, a, b, net = two_jobs()
    rng = np.random.default_rng(11)
    first = random_inputs(rng, np.int32, 3, 50)
    for got in a.allreduce(net, first):  # a completed call first
        np.testing.assert_array_equal(got, expected(first, LANES))
    kill_at = net.now + 200e-6  # ~5 round trips into a call of 50 windows
    run_with_a_dead_worker(a, b, net, dead=1, kill_at=kill_at, size=8 * 4 * 50)
    # The last progress of a's peers lies within a round trip of the kill (results of the
    # dead worker's last packets still arrive); the deadline counts from it.
    waited = net.now - kill_at
    assert DEADLINE - 1e-3 <= waited <= DEADLINE + KILL_POLICY.max_timeout, waited
    # The switch and the network keep serving the other job.
    later = random_inputs(rng, np.float32, 2, 123)
    for got in b.allreduce(net, later):
        np.testing.assert_array_equal(got, expected(later, LANES))
    assert pipe.counters()["drop_bad_slot"] == 0


def test_run_stops_at_max_time() -> None:
    pipe = Pipeline(LANES, slots=16)
    job = FakeJob(pipe, 1, 2, RetryPolicy(deadline=100.0), slots=4)
    net = FakeNetwork(pipe, FAKE_SWITCH)
    engines = job.start(np.zeros((2, 40), dtype=np.int32))
    net.kill(job.addrs[1], 0.0)
    with pytest.raises(RuntimeError, match="still running"):
        net.run(engines, max_time=1.0)


# ----------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    "fields",
    [
        {"loss": -0.1},
        {"loss": 1.5},
        {"duplicate": 2.0},
        {"reorder": -1e-9},
        {"latency": -1.0},
        {"reorder_delay": -1e-6},
    ],
)
def test_link_model_validation(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LinkModel(**fields)


@pytest.mark.parametrize(("ingress", "egress"), [(-0.1, 0.0), (0.0, 1.01)])
def test_drop_simulator_validation(ingress: float, egress: float) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        DropSimulator(ingress, egress)
