"""Duplication and reordering by the eBPF switch's links, seen by the hosts (root, eBPF).

Two veth pairs, a host's raw socket on each host end, ``inalab switch --datapath ebpf``
on the switch ends, forwarding by destination MAC. Every end is shaped by HTB as
Mininet's TCLink shapes a link, host ends at 40 Mbit/s and port 1 (toward h1) at 20, so
frames from h2 queue at port 1 as they do at a busy switch port; port 1's class has the
reordering lanes (``lanes.lane_commands``, as the emulation makes them). Port 1 faces
h1 and its link duplicates frames both ways (``ingress``) and reorders them on egress:
h1 -> h2 crosses port 1's ingress, h2 -> h1 its egress.

What the receiver counts is compared with the switch's link stats and the lanes' own
counts: every copy the switch made arrived, every frame arrived at least once, frames
held back were overtaken on the wire and no frame bypassed the shaper. Without
duplication and reordering, the same queue delivers every frame once, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_switch_ports import frame, host_socket, recv_frame, veth_pairs

from controller.forwarder import HostRoute
from emulation.softswitch import SoftSwitchProcess
from emulation.softswitch.ebpf.lanes import lane_commands
from emulation.softswitch.process import SwitchStartError

pytestmark = [pytest.mark.root, pytest.mark.ebpf, pytest.mark.slow]

MAC1, MAC2 = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
FRAMES = 3000
BATCH = 50
HOST_MBIT, PORT1_MBIT = 40, 20  # h2's frames queue at port 1
FRAME_BYTES = 1000
DUP, REORDER = 0.1, 0.2
SO_RCVBUFFORCE = 33  # Linux; Python's socket module does not name it


def _shape(interface: str, mbit: int) -> None:
    burst = mbit * 1_000_000 // 8 // 1000  # 1 ms of the rate, as the emulator's
    for cmd in (f"qdisc add dev {interface} root handle 5: htb default 1",
                f"class add dev {interface} parent 5: classid 5:1 htb quantum 60000 "
                f"rate {mbit}mbit burst {burst} cburst {burst}"):  # fmt: skip
        subprocess.run(["tc", *cmd.split()], check=True)


@pytest.fixture
def hosts() -> Iterator[tuple[dict[int, str], list[socket.socket]]]:
    """Switch ports {1, 2} on two shaped veth pairs and a host's raw socket on each far
    end (qdiscs and lanes go with the pairs: only what this test made)."""
    with veth_pairs(f"lf{os.getpid() % 100000}", 2) as pairs, contextlib.ExitStack() as stack:
        for host_if, _ in pairs:
            _shape(host_if, HOST_MBIT)
        _shape(pairs[0][1], PORT1_MBIT)
        socks = [stack.enter_context(host_socket(host_if)) for host_if, _ in pairs]
        for s in socks:
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 24)
        yield {1: pairs[0][1], 2: pairs[1][1]}, socks


@contextlib.contextmanager
def _switch(run_dir: Path, ports: dict[int, str], *options: str) -> Iterator[SoftSwitchProcess]:
    sw = SoftSwitchProcess(run_dir, lanes=4, slots=8, interfaces=ports,
                           extra_args=("--datapath", "ebpf", *options))  # fmt: skip
    with sw:
        with sw.controller() as ctl:
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:01", 1))
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:02", 2))
        yield sw
    assert sw.returncode == 0, sw.log_path.read_text()


def _send(tx: socket.socket, rx: socket.socket, dst: bytes, src: bytes) -> list[int]:
    """Send FRAMES numbered frames in batches, paced to port 1's rate; the numbers as
    they arrived at ``rx``, in order."""
    arrived: list[int] = []
    pause = BATCH * FRAME_BYTES * 8 / (PORT1_MBIT * 1e6) * 1.2
    for start in range(0, FRAMES, BATCH):
        for seq in range(start, start + BATCH):
            tx.send(frame(dst, src, struct.pack("!I", seq) + bytes(FRAME_BYTES - 18)))
        time.sleep(pause)
        _drain(rx, arrived, 0.0)
    _drain(rx, arrived, 0.5)
    return arrived


def _drain(sock: socket.socket, arrived: list[int], wait: float) -> None:
    sock.settimeout(wait) if wait > 0 else sock.setblocking(False)
    with contextlib.suppress(BlockingIOError, TimeoutError):
        while True:
            arrived.append(struct.unpack("!I", recv_frame(sock)[14:18])[0])


def _overtaken(arrived: list[int]) -> int:
    """Frames whose first copy arrived after a frame sent later than them."""
    seen: set[int] = set()
    latest, late = -1, 0
    for seq in arrived:
        if seq in seen:
            continue
        seen.add(seq)
        late += seq < latest
        latest = max(latest, seq)
    return late


def _port1(path: Path) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats["ports"]["1"]


def _tc_count(args: str, pattern: str) -> int:
    out = subprocess.run(["tc", "-s", *args.split()], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    found = re.search(pattern, out)
    assert found, out
    return int(found.group(1))


def test_copies_and_held_back_frames_reach_the_hosts_as_counted(
    hosts: tuple[dict[int, str], list[socket.socket]], tmp_path: Path
) -> None:
    ports, (h1, h2) = hosts
    for command in lane_commands(ports[1]):
        subprocess.run(command, check=True)
    stats = tmp_path / "links.json"
    link = f"1:dup={DUP},reorder={REORDER},ingress"
    with _switch(tmp_path, ports, "--link", link, "--link-stats", str(stats)):
        to_h2 = _send(h1, h2, MAC2, MAC1)  # port 1's ingress
        to_h1 = _send(h2, h1, MAC1, MAC2)  # port 1's egress
    counts = _port1(stats)  # written again when the switch stopped
    for direction, arrived in (("ingress", to_h2), ("egress", to_h1)):
        c = counts[direction]
        assert c["offered"] == c["delivered"] == FRAMES and c["lost"] == 0, c
        assert sorted(set(arrived)) == list(range(FRAMES)), direction  # none lost
        assert len(arrived) - FRAMES == c["duplicated"], (direction, c)  # every copy came
        assert 0.5 * DUP * FRAMES < c["duplicated"] < 1.5 * DUP * FRAMES, c
    # Ingress: copies come later, at the back of the receive queue; nothing is held back.
    assert counts["ingress"]["reordered"] == 0 and _overtaken(to_h2) == 0
    # Egress: frames held back were overtaken on the wire, while h2's frames queued.
    held, late = counts["egress"]["reordered"], _overtaken(to_h1)
    assert 0.5 * REORDER * FRAMES < held < 1.5 * REORDER * FRAMES, counts["egress"]
    assert 0.5 * held < late <= held, (late, held)
    # The held-back lane sent them (and their copies), and nothing bypassed the shaper.
    lane = _tc_count(f"class show dev {ports[1]} classid 5:4", r"Sent \d+ bytes (\d+) pkt")
    assert held <= lane <= held + counts["egress"]["duplicated"]
    assert _tc_count(f"qdisc show dev {ports[1]}", r"direct_packets_stat (\d+)") == 0


def test_without_duplication_or_reordering_frames_come_once_in_order(
    hosts: tuple[dict[int, str], list[socket.socket]], tmp_path: Path
) -> None:
    ports, (h1, h2) = hosts
    stats = tmp_path / "links.json"
    with _switch(tmp_path, ports, "--link", "1:ingress", "--link-stats", str(stats)):
        to_h2 = _send(h1, h2, MAC2, MAC1)
        to_h1 = _send(h2, h1, MAC1, MAC2)
    counts = _port1(stats)
    for direction, arrived in (("ingress", to_h2), ("egress", to_h1)):
        assert arrived == list(range(FRAMES)), direction
        assert counts[direction]["duplicated"] == counts[direction]["reordered"] == 0


def test_a_reordering_link_needs_its_lanes(
    hosts: tuple[dict[int, str], list[socket.socket]], tmp_path: Path
) -> None:
    ports, _ = hosts
    options = ("--datapath", "ebpf", "--link", "1:reorder=0.1")
    sw = SoftSwitchProcess(tmp_path, lanes=4, slots=8, interfaces=ports, extra_args=options)
    with pytest.raises(SwitchStartError, match=f"{ports[1]} has none: HTB classes 5:3 and 5:4"):
        sw.start()
