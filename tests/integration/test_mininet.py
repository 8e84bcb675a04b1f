"""Topologies in Mininet with inalab's soft switch (no Open vSwitch): INA and Gloo
allreduces run inside the hosts, over the same shaped links; nothing is left behind.

Needs root and Mininet (``mnexec``): CI runs these as root after installing mininet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emulation.mininet.network import WORKER_UDP_PORT, EmulationError, emulate
from emulation.topology import load_topology, parse_topology

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
REPO = Path(__file__).resolve().parents[2]
SIZE = 5000  # int32 elements: 79 packets per rank at 64 lanes


def _interfaces() -> set[str]:
    """Mininet's interfaces (``<node>-eth<N>``); other tests may add veths meanwhile."""
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n}


def _our_processes(run_dir: Path) -> set[int]:
    """PIDs of Mininet host shells, workers, and this run's switches (by run dir)."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if (
            cmd.startswith(b"mnexec")
            or b"emulation.mininet.hostrun" in cmd
            or str(run_dir).encode() in cmd
        ):
            out.add(int(pid))
    return out


@pytest.fixture
def clean(tmp_path: Path) -> Iterator[None]:
    """The test leaves no interface and no switch or worker process behind."""
    before_if, before_pids = _interfaces(), _our_processes(tmp_path)
    yield
    assert _interfaces() - before_if == set()
    assert _our_processes(tmp_path) - before_pids == set()


def _run(
    em: Any,
    workers: tuple[str, ...],
    algo: str,
    extra: Callable[[str], list[str]],
    size: int = SIZE,
) -> list[dict[str, Any]]:
    """One hostrun per worker host, all at once; their JSON reports in rank order."""
    procs = []
    for rank, name in enumerate(workers):
        host = em.topology.host(name)
        argv = [sys.executable, "-m", "emulation.mininet.hostrun", algo, "--rank", str(rank),
                "--workers", str(len(workers)), "--size", str(size), "--seed", "7",
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


def test_link_loss_is_applied_and_ina_stays_exact(tmp_path: Path, clean: None) -> None:
    # 10% loss each way on h1's link, applied by the soft switch's port (no netem here).
    loss = 0.1
    doc = {
        "switches": {"s1": {}},
        "hosts": {"h1": {}, "h2": {}, "h3": {}},
        "links": [{"a": "h1", "b": "s1", "loss": loss}, ["h2", "s1"], ["h3", "s1"]],
        "jobs": [{"id": 1, "workers": ["h1", "h2", "h3"], "switch": "s1"}],
    }
    topo = parse_topology(doc)
    with emulate(topo, tmp_path, slots=64) as em:
        ip, _ = em.ina_address("s1")
        reports = _run(em, ("h1", "h2", "h3"), "ina", lambda _: ["--switch", ip, "--slots", "16"],
                       size=40 * SIZE)  # fmt: skip
        assert [r["wrong"] for r in reports] == [0] * 3  # bit-exact despite the loss
    stats = json.loads((tmp_path / "s1.links.json").read_text())["ports"]
    assert set(stats) == {"1"}  # only h1's port emulates a link
    for direction in ("ingress", "egress"):
        c = stats["1"][direction]
        n, lost = c["offered"], c["lost"]
        assert c["delivered"] + lost + c["queue_dropped"] + c["in_flight"] == n
        sigma = (n * loss * (1 - loss)) ** 0.5
        assert n > 100 and abs(lost - n * loss) <= 4 * sigma, (direction, c)


def test_link_delay_is_applied_to_pings(tmp_path: Path, clean: None) -> None:
    doc = {
        "switches": {"s1": {}},
        "hosts": {"h1": {}, "h2": {}},
        "links": [{"a": "h1", "b": "s1", "delay": "15ms"}, ["h2", "s1"]],
    }
    with emulate(parse_topology(doc), tmp_path) as em:
        out = em.host("h1").cmd("ping -c 5 -i 0.2 -W 2 10.0.0.2")
    # rtt min/avg/max/mdev = a/b/c/d ms: the request and the reply each wait 15 ms.
    rtt_min = float(out.split("=")[-1].split("/")[0])
    assert 30.0 <= rtt_min < 80.0, out


def test_a_bmv2_switch_without_bmv2_is_refused_before_anything_is_built(
    tmp_path: Path, clean: None
) -> None:
    if shutil.which("simple_switch_grpc"):
        pytest.skip("bmv2 is installed: tests/integration/test_bmv2_mininet.py runs it")
    doc = {"switches": {"s1": {"kind": "bmv2"}}, "hosts": {"h1": {}}, "links": [["h1", "s1"]]}
    with (
        pytest.raises(EmulationError, match="simple_switch_grpc"),
        emulate(parse_topology(doc), tmp_path),
    ):
        pass
