"""Timers served late (``RetryPolicy.late_timer``), in virtual time, on both engines of
INA and of the point-to-point layer under ring and tree.

When the whole machine stalls (a VM whose vCPUs the hypervisor took, measured on this
one at up to 28 ms), the switch, the links and every worker stop together, and every
worker's timers are served late when it resumes. Nothing was lost, so nothing must be
sent again: such a timer is re-armed once from the moment it is served. A packet really
lost is still recovered, one timeout later, and a timer served late twice fires. The
engines count a stall wherever it falls in a timer's life (a heartbeat wakes them while
they wait), so a stall that ends just as timers come due counts too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import FAKE_SWITCH, ROUTER, Router, check_allreduce, random_inputs

from emulation.softswitch.pipeline import JobConfig, Pipeline
from hostlib.ina import InaAllreduce, JobSpec, RetryPolicy, StallClock
from hostlib.native import (
    NativeCollectiveCall,
    NativeInaAllreduce,
    NativeP2pEndpoint,
    native_p2p_unavailable,
    native_unavailable,
)
from hostlib.p2p import P2pEndpoint
from hostlib.p2pwire import PeerSpec
from hostlib.protocol import HEADER
from hostlib.ring import RingCall
from hostlib.transport.base import Addr
from hostlib.transport.memory import FakeNetwork, LinkModel

LANES = 8
WORKERS = 4
SLOTS = 4
# A round trip of the fake wire is 40 us; the timer waits at least 10 ms.
POLICY = RetryPolicy(timeout=0.02, min_timeout=0.01, max_timeout=0.5, deadline=30.0)


def _engines(python: Any, native: Any, unavailable: str | None) -> list[Any]:
    """The Python engine and the native one (skipped where it is not built)."""
    skip = pytest.mark.skipif(unavailable is not None, reason=str(unavailable))
    return [pytest.param(python, id="python"), pytest.param(native, id="native", marks=skip)]


ENGINES = _engines(InaAllreduce, NativeInaAllreduce, native_unavailable())


class DropOnce:
    """The pipeline behind a filter that loses the first copy of one packet."""

    def __init__(self, pipe: Pipeline, rank: int, seq: int) -> None:
        self.pipe, self.target, self.dropped = pipe, (rank, seq), 0

    def process(self, data: memoryview, src: Addr):  # type: ignore[no-untyped-def]
        _vt, _f, _job, rank, _e, _l, _p, _x, seq = HEADER.unpack_from(data)
        if (rank, seq) == self.target and not self.dropped:
            self.dropped += 1
            return None
        return self.pipe.process(data, src)


def _call(
    engine: type,
    stalls: list[tuple[float, float]],
    policy: RetryPolicy = POLICY,
    blocks: int = 200,
    drop: tuple[int, int] | None = None,
) -> tuple[list[Any], float]:
    """One int32 call of four workers with the machine stalled at ``stalls`` ((time,
    seconds), virtual); each worker's stats, and the virtual time it took."""
    rng = np.random.default_rng(7)
    pipe = Pipeline(LANES, slots=32)
    addrs = tuple((f"10.9.0.{r + 1}", 5000 + r) for r in range(WORKERS))
    pipe.add_job(JobConfig(4, addrs, SLOTS))
    switch: Any = pipe if drop is None else DropOnce(pipe, *drop)
    net = FakeNetwork(switch, FAKE_SWITCH, LinkModel(), seed=0)
    for at, seconds in stalls:
        net.stall(at, seconds)
    inputs = random_inputs(rng, np.int32, WORKERS, blocks * LANES)
    engines = {
        a: engine(JobSpec(4, r, WORKERS, FAKE_SWITCH, LANES, SLOTS), inputs[r],
                  np.zeros(SLOTS, np.int64), policy)
        for r, a in enumerate(addrs)
    }  # fmt: skip
    errors = net.run(engines)
    assert all(e is None for e in errors.values()), errors
    check_allreduce([np.array(engines[a].result()) for a in addrs], inputs)
    return [engines[a].stats for a in addrs], net.now


def _total(stats: list[Any], field: Callable[[Any], int]) -> int:
    return sum(field(s) for s in stats)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stall_of_the_whole_machine_sends_nothing_again(engine: type) -> None:
    stats, _ = _call(engine, [(0.001, 0.05)])
    assert _total(stats, lambda s: s.retransmitted) == 0
    # Every worker had its window out when the machine stopped, and served it late.
    assert all(s.late_timers == SLOTS for s in stats), [s.late_timers for s in stats]


@pytest.mark.parametrize("engine", ENGINES)
def test_without_the_rule_the_same_stall_retransmits_every_window(engine: type) -> None:
    off = RetryPolicy(
        timeout=0.02, min_timeout=0.01, max_timeout=0.5, deadline=30.0, late_timer=math.inf
    )
    stats, _ = _call(engine, [(0.001, 0.05)], policy=off)
    assert [s.retransmitted for s in stats] == [SLOTS] * WORKERS
    assert _total(stats, lambda s: s.late_timers) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stall_that_ends_before_the_timers_are_due_changes_nothing(engine: type) -> None:
    # The first window's timers (the initial timeout, 20 ms) are due at 20 ms.
    _, base_time = _call(engine, [])
    stats, elapsed = _call(engine, [(0.001, 0.005)])
    assert _total(stats, lambda s: s.retransmitted) == 0
    assert _total(stats, lambda s: s.late_timers) == 0
    assert elapsed == pytest.approx(base_time + 0.005)


# A stall that ends just after the timers of the packets in flight came due: at 1 ms
# those packets carry the floor timeout (10 ms, the round trip being 40 us), so they are
# due at about 11 ms, and served 0.1-0.3 ms late, under late_timer's 1 ms. Measured so on
# the VM: 10 ms with no scheduling on either core, a timer served 0.3 ms late.
STALL_UNTIL_DUE = (0.001, 0.0102)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_stall_that_ends_as_the_timers_come_due_sends_nothing_again(engine: type) -> None:
    stats, _ = _call(engine, [STALL_UNTIL_DUE])
    assert _total(stats, lambda s: s.retransmitted) == 0
    assert all(s.late_timers == SLOTS for s in stats), [s.late_timers for s in stats]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_waiting_engine_wakes_at_least_every_stall_check(engine: type) -> None:
    # Its first timer is due in 20 ms; the heartbeat wakes it 2.5 ms after each look at
    # the clock, so that a stall anywhere in a timer's life is seen. Off with the rule.
    def first_wakeup(policy: RetryPolicy) -> float:
        spec = JobSpec(4, 0, WORKERS, FAKE_SWITCH, LANES, SLOTS)
        call = engine(spec, np.ones(64, np.int32), np.zeros(SLOTS, np.int64), policy)
        call.start(1.0)
        return float(call.next_wakeup())

    assert first_wakeup(POLICY) == pytest.approx(1.0 + POLICY.stall_check)
    off = RetryPolicy(timeout=0.02, min_timeout=0.01, deadline=30.0, late_timer=math.inf)
    assert first_wakeup(off) == pytest.approx(1.0 + off.timeout)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_short_stall_inside_a_timers_life_is_not_counted(engine: type) -> None:
    # 0.8 ms is within late_timer * min_timeout (1 ms): scheduling noise, not a stall.
    stats, _ = _call(engine, [(0.001, 0.0008)], drop=(1, 100))
    assert stats[1].retransmitted == 1 and stats[1].late_timers == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_the_last_packet_lost_before_a_stall_is_recovered_a_timeout_later(engine: type) -> None:
    # Rank 1's last packet (seq 200) is lost, so no later result can reveal it: only its
    # timer can. The machine stalls before that timer is due.
    base, base_time = _call(engine, [], drop=(1, 200))
    assert base[1].retransmitted == 1 and base[1].fast_retransmitted == 0
    # Its timer (10 ms: the floor, far above the 40 us round trip) is due at base_time.
    resumed = base_time - 0.005 + 0.05
    stalled, stalled_time = _call(engine, [(base_time - 0.005, 0.05)], drop=(1, 200))
    assert stalled[1].retransmitted == 1
    assert stalled[1].late_timers == 1
    # Sent again one timeout after the machine resumed, answered a round trip later.
    assert stalled_time == pytest.approx(resumed + POLICY.min_timeout + 40e-6)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_timer_served_late_twice_fires(engine: type) -> None:
    # The first stall makes the window's timers late and re-arms them; the second
    # starts before they are due again and ends well after: they fire then.
    stats, _ = _call(engine, [(0.001, 0.05), (0.051, 0.05)])
    assert all(s.late_timers == SLOTS for s in stats)
    assert all(s.retransmitted == SLOTS for s in stats)


def test_a_stall_needs_a_time_and_a_duration() -> None:
    net = FakeNetwork(Pipeline(LANES, slots=32), FAKE_SWITCH)
    with pytest.raises(ValueError, match="stall"):
        net.stall(0.0, -1.0)


def test_late_timer_must_be_positive() -> None:
    with pytest.raises(ValueError, match="late_timer"):
        RetryPolicy(late_timer=0.0)
    with pytest.raises(ValueError, match="stall_check"):
        RetryPolicy(stall_check=0.0)


def test_the_stall_clock_counts_only_wakeups_later_than_asked() -> None:
    clock = StallClock(RetryPolicy(late_timer=0.1, min_timeout=0.01), now=1.0)
    clock.observe(1.0025, asked=1.0025)  # on time
    clock.observe(1.0039, asked=1.0030)  # 0.9 ms late: scheduling noise
    clock.observe(1.0200, asked=1.0065)  # 13.5 ms late: a stall
    clock.observe(1.0200, asked=1.0100)  # the same wake-up, served twice
    assert clock.stalled == pytest.approx(0.0135)
    assert clock.seen == 1.02


# ----------------------------------------------------------------- ring (p2p layer)
P2P = _engines(False, True, native_p2p_unavailable())


def _ring(native: bool, stalls: list[tuple[float, float]], policy: RetryPolicy = POLICY):  # type: ignore[no-untyped-def]
    """One int32 ring allreduce of four ranks (16 lanes, window 4) with the machine
    stalled at ``stalls``; each rank's stats."""
    rng = np.random.default_rng(3)
    addrs = [(f"10.1.0.{r + 1}", 7000 + r) for r in range(WORKERS)]
    kind: Any = NativeP2pEndpoint if native else P2pEndpoint
    endpoints = [kind(PeerSpec(r, tuple(addrs), 16, 4), policy) for r in range(WORKERS)]
    net = FakeNetwork(Router(addrs), ROUTER, LinkModel(), seed=0)
    for at, seconds in stalls:
        net.stall(at, seconds)
    inputs = random_inputs(rng, np.int32, WORKERS, 400 * 16)
    calls: dict[Any, Any] = {}
    for r, a in enumerate(addrs):
        if native:
            calls[a] = NativeCollectiveCall(endpoints[r], inputs[r], 0.05, lanes=16, window=4)
        else:
            calls[a] = RingCall(endpoints[r], inputs[r], 0.05, lanes=16, window=4)
    errors = net.run(calls)
    assert all(e is None for e in errors.values()), errors
    check_allreduce([np.array(calls[a].result()) for a in addrs], inputs)
    return [ep.stats for ep in endpoints]


@pytest.mark.parametrize("native", P2P)
def test_a_stall_sends_no_ring_packet_again(native: bool) -> None:
    stats = _ring(native, [(0.001, 0.05)])
    assert _total(stats, lambda s: s.retransmitted) == 0
    assert _total(stats, lambda s: s.late_timers) > 0


@pytest.mark.parametrize("native", P2P)
def test_without_the_rule_a_stall_makes_the_ring_send_again(native: bool) -> None:
    off = RetryPolicy(
        timeout=0.02, min_timeout=0.01, max_timeout=0.5, deadline=30.0, late_timer=math.inf
    )
    stats = _ring(native, [(0.001, 0.05)], policy=off)
    assert _total(stats, lambda s: s.retransmitted) > 0
    assert _total(stats, lambda s: s.late_timers) == 0


@pytest.mark.parametrize("native", P2P)
def test_a_stall_that_ends_as_the_ring_timers_come_due_sends_nothing_again(native: bool) -> None:
    stats = _ring(native, [STALL_UNTIL_DUE])
    assert [(s.retransmitted, s.late_timers) for s in stats] == [(0, SLOTS)] * WORKERS
