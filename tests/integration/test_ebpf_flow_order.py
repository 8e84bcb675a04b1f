"""Emulated links keep each flow's order through the eBPF switch (root, Mininet, eBPF).

A veth hands a frame to its peer on the CPU that sent it; without
``emulation.mininet.network.IN_ORDER_FEATURES`` two cores could receive one flow's frames at
once and pass a later one first, and hostlib took the reordering for loss (fast
retransmissions at zero loss). With ``in_order_links`` both ends of every link get the
features; then numbered datagrams cross the switch, both ways and into one host from
two, on links loaded to their rate, and every flow must arrive in order. With the
features turned back (TSO on, GRO off), the order test failed in 2 of 5 runs (one
datagram of about 15,000 late); with them it passed 6 of 6.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from emulation.mininet.network import IN_ORDER_FEATURES, EmulationError, emulate
from emulation.topology import parse_topology

pytestmark = [pytest.mark.ebpf, pytest.mark.root, pytest.mark.mininet]

TOPOLOGY = {
    "name": "order",
    "switches": {"s1": {"datapath": "ebpf", "lanes": 2048}},  # lanes: a jumbo MTU
    "hosts": {"h1": {}, "h2": {}, "h3": {}},
    "links": [{"a": h, "b": "s1", "bw": bw} for h, bw in (("h1", 1000), ("h2", 1000), ("h3", 200))],
}

SECONDS = 2.0
OTHER_FRAMES = 16
"""Frames of the hosts' own (IPv6 neighbour discovery) a link may drop beside ours."""
PORT = 5001

RECEIVER = """
import json, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.settimeout(3.0)
last, got, late = {}, {}, {}
try:
    while True:
        data, (src, _) = s.recvfrom(65536)
        seq = struct.unpack_from("!Q", data)[0]
        got[src] = got.get(src, 0) + 1
        if seq <= last.get(src, -1):
            late[src] = late.get(src, 0) + 1
        last[src] = max(seq, last.get(src, -1))
except TimeoutError:
    pass
print(json.dumps({"got": got, "late": late}))
"""

SENDER = """
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# SO_SNDBUFFORCE (root): a veth leaves a datagram charged to its socket until it is sent
# or dropped, even in the switch's queue; room for more than that queue holds
s.setsockopt(socket.SOL_SOCKET, 32, 1 << 25)
dst, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
payload = bytearray(8192); seq = 0; end = time.monotonic() + seconds
while time.monotonic() < end:
    struct.pack_into("!Q", payload, 0, seq)
    try:
        s.sendto(payload, (dst, port))
    except OSError:
        time.sleep(0.0002)  # the shaper's queue is full: retry, as an application would
        continue
    seq += 1
print(seq)
"""


def _features(intf: Any) -> dict[str, str]:
    out = intf.cmd(f"ethtool -k {intf.name}")
    pairs = (line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k.strip(): v.split()[0] for k, v in pairs if v.split()}


@pytest.mark.parametrize("in_order", [False, True])
def test_in_order_links_set_the_features_on_every_veth(tmp_path: Path, in_order: bool) -> None:
    wanted = {"tso": "tcp-segmentation-offload", "gro": "generic-receive-offload"}
    words = IN_ORDER_FEATURES.split()
    expected = {wanted[k]: v for k, v in zip(words[::2], words[1::2], strict=True)}
    topo = parse_topology(TOPOLOGY)
    with emulate(topo, tmp_path, install_jobs=False, in_order_links=in_order) as em:
        assert em.plan is not None and em.plan.datapaths["s1"].datapath == "ebpf"
        seen = {intf.name: _features(intf) for intf in em.interfaces()}
    assert len(seen) == 6
    for name, features in seen.items():
        for feature, value in expected.items():
            if in_order:
                assert features.get(feature) == value, (name, feature, features.get(feature))
            else:  # a veth's own defaults: TSO on, GRO off
                assert features.get(feature) != value, (name, feature, features.get(feature))


def test_in_order_links_refuse_a_switch_that_reads_frames(tmp_path: Path) -> None:
    topo = parse_topology(TOPOLOGY)
    with (
        pytest.raises(EmulationError, match="in-order links need every switch on the eBPF"),
        emulate(topo, tmp_path, install_jobs=False, datapath="python", in_order_links=True),
    ):
        pass


def _ends(em: Any, host: str) -> tuple[str, str]:
    """(host's interface, the switch's port toward it) of ``host``'s link."""
    link = em.net.linksBetween(em.host(host), em.net.get("s1"))[0]
    pair = (link.intf1, link.intf2)
    return next(i.name for i in pair if i.node.name == host), next(
        i.name for i in pair if i.node.name == "s1"
    )


def _rcvbuf_errors(em: Any, host: str) -> int:
    """UDP datagrams ``host``'s kernel dropped for full socket buffers so far."""
    lines = [line.split() for line in em.host(host).cmd("cat /proc/net/snmp").splitlines()]
    names, values = (line for line in lines if line and line[0] == "Udp:")
    return int(values[names.index("RcvbufErrors")])


def test_numbered_datagrams_cross_loaded_links_in_order(tmp_path: Path) -> None:
    """h1 and h2 send to h3 (its link runs at 200 Mbit/s) while h3 sends to h1, each
    as fast as it can with a send buffer larger than a shaper's queue, so queues fill
    and drop: every flow's datagrams arrive in the order they were sent, and every
    datagram sent is received or counted as dropped by a link
    (``Emulation.link_drops``) or by the receiver's kernel, but for a few (below)."""
    flows = [("h1", "h3"), ("h2", "h3"), ("h3", "h1")]
    with emulate(parse_topology(TOPOLOGY), tmp_path, install_jobs=False, in_order_links=True) as em:
        drops_before = em.link_drops()
        rcvbuf_before = {h: _rcvbuf_errors(em, h) for h in ("h1", "h3")}
        receivers = {
            dst: em.host(dst).popen(
                [sys.executable, "-c", RECEIVER, str(PORT)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for dst in ("h1", "h3")
        }
        try:
            senders = [
                em.host(src).popen(
                    [
                        sys.executable,
                        "-c",
                        SENDER,
                        em.topology.host(dst).address,
                        str(PORT),
                        str(SECONDS),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                for src, dst in flows
            ]
            sent = []
            for p in senders:
                out, err = p.communicate(timeout=30)
                assert p.returncode == 0, err
                sent.append(int(out))
            reports = {}
            for dst, p in receivers.items():
                out, err = p.communicate(timeout=30)
                assert p.returncode == 0, err
                reports[dst] = json.loads(out)
        finally:
            for p in receivers.values():
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        addresses = {h: em.topology.host(h).address for h in ("h1", "h2", "h3")}
        drops = {k: v - drops_before[k] for k, v in em.link_drops().items()}
        rcvbuf = {h: _rcvbuf_errors(em, h) - rcvbuf_before[h] for h in ("h1", "h3")}
        ends = {h: _ends(em, h) for h in ("h1", "h2", "h3")}
    assert set(drops) == {name for pair in ends.values() for name in pair}
    assert sum(drops.values()) > 0, drops  # the queues overflowed
    for dst in ("h1", "h3"):
        into = [(src, n) for (src, d), n in zip(flows, sent, strict=True) if d == dst]
        received = sum(reports[dst]["got"].get(addresses[src], 0) for src, _ in into)
        lost = drops[ends[dst][1]] + sum(drops[ends[src][0]] for src, _ in into)
        missing = sum(n for _, n in into) - received - rcvbuf[dst]
        # a few frames of the hosts' own (IPv6 neighbour discovery) may be dropped too;
        # measured: 10-25 of some 100,000 missing datagrams were in no counter read here
        assert 0.99 * missing <= lost <= missing + OTHER_FRAMES, (dst, missing, drops, rcvbuf)
    for (src, dst), n in zip(flows, sent, strict=True):
        got = reports[dst]["got"].get(addresses[src], 0)
        late = reports[dst]["late"].get(addresses[src], 0)
        assert got > 100, (src, dst, got, n)  # the flow ran (the share of h3's link varies)
        assert late == 0, f"{src} -> {dst}: {late} of {got} datagrams out of order"
