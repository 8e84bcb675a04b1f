"""INA over RoCEv2: the frames of a UC RDMA WRITE, their ICRC, and what INA puts in them.

The wire format is docs/protocol.md's "INA over RoCEv2"; its constants are
:mod:`hostlib.protocol`'s ``ROCE_*``. This module builds and parses the RoCEv2 part of a
frame (the UDP payload: BTH, RETH, ImmDt, the lanes, the ICRC) for every side that
speaks it: the emulated RNIC, the switches' software data planes, and the tests, which
hold it to scapy's independent ``scapy.contrib.roce``. It imports nothing of inalab's but
the protocol constants.

What INA puts where (SwitchML-RDMA's mapping, with the seq INA's exactly-once needs):

- a worker's message is the units of one slot of its window: ``M`` packets for ``M``
  consecutive switch slots, sent on the worker's queue pair for that slot of its window;
- the first (or only) packet's RETH: R_Key = the message's pool_index (set bit and the
  first packet's job-relative slot, as in the UDP header); VA = seq in bits 63..32 and
  the block exponent in bits 31..24 (bits 23..0 zero); DMA length = the message's bytes;
- the last (or only) packet's immediate: seq's low 24 bits, then the exponent
  (:func:`pack_imm`); in a reply, the exponent is the max the switch kept;
- a reply is a WRITE to the worker's own queue pair, R_Key and address, with the PSNs
  that queue pair expects next.

The ICRC is computed as RoCEv2 defines it for IPv4 (the RoCE annex, A17.8): a CRC-32 over
eight 0xFF bytes standing for the LRH, the IPv4 header with its TOS, TTL and checksum
set to ones, the UDP header with its checksum set to ones, the BTH with its FECN, BECN
and reserved bits set to ones, and the rest of the packet; stored least significant
byte first. INA frames are sent with IPv4 identification 0 and Don't Fragment set (what
Linux puts on an unconnected UDP socket's datagram that may not fragment), so a receiver
that sees only the UDP payload and the addresses rebuilds the same pseudo-header.
"""

from __future__ import annotations

import socket
import struct
import zlib
from dataclasses import dataclass

from hostlib.protocol import (
    EXPONENT_MAX,
    EXPONENT_MIN,
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_PSN_SEQ_SHIFT,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    RoceOpcode,
)

__all__ = [
    "BTH",
    "DEFAULT_PKEY",
    "IMM_OPCODES",
    "LAST_OPCODES",
    "PSN_MASK",
    "QPN_MASK",
    "RETH",
    "RETH_OPCODES",
    "RoceError",
    "RoceFrame",
    "build_frame",
    "icrc",
    "icrc_ok",
    "message_opcode",
    "pack_imm",
    "pack_request_va",
    "parse_frame",
    "psn_add",
    "reply_psn",
    "split_imm",
    "split_request_va",
]

BTH = struct.Struct("!BBHII")
"""opcode; SE, M, pad count, transport version; P_Key; FECN, BECN, reserved and dest QP;
AckReq, reserved and PSN."""

RETH = struct.Struct("!QII")
"""virtual address, R_Key, DMA length."""

_IMM = struct.Struct("!I")

DEFAULT_PKEY = 0xFFFF
"""The default partition key, which RoCEv2 uses."""

QPN_MASK = 0xFFFFFF
PSN_MASK = 0xFFFFFF

RETH_OPCODES = frozenset(
    {
        RoceOpcode.UC_WRITE_FIRST,
        RoceOpcode.UC_WRITE_ONLY,
        RoceOpcode.UC_WRITE_ONLY_IMM,
    }
)
"""Opcodes whose packet carries a RETH: the first packet of a message."""

IMM_OPCODES = frozenset({RoceOpcode.UC_WRITE_LAST_IMM, RoceOpcode.UC_WRITE_ONLY_IMM})
"""Opcodes whose packet carries immediate data: the last packet of a message."""

LAST_OPCODES = IMM_OPCODES | {RoceOpcode.UC_WRITE_LAST, RoceOpcode.UC_WRITE_ONLY}
"""Opcodes that end a message (with or without immediate)."""

_IPV4_DF = 0x4000
_MASKED_BTH_BYTE = 0xFF  # FECN, BECN and the reserved six bits, ones in the ICRC


class RoceError(ValueError):
    """A RoCEv2 frame is malformed (on parse) or a field does not fit (on build)."""


@dataclass(frozen=True, slots=True)
class RoceFrame:
    """A parsed RoCEv2 UDP payload.

    Attributes:
        opcode: the BTH opcode (a UC WRITE).
        dest_qp: the destination queue pair number (24 bits).
        psn: the packet sequence number (24 bits).
        payload: the packet's data (the lanes), without pad or ICRC.
        va, rkey, dma_length: the RETH's fields (first or only packet; else 0).
        imm: the immediate data (last or only packet of a WRITE with immediate; else
            None).
        icrc: the ICRC as received (an int of the little-endian trailer).
        ack_req: the BTH's AckReq bit (UC ignores it).
        pkey: the partition key.
    """

    opcode: RoceOpcode
    dest_qp: int
    psn: int
    payload: bytes
    va: int = 0
    rkey: int = 0
    dma_length: int = 0
    imm: int | None = None
    icrc: int = 0
    ack_req: bool = False
    pkey: int = DEFAULT_PKEY


def message_opcode(index: int, packets: int, immediate: bool = True) -> RoceOpcode:
    """The opcode of packet ``index`` (from 0) of a WRITE message of ``packets`` packets.

    Raises:
        RoceError: ``packets`` < 1 or ``index`` outside 0..packets-1.
    """
    if packets < 1 or not 0 <= index < packets:
        raise RoceError(f"packet {index} of a message of {packets} packets")
    if packets == 1:
        return RoceOpcode.UC_WRITE_ONLY_IMM if immediate else RoceOpcode.UC_WRITE_ONLY
    if index == 0:
        return RoceOpcode.UC_WRITE_FIRST
    if index == packets - 1:
        return RoceOpcode.UC_WRITE_LAST_IMM if immediate else RoceOpcode.UC_WRITE_LAST
    return RoceOpcode.UC_WRITE_MIDDLE


def psn_add(psn: int, n: int) -> int:
    """``psn + n`` in the 24-bit PSN space."""
    return (psn + n) & PSN_MASK


def reply_psn(base: int, seq: int, place: int) -> int:
    """The PSN of the switch's reply at ``place`` of message ``seq`` on a worker queue pair
    whose base PSN is ``base`` (docs/protocol.md): the same every time that packet is sent,
    so a UC receiver never completes a message out of two interleaved sends of it."""
    return (base + (seq << ROCE_PSN_SEQ_SHIFT) + place) & PSN_MASK


def pack_request_va(seq: int, exponent: int) -> int:
    """The RETH virtual address of a worker's message: seq, then the block exponent.

    Raises:
        RoceError: ``seq`` not a 32-bit value or ``exponent`` outside the int8 range.
    """
    _check("seq", seq, 0, 0xFFFFFFFF)
    _check("exponent", exponent, EXPONENT_MIN, EXPONENT_MAX)
    return (seq << 32) | ((exponent & 0xFF) << 24)


def split_request_va(va: int) -> tuple[int, int]:
    """``(seq, exponent)`` of a request's RETH virtual address (bits 23..0 ignored)."""
    exponent = (va >> 24) & 0xFF
    return (va >> 32) & 0xFFFFFFFF, exponent - 256 if exponent > EXPONENT_MAX else exponent


def pack_imm(seq: int, exponent: int) -> int:
    """The immediate of a message's last packet: seq's low 24 bits, then the exponent.

    Raises:
        RoceError: ``exponent`` outside the int8 range.
    """
    _check("exponent", exponent, EXPONENT_MIN, EXPONENT_MAX)
    return ((seq & 0xFFFFFF) << 8) | (exponent & 0xFF)


def split_imm(imm: int) -> tuple[int, int]:
    """``(seq low 24 bits, exponent)`` of an immediate made by :func:`pack_imm`."""
    exponent = imm & 0xFF
    return (imm >> 8) & 0xFFFFFF, exponent - 256 if exponent > EXPONENT_MAX else exponent


def icrc(src_ip: str, dst_ip: str, src_port: int, body: bytes | bytearray | memoryview) -> int:
    """The ICRC of a RoCEv2/IPv4 frame whose UDP payload, up to the ICRC, is ``body``.

    ``body`` starts at the BTH. The IPv4 header is the one INA frames are sent with
    (identification 0, Don't Fragment, no options) and the UDP destination port is
    RoCEv2's; see the module docstring for the masked fields.

    Raises:
        RoceError: ``body`` shorter than a BTH, or an address is not IPv4.
    """
    if len(body) < ROCE_BTH_SIZE:
        raise RoceError(f"{len(body)} bytes hold no BTH")
    udp_len = 8 + len(body) + ROCE_ICRC_SIZE
    try:
        addrs = socket.inet_aton(src_ip) + socket.inet_aton(dst_ip)
    except OSError:
        raise RoceError(f"not IPv4 addresses: {src_ip!r}, {dst_ip!r}") from None
    ip = struct.pack("!BBHHHBBH", 0x45, 0xFF, 20 + udp_len, 0, _IPV4_DF, 0xFF, 17, 0xFFFF)
    udp = struct.pack("!HHHH", src_port, ROCE_UDP_PORT, udp_len, 0xFFFF)
    crc = zlib.crc32(b"\xff" * 8 + ip + addrs + udp)
    crc = zlib.crc32(bytes(body[:4]) + bytes([_MASKED_BTH_BYTE]), crc)
    return zlib.crc32(body[5:], crc) & 0xFFFFFFFF


def build_frame(
    frame: RoceFrame,
    src_ip: str,
    dst_ip: str,
    src_port: int = ROCE_UDP_PORT,
) -> bytes:
    """The UDP payload of ``frame``, its ICRC computed for these addresses.

    ``frame.icrc`` is ignored. The RETH is written for opcodes in :data:`RETH_OPCODES`
    and the immediate for those in :data:`IMM_OPCODES` (``frame.imm`` None: 0).

    Raises:
        RoceError: a field does not fit its width, or the payload is not whole 32-bit
            words (INA's lanes are; pad count is always 0).
    """
    opcode = RoceOpcode(frame.opcode)
    _check("dest_qp", frame.dest_qp, 0, QPN_MASK)
    _check("psn", frame.psn, 0, PSN_MASK)
    _check("pkey", frame.pkey, 0, 0xFFFF)
    if len(frame.payload) % 4:
        raise RoceError(f"a payload of {len(frame.payload)} bytes is not whole words")
    parts = [BTH.pack(opcode, 0, frame.pkey, frame.dest_qp, (frame.ack_req << 31) | frame.psn)]
    if opcode in RETH_OPCODES:
        _check("va", frame.va, 0, 0xFFFFFFFFFFFFFFFF)
        _check("rkey", frame.rkey, 0, 0xFFFFFFFF)
        _check("dma_length", frame.dma_length, 0, 0xFFFFFFFF)
        parts.append(RETH.pack(frame.va, frame.rkey, frame.dma_length))
    if opcode in IMM_OPCODES:
        imm = frame.imm or 0
        _check("imm", imm, 0, 0xFFFFFFFF)
        parts.append(_IMM.pack(imm))
    parts.append(bytes(frame.payload))
    body = b"".join(parts)
    return body + icrc(src_ip, dst_ip, src_port, body).to_bytes(4, "little")


def parse_frame(data: bytes | bytearray | memoryview) -> RoceFrame:
    """Decode a RoCEv2 UDP payload of a UC WRITE (the ICRC is read, not checked).

    Raises:
        RoceError: truncated, an opcode other than a UC WRITE, a transport version other
            than 0, or a pad count other than 0.
    """
    n = len(data)
    if n < ROCE_BTH_SIZE + ROCE_ICRC_SIZE:
        raise RoceError(f"truncated: {n} bytes")
    opcode, flags, pkey, qp, psn = BTH.unpack_from(data)
    try:
        op = RoceOpcode(opcode)
    except ValueError:
        raise RoceError(f"opcode {opcode:#04x} is not a UC RDMA WRITE") from None
    if flags & 0x0F:
        raise RoceError(f"transport version {flags & 0x0F}")
    if flags & 0x30:
        raise RoceError(f"pad count {(flags >> 4) & 3}")
    at = ROCE_BTH_SIZE
    va = rkey = length = 0
    imm = None
    if op in RETH_OPCODES:
        if n < at + ROCE_RETH_SIZE + ROCE_ICRC_SIZE:
            raise RoceError(f"truncated: {n} bytes hold no RETH")
        va, rkey, length = RETH.unpack_from(data, at)
        at += ROCE_RETH_SIZE
    if op in IMM_OPCODES:
        if n < at + ROCE_IMMDT_SIZE + ROCE_ICRC_SIZE:
            raise RoceError(f"truncated: {n} bytes hold no immediate")
        (imm,) = _IMM.unpack_from(data, at)
        at += ROCE_IMMDT_SIZE
    return RoceFrame(
        op,
        qp & QPN_MASK,
        psn & PSN_MASK,
        bytes(data[at : n - ROCE_ICRC_SIZE]),
        va,
        rkey,
        length,
        imm,
        int.from_bytes(bytes(data[n - ROCE_ICRC_SIZE :]), "little"),
        bool(psn >> 31),
        pkey,
    )


def _check(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise RoceError(f"{name}={value} outside {lo}..{hi}")


def icrc_ok(src_ip: str, dst_ip: str, src_port: int, data: bytes | bytearray | memoryview) -> bool:
    """Whether the UDP payload ``data`` ends with the ICRC its content and addresses give.

    False (never an exception) for anything too short to hold a BTH and an ICRC.
    """
    if len(data) < ROCE_BTH_SIZE + ROCE_ICRC_SIZE:
        return False
    got = int.from_bytes(bytes(data[-ROCE_ICRC_SIZE:]), "little")
    return got == icrc(src_ip, dst_ip, src_port, data[:-ROCE_ICRC_SIZE])
