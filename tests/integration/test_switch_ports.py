"""The soft switch on Ethernet ports (``inalab switch --interface``), beyond the vectors.

The data-plane vectors (aggregation, retransmission, invalid packets, forwarding) run
on veth pairs through tests/dataplane (target soft-ports); here: forwarding by a
P4Runtime-written entry, a port whose interface disappears, the switch's own pcap of
its frames, and the options' errors. Needs root for veth pairs and raw sockets.

``veth_pairs``, ``host_socket`` and ``frame`` are shared with test_link_emulation.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from emulation.softswitch import SoftSwitchProcess

pytestmark = pytest.mark.root

ETH_P_ALL = 0x0003
ETHERTYPE = b"\x88\xb5"  # IEEE local experimental ethertype
_PACKET_OUTGOING = 4


@contextlib.contextmanager
def veth_pairs(tag: str, count: int) -> Iterator[list[tuple[str, str]]]:
    """``count`` veth pairs (host end, switch end) named after ``tag``, up, without
    IPv6 (no kernel chatter); deleted afterwards: only these."""
    pairs = [(f"{tag}h{i}", f"{tag}s{i}") for i in range(1, count + 1)]
    made = []
    try:
        for host_if, switch_if in pairs:
            subprocess.run(["ip", "link", "add", host_if, "type", "veth", "peer", "name",
                            switch_if], check=True)  # fmt: skip
            made.append(host_if)
            for name in (host_if, switch_if):
                subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{name}.disable_ipv6=1"],
                               check=True)  # fmt: skip
                subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield pairs
    finally:
        for name in made:
            subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def host_socket(name: str, timeout: float = 2.0) -> socket.socket:
    """A raw socket on interface ``name``: a host that sends and receives whole frames."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((name, 0))
    s.settimeout(timeout)
    return s


def recv_frame(sock: socket.socket) -> bytes:
    """The next frame with our ethertype that arrived on ``sock`` (not one it sent).

    Raises:
        TimeoutError: none within the socket's timeout.
    """
    while True:  # the kernel may put its own frames on the wire too: find ours
        got, addr = sock.recvfrom(2048)
        if addr[2] != _PACKET_OUTGOING and got[12:14] == ETHERTYPE:
            return got


@pytest.fixture
def veths() -> Iterator[list[tuple[str, str]]]:
    """Three veth pairs (host end, switch end), deleted afterwards: only these."""
    with veth_pairs(f"tp{os.getpid() % 100000}", 3) as pairs:
        yield pairs


def frame(dst: bytes, src: bytes, payload: bytes) -> bytes:
    return dst + src + ETHERTYPE + payload


@pytest.mark.slow
def test_forwarding_and_a_port_that_disappears(
    veths: list[tuple[str, str]], tmp_path: Path
) -> None:
    ports = {i + 1: switch_if for i, (_, switch_if) in enumerate(veths)}
    sw = SoftSwitchProcess(tmp_path, lanes=4, slots=8, interfaces=ports).start()
    socks = []
    try:
        assert sw.ready_info["data"] is None
        assert sw.ready_info["interfaces"] == {str(p): n for p, n in ports.items()}
        for host_if, _ in veths:
            socks.append(host_socket(host_if))
        mac2 = bytes.fromhex("020000000002")
        with sw.controller() as ctl:
            from controller.forwarder import HostRoute

            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:02", 2))
        socks[0].send(frame(mac2, bytes.fromhex("020000000001"), b"x" * 50))
        got = recv_frame(socks[1])
        assert got[:6] == mac2 and got[14:64] == b"x" * 50
        # Port 3's interface goes away: the switch goes on serving the others.
        subprocess.run(["ip", "link", "del", veths[2][0]], check=True)
        socks[0].send(frame(mac2, bytes.fromhex("020000000001"), b"y" * 50))
        got = recv_frame(socks[1])
        assert got[14:64] == b"y" * 50
        with sw.controller() as ctl:
            assert ctl.installed_jobs() == []  # P4Runtime still answers
    finally:
        for s in socks:
            s.close()
        code = sw.stop()
    assert code == 0, sw.log_path.read_text()


def test_pcap_on_ports_holds_the_frames_received_and_sent(
    veths: list[tuple[str, str]], tmp_path: Path
) -> None:
    pcap = tmp_path / "ports.pcap"
    ports = {1: veths[0][1], 2: veths[1][1]}
    mac1, mac2 = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
    sent = [frame(mac2, mac1, bytes([i]) * 50) for i in range(3)]
    sent.append(frame(mac1, mac2, b"back" * 12))
    with contextlib.ExitStack() as stack:
        sw = stack.enter_context(
            SoftSwitchProcess(tmp_path, lanes=4, slots=8, interfaces=ports,
                              extra_args=("--pcap", str(pcap)))
        )  # fmt: skip
        h1, h2 = (stack.enter_context(host_socket(veths[i][0])) for i in (0, 1))
        with sw.controller() as ctl:
            from controller.forwarder import HostRoute

            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:01", 1))
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:02", 2))
        for f in sent[:3]:
            h1.send(f)
            assert recv_frame(h2) == f
        h2.send(sent[3])
        assert recv_frame(h1) == sent[3]
    assert sw.returncode == 0, sw.log_path.read_text()
    packets = rdpcap(str(pcap))
    assert all(isinstance(p, Ether) for p in packets)  # link type 1 (Ethernet)
    ours = [bytes(p) for p in packets if bytes(p)[12:14] == ETHERTYPE]
    # Each frame twice: as received on its port, then as sent out of the other.
    assert ours == [f for f in sent for _ in (0, 1)]


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--interface", "1"], 2, "is not PORT@IFACE"),
        (["--interface", "600@lo"], 2, "a port 0..511"),
        (["--interface", "1@lo", "--interface", "1@lo"], 2, "a port is given twice"),
        (["--interface", "1@nosuchif0"], 1, "No such device"),
        (["--interface", "1@lo", "--pcap", "no/such/dir/x.pcap"], 1, "--pcap: "),
        (["--interface", "1@lo", "--link", "1:loss=1"], 2, "outside [0, 1)"),
        (["--interface", "1@lo", "--link", "2:loss=0.1"], 2, "not an --interface port"),
        (["--interface", "1@lo", "--link-stats", "no/such/dir/s.json"], 1, "--link-stats: "),
    ],
)
def test_interface_option_errors(
    argv: list[str], status: int, message: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "emulation.softswitch.cli", "--p4runtime", "127.0.0.1:0", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == status, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
