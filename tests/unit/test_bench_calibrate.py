"""emulation.bench.calibrate without running anything: the profile it writes from given
measurements, and what it records about the network they were taken on."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dynamiccl.fit import Measurement
from dynamiccl.model import ALGORITHMS, DEFAULT_PROFILE, MeasuredLinks, Profile, estimate
from emulation.bench import calibrate as calibrate_module
from emulation.mininet.emulate import apply_overrides
from emulation.topology import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _args(tmp_path: Path, **overrides: Any) -> argparse.Namespace:
    """What ``inalab emulate TOPOLOGY calibrate``'s parser gives (``job``: its --job)."""
    parser = argparse.ArgumentParser()
    calibrate_module.add_arguments(parser, emulated=True)
    args = parser.parse_args(["-o", str(tmp_path / "profile.json"), "--lanes", "256"])
    args.job = None
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run "measures" what the built-in profile predicts, without running."""

    def fake(configs: Sequence[Any], run_dir: Path, fabric: Any = None) -> list[Measurement]:
        return [
            Measurement(a, n, c.workers, estimate(a, n, c.workers, DEFAULT_PROFILE).seconds)
            for c in configs
            for a in c.algos
            for n in c.sizes
        ]

    monkeypatch.setattr(calibrate_module, "measure", fake)


def test_a_profile_fitted_across_emulated_links_records_them(
    tmp_path: Path, measured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    star4 = load_topology(TOPOLOGIES / "star4.yaml")
    applied = apply_overrides(star4, bw=100, delay=1.5, loss=0.001)  # --bw 100 --delay 1.5ms ...
    args = _args(tmp_path)
    where = "star4 (Mininet hosts, job 1)"
    assert calibrate_module.calibrate(args, (4,), tmp_path, None, where, applied) == 0
    profile = Profile.load(args.output)
    assert profile.links is not None
    assert profile.links.loss == pytest.approx(0.001)  # a path's loss: 1 - (1 - p)
    assert replace(profile.links, loss=0.001) == MeasuredLinks("star4", 1, 100.0, 1.5, 0.001)
    doc = json.loads(args.output.read_text())
    assert doc["links"]["bw_mbit"] == 100.0 and doc["links"]["delay_ms"] == 1.5
    assert profile.source.startswith("inalab calibrate on star4 (Mininet hosts, job 1), ")
    assert profile.source.endswith(", lanes 256, links 100 Mbit/s, 1.5 ms one way, loss 0.001")
    out = capsys.readouterr().out
    assert "# measured across the emulated links of star4 job 1: 100 Mbit/s" in out
    for algo in ALGORITHMS:  # the fit recovers the numbers the fake measured
        assert profile.params(algo).beta == pytest.approx(DEFAULT_PROFILE.params(algo).beta)


def test_the_job_is_emulates_job(tmp_path: Path, measured: None) -> None:
    star8 = apply_overrides(load_topology(TOPOLOGIES / "star8.yaml"), bw=10)
    args = _args(tmp_path, job=2)
    assert calibrate_module.calibrate(args, (2,), tmp_path, None, "star8", star8) == 0
    links = Profile.load(args.output).links
    assert links is not None and (links.job, links.bw_mbit) == (2, 10.0)


def test_a_loopback_profile_records_no_links(tmp_path: Path, measured: None) -> None:
    args = _args(tmp_path)
    assert calibrate_module.calibrate(args, (4,), tmp_path, None, "127.0.0.1") == 0
    assert Profile.load(args.output).links is None
    assert "links" not in json.loads(args.output.read_text())


def test_the_profile_records_the_worker_counts_it_was_fitted_at(
    tmp_path: Path, measured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(tmp_path)
    assert calibrate_module.calibrate(args, (8, 2), tmp_path, None, "127.0.0.1") == 0
    assert Profile.load(args.output).workers == (2, 8)
    assert capsys.readouterr().err == ""  # the fake measures the model: a perfect fit


def _point(algo: str, size: int, error: float) -> dict[str, Any]:
    return {"algorithm": algo, "size_bytes": size, "workers": 4, "seconds": 1.0,
            "fitted_seconds": 1.0 + error, "relative_error": error}  # fmt: skip


def test_a_fit_at_the_threshold_is_not_poor() -> None:
    limit = calibrate_module.POOR_FIT_MEAN_ERROR
    at = [_point("ring", 4096, limit), _point("ring", 65536, -limit)]
    assert calibrate_module.poor_fit_warning(at) is None


def test_a_poor_fit_is_warned_about_with_its_worst_point_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Times the model cannot fit: every other size 60% slower than its prediction.
    def uneven(configs: Sequence[Any], run_dir: Path, fabric: Any = None) -> list[Measurement]:
        return [
            Measurement(a, n, c.workers,
                        estimate(a, n, c.workers, DEFAULT_PROFILE).seconds * (1.6 if i % 2 else 1))
            for c in configs
            for a in c.algos
            for i, n in enumerate(c.sizes)
        ]  # fmt: skip

    monkeypatch.setattr(calibrate_module, "measure", uneven)
    args = _args(tmp_path)
    assert calibrate_module.calibrate(args, (4,), tmp_path, None, "127.0.0.1") == 0
    out, err = capsys.readouterr()
    mean = re.search(r"# mean \|error\| (\d+\.\d)%, max (\d+\.\d)%", out)
    assert mean is not None and float(mean.group(1)) > 20
    assert err.startswith(
        f"inalab calibrate: warning: a poor fit: mean |error| {mean.group(1)}%, above 20% (worst:"
    )
    assert "%), so decisions between algorithms closer than that are guesses." in err
    assert "(-n 10 -w 2)" in err and "(-b/-e)" in err and err.count("\n") == 1
    assert Profile.load(args.output).workers == (4,)  # written all the same
