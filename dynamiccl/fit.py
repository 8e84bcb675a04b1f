"""Calibration: fit a :class:`~dynamiccl.model.Profile` to measured allreduce times.

``inalab calibrate`` measures; this module only fits. Each algorithm's alpha and beta
come from a non-negative least-squares fit of the model's own form,
``seconds = alpha * steps(algo, n) + beta * byte_coefficient(algo, n) * size``, with
every row divided by its measured time: the fit minimises *relative* error, so a 4 KiB
call (all latency) weighs as much as a 1 GiB one (all bandwidth) and alpha is not lost
in the large sizes' absolute residuals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from dynamiccl.model import (
    ALGORITHMS,
    DEFAULT_PROFILE,
    AlgoParams,
    Profile,
    byte_coefficient,
    steps,
)

__all__ = ["FitError", "Measurement", "fit_algorithm", "fit_profile"]


class FitError(ValueError):
    """Measurements that cannot determine a fit; the message says which and why."""


@dataclass(frozen=True)
class Measurement:
    """One measured allreduce, the record ``inalab calibrate`` produces.

    Attributes:
        algorithm: ``ina``, ``ring`` or ``tree`` (Gloo's allreduce is measured as ``ring``).
        size_bytes: the message, bytes (> 0).
        workers: ranks taking part (>= 1).
        seconds: time per call (> 0), e.g. the slowest rank's mean as ``inalab bench``
            reports it, on the set-up the profile describes, without added loss.
    """

    algorithm: str
    size_bytes: int
    workers: int
    seconds: float

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise FitError(f"unknown algorithm {self.algorithm!r} (known: {', '.join(ALGORITHMS)})")
        if isinstance(self.size_bytes, bool) or self.size_bytes <= 0:
            raise FitError(f"size_bytes must be positive, got {self.size_bytes!r}")
        if isinstance(self.workers, bool) or self.workers < 1:
            raise FitError(f"workers must be at least 1, got {self.workers!r}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise FitError(f"seconds must be positive and finite, got {self.seconds!r}")


def fit_algorithm(algorithm: str, points: Iterable[Measurement]) -> AlgoParams:
    """Alpha and beta of one algorithm from its measurements (non-negative, relative LSQ).

    Raises:
        FitError: fewer than two points with different sizes (or step counts), or a
            point of another algorithm.
    """
    rows = list(points)
    if any(p.algorithm != algorithm for p in rows):
        raise FitError(f"fit_algorithm({algorithm!r}) given another algorithm's points")
    features = np.array(
        [
            [steps(algorithm, p.workers), byte_coefficient(algorithm, p.workers) * p.size_bytes]
            for p in rows
        ],
        dtype=float,
    ).reshape(-1, 2)
    if len(rows) < 2 or np.linalg.matrix_rank(features) < 2:
        raise FitError(
            f"{algorithm}: need points at two sizes at least to separate alpha from beta "
            f"(got {len(rows)} point(s))"
        )
    seconds = np.array([p.seconds for p in rows], dtype=float)
    a = features / seconds[:, None]
    b = np.ones(len(rows))
    alpha, beta = _nnls2(a, b)
    return AlgoParams(alpha=alpha, beta=beta)


def _nnls2(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Least squares ``a @ x ~ b`` with ``x >= 0``, two unknowns: the unconstrained
    solution if feasible, else the better of the two one-unknown fits (the active sets)."""
    x, *_ = np.linalg.lstsq(a, b, rcond=None)
    if (x >= 0).all():
        return float(x[0]), float(x[1])
    best: tuple[float, float, float] | None = None
    for k in (0, 1):
        col = a[:, k]
        norm = float(col @ col)
        value = max(0.0, float(col @ b) / norm) if norm > 0 else 0.0
        residual = float(np.sum((col * value - b) ** 2))
        if best is None or residual < best[0]:
            best = (residual, value if k == 0 else 0.0, value if k == 1 else 0.0)
    assert best is not None  # the loop runs twice
    return best[1], best[2]


def fit_profile(
    measurements: Iterable[Measurement],
    base: Profile = DEFAULT_PROFILE,
    *,
    switch_rate: float | None = None,
    source: str = "fitted",
) -> Profile:
    """A profile with alpha and beta fitted for every algorithm that has measurements.

    Algorithms without measurements keep ``base``'s constants, and so do the loss,
    timeout, packet and window settings.

    Args:
        measurements: the points, in any order.
        base: where unfitted values come from.
        switch_rate: the switch's aggregation rate (bytes/s of contributions). None:
            take the switch as the INA bottleneck of the calibration (true of the soft
            switch, one Python process): the most workers measured divided by INA's
            fitted beta; without INA points, ``base``'s.
        source: the profile's ``source`` text.

    Raises:
        FitError: an algorithm's points cannot determine a fit (see :func:`fit_algorithm`),
            or no measurements at all.
    """
    points = list(measurements)
    if not points:
        raise FitError("no measurements to fit")
    profile = replace(base, source=source)
    for algo in ALGORITHMS:
        mine = [p for p in points if p.algorithm == algo]
        if mine:
            profile = profile.with_params(algo, fit_algorithm(algo, mine))
    if switch_rate is None:
        ina = [p.workers for p in points if p.algorithm == "ina"]
        switch_rate = base.switch_rate
        if ina and profile.ina.beta > 0:
            switch_rate = max(ina) / profile.ina.beta
    return replace(profile, switch_rate=switch_rate)
