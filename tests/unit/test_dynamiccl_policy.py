"""dynamiccl.policy: the pure decision and the online policy around it."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.model import ALGORITHMS, DEFAULT_PROFILE, AlgoParams, Profile, TopologySummary
from dynamiccl.policy import Decision, Observed, Policy, choose, size_bucket
from hostlib.protocol import MAX_WORKERS

# Crafted so each algorithm wins somewhere: INA has the lowest latency (one step of 5 us)
# but the worst per-byte time; the ring the best per-byte time but 2(n-1) slow steps.
INA_FAST_START = Profile(
    ina=AlgoParams(alpha=5e-6, beta=10e-9),
    ring=AlgoParams(alpha=50e-6, beta=0.1e-9),
    tree=AlgoParams(alpha=50e-6, beta=1e-9),
    switch_rate=1e15,
    source="test",
)
# The other way round: INA is the bandwidth algorithm, the tree the latency one.
INA_FAST_BULK = Profile(
    ina=AlgoParams(alpha=1e-3, beta=0.1e-9),
    ring=AlgoParams(alpha=1e-3, beta=10e-9),
    tree=AlgoParams(alpha=1e-6, beta=10e-9),
    switch_rate=1e15,
    source="test",
)

workers = st.integers(2, MAX_WORKERS)
sizes = st.integers(1, 1 << 34)


def _choose(size: int, n: int = 8, profile: Profile = INA_FAST_START, **kw: object) -> Decision:
    return choose("allreduce", size, n, None, profile, **kw)  # type: ignore[arg-type]


def test_small_messages_pick_the_lowest_latency_and_large_the_highest_bandwidth() -> None:
    assert _choose(8).algorithm == "ina"
    assert _choose(1 << 30).algorithm == "ring"
    assert _choose(8, profile=INA_FAST_BULK).algorithm == "tree"
    assert _choose(1 << 30, profile=INA_FAST_BULK).algorithm == "ina"


@given(n=workers)
def test_extremes_follow_latency_and_bandwidth_for_any_worker_count(n: int) -> None:
    tiny = _choose(1, n, INA_FAST_BULK)
    huge = _choose(1 << 34, n, INA_FAST_BULK)
    assert tiny.algorithm == "tree" and huge.algorithm == "ina"


def test_the_crossover_is_where_the_model_says() -> None:
    # ina: 5us + 10ns*S; ring at n=2: 2*50us + 0.1ns*S -> equal at S = 95us / 9.9ns
    crossover = 95e-6 / 9.9e-9
    assert _choose(int(crossover * 0.9), 2).algorithm == "ina"
    assert _choose(int(crossover * 1.1), 2).algorithm == "ring"


@given(size=sizes, n=workers, reachable=st.booleans())
def test_ina_is_never_chosen_without_slots(size: int, n: int, reachable: bool) -> None:
    summary = TopologySummary(slots=0, switch_reachable=reachable)
    decision = choose("allreduce", size, n, summary, INA_FAST_BULK)
    assert decision.algorithm != "ina"
    assert decision.predicted["ina"] == math.inf


@given(size=sizes, n=workers)
def test_ina_is_never_chosen_when_unreachable_or_disabled(size: int, n: int) -> None:
    gone = TopologySummary(switch_reachable=False)
    assert choose("allreduce", size, n, gone, INA_FAST_BULK).algorithm != "ina"
    assert _choose(size, n, INA_FAST_BULK, ina_available=False).algorithm != "ina"


def test_unavailable_ina_explains_itself() -> None:
    decision = choose("allreduce", 1 << 30, 8, TopologySummary(slots=0), INA_FAST_BULK)
    assert decision.algorithm in ("ring", "tree")
    assert "ina unavailable: no free switch slots" in decision.reason
    assert decision.to_dict()["predicted_seconds"]["ina"] is None  # type: ignore[index]


def test_observed_ina_outside_the_switch_is_ignored() -> None:
    fast = {("ina", size_bucket(4096)): Observed(1e-9, 100)}
    decision = _choose(4096, ina_available=False, observations=fast)
    assert decision.algorithm != "ina" and decision.sources["ina"] == "model"


@given(size=sizes, n=workers, flag=st.booleans())
def test_choose_is_a_pure_function(size: int, n: int, flag: bool) -> None:
    obs = MappingProxyType({("ring", size_bucket(size)): Observed(1.0, 5)})
    first = _choose(size, n, DEFAULT_PROFILE, observations=obs, ina_available=flag)
    again = _choose(size, n, DEFAULT_PROFILE, observations=obs, ina_available=flag)
    assert first == again
    assert first.algorithm in ALGORITHMS
    assert dict(obs) == {("ring", size_bucket(size)): Observed(1.0, 5)}


def test_observations_replace_the_model_after_enough_samples() -> None:
    bucket = size_bucket(8)
    two = {("ina", bucket): Observed(1.0, 2)}
    three = {("ina", bucket): Observed(1.0, 3)}
    assert _choose(8, observations=two).algorithm == "ina"  # still the model's
    decision = _choose(8, observations=three)
    assert decision.sources["ina"] == "observed" and decision.predicted["ina"] == 1.0
    assert decision.algorithm != "ina"
    assert _choose(8, observations=two, min_samples=2).algorithm != "ina"


def test_ties_keep_the_switch_free() -> None:
    same = Profile(
        ina=AlgoParams(1e-3, 0.0),
        ring=AlgoParams(0.5e-3, 0.0),
        tree=AlgoParams(0.5e-3, 0.0),
        switch_rate=1e15,
    )
    assert _choose(4096, 2, same).algorithm == "ring"  # all three take 1 ms


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        choose("alltoall", 4096, 4, None, DEFAULT_PROFILE)
    with pytest.raises(ValueError, match="size"):
        _choose(0)
    with pytest.raises(ValueError, match="min_samples"):
        _choose(4096, min_samples=0)


@pytest.mark.parametrize(
    ("size", "bucket"), [(1, 1), (2, 2), (3, 2), (4096, 4096), (4097, 4096), (8191, 4096)]
)
def test_size_buckets_are_powers_of_two(size: int, bucket: int) -> None:
    assert size_bucket(size) == bucket


# ----------------------------------------------------------------- the online policy


def test_policy_without_exploration_is_the_pure_choice() -> None:
    policy = Policy(INA_FAST_START, 8, epsilon=0.0)
    for size in (8, 4096, 1 << 20, 1 << 30):
        assert policy.decide(size) == _choose(size)
        assert policy.choose(size) == _choose(size).algorithm


def test_policy_is_deterministic_under_a_seed() -> None:
    def run(seed: int) -> list[tuple[str, bool]]:
        policy = Policy(INA_FAST_START, 8, epsilon=0.3, seed=seed, max_regret=1e9)
        out = []
        for i in range(200):
            d = policy.decide(1 << (i % 30))
            out.append((d.algorithm, d.explored))
            policy.record(d.algorithm, 1 << (i % 30), 1e-3 * (i % 7))
        return out

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert any(explored for _, explored in run(1))


def test_policy_explores_only_affordable_available_algorithms() -> None:
    policy = Policy(INA_FAST_START, 8, epsilon=1.0, max_regret=1e9, ina_available=False)
    seen = {policy.decide(1 << 20).algorithm for _ in range(50)}
    assert "ina" not in seen and seen <= {"ring", "tree"}
    # with a tight regret bound the far slower algorithms are never tried
    tight = Policy(INA_FAST_START, 8, epsilon=1.0, max_regret=1.0)
    assert all(not tight.decide(1 << 30).explored for _ in range(20))


def test_policy_learns_from_measured_times() -> None:
    policy = Policy(INA_FAST_START, 8, epsilon=0.0, min_samples=3)
    assert policy.decide(8).algorithm == "ina"
    for _ in range(3):
        policy.record("ina", 8, 0.5)  # much slower than the model's 5 us
    decision = policy.decide(8)
    assert decision.algorithm != "ina" and decision.sources["ina"] == "observed"


def test_record_keeps_an_exponentially_weighted_mean() -> None:
    policy = Policy(DEFAULT_PROFILE, 4, weight=0.5)
    policy.record("ring", 5000, 1.0)
    policy.record("ring", 4096, 3.0)  # same bucket
    assert policy.observations[("ring", 4096)] == Observed(2.0, 2)
    with pytest.raises(ValueError, match="unknown algorithm"):
        policy.record("gloo", 4096, 1.0)
    with pytest.raises(ValueError, match="seconds"):
        policy.record("ring", 4096, math.nan)


def test_losing_the_switch_falls_back_to_the_ring() -> None:
    policy = Policy(INA_FAST_BULK, 8, epsilon=0.0)
    assert policy.decide(1 << 30).algorithm == "ina"
    policy.set_ina_available(False, "switch unreachable (timeout)")
    decision = policy.decide(1 << 30)
    assert decision.algorithm == "ring" and "switch unreachable" in decision.reason
    policy.set_ina_available(True)
    assert policy.decide(1 << 30).algorithm == "ina" and policy.ina_available


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": 1.5}, "epsilon"),
        ({"weight": 0.0}, "weight"),
        ({"max_regret": 0.5}, "max_regret"),
    ],
)
def test_policy_rejects_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy(DEFAULT_PROFILE, 4, **kwargs)  # type: ignore[arg-type]
