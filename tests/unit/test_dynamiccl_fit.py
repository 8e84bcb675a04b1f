"""dynamiccl.fit: alpha and beta recovered from measured (algorithm, size, workers, seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynamiccl.fit import FitError, Measurement, fit_algorithm, fit_profile
from dynamiccl.model import DEFAULT_PROFILE, AlgoParams, Profile, estimate

TRUE = {
    "ina": AlgoParams(alpha=2e-3, beta=50e-9),
    "ring": AlgoParams(alpha=1e-3, beta=2e-9),
    "tree": AlgoParams(alpha=0.4e-3, beta=5e-9),
}
TRUTH = Profile(TRUE["ina"], TRUE["ring"], TRUE["tree"], switch_rate=1e15)
SIZES = [1 << k for k in range(10, 27, 2)]  # 1K .. 64M, like a bench sweep


def _points(
    algo: str, noise: float, seed: int = 0, workers: tuple[int, ...] = (4,)
) -> list[Measurement]:
    rng = np.random.default_rng(seed)
    return [
        Measurement(
            algo, size, n, estimate(algo, size, n, TRUTH).seconds * (1 + noise * rng.normal())
        )
        for n in workers
        for size in SIZES
    ]


@pytest.mark.parametrize("algo", ["ina", "ring", "tree"])
def test_exact_points_give_exact_constants(algo: str) -> None:
    fitted = fit_algorithm(algo, _points(algo, 0.0))
    assert fitted.alpha == pytest.approx(TRUE[algo].alpha, rel=1e-9)
    assert fitted.beta == pytest.approx(TRUE[algo].beta, rel=1e-9)


@pytest.mark.parametrize("algo", ["ina", "ring", "tree"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_points_recover_alpha_and_beta(algo: str, seed: int) -> None:
    points = _points(algo, 0.03, seed, workers=(2, 4, 8))
    fitted = fit_algorithm(algo, points)
    assert fitted.alpha == pytest.approx(TRUE[algo].alpha, rel=0.1)
    assert fitted.beta == pytest.approx(TRUE[algo].beta, rel=0.1)


def test_constants_never_go_negative() -> None:
    # pure bandwidth with noise would fit a slightly negative alpha unconstrained
    rng = np.random.default_rng(3)
    points = [Measurement("ring", s, 4, 1.5 * s * 1e-9 * (1 + 0.05 * rng.normal())) for s in SIZES]
    fitted = fit_algorithm("ring", points)
    assert fitted.alpha >= 0 and fitted.beta == pytest.approx(1e-9, rel=0.1)
    # and pure latency a negative beta
    flat = [Measurement("ina", s, 4, 1e-3 * (1 + 0.05 * rng.normal())) for s in SIZES]
    fitted = fit_algorithm("ina", flat)
    assert fitted.beta >= 0 and fitted.alpha == pytest.approx(1e-3, rel=0.1)


def test_one_size_cannot_separate_alpha_from_beta() -> None:
    with pytest.raises(FitError, match="two sizes"):
        fit_algorithm("ring", [Measurement("ring", 4096, 4, 1e-3)] * 3)
    with pytest.raises(FitError, match="another algorithm"):
        fit_algorithm("ring", _points("ina", 0.0))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (("gloo", 4096, 4, 1e-3), "unknown algorithm 'gloo'"),
        (("ring", 0, 4, 1e-3), "size_bytes"),
        (("ring", 4096, 0, 1e-3), "workers"),
        (("ring", 4096, 4, 0.0), "seconds"),
        (("ring", 4096, 4, float("inf")), "seconds"),
    ],
)
def test_bad_measurements_are_refused(fields: tuple[object, ...], message: str) -> None:
    with pytest.raises(FitError, match=message):
        Measurement(*fields)  # type: ignore[arg-type]


def test_fit_profile_fits_what_was_measured_and_keeps_the_rest(tmp_path: Path) -> None:
    points = _points("ina", 0.0) + _points("ring", 0.0)
    profile = fit_profile(points, source="calibrated on test data")
    assert profile.ina.alpha == pytest.approx(TRUE["ina"].alpha)
    assert profile.ina.beta == pytest.approx(TRUE["ina"].beta)
    assert profile.ring.beta == pytest.approx(TRUE["ring"].beta)
    assert profile.tree == DEFAULT_PROFILE.tree  # no tree points
    assert profile.source == "calibrated on test data"
    # the switch taken as INA's bottleneck: 4 workers per fitted beta
    assert profile.switch_rate == pytest.approx(4 / TRUE["ina"].beta)
    path = tmp_path / "fitted.json"
    profile.save(path)
    assert Profile.load(path) == profile


def test_fit_profile_predicts_its_own_points() -> None:
    points = _points("ring", 0.02, workers=(2, 8)) + _points("tree", 0.02, workers=(4,))
    profile = fit_profile(points)
    for p in points:
        assert estimate(p.algorithm, p.size_bytes, p.workers, profile).seconds == pytest.approx(
            p.seconds, rel=0.1
        )


def test_fit_profile_takes_a_given_switch_rate() -> None:
    assert fit_profile(_points("ina", 0.0), switch_rate=1e9).switch_rate == 1e9
    assert fit_profile(_points("ring", 0.0)).switch_rate == DEFAULT_PROFILE.switch_rate


def test_fit_profile_needs_measurements() -> None:
    with pytest.raises(FitError, match="no measurements"):
        fit_profile([])
