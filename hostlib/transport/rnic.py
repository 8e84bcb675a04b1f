"""An emulated RDMA NIC: RoCEv2 UC queue pairs and memory regions on a UDP socket.

For machines without an RNIC (no device, no ``rdma_rxe``), this puts on the wire the
frames an RNIC would for the operations INA uses, and checks what comes back as a UC
responder does; ``hostlib.transport.rdma`` runs INA over it or over real verbs alike.
The frames are :mod:`hostlib.rocev2`'s: byte for byte a RoCEv2 UC RDMA WRITE, ICRC
included, sent from a socket bound to the address's UDP port 4791 (an unconnected socket
with Don't Fragment, so the kernel writes the IPv4 identification 0 the ICRC assumes).

What it does, and what it checks on receive (each refusal counted in :attr:`counters`):

- :meth:`post_write` sends one message as ``ceil(len / pmtu)`` packets with consecutive
  PSNs of the queue pair: FIRST (RETH), MIDDLE ..., LAST with immediate (or ONLY);
- a received frame must carry a correct ICRC (``bad_icrc``; unless :attr:`check_icrc`
  is off) and a known queue pair
  (``unknown_qp``), come from the queue pair's peer address (``bad_source``), and carry
  the PSN expected next. Any other PSN ends the message in progress (its rest is dropped
  until a FIRST or ONLY), and a FIRST or ONLY with it starts a new one, behind or ahead
  alike, as a UC responder does (Linux's rxe): a MIDDLE or LAST ahead means packets were
  lost (``psn_gap``), one behind is a copy or older (``duplicate``); a MIDDLE or LAST
  outside a message is dropped (``out_of_message``);
- a FIRST or ONLY must name a registered memory region by R_Key with its whole DMA length
  inside it (``bad_rkey``); the message's data is written there as it arrives, and a
  LAST or ONLY must end it at exactly the DMA length (``bad_length``);
- a message with immediate completes with a :class:`Completion` (queue pair, immediate,
  bytes) for :meth:`poll`.

:mod:`hostlib.transport.rnic_native` is the same NIC with its per-packet work in C
(``hostlib/_rnicore.c``), held to this one by a differential test; ``hostlib.native``'s
:func:`~hostlib.native.emulated_rnic` picks either as it picks the host engine.

One emulated NIC is one IPv4 address: a second process cannot bind the same address's
port 4791, so ranks that share a host need addresses of their own (loopback has many).
"""

from __future__ import annotations

import errno
import random
import select
import socket
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Self

from hostlib import rocev2
from hostlib.protocol import ROCE_BTH_SIZE, ROCE_ICRC_SIZE, ROCE_PMTUS, ROCE_UDP_PORT
from hostlib.transport.base import Addr, TransportError

__all__ = [
    "RNIC_COUNTERS",
    "Completion",
    "EmulatedRnic",
    "MemoryRegion",
    "QueuePair",
    "RnicBase",
    "check_write",
]

RNIC_COUNTERS = (
    "frames_out",
    "frames_in",
    "completions",
    "bad_icrc",
    "malformed",
    "unknown_qp",
    "bad_source",
    "psn_gap",
    "duplicate",
    "out_of_message",
    "bad_rkey",
    "bad_length",
)
"""What :attr:`EmulatedRnic.counters` counts: frames sent and received, completions, and
the receive checks' refusals (module docstring)."""

_IP_MTU_DISCOVER = 10  # linux/in.h
_IP_PMTUDISC_DO = 2  # Don't Fragment on every datagram
_BUFFER_BYTES = 8 << 20


class Completion(NamedTuple):
    """A received WRITE with immediate, complete: its queue pair, immediate and bytes."""

    qpn: int
    imm: int
    byte_len: int


@dataclass
class MemoryRegion:
    """Registered memory: ``buf`` at virtual address ``va``, remote key ``rkey``."""

    buf: bytearray
    va: int
    rkey: int

    def holds(self, va: int, length: int) -> bool:
        return self.va <= va and va + length <= self.va + len(self.buf)

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` into the region."""
        return bytes(self.buf[offset : offset + length])


@dataclass
class QueuePair:
    """A UC queue pair: its number, the peer it is connected to, and both PSN streams.

    Attributes:
        qpn: this queue pair's number.
        send_psn: the PSN of the next packet sent.
        recv_psn: the PSN expected next.
        peer: the peer's (IPv4, queue pair number), once connected.
    """

    qpn: int
    send_psn: int
    recv_psn: int = 0
    peer: tuple[str, int] | None = None
    # the responder's message in progress: where its next byte goes, and its end
    _mr: MemoryRegion | None = field(default=None, repr=False)
    _begin: int = 0
    _at: int = 0
    _end: int = 0
    _open: bool = False


class RnicBase:
    """What every emulated RNIC shares (this module's and the native one's): the address,
    the path MTU and the socket bound to its port 4791, and the identifiers an RNIC picks
    (queue pair numbers, initial PSNs, R_Keys, addresses), drawn from ``seed`` in one
    order so that both NICs pick the same ones.

    Raises:
        ValueError: ``pmtu`` is not an RDMA MTU.
        TransportError: the address's port 4791 cannot be bound.
    """

    def __init__(self, address: str, pmtu: int = 256, seed: int | None = None) -> None:
        if pmtu not in ROCE_PMTUS:
            raise ValueError(f"path MTU {pmtu} is not one of {ROCE_PMTUS}")
        self.address, self.pmtu = address, pmtu
        self._rng = random.Random(seed)
        self._sock = _bind(address)
        self.mrs: dict[int, MemoryRegion] = {}
        self._next_qpn = self._rng.randrange(0x100, 0x800000)
        self._next_va = 0x7F00_0000_0000 + self._rng.randrange(1 << 20) * 4096
        self.counters = dict.fromkeys(RNIC_COUNTERS, 0)

    def _new_region(self, size: int) -> MemoryRegion:
        """``size`` zeroed bytes with a fresh R_Key and address, in :attr:`mrs`."""
        rkey = self._rng.randrange(1, 1 << 32)
        while rkey in self.mrs:
            rkey = self._rng.randrange(1, 1 << 32)
        mr = MemoryRegion(bytearray(size), self._next_va, rkey)
        self._next_va += (size + 4095) // 4096 * 4096 + 4096
        self.mrs[rkey] = mr
        return mr

    def _new_qp(self) -> tuple[int, int]:
        """A fresh queue pair number and a random initial PSN."""
        qpn = self._next_qpn
        self._next_qpn = qpn + 1 if qpn < rocev2.QPN_MASK else 0x100
        return qpn, self._rng.randrange(1 << 24)

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_write(
    qpn: int,
    peer: tuple[str, int] | None,
    data: bytes | memoryview,
    va: int,
    rkey: int,
    imm: int | None,
) -> tuple[str, int]:
    """The peer of a WRITE on queue pair ``qpn``, checked before any packet of it is sent.

    Raises:
        TransportError: the queue pair is not connected.
        rocev2.RoceError: a payload that is not whole 32-bit words, or a virtual address,
            R_Key, length or immediate that does not fit its field.
    """
    if peer is None:
        raise TransportError(f"queue pair {qpn:#x} is not connected")
    if len(data) % 4:
        raise rocev2.RoceError(f"a payload of {len(data)} bytes is not whole words")
    for name, value, bits in (("va", va, 64), ("rkey", rkey, 32), ("dma_length", len(data), 32),
                              ("imm", imm or 0, 32)):  # fmt: skip
        if not 0 <= value < 1 << bits:
            raise rocev2.RoceError(f"{name}={value} outside {bits} bits")
    return peer


class EmulatedRnic(RnicBase):
    """RoCEv2 UC WRITEs on a UDP socket bound to ``address``:4791, each packet in Python.

    Args:
        address: this NIC's IPv4 address (its GID's address).
        pmtu: the path MTU, the payload of every packet of a message but its last.
        seed: for queue pair numbers, initial PSNs and R_Keys (as an RNIC picks them).

    Raises:
        ValueError: ``pmtu`` is not an RDMA MTU.
        TransportError: the address's port 4791 cannot be bound (another NIC, emulated
            or kernel ``rdma_rxe``, has it).
    """

    def __init__(self, address: str, pmtu: int = 256, seed: int | None = None) -> None:
        super().__init__(address, pmtu, seed)
        self.qps: dict[int, QueuePair] = {}
        self.completions: deque[Completion] = deque()
        self._buf = bytearray(65536)
        self.check_icrc = True
        """Off, a received frame's ICRC is taken as right (a P4 switch's replies carry
        none: docs/rdma.md); a frame too short to hold one still counts ``bad_icrc``."""

    # ----------------------------------------------------------------- verbs
    def register(self, size: int) -> MemoryRegion:
        """Register ``size`` zeroed bytes for remote writes (``ibv_reg_mr``)."""
        return self._new_region(size)

    def create_qp(self) -> QueuePair:
        """A new UC queue pair with a fresh number and a random initial PSN."""
        qp = QueuePair(*self._new_qp())
        self.qps[qp.qpn] = qp
        return qp

    def connect(self, qp: QueuePair, peer_ip: str, peer_qpn: int, recv_psn: int) -> None:
        """Connect ``qp`` to the peer's queue pair (INIT -> RTR -> RTS): send there, and
        accept packets from there starting at PSN ``recv_psn``.

        Raises:
            ValueError: a queue pair number or PSN outside 24 bits.
        """
        if not 0 <= peer_qpn <= rocev2.QPN_MASK or not 0 <= recv_psn <= rocev2.PSN_MASK:
            raise ValueError(f"queue pair {peer_qpn} or PSN {recv_psn} outside 24 bits")
        qp.peer = (peer_ip, peer_qpn)
        qp.recv_psn = recv_psn
        qp._open = False

    def post_write(
        self, qp: QueuePair, data: bytes | memoryview, va: int, rkey: int, imm: int | None
    ) -> None:
        """Send ``data`` as one RDMA WRITE (with immediate unless ``imm`` is None).

        Raises:
            TransportError: ``qp`` is not connected, or the send fails.
            rocev2.RoceError: a field does not fit (:func:`check_write`); nothing is sent.
        """
        peer = check_write(qp.qpn, qp.peer, data, va, rkey, imm)
        for frame in self._frames(qp, peer, data, va, rkey, imm):
            self._send(frame, peer[0])

    def build_write(
        self, qp: QueuePair, data: bytes | memoryview, va: int, rkey: int, imm: int | None
    ) -> list[bytes]:
        """The frames :meth:`post_write` would send, returned instead (the queue pair's
        PSNs advance as on a send; for tests that compare NICs byte for byte).

        Raises:
            TransportError, rocev2.RoceError: as :meth:`post_write`.
        """
        peer = check_write(qp.qpn, qp.peer, data, va, rkey, imm)
        return list(self._frames(qp, peer, data, va, rkey, imm))

    def _frames(
        self,
        qp: QueuePair,
        peer: tuple[str, int],
        data: bytes | memoryview,
        va: int,
        rkey: int,
        imm: int | None,
    ) -> Iterator[bytes]:
        peer_ip, peer_qpn = peer
        n = max(1, -(-len(data) // self.pmtu))
        for k in range(n):
            chunk = bytes(data[k * self.pmtu : (k + 1) * self.pmtu])
            frame = rocev2.RoceFrame(
                rocev2.message_opcode(k, n, immediate=imm is not None),
                peer_qpn, qp.send_psn, chunk, va, rkey, len(data), imm,
            )  # fmt: skip
            qp.send_psn = rocev2.psn_add(qp.send_psn, 1)
            yield rocev2.build_frame(frame, self.address, peer_ip)

    def poll(self, timeout: float) -> list[Completion]:
        """Receive frames for up to ``timeout`` seconds or until a completion is ready;
        return the completions ready (``ibv_poll_cq``)."""
        if not self.completions:
            self._receive(timeout)
        out = list(self.completions)
        self.completions.clear()
        return out

    # ----------------------------------------------------------------- wire
    def _send(self, frame: bytes, peer_ip: str) -> None:
        try:
            self._sock.sendto(frame, (peer_ip, ROCE_UDP_PORT))
        except OSError as exc:
            raise TransportError(f"RoCEv2 send to {peer_ip}: {exc}") from None
        self.counters["frames_out"] += 1

    def _receive(self, timeout: float) -> None:
        ready, _, _ = select.select([self._sock], [], [], max(timeout, 0.0))
        while ready and not self.completions:
            try:
                n, src = self._sock.recvfrom_into(self._buf)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                    continue  # an ICMP error for an earlier send: nothing to receive
                raise TransportError(f"RoCEv2 receive on {self.address}: {exc}") from None
            self.counters["frames_in"] += 1
            self.on_frame(memoryview(self._buf)[:n], src)

    def on_frame(self, data: memoryview, src: Addr) -> None:
        """Take one received RoCEv2 UDP payload from ``src`` (public for tests that feed
        frames by hand)."""
        counters = self.counters
        if len(data) < ROCE_BTH_SIZE + ROCE_ICRC_SIZE or (
            self.check_icrc and not rocev2.icrc_ok(src[0], self.address, src[1], data)
        ):
            counters["bad_icrc"] += 1
            return
        try:
            frame = rocev2.parse_frame(data)
        except rocev2.RoceError:
            counters["malformed"] += 1
            return
        qp = self.qps.get(frame.dest_qp)
        if qp is None or qp.peer is None:
            counters["unknown_qp"] += 1
            return
        if src[0] != qp.peer[0]:
            counters["bad_source"] += 1
            return
        reason = self._sequence(qp, frame)
        if reason is None:
            reason = self._write(qp, frame)
        if reason is not None:
            counters[reason] += 1

    def _sequence(self, qp: QueuePair, frame: rocev2.RoceFrame) -> str | None:
        """UC's PSN rule; the counter of a refusal, or None to take the packet."""
        ahead = (frame.psn - qp.recv_psn) & rocev2.PSN_MASK
        if ahead == 0:
            return None
        # Not the PSN expected: the message in progress is gone, and the packet is taken
        # only if it starts a message, behind or ahead alike (UC has no duplicates to
        # detect; Linux's rxe responder does the same).
        qp._open = False
        starts = frame.opcode in rocev2.RETH_OPCODES
        if ahead & 0x800000 and not starts:
            return "duplicate"  # behind: a copy, or a packet of an older message
        qp.recv_psn = frame.psn
        return None if starts else "psn_gap"

    def _write(self, qp: QueuePair, frame: rocev2.RoceFrame) -> str | None:
        """Place the packet's data and complete its message; the refusal, or None."""
        qp.recv_psn = rocev2.psn_add(frame.psn, 1)
        if frame.opcode in rocev2.RETH_OPCODES:
            mr = self.mrs.get(frame.rkey)
            if mr is None or not mr.holds(frame.va, frame.dma_length):
                qp._open = False
                return "bad_rkey"
            qp._mr, qp._open = mr, True
            qp._begin = qp._at = frame.va - mr.va
            qp._end = qp._begin + frame.dma_length
        elif not qp._open:
            return "out_of_message"
        mr, at, n = qp._mr, qp._at, len(frame.payload)
        assert mr is not None  # open implies a region
        if at + n > qp._end:
            qp._open = False
            return "bad_length"
        mr.buf[at : at + n] = frame.payload
        qp._at = at + n
        if frame.opcode not in rocev2.LAST_OPCODES:
            return None
        qp._open = False
        if qp._at != qp._end:
            return "bad_length"
        if frame.imm is not None:
            self.completions.append(Completion(qp.qpn, frame.imm, qp._end - qp._begin))
            self.counters["completions"] += 1
        return None


def _bind(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, _BUFFER_BYTES)
        sock.bind((address, ROCE_UDP_PORT))
    except OSError as exc:
        sock.close()
        raise TransportError(
            f"cannot bind RoCEv2's UDP {address}:{ROCE_UDP_PORT} for an emulated RNIC: "
            f"{exc} (another NIC on this address, or the kernel's rdma_rxe, holds it)"
        ) from None
    sock.setblocking(False)
    return sock
