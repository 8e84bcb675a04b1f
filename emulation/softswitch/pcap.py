"""A pcap of what the soft switch receives and sends, for Wireshark and scapy.

On loopback a user without root cannot run tcpdump, and the switch sees every INA
datagram anyway, so it can write the capture itself. Each datagram is stored as an IPv4
packet (link type RAW) with the UDP ports of its real endpoints, so
``hostlib.scapy_layer`` (bound to the INA port) and Wireshark's UDP dissectors read it.
The IPv4 header checksum is real; the UDP checksum is 0, which IPv4 allows ("none").

The switch on Ethernet ports records its frames as they are (link type ETHERNET,
:meth:`PcapWriter.record_frame`).
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import BinaryIO

__all__ = ["LINKTYPE_ETHERNET", "LINKTYPE_RAW", "PcapWriter"]

Addr = tuple[str, int]

LINKTYPE_RAW = 101
"""pcap link type of packets that begin with an IPv4 (or IPv6) header."""

LINKTYPE_ETHERNET = 1
"""pcap link type of Ethernet frames (DLT_EN10MB), without the frame check sequence."""

_GLOBAL_HEADER = struct.Struct("=IHHiIII")
_RECORD_HEADER = struct.Struct("=IIII")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")
_SNAPLEN = 65535


class PcapWriter:
    """Appends datagrams (link type RAW) or Ethernet frames to a new pcap file.

    Args:
        path: the file to create (replaced if it exists).
        max_packets: stop recording after this many packets (0: no limit), so a long run
            cannot fill the disk; :attr:`skipped` counts what was left out.
        linktype: :data:`LINKTYPE_RAW` for :meth:`record` (UDP datagrams), or
            :data:`LINKTYPE_ETHERNET` for :meth:`record_frame` (whole frames).

    Raises:
        ValueError: a negative ``max_packets`` or another link type.
        OSError: the file cannot be created.
    """

    def __init__(self, path: Path, max_packets: int = 0, linktype: int = LINKTYPE_RAW) -> None:
        if max_packets < 0:
            raise ValueError(f"max_packets {max_packets} < 0")
        if linktype not in (LINKTYPE_RAW, LINKTYPE_ETHERNET):
            raise ValueError(f"link type {linktype} is neither RAW (101) nor ETHERNET (1)")
        self.path = Path(path)
        self.max_packets = max_packets
        self.linktype = linktype
        self.written = 0
        self.skipped = 0
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._file.write(_GLOBAL_HEADER.pack(0xA1B2C3D4, 2, 4, 0, 0, _SNAPLEN, linktype))
        self._ip_id = 0

    def record(
        self, data: bytes | memoryview, src: Addr, dst: Addr, ip_id: int | None = None
    ) -> None:
        """Append one UDP datagram from ``src`` to ``dst`` (IPv4 addresses), with the IPv4
        identification ``ip_id`` it had on the wire, else a running count. (RoCEv2's
        sockets send with Don't Fragment, so Linux writes identification 0, and the ICRC
        covers it: a capture checked by ``inalab pcap`` needs the wire's.)

        Raises:
            ValueError: the file's link type is not RAW.
        """
        if self.linktype != LINKTYPE_RAW:
            raise ValueError("record() writes IPv4 packets: use record_frame() for Ethernet")
        if self.max_packets and self.written >= self.max_packets:
            self.skipped += 1
            return
        udp_len = 8 + len(data)
        self._ip_id = (self._ip_id + 1) & 0xFFFF
        ident = self._ip_id if ip_id is None else ip_id
        ip = _ipv4_header(20 + udp_len, ident, src[0], dst[0])
        udp = _UDP.pack(src[1], dst[1], udp_len, 0)
        self._write(20 + udp_len, ip, udp, data)

    def record_frame(self, frame: bytes | memoryview) -> None:
        """Append one packet as it is, in the file's link type (an Ethernet frame)."""
        if self.max_packets and self.written >= self.max_packets:
            self.skipped += 1
            return
        self._write(len(frame), frame)

    def _write(self, length: int, *parts: bytes | memoryview) -> None:
        now = time.time()
        seconds = int(now)
        if length > _SNAPLEN:  # readers reject longer records; keep the head, as tcpdump
            parts = (b"".join(parts)[:_SNAPLEN],)
        stored = min(length, _SNAPLEN)
        self._file.write(_RECORD_HEADER.pack(seconds, int((now - seconds) * 1e6), stored, length))
        for part in parts:
            self._file.write(part)
        self.written += 1

    def close(self) -> None:
        """Flush and close the file; idempotent."""
        if not self._file.closed:
            self._file.close()


def _ipv4_header(total_length: int, ident: int, src: str, dst: str) -> bytes:
    fields = [0x45, 0, total_length, ident, 0x4000, 64, socket.IPPROTO_UDP, 0]
    header = _IPV4.pack(*fields, socket.inet_aton(src), socket.inet_aton(dst))
    fields[7] = _checksum(header)
    return _IPV4.pack(*fields, socket.inet_aton(src), socket.inet_aton(dst))


def _checksum(header: bytes) -> int:
    """The Internet checksum (RFC 1071) of an even-length header."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
