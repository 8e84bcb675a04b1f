"""Topologies in Mininet with inalab's soft switch (no Open vSwitch): INA and Gloo
allreduces run inside the hosts, over the same shaped links; nothing is left behind.

Needs root and Mininet (``mnexec``): CI runs these as root after installing mininet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulation.network import WORKER_UDP_PORT, EmulationError, emulate
from emulation.topology import load_topology, parse_topology

pytestmark = [pytest.mark.root, pytest.mark.mininet]

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
REPO = Path(__file__).resolve().parents[2]
SIZE = 5000  # int32 elements: 79 packets per rank at 64 lanes


def _interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _our_processes() -> set[int]:
    """PIDs of soft switch and hostrun processes (to prove none outlives a test)."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"emulation.softswitch.cli" in cmd or b"emulation.hostrun" in cmd:
            out.add(int(pid))
    return out


@pytest.fixture
def clean() -> Iterator[None]:
    """The test leaves no interface and no switch or worker process behind."""
    before_if, before_pids = _interfaces(), _our_processes()
    yield
    assert _interfaces() == before_if
    assert _our_processes() <= before_pids


def _run(
    em: Any, workers: tuple[str, ...], algo: str, extra: Callable[[str], list[str]]
) -> list[dict[str, Any]]:
    """One hostrun per worker host, all at once; their JSON reports in rank order."""
    procs = []
    for rank, name in enumerate(workers):
        host = em.topology.host(name)
        argv = [sys.executable, "-m", "emulation.hostrun", algo, "--rank", str(rank),
                "--workers", str(len(workers)), "--size", str(SIZE), "--seed", "7",
                "--bind", host.address, "--port", str(WORKER_UDP_PORT), *extra(name)]  # fmt: skip
        procs.append(em.host(name).popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         cwd=str(REPO)))  # fmt: skip
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-2000:]
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:  # a failed or hung rank: stop every one this run started
            if p.poll() is None:
                p.kill()
                p.communicate()
    return reports


def test_star4_ina_and_gloo_in_the_hosts(tmp_path: Path, clean: None) -> None:
    topo = load_topology(TOPOLOGIES / "star4.yaml")
    job = topo.jobs[0]
    with emulate(topo, tmp_path, slots=64) as em:
        ip, _ = em.ina_address(job.switch)
        reports = _run(em, job.workers, "ina", lambda _: ["--switch", ip, "--slots", "32"])
        assert [r["wrong"] for r in reports] == [0] * 4
        counters = em.controllers[job.switch].counters()
        assert counters["completed"] == -(-SIZE // 64)
        assert counters["drop_bad_source"] == counters["drop_unknown_job"] == 0
        master = f"{topo.host(job.workers[0]).address}:29500"
        reports = _run(em, job.workers, "gloo", lambda name: [
            "--master", master, "--iface", em.host(name).defaultIntf().name])  # fmt: skip
        assert [r["wrong"] for r in reports] == [0] * 4
        # Gloo crossed the same switch as ordinary traffic, not as INA.
        assert em.controllers[job.switch].counters()["completed"] == counters["completed"]


def test_leaf_spine_aggregates_at_the_spine_through_forwarding_leaves(
    tmp_path: Path, clean: None
) -> None:
    topo = load_topology(TOPOLOGIES / "leaf_spine.yaml")
    job = topo.jobs[0]
    with emulate(topo, tmp_path, slots=64) as em:
        ip, _ = em.ina_address(job.switch)
        reports = _run(em, job.workers, "ina", lambda _: ["--switch", ip, "--slots", "16"])
        assert [r["wrong"] for r in reports] == [0] * 8
        assert em.controllers["spine"].counters()["completed"] == -(-SIZE // 64)
        for leaf in ("leaf1", "leaf2"):
            assert em.controllers[leaf].counters()["received"] == 0  # forwarded, not INA


def test_links_asking_for_netem_are_refused_before_anything_is_built(
    tmp_path: Path, clean: None
) -> None:
    doc = {
        "switches": {"s1": {}},
        "hosts": {"h1": {}, "h2": {}},
        "links": [{"a": "h1", "b": "s1", "loss": 0.01}, ["h2", "s1"]],
    }
    with pytest.raises(EmulationError, match="no netem"), emulate(parse_topology(doc), tmp_path):
        pass
