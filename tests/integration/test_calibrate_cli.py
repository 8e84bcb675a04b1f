"""``inalab calibrate`` end to end: measure INA, ring and tree on loopback, fit, save.

The fitted profile is then read back by ``inalab decide`` and ``inalab bench``'s auto,
the two commands that use profiles.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynamiccl.model import DEFAULT_PROFILE, Profile

pytestmark = pytest.mark.slow

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _inalab(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_calibrate_fits_a_profile_that_decide_and_bench_read(tmp_path: Path) -> None:
    profile, report = tmp_path / "profile.json", tmp_path / "fit.json"
    argv = ["calibrate", "--workers", "2", "-b", "4K", "-e", "256K", "-f", "8", "-n", "2",
            "-w", "1", "-o", str(profile), "--json", str(report),
            "--run-dir", str(tmp_path)]  # fmt: skip
    out = _ok(_inalab(*argv))
    fitted = Profile.load(profile)
    assert fitted.source.startswith("inalab calibrate on 127.0.0.1")
    assert fitted.links is None and "links" not in json.loads(profile.read_text())
    assert fitted.packet_bytes == 4 * 2048 and fitted.window == 32
    for algo in ("ina", "ring", "tree"):
        params = fitted.params(algo)
        assert params.alpha > 0 or params.beta > 0
    doc = json.loads(report.read_text())
    points = doc["points"]
    assert {(p["algorithm"], p["size_bytes"]) for p in points} == {
        (a, s) for a in ("ina", "ring", "tree") for s in (4096, 32768, 262144)
    }
    assert all(p["workers"] == 2 and p["seconds"] > 0 for p in points)
    # The fit is printed against every point, with its error.
    assert out.count("\n  ") >= len(points) and "mean |error|" in out
    assert (tmp_path / "workers2" / "switch.log").exists()

    argv = ["decide", "--size", "64K", "--workers", "2", "--profile", str(profile), "--json"]
    decided = json.loads(_ok(_inalab(*argv)))
    assert decided["profile"] == fitted.source
    bench = tmp_path / "bench.json"
    argv = ["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--workers", "2",
            "--algos", "auto", "--profile", str(profile), "--json", str(bench)]  # fmt: skip
    _ok(_inalab(*argv))
    doc = json.loads(bench.read_text())
    assert doc["rows"][0]["chosen"] == doc["dynamiccl"]["decisions"]["4096"]["algorithm"]


def test_bench_names_the_built_in_profile_it_decided_with(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    argv = ["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--workers", "2",
            "--algos", "auto", "--json", str(bench), "--run-dir", str(tmp_path)]  # fmt: skip
    _ok(_inalab(*argv))
    doc = json.loads(bench.read_text())
    assert doc["dynamiccl"]["profile"] == DEFAULT_PROFILE.source
    assert DEFAULT_PROFILE.source.startswith("built-in: inalab calibrate on 127.0.0.1")


@pytest.mark.root
@pytest.mark.mininet
def test_calibrate_across_emulated_links_records_them(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    argv = ["emulate", str(TOPOLOGIES / "star4.yaml"), "--bw", "100", "--delay", "1ms",
            "--run-dir", str(tmp_path / "run"), "calibrate", "-b", "4K", "-e", "64K", "-f", "4",
            "-n", "1", "-w", "0", "--lanes", "256", "-o", str(profile)]  # fmt: skip
    out = _ok(_inalab(*argv, timeout=600))
    doc = json.loads(profile.read_text())
    assert doc["links"] == {
        "topology": "star4",
        "job": 1,
        "bw_mbit": 100.0,
        "delay_ms": 1.0,
        "loss": 0.0,
        "jitter_ms": 0.0,
    }
    assert "measured across the emulated links of star4 job 1: 100 Mbit/s, 1 ms" in out
    argv = ["decide", "--size", "1M", "--workers", "4", "--profile", str(profile)]
    decided = _ok(_inalab(*argv))
    assert "# profile measured across the emulated links of star4 job 1 (100 Mbit/s" in decided


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "1"], "invalid worker counts"),
        (["--workers", "2,x"], "invalid worker counts"),
        (["--algos", "gloo"], "invalid algorithms"),
        (["-b", "4K", "-e", "4K"], "two sizes at least"),
        (["-o", "/nonexistent/dir/p.json"], "does not exist"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str, tmp_path: Path) -> None:
    args = ["calibrate", "-o", str(tmp_path / "p.json"), *argv]
    proc = _inalab(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
