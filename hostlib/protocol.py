"""The INA wire protocol: header layout and the constants shared by hosts and switches.

This module is the single definition of what crosses the wire between a worker and an
aggregation switch (the soft switch in ``emulation.softswitch``; the P4 program for bmv2,
in ``p4/`` must match it). It imports nothing of inalab's own.
``docs/protocol.md`` explains the fields and what each side does with them.

Frame: Ethernet / IPv4 / UDP (dst port :data:`INA_UDP_PORT`) / INA header (16 bytes) /
``num_lanes`` x int32 payload. Every multi-byte field, payload included, is big-endian
(network order) because a P4 parser extracts header fields in wire order and a switch ALU
adds lanes as they were extracted; hosts byte-swap once per packet with numpy.

Header (16 bytes, offsets in bytes)::

    0      version:4 | ptype:4
    1      flags:8          FLAG_RESEND: the host marks retransmissions (statistics,
                            pcaps; the switch routes them in a shared slot only)
    2..3   job_id:16        selects the job entry (ATP-style per-job isolation)
    4      rank:8           worker rank within the job, < MAX_WORKERS
    5      exponent:s8      block exponent E (2**E <= max|x| < 2**(E+1)); in a result:
                            the max over the job's workers, as kept by the switch
    6..7   num_lanes:16     int32 lanes in the payload; must equal the switch's lanes
    8..9   pool_index:16    bit 15: the set (shadow copy); bits 0..14: slot within the
                            job's slot range (the switch adds the job's slot base)
    10..11 reserved:16      zero on send, ignored on receive (a result echoes the
                            triggering packet's value: the switch rewrites only ptype,
                            exponent and lanes)
    12..15 seq:32           packet number, monotonic across the calls of a session: from
                            1, wrapping from 2**32-1 to 1 (0 is reserved: it marks an
                            unused switch slot). Every worker's packet of one use of a
                            slot carries the same seq. The switch keeps the seq of the
                            use each (set, slot) holds and drops packets of older uses
                            (serial-number order: bit 31 of (seq - stored) mod 2**32) as
                            stale; the result echoes it, so the host places the result
                            by seq alone.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

__all__ = [
    "DEFAULT_SLOTS_PER_JOB",
    "EXPONENT_MAX",
    "EXPONENT_MIN",
    "FLAG_RESEND",
    "HEADER",
    "HEADER_SIZE",
    "INA_UDP_PORT",
    "LANES_PER_PACKET",
    "LANE_BYTES",
    "MAX_LANES",
    "MAX_SLOT",
    "MAX_WORKERS",
    "POOL_SET_BIT",
    "PROTOCOL_VERSION",
    "ROCE_BTH_SIZE",
    "ROCE_ICRC_SIZE",
    "ROCE_IMMDT_SIZE",
    "ROCE_MAX_MSG_PACKETS",
    "ROCE_PMTUS",
    "ROCE_PSN_SEQ_SHIFT",
    "ROCE_QP_REGISTERS",
    "ROCE_RETH_SIZE",
    "ROCE_UDP_PORT",
    "SLOT_MASK",
    "SWITCH_DROPS",
    "SWITCH_SLOTS",
    "SWITCH_STATS",
    "TNA_LANES_PER_PACKET",
    "TNA_SWITCH_SLOTS",
    "Header",
    "PacketType",
    "ProtocolError",
    "RoceOpcode",
    "make_pool_index",
    "pack_header",
    "packet_size",
    "split_pool_index",
    "unpack_header",
]

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change of the header layout."""

INA_UDP_PORT = 0x4E41  # 20033, "NA": not a registered service port
"""UDP destination port that marks a datagram as INA traffic (switch and scapy binding)."""

LANES_PER_PACKET = 64
"""int32 lanes per packet on the P4 target: one register array per lane, unrolled (a P4
program has no loops); 64 lanes = 256 B payload, SwitchML's 256 B unit. The soft switch
accepts any value up to :data:`MAX_LANES` as a start-up option (jumbo datagrams)."""

TNA_LANES_PER_PACKET = 12
"""int32 lanes per packet of the Tofino (TNA) program, p4/tna/: one 32-bit register a lane,
4 stateful ALUs a stage and the 3 stages left after RoCEv2's lookups and queue-pair state
and the slot's bookkeeping (p4/tna/configuration.p4); a job on a Tofino switch runs with
``lanes=TNA_LANES_PER_PACKET``."""

TNA_SWITCH_SLOTS = 8192
"""Slots per set of the Tofino program's pool: SwitchML's, one 16,384-cell register per
lane holding both sets."""

MAX_LANES = 2048
"""Largest lane count the soft switch accepts: 8 KiB payload fits a 9000 B jumbo frame."""

LANE_BYTES = 4
"""Bytes per lane: one int32."""

MAX_WORKERS = 32
"""Workers per job: the worker bitmap is one 32-bit register cell per slot and set."""

SWITCH_SLOTS = 16384
"""Slots per set in the whole switch pool (every job takes a contiguous range). Twice
SwitchML's 8192 per set (its 16384-entry Tofino register holds both sets): bmv2 registers
have no per-stage size limit, and 16384 per set x 2 sets x 64 lanes x 4 B = 8 MiB of
value registers is cheap for bmv2 and the soft switch."""

SWITCH_STATS = (
    "received",
    "aggregated",
    "completed",
    "results_sent",
    "retransmits_answered",
    "duplicates_ignored",
    "sent_upstream",
    "upstream_resent",
    "results_from_upstream",
)
"""The switch's statistics, in the index order of its P4 counters ina_stats (STAT_* in
configuration.p4). Egress counts results_sent and sent_upstream; ingress the others.
The last three are a leaf switch's of hierarchical aggregation (a job with an upstream
switch): partial sums sent up, local retransmissions answered by sending the partial up
again, and results accepted from the upstream switch."""

SWITCH_DROPS = (
    "truncated",
    "malformed",
    "unknown_job",
    "bad_rank",
    "bad_source",
    "bad_slot",
    "bad_lanes",
    "bad_length",
    "stale",
    "sim_ingress",
    "sim_egress",
    "unknown_qp",
    "bad_psn",
    "bad_icrc",
)
"""Why the switch drops a packet, in the index order of its P4 counters drops (DROP_* in
configuration.p4). Egress counts sim_egress; ingress the others. The last three are
RoCEv2's (docs/protocol.md, "INA over RoCEv2"): a dest QP no table entry holds, a PSN
out of sequence (UC), and a bad ICRC (software data planes only)."""

DEFAULT_SLOTS_PER_JOB = 256
"""Slots a job gets unless configured otherwise: SwitchML's default outstanding window."""

POOL_SET_BIT = 0x8000
"""pool_index bit that selects the shadow-copy set (SwitchML encodes it the same way)."""

SLOT_MASK = 0x7FFF
"""pool_index bits that hold the job-relative slot."""

MAX_SLOT = SLOT_MASK
"""Largest job-relative slot index the header can carry."""

EXPONENT_MIN = -128
"""Exponent of an all-zero block: the identity of max()."""

EXPONENT_MAX = 127
"""Largest value of the signed 8-bit exponent field; float32 exponents never exceed it."""

FLAG_RESEND = 0x01
"""flags bit the host sets on a retransmission (host statistics, pcaps). The switch
tells a retransmission by its bitmap and seq registers, since a packet it never saw must
be aggregated however it is marked; the flag only chooses where a packet of a shared slot
goes (to the fallback when the switch cannot answer it: docs/sharing.md)."""


ROCE_UDP_PORT = 4791
"""UDP destination port of RoCEv2 (IANA): INA over RDMA travels in RoCEv2 frames
(docs/protocol.md, "INA over RoCEv2"; the codec is :mod:`hostlib.rocev2`)."""

ROCE_BTH_SIZE = 12
"""Base Transport Header: opcode, flags, P_Key, dest QP, PSN."""

ROCE_RETH_SIZE = 16
"""RDMA Extended Transport Header (first or only packet of a WRITE): VA, R_Key, length."""

ROCE_IMMDT_SIZE = 4
"""Immediate data (last or only packet of a WRITE with immediate)."""

ROCE_ICRC_SIZE = 4
"""Invariant CRC closing every RoCEv2 frame."""

ROCE_PMTUS = (256, 512, 1024, 2048, 4096)
"""RDMA path MTUs: the payload bytes of every packet of a message but its last. INA over
RoCEv2 sends messages of whole packets, so lanes x 4 is one of these when a message has
more than one packet; a one-packet message may carry any lanes up to the PMTU."""


ROCE_PSN_SEQ_SHIFT = 5
"""A reply's PSN is its queue pair's base PSN + ``seq << ROCE_PSN_SEQ_SHIFT`` + its place
in the message (docs/protocol.md, "INA over RoCEv2"): fixed by what it carries, so a
packet with the PSN a worker's queue pair expects next is the next packet of the same
message, however a re-sent message and the first answer interleave."""

ROCE_MAX_MSG_PACKETS = 1 << ROCE_PSN_SEQ_SHIFT
"""Packets per RoCEv2 message at most: the places one message's PSNs span. At 64 lanes a
packet the engine's unit (``M * lanes``) stays within a soft switch's largest lanes
(2,048)."""

ROCE_QP_REGISTERS = 16384
"""Queue pairs a switch keeps state for, per direction: the cells of each per-queue-pair
register (the request side's UC responder state; the reply side's PSNs). 32 workers with
a window of 512 messages, SwitchML's largest per worker."""


class RoceOpcode(enum.IntEnum):
    """BTH opcodes of an Unreliable Connected (UC) RDMA WRITE: the only ones INA uses.

    A message of one packet is ``*_ONLY``; of more, ``FIRST``, ``MIDDLE`` ..., ``LAST``.
    The first or only packet carries a RETH, the last or only one of a WRITE with
    immediate the immediate data.
    """

    UC_WRITE_FIRST = 0x26
    UC_WRITE_MIDDLE = 0x27
    UC_WRITE_LAST = 0x28
    UC_WRITE_LAST_IMM = 0x29
    UC_WRITE_ONLY = 0x2A
    UC_WRITE_ONLY_IMM = 0x2B


class PacketType(enum.IntEnum):
    """Value of the 4-bit ``ptype`` field."""

    DATA = 1
    """worker -> switch: a contribution."""
    RESULT = 2
    """switch -> worker: the aggregate of a finished slot (multicast, or unicast re-send)."""


HEADER = struct.Struct("!BBHBbHHHI")
HEADER_SIZE = HEADER.size
"""16 bytes: the layout above; the P4 program's header (p4/headers.p4) declares the same
fields."""


class ProtocolError(ValueError):
    """A header field is out of range (on pack) or a datagram is malformed (on unpack)."""


@dataclass(frozen=True, slots=True)
class Header:
    """A decoded INA header; ``slot`` is job-relative and ``pool_set`` is 0 or 1."""

    ptype: PacketType
    job_id: int
    rank: int
    slot: int
    pool_set: int
    seq: int
    num_lanes: int
    exponent: int = EXPONENT_MIN
    flags: int = 0
    version: int = PROTOCOL_VERSION


def make_pool_index(slot: int, pool_set: int) -> int:
    """Encode a job-relative slot and its set into the 16-bit pool_index field.

    Raises:
        ProtocolError: slot outside 0..MAX_SLOT or pool_set not 0/1.
    """
    if not 0 <= slot <= MAX_SLOT:
        raise ProtocolError(f"slot {slot} outside 0..{MAX_SLOT}")
    if pool_set not in (0, 1):
        raise ProtocolError(f"pool set {pool_set} is not 0 or 1")
    return slot | (POOL_SET_BIT if pool_set else 0)


def split_pool_index(pool_index: int) -> tuple[int, int]:
    """Return ``(slot, pool_set)`` of a pool_index field."""
    return pool_index & SLOT_MASK, 1 if pool_index & POOL_SET_BIT else 0


def packet_size(num_lanes: int) -> int:
    """UDP payload size in bytes of a packet with ``num_lanes`` lanes."""
    return HEADER_SIZE + num_lanes * LANE_BYTES


def pack_header(h: Header, buf: bytearray | memoryview | None = None, offset: int = 0) -> bytes:
    """Serialise ``h``; into ``buf`` at ``offset`` when given (returns b"" then).

    Raises:
        ProtocolError: ``ptype`` is not a :class:`PacketType`, a field does not fit its
            width, or ``buf`` has no room for the header at ``offset``.
    """
    try:
        ptype = PacketType(h.ptype)
    except ValueError:
        raise ProtocolError(f"ptype={h.ptype!r} is not a packet type") from None
    _check_range("version", h.version, 0, 15)
    _check_range("job_id", h.job_id, 0, 0xFFFF)
    _check_range("rank", h.rank, 0, 0xFF)
    _check_range("exponent", h.exponent, EXPONENT_MIN, EXPONENT_MAX)
    _check_range("num_lanes", h.num_lanes, 0, 0xFFFF)
    _check_range("seq", h.seq, 0, 0xFFFFFFFF)
    _check_range("flags", h.flags, 0, 0xFF)
    fields = (
        (h.version << 4) | ptype,
        h.flags,
        h.job_id,
        h.rank,
        h.exponent,
        h.num_lanes,
        make_pool_index(h.slot, h.pool_set),
        0,
        h.seq,
    )
    if buf is None:
        return HEADER.pack(*fields)
    try:
        HEADER.pack_into(buf, offset, *fields)
    except struct.error:
        # Every field was range-checked above: only the buffer can be at fault.
        raise ProtocolError(
            f"no room for the {HEADER_SIZE}-byte header at offset {offset} of a "
            f"{memoryview(buf).nbytes}-byte buffer"
        ) from None
    return b""


def unpack_header(data: bytes | bytearray | memoryview) -> Header:
    """Decode the header at the start of ``data`` (payload length is checked too).

    Raises:
        ProtocolError: truncated datagram, unknown version or type, or a payload whose
            length disagrees with ``num_lanes``.
    """
    if len(data) < HEADER_SIZE:
        raise ProtocolError(f"truncated: {len(data)} bytes < header {HEADER_SIZE}")
    vt, flags, job_id, rank, exponent, lanes, pool_index, _, seq = HEADER.unpack_from(data)
    version, ptype = vt >> 4, vt & 0x0F
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unknown protocol version {version}")
    try:
        kind = PacketType(ptype)
    except ValueError:
        raise ProtocolError(f"unknown packet type {ptype}") from None
    if len(data) != packet_size(lanes):
        raise ProtocolError(f"{len(data)} bytes do not hold {lanes} lanes")
    slot, pool_set = split_pool_index(pool_index)
    return Header(kind, job_id, rank, slot, pool_set, seq, lanes, exponent, flags, version)


def _check_range(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise ProtocolError(f"{name}={value} outside {lo}..{hi}")
