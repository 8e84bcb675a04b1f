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
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Mapping

from controller.p4info import P4Info
from emulation.softswitch.pcap import PcapWriter
from emulation.softswitch.pipeline import Addr, Emit, Pipeline
from emulation.softswitch.server import CONTROL_EVERY, SwitchServer
from hostlib.protocol import INA_UDP_PORT

__all__ = ["ETH_P_ALL", "FrameSwitchServer", "build_result_frame"]

log = logging.getLogger(__name__)

ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_MAX_FRAME = 65536
_ETH = 14
_IP = 20
_UDP = 8
_INA_PORT_BYTES = INA_UDP_PORT.to_bytes(2, "big")
_IPV4 = b"\x08\x00"


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def build_result_frame(
    dst_mac: bytes, src_mac: bytes, src_ip: bytes, dst_ip: bytes, dst_port: int, payload: bytes
) -> bytes:
    """An Ethernet/IPv4/UDP frame from the switch's INA port (UDP checksum 0: none)."""
    total = _IP + _UDP + len(payload)
    ip = bytearray(
        struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0, src_ip, dst_ip)
    )
    ip[10:12] = _checksum(bytes(ip)).to_bytes(2, "big")
    udp = struct.pack("!HHHH", INA_UDP_PORT, dst_port, _UDP + len(payload), 0)
    return b"".join((dst_mac, src_mac, _IPV4, ip, udp, payload))


class FrameSwitchServer(SwitchServer):
    """Run ``pipeline`` on Ethernet ports, configured by a P4Runtime gRPC server.

    Args:
        pipeline: the data plane (empty: P4Runtime writes its tables).
        interfaces: switch port number -> network interface.
        p4runtime_addr: gRPC ``(host, port)``; port 0 picks one.
        p4info, device_id, poll_interval, pcap: as for :class:`SwitchServer`.
        forward_only: forward INA packets like any other frame (a switch on the path
            to the aggregating one, as a plain L2 program would).

    Raises:
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
    ) -> None:
        self.forward_only = forward_only
        if not interfaces:
            raise ValueError("a switch with ports needs at least one interface")
        self.interfaces = dict(interfaces)
        super().__init__(
            pipeline, ("0.0.0.0", 0), p4runtime_addr, p4info, device_id, poll_interval, pcap
        )
        self.stats.update({"frames_in": 0, "frames_out": 0, "forwarded": 0, "not_forwarded": 0})

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

    def _drain(self) -> int:
        """Process up to CONTROL_EVERY queued frames from all ports, round robin."""
        done = 0
        buf, view = self._buf, self._view
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
                self._frame(port, view[:n])
            if not got:
                break
            done += got
        return min(done, CONTROL_EVERY)

    def _port_down(self, port: int, exc: OSError) -> None:
        """Stop using a port whose interface failed; the switch goes on with the others."""
        log.warning("port %d (%s) failed, no longer used: %s", port, self.interfaces[port], exc)
        sock = self._ports.pop(port)
        self._selector.unregister(sock)
        sock.close()

    def _frame(self, port: int, frame: memoryview) -> None:
        if (
            not self.forward_only
            and len(frame) >= _ETH + _IP + _UDP
            and frame[12:14] == _IPV4
            and frame[14] == 0x45
            and frame[23] == 17
            and not (int.from_bytes(frame[20:22], "big") & 0x3FFF)
            and frame[36:38] == _INA_PORT_BYTES
        ):
            self._ina(port, frame)
        else:
            self._forward(port, frame)

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
