"""dynamiccl under contention for switch memory: the cost of the fallback's part of a call,
and the agent choosing between INA reserved, INA shared and the ring as the other jobs
come and go (issue #41, item 4).

The agent is the real one; the "world" is a deterministic function of the action and of
how much of the job's shared region another job holds, shaped on the star8_fallback
measurement (docs/results.md, 2026-11-30) with four jobs' share of a pool of one window: the
region all its own, the whole window (256) is fastest; the region held by another job, a
window of the reservation (64) is, since the shared three quarters then go to the
fallback's one link.
"""

from __future__ import annotations

import pytest

from dynamiccl.actions import Action
from dynamiccl.agent import Agent
from dynamiccl.contention import (
    CHANGE,
    Contention,
    ContentionError,
    fallback_floor,
    fallback_fraction,
)
from dynamiccl.model import DEFAULT_PROFILE, TopologySummary

SIZE = 16 << 20
WORKERS = 4
GBIT = 125e6  # bytes/s
RESERVED = Action("ina", 2048, 64)
SHARED = Action("ina", 2048, 256)
RING = Action("ring", 2048, 32)


def world(action: Action, blocked: float) -> float:
    """Seconds of one call: the star16_fallback shapes (a quarter of the pool 173-259 ms;
    the whole window alone 165 ms, at the fallback 691 ms and more; the ring 211-353 ms)."""
    if action == RING:
        return 0.300
    if action == RESERVED:
        return 0.230
    return 0.160 + blocked * 0.540


def reading(blocked: float) -> Contention:
    return Contention(reserved=64, shared=192, blocked=blocked, region_free=0)


def agent() -> Agent:
    topo = TopologySummary(link_bandwidth=GBIT)
    actions = {"allreduce": (RESERVED, SHARED, RING)}
    return Agent(DEFAULT_PROFILE, WORKERS, topo, actions, seed=1)


def run(agent: Agent, blocked: list[float], read: bool) -> list[Action]:
    """One call per entry of ``blocked`` (the other job's hold of the region at that
    call); the agent gets a reading per call when ``read``."""
    chosen = []
    for b in blocked:
        contention = reading(b) if read else None
        action = agent.decide("allreduce", SIZE, contention=contention).action
        agent.record("allreduce", SIZE, action, world(action, b))
        chosen.append(action)
    return chosen


def test_the_fallback_takes_the_blocked_share_and_whatever_lies_past_the_slots() -> None:
    c = Contention(reserved=128, shared=128, blocked=0.5)
    assert fallback_fraction(c, 128) == 0.0
    assert fallback_fraction(c, 256) == 0.25  # 64 of 256 slots held by another job
    assert fallback_fraction(c, 512) == pytest.approx((64 + 256) / 512)
    assert c.arm(128) == "reserved" and c.arm(129) == "shared"


def test_the_floor_is_every_workers_share_through_the_fallbacks_link() -> None:
    c = Contention(reserved=0, shared=256, blocked=1.0)
    # the measured case: a job wholly at the fallback, 4 x 16 MiB over 1 Gbit/s
    assert fallback_floor(c, 256, SIZE, WORKERS, GBIT) == pytest.approx(0.537, abs=1e-3)
    assert fallback_floor(c, 256, SIZE, WORKERS, None) == 0.0


@pytest.mark.parametrize(
    "kw",
    [{"reserved": -1}, {"reserved": 1, "blocked": 1.5}, {"reserved": 1, "fallback_share": -0.1}],
)
def test_a_reading_out_of_range_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ContentionError):
        Contention(**kw)  # type: ignore[arg-type]


def test_without_a_fallback_a_window_past_the_slots_cannot_run() -> None:
    c = Contention(reserved=64, shared=0, fallback=False)
    views = {v.action: v for v in agent().arms("allreduce", SIZE, contention=c)}
    assert not views[SHARED].available
    assert views[RESERVED].available and views[RING].available


def test_a_blocked_region_raises_the_shared_arms_prior_to_the_fallback_floor() -> None:
    views = {v.action: v for v in agent().arms("allreduce", SIZE, contention=reading(1.0))}
    free = {v.action: v for v in agent().arms("allreduce", SIZE, contention=reading(0.0))}
    floor = fallback_floor(reading(1.0), 256, SIZE, WORKERS, GBIT)
    assert views[SHARED].prior >= floor == pytest.approx(0.75 * 0.537, abs=1e-3)
    assert free[SHARED].prior < floor
    assert views[SHARED].fallback == 0.75 and views[RESERVED].fallback == 0.0
    assert views[RESERVED].prior == free[RESERVED].prior


def test_the_agent_takes_the_reservation_while_another_job_holds_the_region() -> None:
    chosen = run(agent(), [1.0] * 40, read=True)
    assert chosen[-16:].count(RESERVED) >= 15, chosen[-16:]


def test_the_agent_moves_to_the_shared_window_soon_after_the_region_frees() -> None:
    """The other job leaves at call 30: with readings the agent notices it at the next
    call (the blocked fraction moved by more than CHANGE) and re-explores the shared arm;
    without them, the reserved arm's times do not change and only a periodic refresh would
    try the shared arm again."""
    schedule = [1.0] * 30 + [0.0] * 30
    assert abs(schedule[0] - schedule[-1]) >= CHANGE
    informed = run(agent(), schedule, read=True)
    blind = run(agent(), schedule, read=False)
    first = informed[30:].index(SHARED)
    assert first <= 3, informed[30:]
    assert informed[-16:].count(SHARED) >= 15, informed[-16:]
    assert blind[30:].index(SHARED) > first if SHARED in blind[30:] else True
    assert sum(world(a, b) for a, b in zip(informed, schedule, strict=True)) < sum(
        world(a, b) for a, b in zip(blind, schedule, strict=True)
    )


def test_a_small_move_of_the_contention_keeps_what_was_learnt() -> None:
    a = agent()
    run(a, [0.0] * 20, read=True)
    before = {v.action: v.count for v in a.arms("allreduce", SIZE)}
    a.decide("allreduce", SIZE, contention=reading(CHANGE / 2))
    after = {v.action: v.count for v in a.arms("allreduce", SIZE)}
    assert after == before and after[SHARED] > 0
