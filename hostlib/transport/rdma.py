"""INA over RDMA: the transport that turns an INA engine's packets into RDMA WRITEs.

The INA engine above is the one of the UDP transport (window, timers, fast
retransmission), run with a unit of ``msg_packets * lanes`` lanes: each of its packets
is one RDMA message of ``msg_packets`` packets of the switch's lanes, on the queue pair
of its window position, and each result is the switch's message of replies, written by
the switch into this worker's memory and announced by a completion with immediate. So a
retransmission resends a whole message, as SwitchML's RDMA backend does, and the switch
sees docs/protocol.md's "INA over RoCEv2".

The NIC underneath is anything with the verbs this needs (:class:`RdmaDevice`): the
emulated RNIC (:class:`~hostlib.transport.rnic.EmulatedRnic`, RoCEv2 frames on a UDP
socket) on any machine, or an RDMA device through pyverbs where one exists.

Setting up a job takes one exchange with the switch's controller, as SwitchML's
``RdmaSession`` does: :meth:`RdmaTransport.endpoints` says, per window position, where
the switch's replies go (queue pair, R_Key, address, first PSN); the controller answers
with the switch's queue pair for each, which :meth:`RdmaTransport.connect_switch` takes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from hostlib import rocev2
from hostlib.protocol import (
    HEADER,
    HEADER_SIZE,
    LANE_BYTES,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    ROCE_PMTUS,
    ROCE_UDP_PORT,
    SLOT_MASK,
    PacketType,
)
from hostlib.transport.base import Addr, TransportError
from hostlib.transport.rnic import Completion

__all__ = ["QueuePairLike", "RdmaDevice", "RdmaEndpoint", "RdmaTransport", "Region"]

_RESULT_VT = (PROTOCOL_VERSION << 4) | PacketType.RESULT


class Region(Protocol):
    """Registered memory as the transport sees it: where the NIC puts it, its key."""

    va: int
    rkey: int

    def read(self, offset: int, length: int) -> bytes: ...


class QueuePairLike(Protocol):
    """A queue pair: its number, and the PSN its sends start at."""

    qpn: int
    send_psn: int


class RdmaDevice(Protocol):
    """The verbs :class:`RdmaTransport` uses: the emulated RNIC's
    (:class:`~hostlib.transport.rnic.EmulatedRnic`) or pyverbs'
    (:class:`~hostlib.transport.verbs.VerbsDevice`)."""

    address: str
    pmtu: int

    def register(self, size: int) -> Any: ...
    def create_qp(self) -> Any: ...
    def connect(self, qp: Any, peer_ip: str, peer_qpn: int, recv_psn: int) -> None: ...
    def post_write(
        self, qp: Any, data: bytes | memoryview, va: int, rkey: int, imm: int | None
    ) -> None: ...
    def poll(self, timeout: float) -> list[Completion]: ...
    def close(self) -> None: ...


class RdmaEndpoint(NamedTuple):
    """Where the switch writes the results of one window position of this worker."""

    qpn: int
    rkey: int
    va: int
    psn: int


class RdmaTransport:
    """An INA engine's transport over RDMA WRITEs: one queue pair per window position.

    Args:
        device: the NIC.
        window: the job's slots as the engine sees them (its window positions).
        msg_packets: packets per message, ``M``.
        lanes: the switch's lanes per packet; the engine's are ``M * lanes``.

    Raises:
        ValueError: messages of more than one packet whose packets are not the
            device's path MTU.
    """

    native_io = False
    results_flagged = False
    """The results it rebuilds carry no ``FLAG_RESEND`` (RoCEv2's immediate has no room
    for it): the engine keeps Karn's rule alone (``InaAllreduce``'s ``flagged``)."""

    def __init__(self, device: RdmaDevice, window: int, msg_packets: int, lanes: int) -> None:
        payload = lanes * LANE_BYTES
        if msg_packets < 1 or window < 1:
            raise ValueError(f"window {window} and message of {msg_packets} packets")
        if msg_packets > 1 and payload != device.pmtu:
            raise ValueError(
                f"messages of {msg_packets} packets of {payload} B need the path MTU to be "
                f"{payload} B ({ROCE_PMTUS}), not {device.pmtu}"
            )
        self.device = device
        self.msg_packets, self.lanes = msg_packets, lanes
        self.msg_bytes = msg_packets * payload
        self.qps: list[QueuePairLike] = [device.create_qp() for _ in range(window)]
        self._position = {qp.qpn: u for u, qp in enumerate(self.qps)}
        self.mr: Region = device.register(window * self.msg_bytes)
        self._recv_psn = [qp.send_psn ^ 0x5A5A5A for qp in self.qps]  # any 24-bit start
        self._switch: Addr | None = None
        # per window position: the last request sent (its INA header, to rebuild results)
        self._sent: list[tuple[int, int, int, int] | None] = [None] * window
        self._ready: deque[Completion] = deque()
        self.stale = 0
        """Completions for a position with no request sent: nothing to match them to."""

    @property
    def local_addr(self) -> Addr:
        return (self.device.address, ROCE_UDP_PORT)

    def endpoints(self) -> list[RdmaEndpoint]:
        """Per window position: the queue pair, R_Key, address and first PSN replies use."""
        return [
            RdmaEndpoint(qp.qpn, self.mr.rkey, self.mr.va + u * self.msg_bytes, self._recv_psn[u])
            for u, qp in enumerate(self.qps)
        ]

    def connect_switch(self, switch_ip: str, switch_qpns: Sequence[int]) -> None:
        """Connect window position ``u``'s queue pair to the switch's ``switch_qpns[u]``.

        Raises:
            ValueError: not one switch queue pair per window position.
        """
        if len(switch_qpns) != len(self.qps):
            raise ValueError(f"{len(switch_qpns)} switch queue pairs for {len(self.qps)}")
        for u, (qp, qpn) in enumerate(zip(self.qps, switch_qpns, strict=True)):
            self.device.connect(qp, switch_ip, qpn, self._recv_psn[u])
        self._switch = (switch_ip, ROCE_UDP_PORT)

    def connect(self, peer: Addr) -> None:
        """The session's switch: it must be the one :meth:`connect_switch` connected.

        Raises:
            TransportError: not connected, or another address.
        """
        if self._switch is None or peer[0] != self._switch[0]:
            raise TransportError(f"RDMA transport connected to {self._switch}, not {peer}")
        self._switch = peer

    def send(self, data: bytes | memoryview, dest: Addr) -> None:
        """Send one INA DATA packet of the engine as the RDMA message of its position.

        Raises:
            TransportError: not an INA packet of this transport's size, a window position
                without a queue pair, or the device fails.
        """
        if len(data) != HEADER_SIZE + self.msg_bytes:
            raise TransportError(f"{len(data)} B is not an INA packet of {self.msg_bytes} B")
        _vt, _f, job, rank, exponent, _l, pidx, _x, seq = HEADER.unpack_from(data)
        position = pidx & SLOT_MASK
        if position >= len(self.qps):
            raise TransportError(f"slot {position} outside the window of {len(self.qps)}")
        self._sent[position] = (job, rank, pidx, seq)
        rkey = (pidx & POOL_SET_BIT) | position * self.msg_packets
        self.device.post_write(
            self.qps[position],
            memoryview(data)[HEADER_SIZE:],
            rocev2.pack_request_va(seq, exponent),
            rkey,
            rocev2.pack_imm(seq, exponent),
        )

    def recv_into(self, buf: bytearray | memoryview, timeout: float) -> tuple[int, Addr | None]:
        """Wait up to ``timeout`` for a message of results; write it into ``buf`` as the
        INA RESULT packet the engine expects. ``(0, None)`` when none came in time."""
        if not self._ready:
            self._ready.extend(self.device.poll(timeout))
        while self._ready:
            n = self._result(self._ready.popleft(), buf)
            if n:
                return n, self._switch
        return 0, None

    def _result(self, done: Completion, buf: bytearray | memoryview) -> int:
        """The INA RESULT packet of a completion, written into ``buf``; 0 if unmatched."""
        position = self._position.get(done.qpn)
        sent = None if position is None else self._sent[position]
        if position is None or sent is None or done.byte_len != self.msg_bytes:
            self.stale += 1
            return 0
        job, rank, pidx, last_seq = sent
        seq24, exponent = rocev2.split_imm(done.imm)
        # The seq this immediate's low 24 bits name, nearest the last one sent here: a
        # late answer of an earlier use keeps its own seq, which the engine recognises.
        seq = (last_seq + ((seq24 - last_seq + 0x800000) & 0xFFFFFF) - 0x800000) & 0xFFFFFFFF
        lanes = self.msg_packets * self.lanes
        HEADER.pack_into(buf, 0, _RESULT_VT, 0, job, rank, exponent, lanes, pidx, 0, seq)
        at = position * self.msg_bytes
        buf[HEADER_SIZE : HEADER_SIZE + self.msg_bytes] = self.mr.read(at, self.msg_bytes)
        return HEADER_SIZE + self.msg_bytes

    def close(self) -> None:
        self.device.close()

    def __enter__(self) -> RdmaTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
