"""Link bandwidth through the eBPF switch, both ways (root, Mininet, eBPF).

The program sends frames on with ``bpf_redirect`` from its TC hook, so the egress port's
HTB (the link's ``bw``) must still shape them: an XDP redirect would skip the qdisc and
leave the switch-to-host direction unshaped. h2's link is the slow one: h1 -> h2 is
shaped by the switch's port toward h2 (after the redirect), h2 -> h1 by h2's own end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from emulation.mininet.network import emulate
from emulation.topology import parse_topology

pytestmark = [pytest.mark.ebpf, pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

SLOW = 20.0  # Mbit/s, h2's link
TOPOLOGY = {
    "name": "ebpfbw",
    "switches": {"s1": {"datapath": "ebpf"}},
    "hosts": {"h1": {}, "h2": {}},
    "links": [{"a": "h1", "b": "s1", "bw": 200}, {"a": "h2", "b": "s1", "bw": SLOW}],
}

RECEIVER = """
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
s.bind(("0.0.0.0", 5001)); s.settimeout(5.0)
n = first = last = 0
try:
    while True:
        size = len(s.recv(65536)); now = time.monotonic()
        first = first or now; last = now; n += size + 42  # + Ethernet, IPv4, UDP headers
except TimeoutError:
    pass
print(json.dumps({"bytes": n, "seconds": last - first}))
"""

SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = bytes(1400); end = time.monotonic() + 3.0
while time.monotonic() < end:
    try:
        s.sendto(payload, (sys.argv[1], 5001))
    except OSError:
        time.sleep(0.0005)  # the shaper's queue is full: as an application would, retry
"""


def _rate(em: Any, src: str, dst: str) -> float:
    """Mbit/s of frames arriving at ``dst`` while ``src`` sends as fast as it can."""
    receiver = em.host(dst).popen(
        [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        sender = em.host(src).popen(
            [sys.executable, "-c", SENDER, em.topology.host(dst).address],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = sender.communicate(timeout=30)
        assert sender.returncode == 0, err
        out, _ = receiver.communicate(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
        receiver.communicate()
    got = json.loads(out.decode())
    return got["bytes"] * 8 / got["seconds"] / 1e6


def test_the_slow_link_holds_its_rate_both_ways(tmp_path: Path) -> None:
    topo = parse_topology(TOPOLOGY)
    with emulate(topo, tmp_path, install_jobs=False) as em:
        assert em.plan is not None and em.plan.datapaths["s1"].datapath == "ebpf"
        toward_h2 = _rate(em, "h1", "h2")  # shaped after the program's redirect
        from_h2 = _rate(em, "h2", "h1")
    for rate in (toward_h2, from_h2):
        assert 0.7 * SLOW <= rate <= 1.1 * SLOW, (toward_h2, from_h2)
