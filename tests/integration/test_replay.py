"""``inalab replay`` end to end: real worker processes, the soft switch and sockets.

Each run is the command a user types, on a tiny trace; the JSON it writes is checked
against the workload (every call of every iteration of every strategy, right results),
and the refusals happen before a run directory exists. Under ``inalab emulate`` (root,
Mininet) a bandwidth drop is applied to a star's links mid-run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import descendants, still_running

from emulation.bench.workloads import load_workload, shipped_workloads
from emulation.cli import main as inalab

REPO = Path(__file__).resolve().parents[2]
INALAB = [sys.executable, "-m", "emulation.cli"]

TRACE = """\
# a tiny iteration: one call of each collective, both dtypes, sizes to round
name tiny
allreduce 64K float32 first bucket
allreduce 16K int32
reduce_scatter 65540 float32 not a multiple of 4 x workers
all_gather 32K
"""
ACTIONS = ("--actions", "ina/l2048/w8,ring/l2048/w8,tree/l256/w8")
DOC_KEYS = ["schema", "metadata", "notes", "workload", "scenario", "actions", "strategies",
            "oracle", "summary"]  # fmt: skip


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.trace"
    path.write_text(TRACE)
    return path


def _replay(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INALAB, *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, check=False)  # fmt: skip


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def _calls(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for run in doc["strategies"].values() for it in run["iterations"] for c in it]


@pytest.mark.slow
def test_a_tiny_trace_replays_under_every_strategy(tmp_path: Path, trace: Path) -> None:
    out, png = tmp_path / "replay.json", tmp_path / "replay.png"
    proc = _replay("replay", str(trace), "--workers", "2", "--iterations", "3", "--scale", "1",
                   *ACTIONS, "--json", str(out), "--plot", str(png), "--run-dir",
                   str(tmp_path / "run"))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert list(doc) == DOC_KEYS and doc["schema"] == "inalab.replay/1"
    assert [c["nbytes_run"] for c in doc["workload"]["calls"]] == [65536, 16384, 65544, 32768]
    assert doc["actions"]["static_mode"] == "product"
    assert doc["actions"]["space"]["all_gather"] == ["ring/l2048/w8"]
    # 3 allreduce actions x 2 reduce_scatter actions x 1 all_gather action
    statics = [n for n, r in doc["strategies"].items() if r["kind"] == "static"]
    assert len(statics) == 6 and list(doc["strategies"])[6:] == ["model", "agent"]
    for run in doc["strategies"].values():
        assert run["complete"] and len(run["iterations"]) == 3
        assert all(len(it) == 4 for it in run["iterations"])
    calls = _calls(doc)
    assert all(c["wrong"] == 0 and c["seconds"] > 0 for c in calls)
    used = {c["action"] for c in calls}
    assert {"ina/l2048/w8", "ring/l2048/w8", "tree/l256/w8"} <= used
    agent = doc["strategies"]["agent"]
    assert len(agent["decisions"]) == 3 and all(len(d) == 4 for d in agent["decisions"])
    assert [d["action"]["label"] for d in agent["decisions"][2]] == [
        c["action"] for c in agent["iterations"][2]
    ]
    rows = {r["strategy"]: r for r in doc["summary"]["rows"]}
    oracle = doc["oracle"]["total_s"]
    assert all(rows[n]["total_s"] >= oracle for n in doc["strategies"] if n.startswith("static"))
    assert rows["agent"]["regret"] == pytest.approx(rows["agent"]["total_s"] / oracle - 1)
    best = doc["summary"]["best_static"]
    assert rows["agent"]["gain"] == pytest.approx(rows[best]["total_s"] / rows["agent"]["total_s"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "# * best static: " in proc.stdout
    assert "# agent: not judged converged" in proc.stdout  # 3 iterations: a half of 1
    assert (tmp_path / "run" / "replay-rank1.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(shipped_workloads()))
def test_every_shipped_workload_runs_at_a_tiny_scale(tmp_path: Path, name: str) -> None:
    # About 2 MiB an iteration, whatever the model: a correctness run, not a benchmark.
    workload = load_workload(name)
    scale = f"{(2 << 20) / workload.total_bytes:.6f}"
    out = tmp_path / f"{name}.json"
    proc = _replay("replay", name, "--workers", "2", "--iterations", "2", "--scale", scale,
                   "--actions", "ina/l2048/w8,ring/l2048/w8", "--json", str(out),
                   "--run-dir", str(tmp_path / "run"))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    workload = load_workload(name, scale=float(scale))
    assert len(doc["workload"]["calls"]) == len(workload.calls)
    assert [c["collective"] for c in doc["workload"]["calls"]] == [
        c.collective for c in workload.calls
    ]
    assert all(len(it) == len(workload.calls) for r in doc["strategies"].values()
               for it in r["iterations"])  # fmt: skip
    assert all(c["wrong"] == 0 for c in _calls(doc))


@pytest.mark.slow
def test_a_competing_job_shares_the_switch_from_the_change_on(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "compete.json"
    proc = _replay("replay", str(trace), "--workers", "2", "--iterations", "3", "--scale", "1",
                   "--actions", "ina/l2048/w8,ring/l2048/w8", "--scenario", "competing-job",
                   "--competing-size", "256K", "--json", str(out), "--run-dir",
                   str(tmp_path / "run"))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    scenario = doc["scenario"]
    assert scenario["name"] == "competing-job" and scenario["change_at"] == 1
    competing = scenario["competing"]
    assert competing["job_id"] == 2 and competing["nbytes"] == 256 << 10
    # Strategies run interleaved: the competitor runs once, from the change through
    # every strategy's remaining iterations, and all its allreduces came back right.
    (entry,) = competing["per_run"]
    assert entry["strategy"] == "every strategy (interleaved)"
    assert entry["calls"] >= len(doc["strategies"]) and entry["wrong"] == 0
    assert all(c["wrong"] == 0 for c in _calls(doc))
    assert (tmp_path / "run" / "competitor-rank1.log").exists()


def test_bandwidth_drop_on_loopback_is_refused(
    trace: Path, own_tmpdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert inalab(["replay", str(trace), "--scenario", "bandwidth-drop"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "inalab emulate TOPOLOGY replay" in err
    assert list(own_tmpdir.iterdir()) == []


def test_a_bad_trace_is_refused_with_its_line_before_a_run_directory(
    tmp_path: Path, own_tmpdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.trace"
    bad.write_text("name bad\nallreduce 4K\nallreduce 4K float64\n")
    run_dir = tmp_path / "run"
    assert inalab(["replay", str(bad), "--run-dir", str(run_dir)]) == 2
    out = capsys.readouterr()
    assert out.err == f"inalab replay: error: {bad}:3: unsupported dtype 'float64'" + (
        " (supported: float32, int32)\n"
    )
    assert out.out == ""
    assert not run_dir.exists() and list(own_tmpdir.iterdir()) == []


@pytest.mark.slow
def test_a_stop_signal_keeps_what_finished_and_stops_everything(
    tmp_path: Path, trace: Path
) -> None:
    out, run_dir = tmp_path / "stopped.json", tmp_path / "run"
    argv = [*INALAB, "replay", str(trace), "--workers", "2", "--iterations", "200",
            "--scale", "4", *ACTIONS, "--scenario", "competing-job", "--change-at", "1",
            "--json", str(out), "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "competitor-rank1.log").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(3.0)  # into the first run's iterations
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr and "WARNING" not in stderr
    assert "inalab replay: stopped by SIGTERM" in stderr
    assert re.search(r"# stopped by SIGTERM: the table holds the (\d+) iteration\(s\) every "
                     r"strategy finished", stdout), stdout  # fmt: skip
    assert len(children) >= 5  # the switch, two ranks and two competitors at least
    assert still_running(children) == set()
    doc = json.loads(out.read_text())
    assert doc["metadata"]["stopped_by"] == "SIGTERM"
    # Interleaved strategies: every run is cut to the iterations all of them finished.
    lengths = {len(run["iterations"]) for run in doc["strategies"].values()}
    assert len(lengths) == 1 and 0 < lengths.pop() < 200
    assert all(c["wrong"] == 0 for c in _calls(doc))


# ----------------------------------------------------------------- emulated (root)
def _interfaces() -> set[str]:
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n}


@pytest.mark.root
@pytest.mark.mininet
@pytest.mark.slow
def test_a_bandwidth_drop_on_star4_slows_every_strategy_alike(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "star4.json"
    before = _interfaces()
    proc = _replay("emulate", str(REPO / "topologies" / "star4.yaml"), "--bw", "100",
                   "--run-dir", str(tmp_path / "run"), "replay", str(trace), "--iterations",
                   "4", "--scale", "1", "--actions", "ina/l2048/w8,ring/l2048/w8",
                   "--scenario", "bandwidth-drop", "--json", str(out))  # fmt: skip
    _ok(proc)
    assert _interfaces() - before == set()
    doc = json.loads(out.read_text())
    assert doc["metadata"]["workers"] == 4
    assert doc["metadata"]["emulation"]["topology"] == "star4"
    assert doc["metadata"]["links"].startswith("every link 100 Mbit/s")
    scenario = doc["scenario"]
    assert scenario["change_at"] == 2
    assert (scenario["bw_mbit_before"], scenario["bw_mbit_after"]) == (100, 10)
    assert all(c["wrong"] == 0 for c in _calls(doc))
    for name, run in doc["strategies"].items():
        times = run["iteration_s"]
        assert len(times) == 4 and run["complete"]
        # the second iteration at 100 Mbit/s, the last at 10: the links set the pace
        assert times[3] > 3 * times[1], (name, times)
    assert "bandwidth-drop at iteration 2: every host link 100 -> 10 Mbit/s" in proc.stdout
