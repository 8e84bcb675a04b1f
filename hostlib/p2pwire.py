"""The point-to-point wire: what both p2p engines (the Python specification in
``hostlib.p2p``, the C core bound by ``hostlib.native``) share.

Layer: hostlib, the bottom floor: it imports only ``hostlib.protocol`` (the packet
sizes). This module owns the p2p header and its flags, a worker's place among its peers
(:class:`PeerSpec`), the checks of one call's knobs (:func:`call_knobs`) and what a
timed-out call says (:func:`stall_message`); the engines, sessions and the native binding
import them from here, so neither engine imports the other.

Wire header (16 bytes, big-endian fields; the payload is little-endian int32 or float32,
since only hosts read it; "Spurious timeouts" and "Peers entering a call" are sections of
``hostlib.p2p``)::

    0      vt:8       0xA1 DATA, 0xA2 ACK. The high nibble P2P_VERSION (0xA) is where
                      INA has its protocol version (1): an INA parser rejects these as an
                      unknown version, and INA datagrams never reach a peer's port.
    1      flags:8    FLAG_RESEND on a retransmitted DATA, echoed on its ACK (so the
                      sender knows which copy an ack answers: "Spurious timeouts");
                      FLAG_DUPLICATE on the ACK of a DATA that had arrived before
                      (RFC 2883's D-SACK; statistics and pcaps only); FLAG_EARLY on
                      the ACK of a DATA of the receiver's next call (kept until that
                      call starts: "Peers entering a call")
    2      src:8      sender's rank
    3      dst:8      receiver's rank: the driver (or a router on the fake network)
                      sends to the address of this rank
    4..7   seq:32     DATA: packet number on the src->dst channel, from 1, continuing
                      across the calls of a session. ACK: the number acknowledged
    8..11  aux:32     DATA: tag, the message's place in the call (the collective's step
                      and chunk). ACK: cumulative, every number <= aux has arrived
    12..13 call:16    the session's call number mod 2**16: a packet of another call is
                      never taken for this one (ACK: echoes the DATA's)
    14..15 count:16   DATA: 4-byte elements in the payload (<= lanes); ACK: 0
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from hostlib.protocol import DEFAULT_SLOTS_PER_JOB, LANES_PER_PACKET, MAX_LANES

__all__ = [
    "FLAG_DUPLICATE",
    "FLAG_EARLY",
    "P2P_ACK",
    "P2P_DATA",
    "P2P_HEADER",
    "P2P_VERSION",
    "PeerSpec",
    "call_knobs",
    "stall_message",
]

P2P_VERSION = 0xA
"""High nibble of byte 0 of every p2p datagram (INA's is ``PROTOCOL_VERSION`` = 1)."""
P2P_DATA = (P2P_VERSION << 4) | 1
P2P_ACK = (P2P_VERSION << 4) | 2
FLAG_DUPLICATE = 0x02
"""ACK flag: the acknowledged DATA had arrived before (D-SACK; statistics only)."""
FLAG_EARLY = 0x04
"""ACK flag: the acknowledged DATA belongs to the receiver's next call, which has not
started there (the packet was kept for it): the sender's timers for that peer keep the
initial timeout until it answers from inside the call."""
P2P_HEADER = struct.Struct("!BBBBIIHH")
"""vt, flags, src, dst, seq, aux (tag | cumulative ack), call, count: 16 bytes."""

_MAX_RANKS = 256  # src/dst are 8-bit
_MAX_WINDOW = 1 << 20  # a bound on memory, not on the protocol

Addr = tuple[str, int]
"""A transport address (``hostlib.transport.base.Addr``, which this floor cannot import)."""


@dataclass(frozen=True)
class PeerSpec:
    """This worker's place among its peers.

    Args:
        rank: this worker's rank.
        addrs: every rank's transport address, in rank order.
        lanes: 4-byte elements per packet (INA's ``lanes``, for an equal packet size).
        window: unacknowledged packets in flight per peer.

    Raises:
        ValueError: a field out of range.
    """

    rank: int
    addrs: tuple[Addr, ...]
    lanes: int = LANES_PER_PACKET
    window: int = DEFAULT_SLOTS_PER_JOB

    def __post_init__(self) -> None:
        object.__setattr__(self, "addrs", tuple(tuple(a) for a in self.addrs))
        if not 1 <= len(self.addrs) <= _MAX_RANKS:
            raise ValueError(f"{len(self.addrs)} ranks outside 1..{_MAX_RANKS}")
        if len(set(self.addrs)) != len(self.addrs):
            raise ValueError("two ranks share an address")
        checks = (
            ("rank", self.rank, 0, len(self.addrs) - 1),
            ("lanes", self.lanes, 1, MAX_LANES),
            ("window", self.window, 1, _MAX_WINDOW),
        )
        for name, value, lo, hi in checks:
            if not lo <= value <= hi:
                raise ValueError(f"{name}={value} outside {lo}..{hi}")

    @property
    def world_size(self) -> int:
        return len(self.addrs)


def call_knobs(spec: PeerSpec, lanes: int | None, window: int | None) -> tuple[int, int]:
    """One call's packet width and window: the given ones, or the spec's (``None``).

    Raises:
        TypeError: a knob that is not an integer.
        ValueError: lanes outside ``1..MAX_LANES`` or window outside ``1..2**20``.
    """
    out = []
    for name, value, default, hi in (
        ("lanes", lanes, spec.lanes, MAX_LANES),
        ("window", window, spec.window, _MAX_WINDOW),
    ):
        if value is None:
            out.append(default)
            continue
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} {value!r} is not an integer")
        if not 1 <= value <= hi:
            raise ValueError(f"{name}={value} outside 1..{hi}")
        out.append(int(value))
    return out[0], out[1]


def stall_message(endpoint: Any, seconds: float, remaining: int) -> str:
    """What :class:`~hostlib.errors.P2pTimeoutError` says (either engine's endpoint): the
    call, how long nothing moved, and what was still missing."""
    ep = endpoint
    return (
        f"rank {ep.spec.rank} call {ep.call}: no progress for "
        f"{seconds:.3f} s (deadline {ep.policy.deadline} s); "
        f"{remaining} messages still expected, unacknowledged packets per peer "
        f"{ep.waiting_for()}, {ep.stats.retransmitted} retransmissions: a peer is down, or "
        "has not entered this call (RetryPolicy.deadline; the torch backend's INALAB_DEADLINE)"
    )
