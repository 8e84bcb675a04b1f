"""The soft switch on Ethernet ports: raw frames in and out of network interfaces.

Where bmv2 takes ``-i 1@veth1``, :class:`FrameSwitchServer` takes ``{1: "veth1"}``: one
``AF_PACKET`` socket per port (root, or CAP_NET_RAW), the same pipeline, the same
P4Runtime server. A frame goes where ``p4/ina.p4`` sends it:

- IPv4 (no options, not fragmented) / UDP to port 20033 is INA: its payload and the
  sender's (IPv4, UDP port) go through the pipeline; a completed slot's result goes to
  each replica (egress port and MAC, IPv4, UDP port from the replicas table), the
  answer to a retransmission back out of the ingress port to the sender; the result's
  source is the address the worker sent to (next_step.p4 swaps the addresses).
- Anything else is forwarded by destination MAC (forwarder.p4): to a port, flooded to
  a multicast group's ports but the ingress one, or dropped (the initial default).

Each port's socket also sees what the kernel sends out of it; those copies
(``PACKET_OUTGOING``) are skipped.

Links are emulated here (``links.py``; the kernel has no netem): a port with a
:class:`LinkSpec` loses and delays the frames sent out of it, and, with ``ingress``,
those arriving on it before the pipeline sees them. Delayed frames wait in a delay
line; the serving loop sleeps no longer than until the next one is due. A port without
a spec costs nothing per frame. With ``link_stats`` the per-port counts are written to
a JSON file (:meth:`FrameSwitchServer.write_link_stats`) when serving starts, at most
once a second while they change, and when it stops.

With a pcap (link type ETHERNET), the switch records each frame it accepts from a port
(after ingress emulation: what the pipeline sees) and each frame it puts on a port's
wire (after egress emulation: lost frames are not recorded, delayed ones when they
leave). Frames it ignores (``PACKET_OUTGOING`` copies) are not recorded, nor the port.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from controller.p4info import P4Info
from controller.tls import TlsFiles
from emulation.softswitch.links import LINK_STATS_INTERVAL, LinkEmulator, LinkSpec, LinkStatsFile
from emulation.softswitch.pcap import LINKTYPE_ETHERNET, PcapWriter
from emulation.softswitch.pipeline import Addr, Emit, Pipeline
from emulation.softswitch.roce import RoceFront
from emulation.softswitch.server import CONTROL_EVERY, SwitchServer
from hostlib.protocol import INA_UDP_PORT, ROCE_UDP_PORT

__all__ = ["ETH_P_ALL", "LINK_STATS_INTERVAL", "FrameSwitchServer", "build_result_frame"]

log = logging.getLogger(__name__)

ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_MAX_FRAME = 65536
_ETH = 14
_IP = 20
_UDP = 8
_INA_PORT_BYTES = INA_UDP_PORT.to_bytes(2, "big")
_ROCE_PORT_BYTES = ROCE_UDP_PORT.to_bytes(2, "big")
_IPV4 = b"\x08\x00"


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def build_result_frame(
    dst_mac: bytes,
    src_mac: bytes,
    src_ip: bytes,
    dst_ip: bytes,
    dst_port: int,
    payload: bytes,
    src_port: int = INA_UDP_PORT,
) -> bytes:
    """An Ethernet/IPv4/UDP frame from the switch's INA port (or RoCEv2's), identification
    0, Don't Fragment, UDP checksum 0 (none; RoCEv2's ICRC masks it anyway)."""
    total = _IP + _UDP + len(payload)
    ip = bytearray(
        struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0, src_ip, dst_ip)
    )
    ip[10:12] = _checksum(bytes(ip)).to_bytes(2, "big")
    udp = struct.pack("!HHHH", src_port, dst_port, _UDP + len(payload), 0)
    return b"".join((dst_mac, src_mac, _IPV4, ip, udp, payload))


class FrameSwitchServer(SwitchServer):
    """Run ``pipeline`` on Ethernet ports, configured by a P4Runtime gRPC server.

    Args:
        pipeline: the data plane (empty: P4Runtime writes its tables).
        interfaces: switch port number -> network interface.
        p4runtime_addr: gRPC ``(host, port)``; port 0 picks one.
        p4info, device_id, poll_interval, arbitration, tls: as for :class:`SwitchServer`.
        pcap: where to record frames (a :class:`PcapWriter` with link type ETHERNET);
            the server closes it.
        forward_only: forward INA packets like any other frame (a switch on the path
            to the aggregating one, as a plain L2 program would).
        links: switch port -> its emulated link (ports not named are plain wires).
        seed: seed of the links' loss (one stream per port and direction).
        link_stats: where :meth:`write_link_stats` writes the links' counts.
        roce: aggregate INA over RoCEv2 too: every UDP datagram to port 4791 is taken for
            it (as the P4 program does), whatever its destination.

    Raises:
        ValueError: no interface, a link on a port that is not one, or a pcap of
            another link type.
        OSError: an interface cannot be opened (missing, or no CAP_NET_RAW).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        interfaces: Mapping[int, str],
        p4runtime_addr: Addr,
        p4info: P4Info | None = None,
        device_id: int = 0,
        poll_interval: float = 0.05,
        pcap: PcapWriter | None = None,
        forward_only: bool = False,
        links: Mapping[int, LinkSpec] | None = None,
        seed: int = 0,
        link_stats: Path | None = None,
        arbitration: str = "spec",
        tls: TlsFiles | None = None,
        roce: bool = False,
    ) -> None:
        self.forward_only = forward_only
        self._roce_front = RoceFront(pipeline, "0.0.0.0") if roce else None
        if not interfaces:
            raise ValueError("a switch with ports needs at least one interface")
        self.interfaces = dict(interfaces)
        links = dict(links or {})
        if unknown := sorted(set(links) - set(self.interfaces)):
            raise ValueError(f"links on ports {unknown} that have no interface")
        if pcap is not None and pcap.linktype != LINKTYPE_ETHERNET:
            raise ValueError("a switch on ports records Ethernet frames: pcap link type 1")
        self.links = LinkEmulator(links, seed)
        # Empty when nothing is emulated: a truth test per frame received, none sent.
        self._egress = self.links.egress
        self._ingress = self.links.ingress
        self.link_stats = LinkStatsFile(link_stats, self.links.stats)
        super().__init__(
            pipeline, ("0.0.0.0", 0), p4runtime_addr, p4info, device_id, poll_interval, pcap,
            arbitration, tls,
        )
        self.stats.update({"frames_in": 0, "frames_out": 0, "forwarded": 0, "not_forwarded": 0})
        if not self._egress:  # no link to go through: frames go straight to the wire
            self._send = self._transmit  # type: ignore[method-assign]

    def _open_io(self, data_addr: Addr) -> list[socket.socket]:
        self._ports: dict[int, socket.socket] = {}
        try:
            for port, name in self.interfaces.items():
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                self._ports[port] = sock
                sock.bind((name, 0))
                sock.setblocking(False)
        except OSError:
            for sock in self._ports.values():
                sock.close()
            raise
        return list(self._ports.values())

    @property
    def data_addr(self) -> Addr:
        """No UDP endpoint: workers reach the switch through its ports."""
        return ("0.0.0.0", 0)

    def counters(self) -> dict[str, int]:
        """The server's counters plus each emulated link's (``link<PORT>_<dir>_<count>``)."""
        return {**super().counters(), **self.links.counters()}

    def serve_forever(self) -> dict[str, int]:
        """As :meth:`SwitchServer.serve_forever`; the link stats file is written first
        and last (frames still in a delay line when it stops are never delivered)."""
        self.link_stats.write_logged()
        try:
            return super().serve_forever()
        finally:
            self.link_stats.write_logged()

    def write_link_stats(self) -> None:
        """Write the links' counts to the ``link_stats`` file (if set) atomically, as
        ``{"ports": {"1": {"egress": {...}, "ingress": {...}}}}`` (see ``links.py``).

        Raises:
            OSError: the file cannot be written.
        """
        self.link_stats.write()

    def _idle_timeout(self) -> float:
        due = self.links.next_due()
        if due is None:
            return self.poll_interval
        return min(self.poll_interval, max(0.0, due - time.monotonic()))

    def _drain(self) -> int:
        """Process up to CONTROL_EVERY queued frames from all ports, round robin, and
        the delayed frames that fell due."""
        emulating = bool(self.links)
        if emulating:
            self._release_due()
        done = 0
        buf, view, ingress = self._buf, self._view, self._ingress
        while done < CONTROL_EVERY:
            got = 0
            for port, sock in list(self._ports.items()):
                try:
                    n, addr = sock.recvfrom_into(buf)
                except BlockingIOError:
                    continue
                except OSError as exc:  # the interface went down or away
                    self._port_down(port, exc)
                    continue
                got += 1
                if addr[2] == _PACKET_OUTGOING:
                    continue
                self.stats["frames_in"] += 1
                frame = view[:n]
                if ingress and port in ingress:
                    kept = ingress[port].offer(frame)  # copied if delayed
                    if kept is None:
                        continue
                    frame = kept
                if self.pcap is not None:
                    self.pcap.record_frame(frame)
                self._frame(port, frame)  # as _accept, one call less per frame
            if not got:
                break
            done += got
            if emulating:
                self._release_due()
        self.link_stats.tick()
        return min(done, CONTROL_EVERY)

    def _release_due(self) -> None:
        """Deliver the delayed frames that are due: process ingress, transmit egress."""
        now = time.monotonic()
        due = self.links.next_due()
        if due is None or due > now:
            return
        for direction, port, frame in self.links.release(now):
            if direction == "egress":
                self._transmit(port, frame)
            else:
                self._accept(port, memoryview(frame))

    def _port_down(self, port: int, exc: OSError) -> None:
        """Stop using a port whose interface failed; the switch goes on with the others."""
        log.warning("port %d (%s) failed, no longer used: %s", port, self.interfaces[port], exc)
        sock = self._ports.pop(port)
        self._selector.unregister(sock)
        sock.close()

    def _accept(self, port: int, frame: memoryview) -> None:
        """A frame the port delivers to the pipeline (after ingress emulation)."""
        if self.pcap is not None:
            self.pcap.record_frame(frame)
        self._frame(port, frame)

    def _frame(self, port: int, frame: memoryview) -> None:
        if (
            not self.forward_only
            and len(frame) >= _ETH + _IP + _UDP
            and frame[12:14] == _IPV4
            and frame[14] == 0x45
            and frame[23] == 17
            and not (int.from_bytes(frame[20:22], "big") & 0x3FFF)
        ):
            if frame[36:38] == _INA_PORT_BYTES:
                self._ina(port, frame)
                return
            if frame[36:38] == _ROCE_PORT_BYTES and self._roce_front is not None:
                self._roce_frame(port, frame, self._roce_front)
                return
        self._forward(port, frame)

    def _roce_frame(self, port: int, frame: memoryview, front: RoceFront) -> None:
        """A RoCEv2 frame: through the RoCEv2 front; its WRITEs out of their ports."""
        udp_len = int.from_bytes(frame[38:40], "big")
        payload = frame[_ETH + _IP + _UDP : _ETH + _IP + max(udp_len, _UDP)]
        src = (socket.inet_ntoa(frame[26:30]), int.from_bytes(frame[34:36], "big"))
        own_mac, own_ip = bytes(frame[0:6]), bytes(frame[30:34])
        for send in front.process(payload, src, socket.inet_ntoa(own_ip)):
            if send.link is None:  # the answer to a retransmission: back to the sender
                egress, mac = port, bytes(frame[6:12])
            else:
                egress, mac = send.link[0], send.link[1].to_bytes(6, "big")
            out = build_result_frame(
                mac, own_mac, own_ip, socket.inet_aton(send.dest[0]), send.dest[1],
                send.payload, src_port=ROCE_UDP_PORT,
            )  # fmt: skip
            self._send(egress, out)

    def _ina(self, port: int, frame: memoryview) -> None:
        udp_len = int.from_bytes(frame[38:40], "big")
        payload = frame[_ETH + _IP + _UDP : _ETH + _IP + max(udp_len, _UDP)]
        src_ip = bytes(frame[26:30])
        src = (socket.inet_ntoa(src_ip), int.from_bytes(frame[34:36], "big"))
        emit = self.pipeline.process(payload, src)
        if emit is not None:
            self._send_result(port, frame, src_ip, src, emit)

    def _send_result(
        self, port: int, frame: memoryview, src_ip: bytes, src: Addr, emit: Emit
    ) -> None:
        own_mac, own_ip = bytes(frame[0:6]), bytes(frame[30:34])
        payload = bytes(emit.payload)
        if not emit.links:  # the answer to a retransmission: back to the sender
            out = build_result_frame(bytes(frame[6:12]), own_mac, own_ip, src_ip, src[1], payload)
            self._send(port, out)
            return
        for (ip, udp_port), (egress, mac) in zip(emit.dests, emit.links, strict=True):
            out = build_result_frame(
                mac.to_bytes(6, "big"), own_mac, own_ip, socket.inet_aton(ip), udp_port, payload
            )
            self._send(egress, out)

    def _forward(self, port: int, frame: memoryview) -> None:
        p = self.pipeline
        kind, value = p.forward.get(int.from_bytes(frame[0:6], "big"), p.forward_default)
        if kind == "port":
            self._send(value, frame)
        elif kind == "flood":
            for egress, _rid in p.group(value):
                if egress != port:
                    self._send(egress, frame)
        else:
            self.stats["not_forwarded"] += 1
            return
        self.stats["forwarded"] += 1

    def _send(self, port: int, frame: bytes | memoryview) -> None:
        """Send a frame out of ``port``, through the port's link if it is emulated (a
        switch without egress links sends with :meth:`_transmit` directly)."""
        link = self._egress.get(port)
        if link is not None:
            kept = link.offer(frame)  # copied if delayed
            if kept is None:
                return
            frame = kept
        self._transmit(port, frame)

    def _transmit(self, port: int, frame: bytes | memoryview) -> None:
        """Put a frame on ``port``'s wire now."""
        sock = self._ports.get(port)
        if sock is None:
            self.stats["send_errors"] += 1
            log.debug("no port %d", port)
            return
        try:
            sock.send(frame)
        except OSError as exc:
            self.stats["send_errors"] += 1
            log.debug("port %d: send failed: %s", port, exc)
            return
        self.stats["frames_out"] += 1
        if self.pcap is not None:
            self.pcap.record_frame(frame)
