"""Ranks that enter an INA call apart, in virtual time, on both engines.

A call's first result needs every rank's first packet, so the ranks that enter first
wait for the last one on top of the round trip. On this VM ranks entered calls
1.5-15.7 ms apart (star4, float32, 12 calls, by pcap). The round-trip estimator, fed by
the rest of the call, sits at its 10 ms floor by then, so the first rank in sent its
first window again when the last came 11 ms later. Until a call's first result its
packets wait at least ``RetryPolicy.timeout`` (20 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import FAKE_SWITCH, check_allreduce, random_inputs

from emulation.softswitch.pipeline import JobConfig, Pipeline
from hostlib.ina import InaAllreduce, JobSpec, RetryPolicy, _Rtt
from hostlib.native import NativeInaAllreduce, native_unavailable
from hostlib.transport.memory import FakeNetwork, LinkModel

LANES = 8
WORKERS = 4
SLOTS = 4
POLICY = RetryPolicy(timeout=0.02, min_timeout=0.01, max_timeout=0.5, deadline=30.0)

_NO_NATIVE = native_unavailable()
ENGINES = [
    pytest.param(InaAllreduce, id="python"),
    pytest.param(
        NativeInaAllreduce,
        id="native",
        marks=pytest.mark.skipif(_NO_NATIVE is not None, reason=str(_NO_NATIVE)),
    ),
]


class LateStart:
    """An engine that enters its call ``delay`` seconds after the network starts it."""

    def __init__(self, engine: Any, delay: float) -> None:
        self.engine, self.at, self.started = engine, delay, False

    @property
    def done(self) -> bool:
        return bool(self.engine.done)

    def start(self, now: float) -> list[Any]:
        self.at += now
        return []

    def next_wakeup(self) -> float:
        return float(self.engine.next_wakeup()) if self.started else self.at

    def on_timer(self, now: float) -> list[Any]:
        if self.started:
            return list(self.engine.on_timer(now))
        if now < self.at:
            return []
        self.started = True
        return list(self.engine.start(now))

    def on_datagram(self, data: memoryview, now: float) -> Any:
        return self.engine.on_datagram(data, now) if self.started else None


def _call(engine: type, late_by: float, policy: RetryPolicy = POLICY) -> list[Any]:
    """One int32 call of four workers of a session whose estimator sits at its floor
    (a call after many), rank 3 entering it ``late_by`` seconds after the others; each
    worker's stats."""
    rng = np.random.default_rng(11)
    pipe = Pipeline(LANES, slots=32)
    addrs = tuple((f"10.9.0.{r + 1}", 5000 + r) for r in range(WORKERS))
    pipe.add_job(JobConfig(4, addrs, SLOTS))
    net = FakeNetwork(pipe, FAKE_SWITCH, LinkModel(), seed=0)
    inputs = random_inputs(rng, np.int32, WORKERS, 200 * LANES)
    calls = [
        engine(JobSpec(4, r, WORKERS, FAKE_SWITCH, LANES, SLOTS), inputs[r],
               np.zeros(SLOTS, np.int64), policy,
               _Rtt(policy.min_timeout, srtt=40e-6, rttvar=10e-6, samples=1000))
        for r in range(WORKERS)
    ]  # fmt: skip
    engines: dict[Any, Any] = dict(zip(addrs, calls, strict=True))
    engines[addrs[3]] = LateStart(calls[3], late_by)
    errors = net.run(engines)
    assert all(e is None for e in errors.values()), errors
    check_allreduce([np.array(c.result()) for c in calls], inputs)
    return [c.stats for c in calls]


@pytest.mark.parametrize("engine", ENGINES)
def test_ranks_entering_a_call_15_ms_apart_send_nothing_again(engine: type) -> None:
    stats = _call(engine, 0.015)
    assert [s.retransmitted for s in stats] == [0] * WORKERS


@pytest.mark.parametrize("engine", ENGINES)
def test_with_the_floor_before_the_first_result_the_first_in_resend_their_window(
    engine: type,
) -> None:
    floor = RetryPolicy(timeout=0.01, min_timeout=0.01, max_timeout=0.5, deadline=30.0)
    stats = _call(engine, 0.015, policy=floor)
    assert [s.retransmitted for s in stats] == [SLOTS, SLOTS, SLOTS, 0]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_later_than_the_timeout_costs_one_window_sent_again(engine: type) -> None:
    # 25 ms outlasts the 20 ms: the others send their first window once more, backed
    # off, and nothing after it.
    stats = _call(engine, 0.025)
    assert [s.retransmitted for s in stats] == [SLOTS, SLOTS, SLOTS, 0]
