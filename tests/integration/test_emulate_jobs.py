"""``inalab emulate T --jobs A,B bench|run``: several jobs on one fabric (root, Mininet).

Each job runs the bench alone, then all together on the one switch; the JSON holds
both, every result exact. A slot pool that fits one job's slots fails the second job's
install when they run together (today's static partition), naming it. ``run`` trains
two torch jobs through the one switch at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SMALL = ("-b", "256K", "-e", "256K", "-n", "2", "-w", "1", "-d", "int32")


def _emulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", "topologies/star8.yaml", *args],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
    )  # fmt: skip


def test_two_jobs_alone_then_together_are_exact(tmp_path: Path) -> None:
    out = tmp_path / "jobs.json"
    proc = _emulate("--bw", "1000", "--jobs", "4,5", "--stagger", "0.2", "--run-dir",
                    str(tmp_path / "run"), "bench", *SMALL, "--algos", "ina,ring",
                    "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "inalab-multijob/1"
    assert [j["job"] for j in doc["jobs"]] == [4, 5]
    assert doc["jobs"][1]["start_after_s"] == pytest.approx(0.2)
    for job in doc["jobs"]:
        assert job["error"] is None and job["workers"] == 4
        for phase in ("alone", "together"):
            assert [r["algo"] for r in job[phase]] == ["ina", "ring"]
            assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in job[phase])
    assert "x alone" in proc.stdout


def test_a_pool_for_one_job_fails_the_second_together(tmp_path: Path) -> None:
    proc = _emulate("--bw", "1000", "--jobs", "4,5", "--switch-slots", "8", "--run-dir",
                    str(tmp_path / "run"), "bench", *SMALL, "--algos", "ina",
                    "--slots", "8")  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = [line for line in proc.stderr.splitlines() if "failed" in line]
    assert failed and "no free range of 8 slots" in proc.stderr, proc.stderr[-3000:]


def test_two_torch_jobs_at_once_each_train_as_gloo_does(tmp_path: Path) -> None:
    """``run --jobs``: examples/ddp_digits.py in both jobs at once, each through the one
    switch under its own job id: every rank of a job holds one model, and INA's trains
    as Gloo's does."""
    run = tmp_path / "run"
    proc = _emulate("--jobs", "4,5", "--stagger", "0.5", "--run-dir", str(run), "run",
                    "--grace", "1", "--", "python", str(REPO / "examples" / "ddp_digits.py"),
                    "--epochs", "2")  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    reports: dict[int, dict[int, dict[str, Any]]] = {4: {}, 5: {}}
    for m in re.finditer(r"^\[job (\d+) rank (\d+)\] (\{.*\})$", proc.stdout, re.MULTILINE):
        reports[int(m.group(1))][int(m.group(2))] = json.loads(m.group(3))
    for job, ranks in reports.items():
        assert sorted(ranks) == [0, 1, 2, 3], (job, proc.stdout[-3000:])
        ina = {r["ina"]["accuracy"] for r in ranks.values()}
        gloo = {r["gloo"]["accuracy"] for r in ranks.values()}
        assert len(ina) == len(gloo) == 1, (job, ina, gloo)  # one DDP model per backend
        assert ina.pop() >= gloo.pop() - 0.05 and all(r["ina_packets"] > 0 for r in ranks.values())
        assert (run / f"job{job}" / "rank-3.log").is_file()
    assert "# job 4: exit status 0" in proc.stdout and "# job 5: exit status 0" in proc.stdout
