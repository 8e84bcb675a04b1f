"""Two ``inalab emulate`` runs on one machine (root, Mininet).

Mininet names interfaces after the nodes, so runs whose topologies share a node name
cannot both be built: the second must refuse in one line within 5 s, before it touches
anything, naming the first run's directory and how to stop it. Runs with no name in
common both come up. Either way nothing of either run is left behind.
"""

from __future__ import annotations

import os
import re
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


PREFIXES = ("q", "r")
"""This file's node names begin so (:func:`_renamed`): other tests' networks may come and
go meanwhile, and only ours are checked."""


def _interfaces() -> set[str]:
    """Interfaces of this file's networks (``<prefix><node>-eth<N>``)."""
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n and n.startswith(PREFIXES)}


def _leftovers(run_dirs: Path) -> set[int]:
    """PIDs of this file's Mininet host shells and of switch processes of runs under
    ``run_dirs``."""
    shells = tuple(f"mininet:{p}".encode() for p in PREFIXES)
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(s in cmd for s in shells) or str(run_dirs).encode() in cmd:
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


def _renamed(topology: str, prefix: str, tmp_path: Path) -> Path:
    """``topologies/TOPOLOGY`` with every node name prefixed (``h1`` -> ``qh1``): names
    no other test's network uses, so this test runs beside them."""
    text = (TOPOLOGIES / topology).read_text()
    text = re.sub(r"\b([hs]\d+)\b", rf"{prefix}\1", text)
    path = tmp_path / f"{prefix}-{topology}"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("second", "action"),
    [("star4.yaml", ["up", "--seconds", "1"]), ("star8.yaml", ["bench", "-b", "4K", "-e", "4K"])],
)
def test_a_second_run_with_the_same_node_names_is_refused_in_one_line(
    tmp_path: Path, clean: None, second: str, action: list[str]
) -> None:
    first_dir = tmp_path / "first"
    first = _up(_renamed("star4.yaml", "q", tmp_path), first_dir)
    try:
        _wait_up(first, first_dir)
        links_before = _interfaces()
        start = time.monotonic()
        other = subprocess.run(
            [sys.executable, "-m", "emulation.cli", "emulate", str(_renamed(second, "q", tmp_path)),
             *action],
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
    dirs = [tmp_path / "one", tmp_path / "two"]
    procs = [_up(_renamed("star4.yaml", "q", tmp_path), dirs[0]),
             _up(_renamed("star4.yaml", "r", tmp_path), dirs[1])]  # fmt: skip
    try:
        for proc, run_dir in zip(procs, dirs, strict=True):
            _wait_up(proc, run_dir)
        names = _interfaces()
        assert {"qs1-eth1", "rs1-eth1"} <= names
    finally:
        outputs = [_stop(p) for p in procs]
    assert all("# run dir:" in out for out in outputs)


def test_interfaces_left_by_another_network_are_refused_in_one_line(
    tmp_path: Path, clean: None
) -> None:
    """An interface a run's switch would create exists, and no live run holds it (a
    Mininet network of another tool, or a run killed before it cleaned up)."""
    subprocess.run(
        ["ip", "link", "add", "qs1-eth2", "type", "veth", "peer", "name", "qx-peer"], check=True
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "emulation.cli", "emulate",
             str(_renamed("star4.yaml", "q", tmp_path)), "up", "--seconds", "1"],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr == (
            "inalab emulate: error: interfaces qs1-eth2 exist already, and no live inalab"
            " emulate run holds them: another Mininet network with these node names runs"
            " (stop it), or one was not cleaned up (`ip link del qs1-eth2` for each)\n"
        )
        assert _interfaces() >= {"qs1-eth2"}  # not ours to remove
    finally:
        subprocess.run(["ip", "link", "del", "qs1-eth2"], check=True)
