"""Frames as the TNA program's parsers see them (p4/tna/parsers.p4), and back to bytes.

Ethernet; IPv4 without options or fragments; UDP; to UDP port INA_UDP_PORT the 16-byte
INA header and the lanes. A frame too short for a header leaves it (and what follows)
invalid, as Tofino's parser does with parser_err set; the rest of the frame is payload
the deparser emits unchanged.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "Ethernet",
    "Headers",
    "Ina",
    "Ipv4",
    "Udp",
    "deparse",
    "ina_or_zero",
    "ipv4_checksum",
    "parse",
]

_ETH = struct.Struct("!6s6sH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
_INA = struct.Struct("!BBHBBHHHI")  # bit<8> exponent: unsigned, as the P4 header
ETHERTYPE_IPV4 = 0x0800
IP_PROTOCOL_UDP = 17


@dataclass
class Ethernet:
    dst: bytes
    src: bytes
    ether_type: int


@dataclass
class Ipv4:
    version_ihl: int
    diffserv: int
    total_len: int
    identification: int
    flags_frag: int
    ttl: int
    protocol: int
    hdr_checksum: int
    src: bytes
    dst: bytes

    @property
    def ihl(self) -> int:
        return self.version_ihl & 0x0F

    @property
    def frag_offset(self) -> int:
        return self.flags_frag & 0x1FFF


@dataclass
class Udp:
    src_port: int
    dst_port: int
    length: int
    checksum: int


@dataclass
class Ina:
    """tna_ina_h: pool_index is one 16-bit field (bit 15 the set)."""

    version: int
    ptype: int
    flags: int
    job_id: int
    rank: int
    exponent: int
    num_lanes: int
    pool_index: int
    reserved: int
    seq: int


@dataclass
class Headers:
    """The headers a parser extracted (None: invalid) and the unparsed rest."""

    ethernet: Ethernet | None = None
    ipv4: Ipv4 | None = None
    udp: Udp | None = None
    ina: Ina | None = None
    lanes: list[int] | None = None
    rest: bytes = b""
    is_ina: bool = False
    roce: bytes = b""  # a RoCEv2 reply's BTH, RETH and ImmDt (after UDP: roce_replies.p4)


def parse(frame: bytes, ina_port: int | None, lanes: int | None) -> Headers:
    """Parse ``frame`` as the ingress parser does (INA after UDP to ``ina_port``, then
    ``lanes`` lanes), or as the egress parser of an INA result or partial sum does
    (``ina_port`` None: the INA header follows UDP whatever its port; ``lanes`` None: the
    lanes stay payload).
    """
    hdr = Headers()
    if len(frame) < _ETH.size:
        hdr.rest = frame
        return hdr
    hdr.ethernet = Ethernet(*_ETH.unpack_from(frame))
    at = _ETH.size
    if hdr.ethernet.ether_type == ETHERTYPE_IPV4 and len(frame) >= at + _IPV4.size:
        hdr.ipv4 = ip = Ipv4(*_IPV4.unpack_from(frame, at))
        at += _IPV4.size
        udp_next = ip.ihl == 5 and ip.frag_offset == 0 and ip.protocol == IP_PROTOCOL_UDP
        if udp_next and len(frame) >= at + _UDP.size:
            hdr.udp = Udp(*_UDP.unpack_from(frame, at))
            at += _UDP.size
            if ina_port is None or hdr.udp.dst_port == ina_port:
                hdr.is_ina = True
                at = _parse_ina(hdr, frame, at, lanes)
    hdr.rest = frame[at:]
    return hdr


def _parse_ina(hdr: Headers, frame: bytes, at: int, lanes: int | None) -> int:
    if len(frame) < at + _INA.size:
        return at
    vt, flags, job_id, rank, exp, num_lanes, pidx, reserved, seq = _INA.unpack_from(frame, at)
    hdr.ina = Ina(vt >> 4, vt & 0x0F, flags, job_id, rank, exp, num_lanes, pidx, reserved, seq)
    at += _INA.size
    if lanes is not None and len(frame) >= at + 4 * lanes:
        hdr.lanes = list(struct.unpack_from(f"!{lanes}I", frame, at))
        at += 4 * lanes
    return at


def ina_or_zero(hdr: Headers) -> Ina:
    """The INA header; an invalid one (a truncated packet) reads as zeros, as the fields
    Tofino's parser left unwritten do in this model."""
    return hdr.ina if hdr.ina is not None else Ina(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def deparse(hdr: Headers) -> bytes:
    """The valid headers in order, then the rest of the frame."""
    out = bytearray()
    if hdr.ethernet is not None:
        e = hdr.ethernet
        out += _ETH.pack(e.dst, e.src, e.ether_type)
    if hdr.ipv4 is not None:
        out += _ipv4_bytes(hdr.ipv4)
    if hdr.udp is not None:
        u = hdr.udp
        out += _UDP.pack(u.src_port, u.dst_port, u.length, u.checksum)
    out += hdr.roce
    if hdr.ina is not None:
        i = hdr.ina
        out += _INA.pack(
            (i.version << 4) | i.ptype, i.flags, i.job_id, i.rank, i.exponent, i.num_lanes,
            i.pool_index, i.reserved, i.seq,
        )  # fmt: skip
    if hdr.lanes is not None:
        out += struct.pack(f"!{len(hdr.lanes)}I", *hdr.lanes)
    return bytes(out) + hdr.rest


def _ipv4_bytes(ip: Ipv4) -> bytes:
    return _IPV4.pack(
        ip.version_ihl, ip.diffserv, ip.total_len, ip.identification, ip.flags_frag, ip.ttl,
        ip.protocol, ip.hdr_checksum, ip.src, ip.dst,
    )  # fmt: skip


def ipv4_checksum(ip: Ipv4) -> int:
    """The IPv4 header checksum of ``ip`` (its own checksum field taken as 0)."""
    data = _ipv4_bytes(Ipv4(**{**ip.__dict__, "hdr_checksum": 0}))
    total = sum(struct.unpack("!10H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
