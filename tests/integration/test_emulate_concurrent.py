"""Two ``inalab emulate`` runs on one machine (root, Mininet).

Mininet names interfaces after the nodes, so runs whose topologies share a node name
cannot both be built: the second must refuse in one line within 5 s, before it touches
anything, naming the first run's directory and how to stop it. Runs with no name in
common both come up. Either way nothing of either run is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"


def _interfaces() -> set[str]:
    """Mininet's interfaces (``<node>-eth<N>``)."""
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n}


def _leftovers(run_dirs: Path) -> set[int]:
    """PIDs of Mininet host shells and of switch processes of runs under ``run_dirs``."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"mnexec") or str(run_dirs).encode() in cmd:
            out.add(int(pid))
    return out


def _up(topology: Path, run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "emulation.cli", "emulate", str(topology), "--run-dir",
         str(run_dir), "up"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip


def _wait_up(proc: subprocess.Popen[str], run_dir: Path) -> None:
    deadline = time.monotonic() + 120
    while not (run_dir / "manifest.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no manifest"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.fixture
def clean(tmp_path: Path) -> Iterator[None]:
    before_if, before_pids = _interfaces(), _leftovers(tmp_path)
    yield
    assert _interfaces() - before_if == set()
    assert _leftovers(tmp_path) - before_pids == set()


def _renamed_star4(path: Path) -> Path:
    """star4 with node names no other topology uses (a1..a4 on t1)."""
    text = (TOPOLOGIES / "star4.yaml").read_text().replace("name: star4", "name: star4b")
    text = text.replace("s1", "t1")
    for k in range(1, 5):
        text = text.replace(f"h{k}", f"a{k}")
    path.write_text(text)
    return path


@pytest.mark.parametrize("second", ["star4.yaml", "star8.yaml"])
def test_a_second_run_with_the_same_node_names_is_refused_in_one_line(
    tmp_path: Path, clean: None, second: str
) -> None:
    first_dir = tmp_path / "first"
    first = _up(TOPOLOGIES / "star4.yaml", first_dir)
    try:
        _wait_up(first, first_dir)
        links_before = _interfaces()
        start = time.monotonic()
        other = subprocess.run(
            [sys.executable, "-m", "emulation.cli", "emulate", str(TOPOLOGIES / second), "up",
             "--seconds", "1"],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        took = time.monotonic() - start
        assert other.returncode == 2, other.stderr
        assert took < 5, took
        assert other.stdout == ""
        lines = other.stderr.splitlines()
        assert len(lines) == 1, other.stderr
        assert str(first_dir) in lines[0] and f"kill {first.pid}" in lines[0]
        assert _interfaces() == links_before  # the first run's interfaces are untouched
        assert first.poll() is None
    finally:
        _stop(first)


def test_runs_with_no_name_in_common_both_come_up(tmp_path: Path, clean: None) -> None:
    other_topology = _renamed_star4(tmp_path / "star4b.yaml")
    dirs = [tmp_path / "one", tmp_path / "two"]
    procs = [_up(TOPOLOGIES / "star4.yaml", dirs[0]), _up(other_topology, dirs[1])]
    try:
        for proc, run_dir in zip(procs, dirs, strict=True):
            _wait_up(proc, run_dir)
        names = _interfaces()
        assert {"s1-eth1", "t1-eth1"} <= names
    finally:
        outputs = [_stop(p) for p in procs]
    assert all("# run dir:" in out for out in outputs)
