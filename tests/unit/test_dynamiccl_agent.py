"""The online agent (dynamiccl.agent) in a simulated environment with a known optimum.

The environment is a table of true times per (action, size) with seeded multiplicative
noise; the model's prior (the shipped default profile) is deliberately not the truth, so
the agent must learn. A change of the environment mid-run (a link drop making INA slow,
a competing job making it fast again) must be detected and re-learnt within the stated
budget.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from dynamiccl.actions import Action, ActionError, action_space, parse_action
from dynamiccl.agent import Agent, AgentError, predict
from dynamiccl.model import DEFAULT_PROFILE, TopologySummary

WORKERS = 4
SIZES = (4096, 1 << 20, 16 << 20)

ACTIONS = {
    "allreduce": action_space(
        "allreduce", switch_lanes=2048, slots=32, algorithms=("ina", "ring", "tree")
    ),
    "reduce_scatter": action_space("reduce_scatter", switch_lanes=2048, slots=32),
    "all_gather": action_space("all_gather", switch_lanes=2048, slots=32),
}

Truth = Callable[[Action, str, int], float]


def truth_before(action: Action, collective: str, size: int) -> float:
    """Ground truth: the ring best for large sizes, the tree for small (any width and
    window: the message is one packet), INA in between; at 1 MiB and 16 MiB the best arm is
    the only one with 2048 lanes and a window of 32, every other at least 30% slower. Not
    what the model predicts."""
    base = {"ring": 1.0, "tree": 1.6, "ina": 1.4, "collnet": 1.5}[action.algorithm]
    if size <= 4096:
        base = {"ring": 3.0, "tree": 1.0, "ina": 2.0, "collnet": 2.5}[action.algorithm]
    elif size <= 1 << 20:
        base = {"ring": 1.5, "tree": 2.0, "ina": 1.0, "collnet": 1.5}[action.algorithm]
    if size <= 4096:  # one packet: width and window do not matter
        knobs = 1.0
    elif action.needs_switch:  # INA's lanes are the switch's: only the window matters
        knobs = 1.0 if action.window == 32 else 1.3
    else:  # wide packets and a deep window: fewer per-packet costs, the pipe full
        knobs = 1.0 if (action.lanes, action.window) == (2048, 32) else 1.3
    return base * knobs * (1e-4 + size * 1e-8)


def truth_after(action: Action, collective: str, size: int) -> float:
    """The network changed: INA is 5x slower everywhere (e.g. a competing job took the
    switch), so the ring wins the mid sizes too (by 33% over the tree: the agent treats
    arms within its call-to-call noise allowance, 15%, as equals)."""
    t = truth_before(action, collective, size)
    return 5 * t if action.needs_switch else t


def optimum(truth: Truth, collective: str, size: int) -> Action:
    return min(ACTIONS[collective], key=lambda a: truth(a, collective, size))


def is_optimal(truth: Truth, action: Action, size: int) -> bool:
    best = truth(optimum(truth, "allreduce", size), "allreduce", size)
    return truth(action, "allreduce", size) <= 1.001 * best


def run(agent: Agent, truth: Truth, calls: int, rng: random.Random, collective: str = "allreduce",
        noise: float = 0.1) -> list[tuple[int, Action, str]]:  # fmt: skip
    """``calls`` calls cycling through SIZES; returns (size, action, phase) per call."""
    out = []
    for i in range(calls):
        size = SIZES[i % len(SIZES)]
        decision = agent.decide(collective, size)
        seconds = truth(decision.action, collective, size) * (1 + noise * (2 * rng.random() - 1))
        agent.record(collective, size, decision.action, seconds)
        out.append((size, decision.action, decision.phase))
    return out


def new_agent(**kw: object) -> Agent:
    return Agent(DEFAULT_PROFILE, WORKERS, TopologySummary(), ACTIONS, **kw)  # type: ignore[arg-type]


def test_converges_within_budget_to_the_known_optimum() -> None:
    agent = new_agent(budget=4)
    trace = run(agent, truth_before, 3 * 40, random.Random(1))
    for size in SIZES:
        mine = [(a, p) for s, a, p in trace if s == size]
        explored = [p for _, p in mine if p == "explore"]
        assert len(explored) <= agent.budget
        late = [a for a, p in mine[agent.budget + 2 :] if p == "exploit"]
        assert late and all(is_optimal(truth_before, a, size) for a in late), (size, late)
        # The budget is honoured afterwards: one refresh per `refresh` greedy calls.
        assert sum(p == "refresh" for _, p in mine) <= len(mine) // agent.refresh + 1


def test_reconverges_after_the_environment_changes() -> None:
    agent = new_agent(budget=4, patience=2)
    rng = random.Random(2)
    run(agent, truth_before, 3 * 30, rng)
    trace = run(agent, truth_after, 3 * 40, rng)
    for size in SIZES:
        mine = [(a, p) for s, a, p in trace if s == size]
        # Noticed within `patience` calls, re-explored within the budget, then exploited.
        settle = agent.patience + agent.budget + 2
        late = [a for a, p in mine[settle:] if p == "exploit"]
        assert late and all(is_optimal(truth_after, a, size) for a in late), (size, late)
    mid = [a for s, a, _ in trace if s == 1 << 20]
    assert mid[0].algorithm == "ina"  # INA was the mid-size choice before the change
    assert sum(not is_optimal(truth_after, a, 1 << 20) for a in mid) <= agent.budget + 2


def test_a_change_of_the_chosen_arm_is_detected_and_re_explored() -> None:
    # Everything 3x slower (a link drop): the chosen arm's times leave its mean, the
    # context forgets its stale means and explores its budget again.
    agent = new_agent(budget=4, patience=2)
    rng = random.Random(5)
    run(agent, truth_before, 3 * 20, rng, noise=0.0)
    slower: Truth = lambda a, c, s: 3 * truth_before(a, c, s)  # noqa: E731
    trace = run(agent, slower, 3 * 30, rng, noise=0.0)
    for size in SIZES:
        phases = [p for s, _, p in trace if s == size]
        assert phases.count("re-explore") == agent.budget - 1, phases  # its arm is measured
        assert all(is_optimal(slower, a, size) for s, a, p in trace[-6:] if s == size)
    assert all(c["changes"] == 1 for c in agent.state()["contexts"])


def test_regret_after_convergence_is_small() -> None:
    agent = new_agent()
    rng = random.Random(3)
    run(agent, truth_before, 60, rng)
    trace = run(agent, truth_before, 300, rng, noise=0.0)
    taken = sum(truth_before(a, "allreduce", s) for s, a, _ in trace)
    best = sum(truth_before(optimum(truth_before, "allreduce", s), "allreduce", s)
               for s, _, _ in trace)  # fmt: skip
    assert taken / best < 1.05  # within 5% of the per-call oracle once converged


def test_never_chooses_the_switch_without_it_or_without_slots() -> None:
    agent = new_agent(budget=len(ACTIONS["allreduce"]), max_regret=1e9)
    for i in range(60):
        size = SIZES[i % 3]
        d = agent.decide("allreduce", size, switch_reachable=False)
        assert not d.action.needs_switch
        agent.record("allreduce", size, d.action, truth_before(d.action, "allreduce", size))
        d = agent.decide("allreduce", size, free_slots=8)
        assert not d.action.needs_switch or d.action.window <= 8
        agent.record("allreduce", size, d.action, truth_before(d.action, "allreduce", size))
        d = agent.decide("allreduce", size, free_slots=0)
        assert not d.action.needs_switch
        agent.record("allreduce", size, d.action, truth_before(d.action, "allreduce", size))


def test_model_only_agent_follows_the_prior_and_ignores_times() -> None:
    agent = new_agent(learn=False)
    first = [agent.decide("allreduce", s) for s in SIZES]
    for d in first:
        agent.record("allreduce", d.size_bytes, d.action, 1e6)  # absurd times: ignored
        assert d.phase == "model"
        finite = [a for a in d.arms if a.available and math.isfinite(a.prior)]
        best = min(a.prior for a in finite)
        assert d.action in [a.action for a in finite if a.prior == best]
        # On a tie the widest packet and deepest window (fewest per-packet costs).
        tied = [a.action for a in finite if a.prior == best]
        assert d.action == max(tied, key=lambda a: (a.lanes, a.window))
    assert [agent.decide("allreduce", s).action for s in SIZES] == [d.action for d in first]


def test_batched_decisions_explore_distinct_arms() -> None:
    # A replay decides a whole iteration before measuring it: the budget's arms are
    # spread over the iteration's calls instead of one arm for all of them.
    agent = new_agent(budget=3)
    picks = [agent.decide("allreduce", 1 << 20) for _ in range(6)]
    explored = [d.action for d in picks if d.phase == "explore"]
    assert len(explored) == 3 and len(set(explored)) == 3
    assert all(d.phase == "exploit" for d in picks[3:])


def test_save_and_load_keep_what_was_learnt(tmp_path: Path) -> None:
    agent = new_agent(job="job-7", seed=5)
    rng = random.Random(4)
    run(agent, truth_before, 90, rng)
    path = tmp_path / "agent.json"
    agent.save(path)
    again = Agent.load(path, DEFAULT_PROFILE, TopologySummary(), job="job-7", workers=WORKERS)
    assert again.state() == agent.state()
    for size in SIZES:  # the same next decisions
        assert again.decide("allreduce", size).action == agent.decide("allreduce", size).action
    json.loads(path.read_text())  # plain JSON
    with pytest.raises(AgentError, match="job"):
        Agent.load(path, DEFAULT_PROFILE, job="other")
    with pytest.raises(AgentError, match="saved for 4 workers, not 8"):
        Agent.load(path, DEFAULT_PROFILE, workers=8)
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(AgentError, match="not JSON"):
        Agent.load(bad, DEFAULT_PROFILE)
    bad.write_text(json.dumps({"schema": 1}))
    with pytest.raises(AgentError, match=r"bad\.json"):
        Agent.load(bad, DEFAULT_PROFILE)


def test_decisions_explain_themselves() -> None:
    agent = new_agent()
    d = agent.decide("allreduce", 1 << 20)
    doc = d.to_dict()
    json.dumps(doc)
    assert doc["phase"] == "explore" and doc["action"]["label"] == d.action.label
    assert {a["action"] for a in doc["arms"]} == {a.label for a in ACTIONS["allreduce"]}
    assert d.action.label in d.reason


def test_collectives_use_their_own_actions() -> None:
    agent = new_agent()
    assert agent.decide("all_gather", 1 << 20).action.algorithm == "ring"
    assert agent.decide("reduce_scatter", 1 << 20).action.algorithm in ("ina", "ring")
    with pytest.raises(ValueError, match="ring"):
        Agent(DEFAULT_PROFILE, 4, None, {"allreduce": [Action("ina", 64, 8)]})
    with pytest.raises(ValueError, match="not one of"):
        agent.record("all_gather", 4096, Action("ina", 2048, 8), 1.0)


def test_action_labels_and_space() -> None:
    a = Action("ring", 256, 8)
    assert parse_action(a.label) == a
    for bad in ("ring", "ring/l0/w8", "magic/l64/w8", "ring/l64/w0"):
        with pytest.raises(ActionError):
            parse_action(bad)
    space = action_space("allreduce", switch_lanes=64, slots=8, window_choices=(4, 32))
    assert Action("ina", 64, 8) in space and Action("ina", 64, 32) not in space
    assert all(x.lanes == 64 for x in space if x.needs_switch)
    assert {x.algorithm for x in action_space("all_gather", switch_lanes=64, slots=8)} == {"ring"}


def test_prediction_prices_windows_and_collectives() -> None:
    topo = TopologySummary(link_bandwidth=12.5e6, delay=0.005)
    small = predict(Action("ina", 2048, 2), "allreduce", 16 << 20, 4, DEFAULT_PROFILE, topo)
    large = predict(Action("ina", 2048, 32), "allreduce", 16 << 20, 4, DEFAULT_PROFILE, topo)
    assert small > large  # a window of 2 packets cannot fill a 10 ms round trip
    ar = predict(Action("ring", 2048, 32), "allreduce", 16 << 20, 4, DEFAULT_PROFILE, topo)
    rs = predict(Action("ring", 2048, 32), "reduce_scatter", 16 << 20, 4, DEFAULT_PROFILE, topo)
    assert rs == pytest.approx(ar / 2)
    with pytest.raises(ActionError):
        predict(Action("tree", 2048, 32), "all_gather", 4096, 4, DEFAULT_PROFILE)


def test_frozen_agent_decides_by_what_it_learnt_and_learns_nothing(tmp_path: Path) -> None:
    agent = new_agent()
    run(agent, truth_before, 90, random.Random(6), noise=0.0)
    frozen = agent.frozen()
    for size in SIZES:
        pick = frozen.choose(size)
        assert is_optimal(truth_before, pick, size)
        frozen.record("allreduce", size, pick, 1e6)  # ignored
        assert frozen.choose(size) == pick
        assert frozen.decide("allreduce", size).phase == "model"
    # What the torch backend builds from INALAB_CHOOSER=agent.
    from dynamiccl.torch_backend import chooser_from_env

    path = tmp_path / "agent.json"
    agent.save(path)
    env = {"INALAB_CHOOSER": "agent", "INALAB_AGENT_STATE": str(path), "WORLD_SIZE": "4",
           "INALAB_AGENT_FROZEN": "1"}  # fmt: skip
    chooser = chooser_from_env(env)
    assert [chooser.choose(s) for s in SIZES] == [frozen.choose(s) for s in SIZES]
    with pytest.raises(ValueError, match="INALAB_AGENT_STATE"):
        chooser_from_env({"INALAB_CHOOSER": "agent", "WORLD_SIZE": "4", "INALAB_AGENT_FROZEN": "1"})
    # Without FROZEN the agent learns inside the job, from the saved state or from scratch.
    from dynamiccl.learning import AgreedLearner

    learning = chooser_from_env({k: v for k, v in env.items() if k != "INALAB_AGENT_FROZEN"})
    assert isinstance(learning, AgreedLearner) and learning.state_path == path
    scratch = chooser_from_env({"INALAB_CHOOSER": "agent", "WORLD_SIZE": "4"})
    assert isinstance(scratch, AgreedLearner) and scratch.state_path is None


def test_retransmissions_are_kept_per_arm_and_explained(tmp_path: Path) -> None:
    agent = new_agent()
    d = agent.decide("allreduce", 1 << 20)
    agent.record("allreduce", 1 << 20, d.action, 0.01, retransmissions=12)
    view = next(a for a in agent.arms("allreduce", 1 << 20) if a.action == d.action)
    assert view.retransmissions == 12 and view.to_dict()["retransmissions"] == 12
    path = tmp_path / "a.json"
    agent.save(path)
    again = Agent.load(path, DEFAULT_PROFILE)
    assert (
        next(a for a in again.arms("allreduce", 1 << 20) if a.action == d.action).retransmissions
        == 12
    )
    with pytest.raises(ValueError, match="retransmissions"):
        agent.record("allreduce", 1 << 20, d.action, 0.01, retransmissions=-1)
