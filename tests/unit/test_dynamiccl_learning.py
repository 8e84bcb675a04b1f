"""``dynamiccl.learning.AgreedLearner``: ranks that measure different times still decide
alike, because they learn only the times they agreed on (the maximum over ranks)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dynamiccl.actions import Action
from dynamiccl.learning import AgreedLearner
from dynamiccl.model import DEFAULT_PROFILE

CALLS = [("allreduce", 4 << 10), ("allreduce", 1 << 20), ("reduce_scatter", 1 << 20)]


def _ranks(n: int, sync_every: int = 4, state: Path | None = None) -> list[AgreedLearner]:
    ranks = [AgreedLearner(DEFAULT_PROFILE, n, sync_every=sync_every, state=state)
             for _ in range(n)]  # fmt: skip
    for r in ranks:
        r.bind(256, 32)
    return ranks


def _time(action: Action, size: int, rank: int, call: int) -> float:
    # Each rank its own, noisy, different time for the same call.
    base = {"ina": 2e-9, "ring": 1e-9, "tree": 1.5e-9}[action.algorithm] * size + 1e-4
    return base * (1.0 + 0.4 * rank) * (1.0 + 0.3 * math.sin(call * (rank + 1)))


def _step_all(ranks: list[AgreedLearner], call: int) -> list[str]:
    """One call on every rank: choose, observe its own time, agree when due."""
    chosen = []
    collective, size = CALLS[call % len(CALLS)]
    for r, learner in enumerate(ranks):
        action = learner.choose_call(collective, size)
        chosen.append(action.label)
        learner.observe(collective, size, action, _time(action, size, r, call))
    if ranks[0].due:
        mine = [[p.seconds for p in x.pending] for x in ranks]
        agreed = [max(vals) for vals in zip(*mine, strict=True)]
        for learner in ranks:
            learner.agree(lambda times, agreed=agreed: agreed)
    return chosen


def test_ranks_with_different_times_choose_alike() -> None:
    ranks = _ranks(4)
    for call in range(300):
        chosen = _step_all(ranks, call)
        assert len(set(chosen)) == 1, (call, chosen)
    assert ranks[0].recorded == 300 and ranks[0].agreements == 75
    assert ranks[0].agent is not None and ranks[0].agent.state() == ranks[3].agent.state()  # type: ignore[union-attr]


def test_learning_from_own_times_would_diverge() -> None:
    # The control: each rank recording its own times makes them choose differently, which
    # is why the learner agrees first (and why the test above can fail).
    ranks = _ranks(4)
    diverged = False
    for call in range(300):
        collective, size = CALLS[call % len(CALLS)]
        chosen = []
        for r, learner in enumerate(ranks):
            action = learner.choose_call(collective, size)
            chosen.append(action.label)
            learner.observe(collective, size, action, _time(action, size, r, call))
            learner.agree(lambda times: times)  # its own times, at once
        diverged |= len(set(chosen)) > 1
    assert diverged


def test_a_saved_state_continues(tmp_path: Path) -> None:
    ranks = _ranks(2, state=None)
    for call in range(60):
        _step_all(ranks, call)
    ranks[0].save_to = tmp_path / "agent.json"
    assert ranks[0].save() == tmp_path / "agent.json"
    resumed = _ranks(2, state=tmp_path / "agent.json")
    assert resumed[0].agent is not None and resumed[0].agent.learn
    before = resumed[0].agent.state()
    for call in range(60):
        _step_all(resumed, call)
    after = resumed[0].agent.state()
    calls = {(c["collective"], c["bucket"]): c["calls"] for c in before["contexts"]}
    assert all(c["calls"] > calls[c["collective"], c["bucket"]] for c in after["contexts"])


def test_bad_use_is_refused() -> None:
    with pytest.raises(ValueError, match="sync_every"):
        AgreedLearner(DEFAULT_PROFILE, 4, sync_every=0)
    learner = AgreedLearner(DEFAULT_PROFILE, 4)
    with pytest.raises(RuntimeError, match="bind"):
        learner.choose(1024)
    learner.bind(256, 32)
    action = learner.choose(1024)
    with pytest.raises(ValueError, match="finite"):
        learner.observe("allreduce", 1024, action, math.nan)
    learner.observe("allreduce", 1024, action, 0.001)
    with pytest.raises(ValueError, match="agreed on 2 times for 1 calls"):
        learner.agree(lambda times: [0.1, 0.2])
    assert AgreedLearner(DEFAULT_PROFILE, 4).save() is None  # not asked to save
