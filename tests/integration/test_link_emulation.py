"""The soft switch's own link emulation on real ports: ``inalab switch --link``.

Two veth pairs, a host's raw socket on each host end, the switch on the switch ends,
forwarding by destination MAC. Loss is measured by counting frames and compared with
the switch's link stats file; delay by timing frames both ways across the link.
Needs root for veth pairs and raw sockets.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import statistics
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_switch_ports import frame, host_socket, recv_frame, veth_pairs

from controller.forwarder import HostRoute
from emulation.softswitch import SoftSwitchProcess

pytestmark = [pytest.mark.root, pytest.mark.slow]

MAC1, MAC2 = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
FRAMES = 3000
LOSS = 0.1
DELAY = 0.020
BATCH = 50  # frames sent before the receiver is drained (socket buffers are finite)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[dict[int, str], list[socket.socket]]]:
    """Switch ports {1, 2} on two veth pairs and a host's raw socket on each far end."""
    with veth_pairs(f"tl{os.getpid() % 100000}", 2) as pairs, contextlib.ExitStack() as stack:
        socks = [stack.enter_context(host_socket(host_if)) for host_if, _ in pairs]
        yield {1: pairs[0][1], 2: pairs[1][1]}, socks


@contextlib.contextmanager
def _switch(run_dir: Path, ports: dict[int, str], *options: str) -> Iterator[SoftSwitchProcess]:
    sw = SoftSwitchProcess(run_dir, lanes=4, slots=8, interfaces=ports, extra_args=options)
    with sw:
        with sw.controller() as ctl:
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:01", 1))
            ctl.forwarder.add_host(HostRoute("02:00:00:00:00:02", 2))
        yield sw
    assert sw.returncode == 0, sw.log_path.read_text()


def _numbered(dst: bytes, src: bytes, seq: int) -> bytes:
    return frame(dst, src, struct.pack("!I", seq) + bytes(46))


def _drain(sock: socket.socket, seen: set[int], wait: float = 0.0) -> None:
    """Add the sequence numbers of our frames on ``sock`` to ``seen``, until it has been
    quiet for ``wait`` seconds."""
    sock.settimeout(wait) if wait > 0 else sock.setblocking(False)
    with contextlib.suppress(BlockingIOError, TimeoutError):
        while True:
            seen.add(struct.unpack("!I", recv_frame(sock)[14:18])[0])


def _send_paced(tx: socket.socket, rx: socket.socket, dst: bytes, src: bytes) -> set[int]:
    seen: set[int] = set()
    for start in range(0, FRAMES, BATCH):
        for seq in range(start, start + BATCH):
            tx.send(_numbered(dst, src, seq))
        time.sleep(0.002)
        _drain(rx, seen)
    _drain(rx, seen, wait=0.5)
    return seen


def _read_stats(path: Path) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats


def _wait_for_stats(path: Path, done: Any, timeout: float = 5.0) -> dict[str, Any]:
    """The live stats file once ``done(stats)`` holds (it is written once a second)."""
    deadline = time.monotonic() + timeout
    while not done(stats := _read_stats(path)):
        assert time.monotonic() < deadline, f"link stats never got there: {stats}"
        time.sleep(0.05)
    return stats


def test_loss_both_ways_matches_the_rate_and_the_switch_counts(
    hosts: tuple[dict[int, str], list[socket.socket]], tmp_path: Path
) -> None:
    ports, (h1, h2) = hosts
    stats_path = tmp_path / "links.json"
    option = f"1:loss={LOSS},ingress"
    with _switch(tmp_path, ports, "--link", option, "--link-stats", str(stats_path)) as sw:
        # Port 1 faces host 1: its link is played on ingress (h1 -> h2) and egress (h2 -> h1).
        to_h2 = _send_paced(h1, h2, MAC2, MAC1)
        to_h1 = _send_paced(h2, h1, MAC1, MAC2)
        live = _wait_for_stats(
            stats_path,
            lambda s: all(s["ports"]["1"][d]["offered"] == FRAMES for d in ("ingress", "egress")),
        )
    final = _read_stats(stats_path)
    assert final == live  # nothing happened after; written again on exit all the same
    sigma = math.sqrt(FRAMES * LOSS * (1 - LOSS))
    for direction, seen in (("ingress", to_h2), ("egress", to_h1)):
        counts = final["ports"]["1"][direction]
        assert counts["offered"] == FRAMES, counts  # the kernel dropped none on the way
        assert counts["queue_dropped"] == counts["in_flight"] == 0
        assert len(seen) == counts["delivered"] == FRAMES - counts["lost"]
        assert abs(counts["lost"] - FRAMES * LOSS) <= 4 * sigma, counts
    assert set(final["ports"]) == {"1"}
    log = sw.log_path.read_text()
    assert f"'link1_ingress_lost': {final['ports']['1']['ingress']['lost']}" in log


def test_delay_each_way(hosts: tuple[dict[int, str], list[socket.socket]], tmp_path: Path) -> None:
    ports, (h1, h2) = hosts
    there, back = [], []
    with _switch(tmp_path, ports, "--link", f"1:delay={DELAY * 1e3:g}ms,ingress"):
        for seq in range(10):
            ping = _numbered(MAC2, MAC1, seq)
            t0 = time.monotonic()
            h1.send(ping)
            assert recv_frame(h2) == ping
            t1 = time.monotonic()
            pong = _numbered(MAC1, MAC2, seq)
            h2.send(pong)
            assert recv_frame(h1) == pong
            there.append(t1 - t0)
            back.append(time.monotonic() - t1)
    # Each crossing of port 1's link, h1 -> switch and switch -> h1, takes the delay once.
    for one_way in (there, back):
        assert min(one_way) >= DELAY, one_way
        assert statistics.median(one_way) < DELAY + 0.050, one_way


def test_queue_tail_drops_a_burst(
    hosts: tuple[dict[int, str], list[socket.socket]], tmp_path: Path
) -> None:
    ports, (h1, h2) = hosts
    stats_path = tmp_path / "links.json"
    # A burst of 40 reaches the switch well within the 200 ms delay: 10 wait, 30 drop.
    options = ("--link", "2:delay=200ms,queue=10", "--link-stats", str(stats_path))
    with _switch(tmp_path, ports, *options):
        for seq in range(40):
            h1.send(_numbered(MAC2, MAC1, seq))
        seen: set[int] = set()
        _drain(h2, seen, wait=0.5)
    counts = _read_stats(stats_path)["ports"]["2"]["egress"]
    assert seen == set(range(10))
    assert counts == {
        "offered": 40, "lost": 0, "queue_dropped": 30, "delivered": 10, "in_flight": 0,
    }  # fmt: skip
