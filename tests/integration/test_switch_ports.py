"""The soft switch on Ethernet ports (``inalab switch --interface``), beyond the vectors.

The data-plane vectors (aggregation, retransmission, invalid packets, forwarding) run
on veth pairs through tests/dataplane (target soft-ports); here: forwarding by a
P4Runtime-written entry, a port whose interface disappears, and the option's errors.
Needs root for veth pairs and raw sockets.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.softswitch import SoftSwitchProcess

pytestmark = pytest.mark.root

ETH_P_ALL = 0x0003


@pytest.fixture
def veths() -> Iterator[list[tuple[str, str]]]:
    """Three veth pairs (host end, switch end), deleted afterwards: only these."""
    tag = f"tp{os.getpid() % 100000}"
    pairs = [(f"{tag}h{i}", f"{tag}s{i}") for i in (1, 2, 3)]
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


def _frame(dst: bytes, src: bytes, payload: bytes) -> bytes:
    return dst + src + b"\x88\xb5" + payload  # IEEE local experimental ethertype


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
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            s.bind((host_if, 0))
            s.settimeout(2.0)
            socks.append(s)
        mac2 = bytes.fromhex("020000000002")
        with sw.controller() as ctl:
            from controller.forwarder import HostRoute

            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:02", 2))
        socks[0].send(_frame(mac2, bytes.fromhex("020000000001"), b"x" * 50))
        while True:  # the kernel may put its own frames on the wire too: find ours
            got = socks[1].recv(2048)
            if got[12:14] == b"\x88\xb5":
                break
        assert got[:6] == mac2 and got[14:64] == b"x" * 50
        # Port 3's interface goes away: the switch goes on serving the others.
        subprocess.run(["ip", "link", "del", veths[2][0]], check=True)
        socks[0].send(_frame(mac2, bytes.fromhex("020000000001"), b"y" * 50))
        while True:
            got = socks[1].recv(2048)
            if got[12:14] == b"\x88\xb5":
                break
        assert got[14:64] == b"y" * 50
        with sw.controller() as ctl:
            assert ctl.installed_jobs() == []  # P4Runtime still answers
    finally:
        for s in socks:
            s.close()
        code = sw.stop()
    assert code == 0, sw.log_path.read_text()


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--interface", "1"], 2, "is not PORT@IFACE"),
        (["--interface", "600@lo"], 2, "a port 0..511"),
        (["--interface", "1@lo", "--interface", "1@lo"], 2, "a port is given twice"),
        (["--interface", "1@nosuchif0"], 1, "No such device"),
        (["--interface", "1@lo", "--pcap", "x.pcap"], 2, "capture the interfaces"),
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
