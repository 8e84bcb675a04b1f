"""The decision: which algorithm runs one collective, as a pure function and an online learner.

:func:`choose` is pure: the same collective, size, workers, network summary, profile and
observations give the same :class:`Decision`, with no global state. Observed call times
(an exponentially weighted mean per algorithm and power-of-two size bucket) replace the
model's prediction once a bucket has ``min_samples`` of them, so a miscalibrated
profile is corrected by what the job actually sees.

:class:`Policy` wraps it for one job (fixed workers and network): it records call times,
explores rarely (epsilon-greedy with a seeded RNG, so a run is reproducible), and never
picks INA when the job has no switch slots or the switch is unreachable: like ATP's
best-effort aggregation, the job then falls back to the ring and keeps going.

Every rank of a job must make the same choice for the same call (the collective only
completes if all ranks run the same algorithm). :func:`choose` guarantees that for equal
inputs; a :class:`Policy` per rank does too when every rank constructs it with the same
seed and records the same times (e.g. the slowest rank's, agreed on by the job), or
when one rank decides and the others follow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from dynamiccl.model import (
    ALGORITHMS,
    COLLECTIVES,
    Estimate,
    Profile,
    TopologySummary,
    estimate_all,
)

__all__ = [
    "FALLBACK",
    "Decision",
    "Observations",
    "Observed",
    "Policy",
    "choose",
    "format_seconds",
    "size_bucket",
]

FALLBACK = "ring"
"""What runs when nothing else can: it needs no switch state and has no size limit."""

_PREFERENCE = ("ring", "tree", "ina")
"""Tie order: on equal times keep the switch's slots for jobs that need them more."""


def size_bucket(size_bytes: int) -> int:
    """The power of two at or below ``size_bytes``: observations are kept per bucket.

    Raises:
        ValueError: ``size_bytes`` not positive.
    """
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise ValueError(f"size must be a positive number of bytes, got {size_bytes!r}")
    return 1 << (size_bytes.bit_length() - 1)


@dataclass(frozen=True)
class Observed:
    """Measured times of one algorithm in one size bucket.

    Attributes:
        mean: exponentially weighted mean, seconds.
        count: calls recorded.
    """

    mean: float
    count: int

    def update(self, seconds: float, weight: float) -> Observed:
        """This with one more call of ``seconds`` (the newest counts ``weight``)."""
        if self.count == 0:
            return Observed(seconds, 1)
        return Observed((1.0 - weight) * self.mean + weight * seconds, self.count + 1)


Observations = Mapping[tuple[str, int], Observed]
"""(algorithm, :func:`size_bucket`) -> :class:`Observed`."""


@dataclass(frozen=True)
class Decision:
    """The chosen algorithm for one call and why.

    Attributes:
        algorithm: one of :data:`~dynamiccl.model.ALGORITHMS`.
        predicted: seconds per algorithm (``math.inf``: unavailable), model or observed.
        reason: one line for a person.
        sources: per algorithm, ``model`` or ``observed`` (where ``predicted`` came from).
        estimates: the model's breakdown per algorithm.
        explored: True when an online :class:`Policy` tried something other than the
            best, to keep its observations fresh.
    """

    algorithm: str
    predicted: Mapping[str, float]
    reason: str
    sources: Mapping[str, str] = field(default_factory=dict)
    estimates: Mapping[str, Estimate] = field(default_factory=dict, compare=False)
    explored: bool = False

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready view (infinite times as None)."""
        return {
            "algorithm": self.algorithm,
            "reason": self.reason,
            "explored": self.explored,
            "predicted_seconds": {
                a: (t if math.isfinite(t) else None) for a, t in self.predicted.items()
            },
            "sources": dict(self.sources),
            "bounds": {a: e.bound for a, e in self.estimates.items()},
        }


def choose(
    collective: str,
    size_bytes: int,
    workers: int,
    topology_summary: TopologySummary | None,
    profile: Profile,
    observations: Observations | None = None,
    *,
    ina_available: bool = True,
    min_samples: int = 3,
) -> Decision:
    """The fastest algorithm for one collective call.

    Args:
        collective: one of :data:`~dynamiccl.model.COLLECTIVES`.
        size_bytes: the message, bytes.
        workers: ranks taking part.
        topology_summary: what the network adds (None: the profile's own set-up).
        profile: the model's constants.
        observations: measured times per (algorithm, size bucket); a bucket with at
            least ``min_samples`` calls replaces the model's prediction.
        ina_available: False when the job may not use the switch (no slots granted,
            switch unreachable): INA is then never chosen.
        min_samples: calls before an observation is trusted over the model.

    Raises:
        ValueError: unknown collective, non-positive size or workers, min_samples < 1.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
    if min_samples < 1:
        raise ValueError(f"min_samples must be at least 1, got {min_samples}")
    estimates = estimate_all(
        size_bytes, workers, profile, topology_summary, ina_available=ina_available
    )
    bucket = size_bucket(size_bytes)
    seen = observations or {}
    predicted: dict[str, float] = {}
    sources: dict[str, str] = {}
    for algo, est in estimates.items():
        obs = seen.get((algo, bucket))
        if est.available and obs is not None and obs.count >= min_samples:
            predicted[algo], sources[algo] = obs.mean, "observed"
        else:
            predicted[algo], sources[algo] = est.seconds, "model"
    best = min(_PREFERENCE, key=lambda a: (predicted[a], _PREFERENCE.index(a)))
    if not math.isfinite(predicted[best]):
        best = FALLBACK
    reason = _reason(best, predicted, sources, estimates)
    return Decision(best, predicted, reason, sources, estimates)


def format_seconds(seconds: float) -> str:
    """``seconds`` to three significant digits in s, ms or us, as a decision's reason
    shows a time; ``n/a`` for one that is not finite (an algorithm that cannot run)."""
    if not math.isfinite(seconds):
        return "n/a"
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def _reason(
    best: str,
    predicted: Mapping[str, float],
    sources: Mapping[str, str],
    estimates: Mapping[str, Estimate],
) -> str:
    est = estimates[best]
    others = [a for a in ALGORITHMS if a != best]
    versus = ", ".join(
        f"{a} {format_seconds(predicted[a])}" for a in others if math.isfinite(predicted[a])
    )
    text = f"{best} {format_seconds(predicted[best])} ({sources[best]})"
    text += f" vs {versus}" if versus else ""
    if sources[best] == "model" and est.seconds > 0:
        if est.latency >= est.transfer + est.stalls:
            text += f"; latency-bound ({est.latency / est.seconds:.0%} in steps)"
        else:
            text += f"; bandwidth-bound ({est.bound} limit)"
    gone = [f"{a} {estimates[a].bound}" for a in others if not math.isfinite(predicted[a])]
    if gone:
        text += "; " + "; ".join(gone)
    return text


class Policy:
    """The online decision for one job: :func:`choose` plus what the job has measured.

    Args:
        profile: the model's constants.
        workers: the job's ranks.
        topology_summary: the job's network (None: the profile's own set-up).
        collective: the collective decided for.
        ina_available: whether the job holds switch slots and reaches the switch.
        epsilon: probability of trying another available algorithm (0: never).
        seed: seed of the exploration RNG (same seed, same calls -> same decisions).
        weight: weight of the newest sample in the moving mean, in (0, 1].
        min_samples: calls before a bucket's mean replaces the model.
        max_regret: never explore an algorithm predicted this many times slower than
            the best (a 1 GiB ring "just to see" is too expensive to learn from).

    Raises:
        ValueError: epsilon outside [0, 1], weight outside (0, 1], max_regret < 1.
    """

    def __init__(
        self,
        profile: Profile,
        workers: int,
        topology_summary: TopologySummary | None = None,
        *,
        collective: str = "allreduce",
        ina_available: bool = True,
        epsilon: float = 0.02,
        seed: int = 0,
        weight: float = 0.25,
        min_samples: int = 3,
        max_regret: float = 4.0,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        if max_regret < 1.0:
            raise ValueError(f"max_regret must be at least 1, got {max_regret}")
        self.profile = profile
        self.workers = workers
        self.topology_summary = topology_summary
        self.collective = collective
        self.epsilon = epsilon
        self.weight = weight
        self.min_samples = min_samples
        self.max_regret = max_regret
        self._ina_available = ina_available
        self._unavailable_reason = ""
        self._rng = random.Random(seed)
        self._observed: dict[tuple[str, int], Observed] = {}

    @property
    def observations(self) -> Mapping[tuple[str, int], Observed]:
        """A copy of what has been recorded."""
        return dict(self._observed)

    @property
    def ina_available(self) -> bool:
        return self._ina_available

    def set_ina_available(self, available: bool, reason: str = "") -> None:
        """Allow or forbid INA from now on (slots revoked, switch unreachable, restored)."""
        self._ina_available = available
        self._unavailable_reason = "" if available else reason

    def decide(self, size_bytes: int) -> Decision:
        """The algorithm for the next call of ``size_bytes``; sometimes an exploration.

        Raises:
            ValueError: non-positive size.
        """
        decision = choose(
            self.collective,
            size_bytes,
            self.workers,
            self.topology_summary,
            self.profile,
            self._observed,
            ina_available=self._ina_available,
            min_samples=self.min_samples,
        )
        if self._unavailable_reason:
            decision = _with_reason(decision, f"{decision.reason}; {self._unavailable_reason}")
        if self.epsilon == 0.0 or self._rng.random() >= self.epsilon:
            return decision
        best = decision.predicted[decision.algorithm]
        candidates = [
            a
            for a in ALGORITHMS
            if a != decision.algorithm
            and math.isfinite(decision.predicted[a])
            and decision.predicted[a] <= self.max_regret * max(best, 1e-9)
        ]
        if not candidates:
            return decision
        pick = self._rng.choice(candidates)
        reason = f"exploring {pick} (best: {decision.reason})"
        return Decision(
            pick,
            decision.predicted,
            reason,
            decision.sources,
            decision.estimates,
            explored=True,
        )

    def choose(self, size_bytes: int) -> str:
        """The algorithm's name only: ``dynamiccl.torch_backend``'s ``Chooser`` protocol."""
        return self.decide(size_bytes).algorithm

    def record(self, algorithm: str, size_bytes: int, seconds: float) -> None:
        """Add one measured call.

        Raises:
            ValueError: unknown algorithm, non-positive size, negative or non-finite time.
        """
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
        key = (algorithm, size_bucket(size_bytes))
        self._observed[key] = self._observed.get(key, Observed(0.0, 0)).update(seconds, self.weight)


def _with_reason(decision: Decision, reason: str) -> Decision:
    return Decision(
        decision.algorithm,
        decision.predicted,
        reason,
        decision.sources,
        decision.estimates,
        decision.explored,
    )
