"""The emulated RDMA NIC with its per-packet work in C: :class:`NativeRnic`.

Layer: hostlib.transport, beside :mod:`hostlib.transport.rnic`, whose
:class:`~hostlib.transport.rnic.EmulatedRnic` is the specification: the same verbs
(``register``, ``create_qp``, ``connect``, ``post_write``, ``poll``), the same counters,
and the same frames, byte for byte, for the same calls and frames in
(tests/unit/test_rnic_native.py holds the two together). What moves to C
(``hostlib/_rnicore.c``) is each packet: building a message's frames and their ICRC,
sending them with ``sendmmsg``, receiving with ``recvmmsg`` and every check of
``EmulatedRnic.on_frame``, and the copy into registered memory, with the GIL released.
The identifiers (queue pair numbers, PSNs, R_Keys, addresses) are still picked here, by
:class:`~hostlib.transport.rnic.RnicBase`, so one seed gives both NICs the same ones.

Where the two differ: a full socket send buffer waits for room (the Python NIC raises
:class:`TransportError`); a peer's address must be a dotted IPv4 address (the C core
compares addresses as numbers); and :meth:`NativeRnic.poll` takes the whole
``recvmmsg`` batch (up to 64 frames) it received, so one call may return completions
the Python NIC returns over several (the same ones, in the same order).
"""

from __future__ import annotations

import socket
from typing import Any

from hostlib.protocol import (
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    RoceOpcode,
)
from hostlib.rocev2 import DEFAULT_PKEY, PSN_MASK, QPN_MASK
from hostlib.transport.base import Addr, TransportError
from hostlib.transport.rnic import (
    RNIC_COUNTERS,
    Completion,
    MemoryRegion,
    RnicBase,
    check_write,
)

__all__ = ["NativeQueuePair", "NativeRnic", "rnic_core_unavailable"]


def _load() -> tuple[Any, str | None]:
    try:
        from hostlib import _rnicore
    except ImportError as exc:
        return None, f"the native RNIC core was not built ({exc})"
    wire: dict[str, object] = {
        "ROCE_UDP_PORT": ROCE_UDP_PORT,
        "ROCE_BTH_SIZE": ROCE_BTH_SIZE,
        "ROCE_RETH_SIZE": ROCE_RETH_SIZE,
        "ROCE_IMMDT_SIZE": ROCE_IMMDT_SIZE,
        "ROCE_ICRC_SIZE": ROCE_ICRC_SIZE,
        **{op.name: int(op) for op in RoceOpcode},
        "DEFAULT_PKEY": DEFAULT_PKEY,
        "COUNTERS": RNIC_COUNTERS,
    }
    if wire != _rnicore.PROTOCOL:
        return None, f"the native RNIC core's protocol {_rnicore.PROTOCOL} is not {wire}"
    return _rnicore, None


_core, _why_not = _load()


def rnic_core_unavailable() -> str | None:
    """Why :class:`NativeRnic` cannot run here, or ``None`` when it can."""
    return _why_not


def _ipv4(address: str) -> int:
    """A dotted IPv4 address as an int (host order).

    Raises:
        ValueError: not a dotted IPv4 address.
    """
    try:
        packed = socket.inet_pton(socket.AF_INET, address)
    except OSError:
        raise ValueError(f"{address!r} is not a dotted IPv4 address") from None
    return int.from_bytes(packed, "big")


class NativeQueuePair:
    """A UC queue pair of a :class:`NativeRnic`: its number and peer here, its PSNs in
    the C core (read as :class:`~hostlib.transport.rnic.QueuePair`'s are)."""

    def __init__(self, core: Any, qpn: int) -> None:
        self._core = core
        self.qpn = qpn
        self.peer: tuple[str, int] | None = None

    @property
    def send_psn(self) -> int:
        """The PSN of the next packet sent."""
        return int(self._core.qp_state(self.qpn)[0])

    @property
    def recv_psn(self) -> int:
        """The PSN expected next."""
        return int(self._core.qp_state(self.qpn)[1])


class NativeRnic(RnicBase):
    """RoCEv2 UC WRITEs on a UDP socket bound to ``address``:4791, each packet in C.

    Args:
        address: this NIC's IPv4 address (dotted).
        pmtu: the path MTU, the payload of every packet of a message but its last.
        seed: for queue pair numbers, initial PSNs and R_Keys (those EmulatedRnic picks).

    Raises:
        ValueError: ``pmtu`` is not an RDMA MTU, ``address`` is not dotted IPv4, or the
            native core was not built.
        TransportError: the address's port 4791 cannot be bound.
    """

    def __init__(self, address: str, pmtu: int = 256, seed: int | None = None) -> None:
        if _core is None:
            raise ValueError(f"native RNIC: {_why_not}")
        me = _ipv4(address)
        super().__init__(address, pmtu, seed)
        try:
            self._core = _core.RnicCore(self.fileno(), me, pmtu)
        except BaseException:
            self.close()
            raise
        self.qps: dict[int, NativeQueuePair] = {}
        self._check_icrc = True

    @property
    def check_icrc(self) -> bool:
        """EmulatedRnic.check_icrc: off, a received frame's ICRC is taken as right."""
        return self._check_icrc

    @check_icrc.setter
    def check_icrc(self, on: bool) -> None:
        self._core.set_check_icrc(on)
        self._check_icrc = bool(on)

    # ----------------------------------------------------------------- verbs
    def register(self, size: int) -> MemoryRegion:
        """Register ``size`` zeroed bytes for remote writes (``ibv_reg_mr``); the core
        holds the region's buffer, which cannot be resized while the NIC lives."""
        mr = self._new_region(size)
        try:
            self._core.add_mr(mr.rkey, mr.va, mr.buf)
        except BaseException:
            del self.mrs[mr.rkey]  # not registered after all
            raise
        return mr

    def create_qp(self) -> NativeQueuePair:
        """A new UC queue pair with a fresh number and a random initial PSN."""
        qpn, psn = self._new_qp()
        self._core.add_qp(qpn, psn)
        qp = self.qps[qpn] = NativeQueuePair(self._core, qpn)
        return qp

    def connect(self, qp: NativeQueuePair, peer_ip: str, peer_qpn: int, recv_psn: int) -> None:
        """Connect ``qp`` to the peer's queue pair: send there, and accept packets from
        there starting at PSN ``recv_psn``.

        Raises:
            ValueError: a queue pair number or PSN outside 24 bits, or ``peer_ip`` not
                dotted IPv4.
        """
        if not 0 <= peer_qpn <= QPN_MASK or not 0 <= recv_psn <= PSN_MASK:
            raise ValueError(f"queue pair {peer_qpn} or PSN {recv_psn} outside 24 bits")
        self._core.connect(qp.qpn, _ipv4(peer_ip), peer_qpn, recv_psn)
        qp.peer = (peer_ip, peer_qpn)

    def post_write(
        self, qp: NativeQueuePair, data: bytes | memoryview, va: int, rkey: int, imm: int | None
    ) -> None:
        """Send ``data`` as one RDMA WRITE (with immediate unless ``imm`` is None).

        Raises:
            TransportError: ``qp`` is not connected, or the send fails.
            rocev2.RoceError: a field does not fit (:func:`check_write`); nothing is sent.
        """
        peer = check_write(qp.qpn, qp.peer, data, va, rkey, imm)
        try:
            self._core.post_write(qp.qpn, data, va, rkey, -1 if imm is None else imm)
        except OSError as exc:
            raise TransportError(f"RoCEv2 send to {peer[0]}: {exc}") from None
        finally:
            self._sync()

    def build_write(
        self, qp: NativeQueuePair, data: bytes | memoryview, va: int, rkey: int, imm: int | None
    ) -> list[bytes]:
        """The frames :meth:`post_write` would send, returned instead (the PSNs advance
        as on a send; EmulatedRnic.build_write's).

        Raises:
            TransportError, rocev2.RoceError: as :meth:`post_write`.
        """
        check_write(qp.qpn, qp.peer, data, va, rkey, imm)
        frames: list[bytes] = self._core.build_write(
            qp.qpn, data, va, rkey, -1 if imm is None else imm
        )
        return frames

    def poll(self, timeout: float) -> list[Completion]:
        """Receive frames for up to ``timeout`` seconds or until a completion is ready;
        return the completions ready (``ibv_poll_cq``).

        Raises:
            TransportError: the socket fails.
        """
        try:
            done = self._core.poll(max(timeout, 0.0))
        except OSError as exc:
            raise TransportError(f"RoCEv2 receive on {self.address}: {exc}") from None
        finally:
            self._sync()
        return [Completion._make(d) for d in done]

    def on_frame(self, data: bytes | memoryview, src: Addr) -> None:
        """Take one received RoCEv2 UDP payload from ``src`` (for tests that feed frames
        by hand, as EmulatedRnic.on_frame).

        Raises:
            ValueError: ``src`` is not a dotted IPv4 address.
        """
        self._core.on_frame(data, _ipv4(src[0]), src[1])
        self._sync()

    def _sync(self) -> None:
        """The core's counters into :attr:`counters` (a dict, as EmulatedRnic's)."""
        self.counters.update(zip(RNIC_COUNTERS, self._core.counters(), strict=True))
