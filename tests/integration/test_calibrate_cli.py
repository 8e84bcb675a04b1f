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

from dynamiccl.model import Profile


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
