"""bmv2 as a Mininet switch: ``p4/ina.p4`` on simple_switch_grpc forwards and aggregates.

Needs root, Mininet (``mnexec``), ``simple_switch_grpc`` (built with its Thrift server)
and ``p4c-bm2-ss``: the markers skip without the first three, the ``tools`` fixture
without the compiler. Every test proves it leaves no interface and no switch or worker
process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.forwarder import HostRoute
from emulation.bmv2 import BMV2_LANES, BMV2_SLOTS, Bmv2Tools, Bmv2Unavailable, find_bmv2
from emulation.mininet.network import WORKER_UDP_PORT, emulate
from emulation.topology import parse_topology

pytestmark = [pytest.mark.bmv2, pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SIZE = 5000  # int32 elements: 79 packets per rank at 64 lanes
TOPOLOGY = {
    "name": "bmv2-pair",
    "switches": {"s1": {"kind": "bmv2", "role": "aggregate"}},
    "hosts": {"h1": {}, "h2": {}},
    "links": [["h1", "s1"], ["h2", "s1"]],
    "jobs": [{"id": 1, "workers": ["h1", "h2"], "switch": "s1"}],
}


@pytest.fixture
def tools() -> Bmv2Tools:
    try:
        return find_bmv2()
    except Bmv2Unavailable as exc:
        pytest.skip(str(exc))


def _ours() -> set[int]:
    """PIDs of bmv2 switches and hostrun workers (to prove none outlives a test)."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode(errors="replace")).name == "simple_switch_grpc" or (
            b"emulation.mininet.hostrun" in argv
        ):
            out.add(int(pid))
    return out


@pytest.fixture
def clean(tools: Bmv2Tools) -> Iterator[None]:
    before_if, before_pids = set(os.listdir("/sys/class/net")), _ours()
    yield
    assert set(os.listdir("/sys/class/net")) == before_if
    assert _ours() <= before_pids


def test_a_bmv2_node_forwards_on_its_ports_and_leaves_nothing(tmp_path: Path, clean: None) -> None:
    from mininet.net import Mininet
    from mininet.node import Host

    from emulation.mininet.nodes import bmv2_switch_class

    net = Mininet(topo=None, switch=None, host=Host, controller=None, build=False)
    h1 = net.addHost("h1", ip="10.0.0.1/24", mac="02:00:00:00:00:01")
    h2 = net.addHost("h2", ip="10.0.0.2/24", mac="02:00:00:00:00:02")
    s1 = net.addSwitch("s1", cls=bmv2_switch_class(), dpid=f"{3:016x}", run_dir=tmp_path,
                       pcap=True)  # fmt: skip
    net.addLink(h1, s1, port2=1)
    net.addLink(h2, s1, port2=2)
    net.build()
    try:
        net.start()
        info = s1.process.ready_info
        assert (info["kind"], info["device_id"]) == ("bmv2", 3)
        assert info["interfaces"] == {"1": "s1-eth1", "2": "s1-eth2"}
        pid = info["pid"]
        with s1.process.controller() as ctl:
            assert (ctl.lanes, ctl.slots_per_set) == (BMV2_LANES, BMV2_SLOTS)
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:01", 1))
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:02", 2))
            for me, other, mac in ((h1, "10.0.0.2", "02"), (h2, "10.0.0.1", "01")):
                me.cmd(f"ip neigh replace {other} lladdr 02:00:00:00:00:{mac} dev {me.name}-eth0")
            out = h1.cmd("ping -c 3 -W 2 10.0.0.2")
            assert " 0% packet loss" in out, out
        with s1.process.controller(election_id=(0, 2)) as again:
            # A later controller reads the installed pipeline: the entries are still there.
            assert " 0% packet loss" in h2.cmd("ping -c 1 -W 2 10.0.0.1")
            assert again.is_primary
        captured = sorted(p.name for p in (tmp_path / "pcaps").iterdir())
        assert any(name.startswith("s1-eth1") for name in captured), captured
    finally:
        net.stop()
    assert not Path(f"/proc/{pid}").exists()


def _hostrun(em: Any, workers: tuple[str, ...], ip: str) -> list[dict[str, Any]]:
    """One INA rank per worker host, all at once; their JSON reports in rank order."""
    procs = []
    for rank, name in enumerate(workers):
        host = em.topology.host(name)
        argv = [sys.executable, "-m", "emulation.mininet.hostrun", "ina", "--rank", str(rank),
                "--workers", str(len(workers)), "--size", str(SIZE), "--seed", "7",
                "--bind", host.address, "--port", str(WORKER_UDP_PORT), "--switch", ip,
                "--lanes", str(BMV2_LANES), "--slots", "32"]  # fmt: skip
        procs.append(em.host(name).popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         cwd=str(REPO)))  # fmt: skip
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)  # bmv2 does a few thousand packets/s
            assert p.returncode == 0, err.decode()[-2000:]
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return reports


def test_ina_allreduce_through_a_bmv2_switch(tmp_path: Path, clean: None) -> None:
    topo = parse_topology(TOPOLOGY)
    job = topo.jobs[0]
    with emulate(topo, tmp_path, slots=64) as em:
        assert em.net.get("s1").process.ready_info["kind"] == "bmv2"
        ip, _ = em.ina_address("s1")
        reports = _hostrun(em, job.workers, ip)
        assert [r["wrong"] for r in reports] == [0, 0]
        counters = em.controllers["s1"].counters()
        packets = -(-SIZE // BMV2_LANES)
        assert counters["completed"] == packets  # once per slot use, retransmissions or not
        assert counters["drop_bad_source"] == counters["drop_unknown_job"] == 0
