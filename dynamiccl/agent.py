"""The online agent: per collective call, the whole configuration (DynamICCL's part).

State: the call's collective and power-of-two size bucket (the *context*), fixed per
agent the job's workers and network summary, and what the job observes: each action's
recent times in the context, retransmissions, and whether the switch is reachable and
has free slots. Action: an :class:`~dynamiccl.actions.Action` (algorithm, packet width,
window). Reward: minus the call's time.

Method: a contextual bandit whose arms start from the cost model's prior, chosen over
Q-learning because a collective call does not change the state the next call sees (no
delayed reward to propagate), while the arms' times are strongly structured by size,
which the model captures:

1. **Prior.** :func:`predict` is the model's time for each action (:mod:`dynamiccl.model`,
   with the action's packet width and window). Observed times correct it twice: in the
   context itself, an arm's measured mean replaces its prediction; in a context where an
   arm has not run, its prediction is scaled by its measured/predicted ratio in the
   nearest size bucket where it ran (at most :data:`_NEAR_OCTAVES` powers of two away), so
   a profile that is 10x optimistic for the ring is corrected after the first ring calls,
   not per bucket.
2. **Exploration budget.** In a new context the agent tries, once each, ``budget`` arms
   within ``max_regret`` of the best corrected prior (never a hopeless arm "just to see"):
   each algorithm's best first, then each one's next best (the model separates algorithms
   better than packet widths); afterwards it is greedy on the measured means, each
   raised by the call-to-call noise over the square root of its calls (one lucky call of
   a rarely tried arm does not unseat a well-measured one). Every
   ``refresh`` greedy calls it re-tries one other arm once (an untried one believed within
   2x of the best, else the measured one that could most plausibly be faster), so an arm
   that became faster, one the budget left out, or one a single unlucky call misjudged is
   noticed. The cost is bounded and stated: at most ``budget`` exploratory calls per
   context, then one in ``refresh`` (default 16: at most 6% over the best arm once
   converged).
3. **Change detection.** When the chosen arm's time leaves its mean by more than a
   factor ``change_ratio`` on ``patience`` consecutive calls, the context forgets its
   means and explores its budget again: a link
   that drops from 1000 to 100 Mbit/s, or a second job taking the switch's slots, is
   re-learnt within ``budget`` calls of being noticed.
4. **Safety.** INA and CollNet arms are never chosen when the switch is unreachable or
   has fewer free slots than the arm's window; the ring (the best ring arm) is the
   fallback, which needs no switch state.

Every rank of a job must run the same action: an agent per rank makes the same decisions
when each records the same times (e.g. the slowest rank's); or one rank decides. The
agent keeps its state per job (``job``) and saves it as JSON (:meth:`Agent.save`,
:meth:`Agent.load`); every decision explains itself (:meth:`AgentDecision.to_dict`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dynamiccl.actions import (
    ALL_COLLECTIVES,
    Action,
    ActionError,
    algorithms_for,
    parse_action,
)
from dynamiccl.contention import CHANGE, Contention, fallback_floor, fallback_fraction
from dynamiccl.model import (
    AlgoParams,
    Profile,
    TopologySummary,
    byte_coefficient,
    estimate,
    read_json,
)
from dynamiccl.policy import format_seconds, size_bucket

__all__ = [
    "AGENT_SCHEMA",
    "Agent",
    "AgentDecision",
    "AgentError",
    "ArmView",
    "predict",
]

AGENT_SCHEMA = 1
"""Version of :meth:`Agent.save`'s JSON."""


_REFRESH_REGRET = 2.0
"""A refresh re-tries only arms believed at most this many times slower than the best:
with ``refresh`` = 16 a converged agent spends at most (2 - 1) / 16 = 6% over the best arm
on refreshes, and far less when the re-tried arm is close (the usual case)."""

_CALL_NOISE = 0.15
"""Call-to-call spread of one action's time, relative (measured here: 10-20% between
iterations of the same static configuration on a loaded 2-core loopback, tp-dp-mix)."""

_NEAR_OCTAVES = 2
"""How far (in powers of two of size) an arm's measured model error is carried to a size
bucket where it was not measured: the model's error changes with size (latency- against
bandwidth-bound), so only neighbours are trusted."""


class AgentError(ValueError):
    """A saved agent that cannot be read, or does not fit the job it is loaded for."""


def predict(
    action: Action,
    collective: str,
    size_bytes: int,
    workers: int,
    profile: Profile,
    topology: TopologySummary | None = None,
) -> float:
    """The cost model's time of one call with ``action`` (``math.inf``: cannot run).

    The model's per-algorithm alpha and beta are used with the action's packet width and
    window. hostlib's software cost is per packet (measured on loopback: the ring with
    256-lane packets 6.3x slower than with 2048), so beta, measured at the profile's
    ``packet_bytes``, scales by ``profile.packet_bytes / action.packet_bytes``; the window
    bounds every algorithm to ``window`` packets per round trip (the step's alpha plus
    twice the delay) and sets how many losses overlap.
    CollNet is modelled as INA (its switch leg); ``reduce_scatter`` and ``all_gather`` on
    the ring are half a ring allreduce (``n - 1`` of its ``2(n - 1)`` steps and bytes);
    INA's ``reduce_scatter`` is an INA allreduce.

    Raises:
        ActionError: the action's algorithm does not run ``collective``.
        ValueError: non-positive size or workers.
    """
    if action.algorithm not in algorithms_for(collective):
        raise ActionError(f"{action.algorithm} does not run {collective}")
    model_algo = "ina" if action.algorithm == "collnet" else action.algorithm
    params = profile.params(model_algo)
    per_packet = profile.packet_bytes / action.packet_bytes
    tuned = replace(
        profile.with_params(model_algo, AlgoParams(params.alpha, params.beta * per_packet)),
        packet_bytes=action.packet_bytes,
        window=action.window,
    )
    topo = topology if topology is not None else TopologySummary()
    if model_algo == "ina":
        slots = action.window if topo.slots is None else min(topo.slots, action.window)
        topo = replace(topo, slots=slots)
    est = estimate(model_algo, size_bytes, workers, tuned, topo)
    if not est.available:
        return math.inf
    seconds = est.seconds
    if model_algo != "ina":  # the model bounds INA's window itself; a peer's window too
        rtt = tuned.params(model_algo).alpha + 2.0 * topo.delay
        moved = byte_coefficient(model_algo, workers) * size_bytes
        windowed = moved * rtt / (action.window * action.packet_bytes)
        seconds += max(0.0, windowed - est.transfer)
    if collective != "allreduce" and model_algo != "ina":
        return seconds / 2.0
    return seconds


@dataclass
class _Arm:
    mean: float = 0.0
    count: int = 0
    drift: int = 0  # consecutive calls outside the change band
    retx: float = 0.0  # retransmissions per call, the same moving mean

    def add(self, seconds: float, retransmissions: int, weight: float) -> None:
        first = self.count == 0
        self.mean = seconds if first else (1 - weight) * self.mean + weight * seconds
        self.retx = (
            retransmissions if first else (1 - weight) * self.retx + weight * retransmissions
        )
        self.count += 1


@dataclass
class _Context:
    arms: dict[Action, _Arm] = field(default_factory=dict)
    greedy_calls: int = 0
    changes: int = 0
    calls: int = 0
    pending: dict[Action, int] = field(default_factory=dict)  # decided, not yet recorded


@dataclass(frozen=True)
class ArmView:
    """One action as the agent saw it for a decision.

    Attributes:
        action: the action.
        model: the cost model's time (seconds; inf: cannot run).
        prior: the model's time corrected by what other contexts taught about this arm.
        observed: the context's measured mean (None: not tried since the last change).
        count: calls measured in the context since the last change.
        retransmissions: the measured mean of retransmissions per call (None: untried).
        available: False when the switch is unreachable or short of slots for it.
        fallback: the fraction of the arm's packets the job's contention sends to the
            fallback aggregator (0 without a reading, or for an arm that needs no switch).
    """

    action: Action
    model: float
    prior: float
    observed: float | None
    count: int
    available: bool
    retransmissions: float | None = None
    fallback: float = 0.0

    @property
    def estimate(self) -> float:
        """What the agent believes: the observed mean, else the corrected prior."""
        return self.observed if self.observed is not None else self.prior

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.label,
            "model_seconds": _finite(self.model),
            "prior_seconds": _finite(self.prior),
            "observed_seconds": self.observed,
            "count": self.count,
            "retransmissions": self.retransmissions,
            "available": self.available,
            "fallback": self.fallback,
        }


@dataclass(frozen=True)
class AgentDecision:
    """The action for one call and why.

    Attributes:
        action: what runs.
        phase: ``explore`` (trying a candidate of the budget), ``exploit`` (the best
            estimate), ``refresh`` (the periodic re-try of another candidate),
            ``re-explore`` (exploring after a detected change), ``model`` (a model-only
            agent: its prior, or what it measured before it was frozen).
        reason: one line for a person.
        collective: the call's collective.
        size_bytes: the call's size.
        bucket: the size bucket (context).
        arms: every action considered, best estimate first.
    """

    action: Action
    phase: str
    reason: str
    collective: str
    size_bytes: int
    bucket: int
    arms: tuple[ArmView, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (infinite times as None)."""
        return {
            "action": self.action.to_dict() | {"label": self.action.label},
            "phase": self.phase,
            "reason": self.reason,
            "collective": self.collective,
            "size_bytes": self.size_bytes,
            "bucket": self.bucket,
            "arms": [a.to_dict() for a in self.arms],
        }


class Agent:
    """The online agent of one job (see the module docstring for the method).

    Args:
        profile: the cost model's constants (the prior).
        workers: the job's ranks.
        topology: the job's network summary (None: the profile's own set-up).
        actions: per collective, the actions the set-up can run
            (:func:`~dynamiccl.actions.action_space`); at least one ring action each.
        job: the job's name (saved state is per job).
        seed: seeds the refresh choice (same seed and times, same decisions).
        learn: False: a model-only agent, which never explores and ignores times.
        budget: candidate arms explored once per context (>= 1).
        refresh: greedy calls between re-tries of another candidate (0: never).
        max_regret: candidates are within this factor of the best corrected prior.
        weight: weight of the newest call in an arm's mean, in (0, 1].
        change_ratio: a call this many times slower or faster than the chosen arm's mean
            counts towards a change (> 1).
        patience: consecutive such calls that declare a change (>= 1).

    Raises:
        ValueError: a parameter out of range, an unknown collective, or a collective
            without a ring action.
    """

    def __init__(
        self,
        profile: Profile,
        workers: int,
        topology: TopologySummary | None,
        actions: Mapping[str, Sequence[Action]],
        *,
        job: str = "job",
        seed: int = 0,
        learn: bool = True,
        budget: int = 4,
        refresh: int = 16,
        max_regret: float = 3.0,
        weight: float = 0.3,
        change_ratio: float = 1.5,
        patience: int = 2,
    ) -> None:
        _check_params(workers, budget, refresh, max_regret, weight, change_ratio, patience)
        self.actions = _check_actions(actions)
        self.profile = profile
        self.workers = workers
        self.topology = topology
        self.job = job
        self.seed = seed
        self.learn = learn
        self.budget = budget
        self.refresh = refresh
        self.max_regret = max_regret
        self.weight = weight
        self.change_ratio = change_ratio
        self.patience = patience
        self._rng = random.Random(seed)
        self._contexts: dict[tuple[str, int], _Context] = {}
        self._model_cache: dict[tuple[str, int, Action], float] = {}
        self._blocked: float | None = None  # the contention the shared arms ran under

    # ------------------------------------------------------------------ deciding
    def decide(
        self,
        collective: str,
        size_bytes: int,
        *,
        free_slots: int | None = None,
        switch_reachable: bool = True,
        contention: Contention | None = None,
    ) -> AgentDecision:
        """The action for the next call of ``collective`` on ``size_bytes``.

        Args:
            collective: one of the agent's collectives.
            size_bytes: the call's size.
            free_slots: the job's slots the switch can give now (None: unknown, assumed
                enough); an INA or CollNet arm needs at least its window.
            switch_reachable: False: no INA or CollNet arm is chosen.
            contention: the job's reading of the switch memory it shares
                (:func:`~dynamiccl.contention.read_contention`; None: none shared). A
                window within the reservation is an "INA reserved" arm, a wider one an
                "INA shared" arm, whose prior is at least the fallback's floor for the
                part of it the reading sends there; when the blocked fraction has moved
                by :data:`~dynamiccl.contention.CHANGE` since the shared arms last ran,
                their times are forgotten and explored again.

        Raises:
            ValueError: unknown collective or non-positive size.
        """
        if contention is not None and self.learn:
            self._see(contention)
        arms = self.arms(collective, size_bytes, free_slots=free_slots,
                         switch_reachable=switch_reachable, contention=contention)  # fmt: skip
        bucket = size_bucket(size_bytes)
        # Never empty: every collective has a ring action (checked at construction),
        # which needs no switch and always has a finite prediction.
        usable = [a for a in arms if a.available and math.isfinite(a.estimate)]
        if not self.learn:
            best = usable[0]
            source = "model" if best.observed is None else f"measured over {best.count}"
            reason = f"{best.action.label} {format_seconds(best.estimate)} ({source})"
            reason += _versus(best, usable)
            return AgentDecision(best.action, "model", reason, collective, size_bytes, bucket, arms)
        ctx = self._contexts.setdefault((collective, bucket), _Context())
        pick, phase = self._pick(ctx, usable)
        ctx.pending[pick.action] = ctx.pending.get(pick.action, 0) + 1
        reason = self._reason(pick, phase, usable, ctx)
        return AgentDecision(pick.action, phase, reason, collective, size_bytes, bucket, arms)

    def arms(
        self,
        collective: str,
        size_bytes: int,
        *,
        free_slots: int | None = None,
        switch_reachable: bool = True,
        contention: Contention | None = None,
    ) -> tuple[ArmView, ...]:
        """Every action of ``collective`` with the agent's view of it, best first
        (``contention``: see :meth:`decide`).

        Raises:
            ValueError: unknown collective or non-positive size.
        """
        if collective not in self.actions:
            raise ValueError(
                f"the agent has no actions for {collective!r} (it has: {', '.join(self.actions)})"
            )
        bucket = size_bucket(size_bytes)
        ctx = self._contexts.get((collective, bucket))
        views = []
        for action in self.actions[collective]:
            model = self._model(collective, bucket, action)
            prior = model * self._correction(collective, bucket, action)
            arm = ctx.arms.get(action) if ctx is not None else None
            observed = arm.mean if arm is not None and arm.count else None
            ok = _switch_ok(action, free_slots, switch_reachable)
            share = 0.0
            if contention is not None and action.needs_switch:
                ok = ok and contention.usable(action.window)
                share = fallback_fraction(contention, action.window)
                floor = self._floor(contention, action, size_bytes)
                model, prior = max(model, floor), max(prior, floor)
            retx = arm.retx if arm is not None and arm.count else None
            count = arm.count if arm else 0
            views.append(ArmView(action, model, prior, observed, count, ok, retx, share))
        return tuple(
            sorted(views, key=lambda v: (not v.available, v.estimate, *_prior_order(v)[1:]))
        )

    def _floor(self, contention: Contention, action: Action, size_bytes: int) -> float:
        """The fallback link's floor under ``action`` (0 when the link is unshaped)."""
        bandwidth = None if self.topology is None else self.topology.link_bandwidth
        return fallback_floor(contention, action.window, size_bytes, self.workers, bandwidth)

    def _see(self, contention: Contention) -> None:
        """Take a contention reading: when its blocked fraction has moved by
        :data:`~dynamiccl.contention.CHANGE` or more since the last one, every context
        forgets its shared arms' times (measured under the old contention), counts a
        change and explores again."""
        before, self._blocked = self._blocked, contention.blocked
        if before is None or abs(contention.blocked - before) < CHANGE:
            return
        for ctx in self._contexts.values():
            stale = [a for a in ctx.arms if a.needs_switch and a.window > contention.reserved]
            if not stale:
                continue
            for action in stale:
                del ctx.arms[action]
            ctx.changes += 1
            ctx.greedy_calls = 0

    def _pick(self, ctx: _Context, usable: list[ArmView]) -> tuple[ArmView, str]:
        candidates = self._candidates(usable)
        # Decided but not yet recorded counts as tried: a job may decide a whole
        # iteration's calls before it measures any of them.
        untried = [v for v in candidates if v.count == 0 and not ctx.pending.get(v.action)]
        if untried:
            return untried[0], "re-explore" if ctx.changes else "explore"
        observed = [v for v in usable if v.observed is not None]
        if not observed:  # every candidate decided, none measured yet
            return min(candidates, key=_prior_order), "exploit"
        best = min(observed, key=lambda v: (_cautious(v), v.action))
        ctx.greedy_calls += 1
        if self.refresh and ctx.greedy_calls % self.refresh == 0:
            other = self._refresh_arm(usable, best)
            if other is not None:
                return other, "refresh"
        return best, "exploit"

    def _candidates(self, usable: list[ArmView]) -> list[ArmView]:
        """The budget's arms: within ``max_regret`` of the best prior, the best arm of
        each algorithm first (the model knows algorithms better than packet widths), then
        each algorithm's next best, and so on."""
        best_prior = min(v.prior for v in usable)
        near = sorted((v for v in usable if v.prior <= self.max_regret * best_prior),
                      key=_prior_order)  # fmt: skip
        rank: dict[str, int] = {}
        keyed = []
        for v in near:
            k = rank.get(v.action.algorithm, 0)
            rank[v.action.algorithm] = k + 1
            keyed.append((k, _prior_order(v), v))
        return [v for *_, v in sorted(keyed, key=lambda t: t[:2])][: self.budget]

    def _refresh_arm(self, usable: list[ArmView], best: ArmView) -> ArmView | None:
        """Another arm to re-try once: an untried one within :data:`_REFRESH_REGRET` of the
        best estimate (best prior first), else the measured one within it that could most
        plausibly be faster (its mean lowered by the noise over the square root of its
        calls; the seeded RNG breaks ties)."""
        limit = _REFRESH_REGRET * best.estimate
        pool = [v for v in usable if v.action != best.action and v.estimate <= limit]
        untried = [v for v in pool if v.observed is None]
        if untried:
            return min(untried, key=_prior_order)
        return min(pool, key=lambda v: (_hopeful(v), self._rng.random())) if pool else None

    def choose_call(self, collective: str, size_bytes: int) -> Action:
        """The action alone: the torch backend's chooser protocol
        (``dynamiccl.torch_backend.Chooser``). Every rank must decide alike, so a chooser
        shared by ranks should be frozen (:meth:`frozen`): it records nothing."""
        return self.decide(collective, size_bytes).action

    def choose(self, size_bytes: int) -> Action:
        """:meth:`choose_call` for an allreduce."""
        return self.choose_call("allreduce", size_bytes)

    def frozen(self) -> Agent:
        """This agent as a model-only one that keeps what it learnt: it decides by its
        measured means where it has them (its prior elsewhere), explores nothing and
        ignores new times, so every rank holding a copy decides the same way."""
        twin = Agent._from_state(self.state(), self.profile, self.topology, None, None)
        twin.learn = False
        return twin

    # ------------------------------------------------------------------ learning
    def record(
        self,
        collective: str,
        size_bytes: int,
        action: Action,
        seconds: float,
        *,
        retransmissions: int = 0,
    ) -> None:
        """One measured call (its time over every rank: the slowest rank's).

        A model-only agent ignores it. Retransmissions are kept per arm for explanations
        (their cost is already in ``seconds``: a lossy arm is slow, and a burst of loss
        moves its time out of the change band).

        Raises:
            ValueError: unknown collective or action, a negative or non-finite time.
        """
        if collective not in self.actions or action not in self.actions[collective]:
            raise ValueError(f"{action} is not one of the agent's actions for {collective!r}")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
        if retransmissions < 0:
            raise ValueError(f"retransmissions must be >= 0, got {retransmissions}")
        if not self.learn:
            return
        bucket = size_bucket(size_bytes)
        ctx = self._contexts.setdefault((collective, bucket), _Context())
        ctx.calls += 1
        if ctx.pending.get(action):
            ctx.pending[action] -= 1
        arm = ctx.arms.setdefault(action, _Arm())
        if self._changed(arm, seconds):
            ctx.arms = {}
            ctx.changes += 1
            ctx.greedy_calls = 0
            arm = ctx.arms.setdefault(action, _Arm())
        arm.add(seconds, retransmissions, self.weight)

    def _changed(self, arm: _Arm, seconds: float) -> bool:
        if arm.count < 2 or arm.mean <= 0:
            return False
        ratio = seconds / arm.mean
        if ratio > self.change_ratio or ratio < 1.0 / self.change_ratio:
            arm.drift += 1
        else:
            arm.drift = 0
        return arm.drift >= self.patience

    def _correction(self, collective: str, bucket: int, action: Action) -> float:
        """observed / model for ``action`` in the nearest other size bucket where it was
        measured (within :data:`_NEAR_OCTAVES`), 1 when there is none."""
        best: tuple[int, float] | None = None
        for (coll, other), ctx in self._contexts.items():
            arm = ctx.arms.get(action)
            if coll != collective or other == bucket or arm is None or not arm.count:
                continue
            distance = abs(other.bit_length() - bucket.bit_length())
            model = self._model(collective, other, action)
            near = distance <= _NEAR_OCTAVES and math.isfinite(model) and model > 0
            if near and (best is None or distance < best[0]):
                best = (distance, arm.mean / model)
        return 1.0 if best is None else best[1]

    def _model(self, collective: str, bucket: int, action: Action) -> float:
        key = (collective, bucket, action)
        if key not in self._model_cache:
            self._model_cache[key] = predict(
                action, collective, bucket, self.workers, self.profile, self.topology
            )
        return self._model_cache[key]

    # ------------------------------------------------------------------ explaining
    def _reason(self, pick: ArmView, phase: str, usable: list[ArmView], ctx: _Context) -> str:
        source = f"observed over {pick.count}" if pick.observed is not None else "prior"
        text = f"{pick.action.label} {format_seconds(pick.estimate)} ({source})"
        if phase in ("explore", "re-explore"):
            tried = sum(1 for v in usable if v.count)
            text = f"{phase} {tried + 1}/{self.budget}: {text}"
            if ctx.changes:
                text += f"; {ctx.changes} change(s) detected in this context"
        elif phase == "refresh":
            text = f"refresh (every {self.refresh} calls): {text}"
        return text + _versus(pick, usable)

    def state(self) -> dict[str, Any]:
        """The agent's learnt state as a JSON-ready document (what :meth:`save` writes)."""
        contexts = []
        for (collective, bucket), ctx in sorted(self._contexts.items()):
            contexts.append({
                "collective": collective,
                "bucket": bucket,
                "calls": ctx.calls,
                "greedy_calls": ctx.greedy_calls,
                "changes": ctx.changes,
                "arms": {a.label: {"mean": arm.mean, "count": arm.count, "drift": arm.drift,
                                   "retx": arm.retx}
                         for a, arm in sorted(ctx.arms.items())},
            })  # fmt: skip
        return {
            "schema": AGENT_SCHEMA,
            "job": self.job,
            "workers": self.workers,
            "seed": self.seed,
            "learn": self.learn,
            "params": {
                "budget": self.budget,
                "refresh": self.refresh,
                "max_regret": self.max_regret,
                "weight": self.weight,
                "change_ratio": self.change_ratio,
                "patience": self.patience,
            },
            "actions": {c: [a.label for a in acts] for c, acts in self.actions.items()},
            "contexts": contexts,
        }

    def save(self, path: str | Path) -> None:
        """Write :meth:`state` as JSON.

        Raises:
            OSError: the file cannot be written.
        """
        Path(path).write_text(json.dumps(self.state(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(
        cls,
        path: str | Path,
        profile: Profile,
        topology: TopologySummary | None = None,
        *,
        job: str | None = None,
        workers: int | None = None,
    ) -> Agent:
        """An agent with the state :meth:`save` wrote (profile and network are given anew:
        they are inputs, not learnt).

        Args:
            path: the saved state.
            profile: the cost model's constants.
            topology: the network summary.
            job: refuse a state saved for another job (None: take the saved one).
            workers: refuse a state saved for another worker count (None: the saved one).

        Raises:
            AgentError: unreadable, not an agent's state, or for another job or workers.
        """
        file = Path(path)
        doc = read_json(file, "agent state", AgentError)
        try:
            return cls._from_state(doc, profile, topology, job, workers)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, AgentError):
                raise AgentError(f"{file}: {exc}") from None
            raise AgentError(f"{file}: not an agent state ({type(exc).__name__}: {exc})") from None

    @classmethod
    def _from_state(
        cls,
        doc: Any,
        profile: Profile,
        topology: TopologySummary | None,
        job: str | None,
        workers: int | None,
    ) -> Agent:
        if not isinstance(doc, Mapping) or doc.get("schema") != AGENT_SCHEMA:
            raise AgentError(f"schema is not {AGENT_SCHEMA} (an agent saved by another inalab?)")
        if job is not None and doc["job"] != job:
            raise AgentError(f"saved for job {doc['job']!r}, not {job!r}")
        if workers is not None and doc["workers"] != workers:
            raise AgentError(f"saved for {doc['workers']} workers, not {workers}")
        actions = {c: [parse_action(t) for t in labels] for c, labels in doc["actions"].items()}
        agent = cls(profile, int(doc["workers"]), topology, actions, job=str(doc["job"]),
                    seed=int(doc["seed"]), learn=bool(doc["learn"]), **doc["params"])  # fmt: skip
        for item in doc["contexts"]:
            ctx = _Context(greedy_calls=int(item["greedy_calls"]), changes=int(item["changes"]),
                           calls=int(item["calls"]))  # fmt: skip
            for label, arm in item["arms"].items():
                ctx.arms[parse_action(label)] = _Arm(
                    float(arm["mean"]), int(arm["count"]), int(arm["drift"]), float(arm["retx"])
                )
            agent._contexts[(str(item["collective"]), int(item["bucket"]))] = ctx
        return agent


def _check_params(
    workers: int,
    budget: int,
    refresh: int,
    max_regret: float,
    weight: float,
    change_ratio: float,
    patience: int,
) -> None:
    checks = (
        ("workers", workers >= 1),
        ("budget", budget >= 1),
        ("refresh", refresh >= 0),
        ("max_regret", max_regret >= 1.0),
        ("weight", 0.0 < weight <= 1.0),
        ("change_ratio", change_ratio > 1.0),
        ("patience", patience >= 1),
    )
    for name, ok in checks:
        if not ok:
            raise ValueError(f"{name} out of range")


def _check_actions(actions: Mapping[str, Sequence[Action]]) -> dict[str, tuple[Action, ...]]:
    checked: dict[str, tuple[Action, ...]] = {}
    for collective, acts in actions.items():
        if collective not in ALL_COLLECTIVES:
            raise ValueError(
                f"unknown collective {collective!r} (known: {', '.join(ALL_COLLECTIVES)})"
            )
        unique = tuple(dict.fromkeys(acts))
        if not any(a.algorithm == "ring" for a in unique):
            raise ValueError(f"{collective}: the actions need a ring action (the fallback)")
        checked[collective] = unique
    if not checked:
        raise ValueError("the agent needs actions for at least one collective")
    return checked


def _switch_ok(action: Action, free_slots: int | None, reachable: bool) -> bool:
    if not action.needs_switch:
        return True
    if not reachable:
        return False
    return free_slots is None or free_slots >= action.window


def _cautious(v: ArmView) -> float:
    """An arm's measured mean, raised by :data:`_CALL_NOISE` over the square root of its
    calls: one lucky call of a rarely tried arm does not unseat an arm measured many
    times, while a real difference larger than the noise still does."""
    assert v.observed is not None
    return v.observed * (1.0 + _CALL_NOISE / math.sqrt(max(v.count, 1)))


def _hopeful(v: ArmView) -> float:
    """The other side of :func:`_cautious`: the mean lowered by the noise over the square
    root of the calls (how fast the arm might really be)."""
    assert v.observed is not None
    return v.observed * (1.0 - _CALL_NOISE / math.sqrt(max(v.count, 1)))


def _prior_order(v: ArmView) -> tuple[float, int, int, str]:
    """Best prior first; on a tie (the model rarely separates widths) the wider packet and
    the deeper window, which cost fewer per-packet overheads."""
    return (v.prior, -v.action.lanes, -v.action.window, v.action.algorithm)


def _finite(seconds: float) -> float | None:
    return seconds if math.isfinite(seconds) else None


def _versus(pick: ArmView, usable: Sequence[ArmView]) -> str:
    others = [v for v in usable if v.action != pick.action][:2]
    if not others:
        return ""
    return " vs " + ", ".join(f"{v.action.label} {format_seconds(v.estimate)}" for v in others)
