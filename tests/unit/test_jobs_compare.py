"""``inalab compare`` of multi-job documents (``inalab emulate T --jobs ... bench --json``):
each job's time together under each policy, one table and one plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _row(algo: str, us: float, bound: bool = False) -> dict[str, Any]:
    return {"algo": algo, "size_bytes": 1 << 24, "time_us": us, "wrong": 0,
            "cpu": {"machine": 0.9, "bound": bound, "bound_by": []}}  # fmt: skip


def _doc(policy: str, together: dict[int, list[dict[str, Any]]], alone_us: float) -> Any:
    jobs = [
        {"job": j, "workers": 4, "alone": [{**r, "time_us": alone_us} for r in rows],
         "together": rows}
        for j, rows in together.items()
    ]  # fmt: skip
    return {"schema": "inalab-multijob/1", "sharing": {"policy": policy}, "jobs": jobs}


def _compare(tmp_path: Path, docs: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    paths = []
    for name, doc in docs.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(str(path))
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "compare", *paths, *extra],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip


def test_each_jobs_time_together_per_policy_and_algorithm_side_by_side(tmp_path: Path) -> None:
    docs = {
        "part": _doc("partition", {4: [_row("ina", 155e3), _row("ring", 211e3)],
                                   5: [_row("ina", 147e3), _row("ring", 217e3)]}, 140e3),
        "shr": _doc("shared", {4: [_row("ina", 157e3)], 5: [_row("ina", 691e3, True)]}, 178e3),
        "dyn": _doc("dynamic", {4: [_row("auto", 170e3)], 5: [_row("auto", 180e3)]}, 150e3),
    }  # fmt: skip
    plot = tmp_path / "jobs.png"
    proc = _compare(tmp_path, docs, "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("job"))
    assert header.split()[1:] == ["partition", "ina", "partition", "ring", "shared", "ina",
                                  "dynamic", "auto"]  # fmt: skip
    five = next(line for line in lines if line.split()[:1] == ["5"])
    assert "691.0 (3.88x)*" in five and "147.0 (1.05x)" in five and "180.0 (1.20x)" in five
    assert plot.stat().st_size > 10_000 and f"# plot: {plot}" in proc.stdout


def test_files_of_other_jobs_or_bench_runs_are_refused_in_one_line(tmp_path: Path) -> None:
    a = _doc("partition", {4: [_row("ina", 1e3)], 5: [_row("ina", 1e3)]}, 1e3)
    b = _doc("shared", {4: [_row("ina", 1e3)], 6: [_row("ina", 1e3)]}, 1e3)
    proc = _compare(tmp_path, {"a": a, "b": b})
    assert proc.returncode == 2
    assert "jobs 4 (4 workers), 6 (4 workers), not" in proc.stderr
    bench = {"schema": "inalab-bench/1", "metadata": {}, "rows": []}
    proc = _compare(tmp_path, {"a": a, "bench": bench})
    assert proc.returncode == 2
    assert "is a multi-job run (emulate --jobs): compare it with other multi-job runs" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr
    broken = _doc("shared", {4: [{"time_us": 1e3}], 5: [_row("ina", 1e3)]}, 1e3)
    proc = _compare(tmp_path, {"a": a, "broken": broken})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "broken.json: a row without its algo or size_bytes" in proc.stderr
