"""Test tooling: veth pairs for a switch's ports, and hosts on them through raw sockets.

Imported as ``ports`` (``tests/`` is on ``sys.path``). Root only.

- :class:`VethPorts` makes one veth pair per switch port and removes exactly those on
  exit (they are named with this process's id; never found by pattern).
- :class:`RawPortTransport` is a ``hostlib`` transport on the host end of one pair:
  Ethernet/IPv4/UDP frames to the switch's INA address built by hand, results read back
  with a raw socket, so ``hostlib.session.InaSession`` runs unchanged against a switch on
  ports.
- :class:`FaultyTransport` wraps a transport with seeded loss, duplication and
  reordering of what it sends and receives.
"""

from __future__ import annotations

import os
import random
import select
import socket
import struct
import subprocess
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hostlib.protocol import INA_UDP_PORT
from hostlib.transport.base import Addr, TransportError

ETH_P_ALL = 0x0003
SWITCH_MAC = "02:00:00:00:00:fe"
SWITCH_IP = "10.0.0.254"
"""The switch's INA endpoint on the test wire (what hosts send to; results come from)."""

_IPV4 = b"\x08\x00"


@dataclass(frozen=True)
class Identity:
    """A test host on port ``port``: MAC 02:00:00:00:00:pp, IPv4 10.0.0.p, UDP 40000+p."""

    port: int

    @property
    def mac(self) -> str:
        return f"02:00:00:00:00:{self.port:02x}"

    @property
    def ip(self) -> str:
        return f"10.0.0.{self.port}"

    @property
    def udp_port(self) -> int:
        return 40000 + self.port


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@contextmanager
def veth_ports(
    count: int, tag: str, mtu: int | None = None
) -> Iterator[dict[int, tuple[str, str]]]:
    """Ports 1..count as veth pairs: port -> (host end, switch end), up, IPv6 off.

    The pairs are named ``<tag><pid % 1e5>h<p>``/``s<p>`` and removed on exit, whatever
    the exit (only these: deleting one end removes its pair).
    """
    stem = f"{tag}{os.getpid() % 100000}"
    made: list[str] = []
    try:
        out = {}
        for port in range(1, count + 1):
            host, switch = f"{stem}h{port}", f"{stem}s{port}"
            _ip("link", "add", host, "type", "veth", "peer", "name", switch)
            made.append(host)
            for name in (host, switch):
                path = Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6")
                if path.exists():
                    path.write_text("1")  # no router solicitations on the test wire
                if mtu is not None:
                    _ip("link", "set", name, "mtu", str(mtu))
                _ip("link", "set", name, "up")
            out[port] = (host, switch)
        yield out
    finally:
        for name in made:
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def udp_frame(src: Identity, dst_mac: str, dst_ip: str, dst_port: int, payload: bytes) -> bytes:
    """An Ethernet/IPv4/UDP frame from ``src`` (UDP checksum 0: none)."""
    total = 28 + len(payload)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0,
                               socket.inet_aton(src.ip), socket.inet_aton(dst_ip)))  # fmt: skip
    ip[10:12] = _checksum(bytes(ip)).to_bytes(2, "big")
    udp = struct.pack("!HHHH", src.udp_port, dst_port, 8 + len(payload), 0)
    macs = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src.mac.replace(":", ""))
    return b"".join((macs, _IPV4, bytes(ip), udp, payload))


class RawPortTransport:
    """A host on one test port: sends INA datagrams to the switch as Ethernet frames,
    receives the UDP datagrams addressed to it (a ``hostlib`` transport).

    Args:
        interface: the host end of the port's veth pair.
        me: the host's identity (its MAC, IPv4 and UDP port on the wire).
    """

    def __init__(self, interface: str, me: Identity) -> None:
        self.me = me
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._sock.bind((interface, 0))
        self._sock.setblocking(False)
        self._buf = bytearray(65536)
        self._mac = bytes.fromhex(me.mac.replace(":", ""))
        self._ip = socket.inet_aton(me.ip)

    @property
    def local_addr(self) -> Addr:
        return (self.me.ip, self.me.udp_port)

    def send(self, data: bytes | memoryview, dest: Addr) -> None:
        if dest != (SWITCH_IP, INA_UDP_PORT):
            raise TransportError(f"this test port only reaches the switch, not {dest}")
        self._sock.send(udp_frame(self.me, SWITCH_MAC, SWITCH_IP, INA_UDP_PORT, bytes(data)))

    def recv_into(self, buf: bytearray | memoryview, timeout: float) -> tuple[int, Addr | None]:
        deadline = None
        while True:
            try:
                n = self._sock.recv_into(self._buf)
            except BlockingIOError:
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + timeout
                if now >= deadline or not select.select([self._sock], [], [], deadline - now)[0]:
                    return 0, None
                continue
            got = self._datagram(n, buf)
            if got is not None:
                return got

    def _datagram(self, n: int, buf: bytearray | memoryview) -> tuple[int, Addr] | None:
        f = self._buf
        if n < 42 or f[12:14] != _IPV4 or f[23] != 17 or f[0:6] != self._mac:
            return None
        if f[30:34] != self._ip or int.from_bytes(f[36:38], "big") != self.me.udp_port:
            return None
        length = int.from_bytes(f[38:40], "big") - 8
        buf[:length] = f[42 : 42 + length]
        src = (socket.inet_ntoa(bytes(f[26:30])), int.from_bytes(f[34:36], "big"))
        return length, src

    def close(self) -> None:
        self._sock.close()


class FaultyTransport:
    """``inner`` with seeded faults: each datagram sent or received is lost with
    ``loss``, doubled with ``dup``, and with ``reorder`` held back until after the next
    one (a held datagram is received late when nothing else comes)."""

    def __init__(
        self, inner: RawPortTransport, seed: int, loss: float, dup: float, reorder: float
    ) -> None:
        self.inner = inner
        self._random = random.Random(seed).random
        self.loss, self.dup, self.reorder = loss, dup, reorder
        self._held_out: tuple[bytes, Addr] | None = None
        self._held_in: tuple[bytes, Addr] | None = None
        self._inbox: deque[tuple[bytes, Addr]] = deque()
        self.counts = {"lost": 0, "duplicated": 0, "reordered": 0}

    @property
    def local_addr(self) -> Addr:
        return self.inner.local_addr

    def send(self, data: bytes | memoryview, dest: Addr) -> None:
        for copy in self._fate(bytes(data)):
            if self._held_out is None and self._random() < self.reorder:
                self.counts["reordered"] += 1
                self._held_out = (copy, dest)
                continue
            self.inner.send(copy, dest)
            if self._held_out is not None:
                held, self._held_out = self._held_out, None
                self.inner.send(*held)

    def recv_into(self, buf: bytearray | memoryview, timeout: float) -> tuple[int, Addr | None]:
        while not self._inbox:
            n, src = self.inner.recv_into(buf, timeout)
            if not n or src is None:
                if self._held_in is None:
                    return 0, None
                self._inbox.append(self._held_in)
                self._held_in = None
                break
            for copy in self._fate(bytes(buf[:n])):
                if self._held_in is None and self._random() < self.reorder:
                    self.counts["reordered"] += 1
                    self._held_in = (copy, src)
                    continue
                self._inbox.append((copy, src))
                if self._held_in is not None:
                    self._inbox.append(self._held_in)
                    self._held_in = None
        data, src = self._inbox.popleft()
        buf[: len(data)] = data
        return len(data), src

    def _fate(self, data: bytes) -> list[bytes]:
        if self._random() < self.loss:
            self.counts["lost"] += 1
            return []
        if self._random() < self.dup:
            self.counts["duplicated"] += 1
            return [data, data]
        return [data]

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class Hammer:
    """One sender process of :func:`hammer`: ranks ``ranks`` of a job on one port,
    pinned to ``cpu``, for ``rounds`` rounds over ``slots`` slots."""

    interface: str
    port: int
    ranks: tuple[int, ...]
    num_workers: int
    job_id: int
    slots: int
    rounds: int
    lanes: int
    cpu: int


def rank_identity(port: int, rank: int) -> tuple[str, str, int]:
    """(MAC, IPv4, UDP port) of rank ``rank`` sending from port ``port``: several ranks
    may share a port, each its own address."""
    return f"02:00:00:00:{rank:02x}:{port:02x}", f"10.{rank + 1}.0.{port}", 41000 + rank


def hammer(plan: Hammer, out: Any) -> None:
    """A sender process: its ranks' packets of every slot, round after round, as fast as
    it can; a round ends when every slot's result came back (retransmitting what has
    not after 20 ms). Puts ``{"rounds", "bad", "resent"}`` on queue ``out``: rounds
    completed, results whose lanes were not the expected sum, packets sent again."""
    os.sched_setaffinity(0, {plan.cpu})
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((plan.interface, 0))
    sock.settimeout(0.02)
    mine = {rank_identity(plan.port, r)[2]: r for r in plan.ranks}
    stats = {"rounds": 0, "bad": 0, "resent": 0}
    buf = bytearray(65536)
    for rnd in range(plan.rounds):
        want = sum(r + 1 + rnd for r in range(plan.num_workers))
        frames = {
            s: [_hammer_frame(plan, r, rnd, s) for r in plan.ranks] for s in range(plan.slots)
        }
        for group in frames.values():
            for frame in group:
                sock.send(frame)
        missing = set(frames)
        deadline = time.monotonic() + 3.0
        while missing and time.monotonic() < deadline:
            try:
                n = sock.recv_into(buf)
            except TimeoutError:
                for s in missing:  # no news for 20 ms: send the slot's packets again
                    for frame in frames[s]:
                        sock.send(frame)
                        stats["resent"] += 1
                continue
            if n < 42 + 16 or int.from_bytes(buf[36:38], "big") not in mine:
                continue
            seq = int.from_bytes(buf[54:58], "big")
            slot = seq - 1 - rnd * plan.slots
            if slot not in missing:
                continue
            lanes = np.frombuffer(bytes(buf[58 : 58 + 4 * plan.lanes]), dtype=">i4")
            if not np.all(lanes == want):
                stats["bad"] += 1
            missing.discard(slot)
        if missing:
            break
        stats["rounds"] += 1
    sock.close()
    out.put(stats)


def _hammer_frame(plan: Hammer, rank: int, rnd: int, slot: int) -> bytes:
    mac, ip, udp_port = rank_identity(plan.port, rank)
    seq = rnd * plan.slots + slot + 1
    pool = slot | (0x8000 if rnd % 2 else 0)
    vt = 0x11  # version 1, DATA
    header = struct.pack("!BBHBbHHHI", vt, 0, plan.job_id, rank, -128, plan.lanes, pool, 0, seq)
    payload = header + struct.pack(f"!{plan.lanes}i", *([rank + 1 + rnd] * plan.lanes))
    total = 28 + len(payload)
    iph = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0,
                                socket.inet_aton(ip), socket.inet_aton(SWITCH_IP)))  # fmt: skip
    iph[10:12] = _checksum(bytes(iph)).to_bytes(2, "big")
    udp = struct.pack("!HHHH", udp_port, INA_UDP_PORT, 8 + len(payload), 0)
    macs = bytes.fromhex(SWITCH_MAC.replace(":", "")) + bytes.fromhex(mac.replace(":", ""))
    return b"".join((macs, _IPV4, bytes(iph), udp, payload))
