"""The soft switch on Ethernet ports with the eBPF data plane: ``inalab switch
--datapath ebpf --interface PORT@IFACE ...``.

Same ports, same P4Runtime server, same tables as :class:`~emulation.softswitch.frames.
FrameSwitchServer`; the frames never reach this process: :class:`EbpfDataplane`'s
program handles them on the ports in the kernel. What is left here is the control plane
(the P4Runtime server and its queue, served by the main loop) and the link statistics
file.

One-armed (``inalab switch --one-armed IFACE``): one port, the host's NIC; the program
aggregates the INA packets sent to the NIC's address and leaves everything else to the
host (``ina.bpf.c``), and :attr:`EbpfSwitchServer.data_addr` is that INA address.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import struct
from collections.abc import Mapping
from pathlib import Path

from controller.p4info import P4Info
from controller.tls import TlsFiles
from emulation.softswitch.ebpf.dataplane import EbpfDataplane
from emulation.softswitch.links import LinkSpec, LinkStatsFile
from emulation.softswitch.pipeline import Addr
from emulation.softswitch.server import SwitchServer
from hostlib.protocol import INA_UDP_PORT

__all__ = ["EbpfSwitchServer", "interface_ipv4"]

log = logging.getLogger(__name__)


class EbpfSwitchServer(SwitchServer):
    """Run ``dataplane`` on the ports ``interfaces``, configured by a P4Runtime server.

    Args:
        dataplane: the loaded program and its maps (tables empty).
        interfaces: switch port number -> network interface.
        p4runtime_addr: gRPC ``(host, port)``; port 0 picks one.
        p4info, device_id, poll_interval, arbitration, tls: as for :class:`SwitchServer`.
        links: switch port -> its emulated link (loss, duplication, reordering: no
            delay in the kernel).
        link_stats: where :meth:`write_link_stats` writes the links' counts.

    Raises:
        ValueError: no interface, a link on a port that is not one, or a link with delay.
        OSError: an interface does not exist, or the program cannot be attached to it.
    """

    def __init__(
        self,
        dataplane: EbpfDataplane,
        interfaces: Mapping[int, str],
        p4runtime_addr: Addr,
        p4info: P4Info | None = None,
        device_id: int = 0,
        poll_interval: float = 0.05,
        links: Mapping[int, LinkSpec] | None = None,
        link_stats: Path | None = None,
        arbitration: str = "spec",
        tls: TlsFiles | None = None,
    ) -> None:
        if not interfaces:
            raise ValueError("a switch with ports needs at least one interface")
        self.interfaces = dict(interfaces)
        self._links = dict(links or {})
        if unknown := sorted(set(self._links) - set(self.interfaces)):
            raise ValueError(f"links on ports {unknown} that have no interface")
        self.dataplane = dataplane
        self.link_stats = LinkStatsFile(link_stats, dataplane.link_stats)
        try:
            super().__init__(dataplane, ("0.0.0.0", 0), p4runtime_addr, p4info, device_id,
                             poll_interval, arbitration=arbitration, tls=tls)  # fmt: skip
        except BaseException:
            dataplane.detach()  # attached in _open_io; the gRPC port was the problem
            raise

    def _open_io(self, data_addr: Addr) -> list[socket.socket]:
        """Put the program on the ports: no socket for this process to serve."""
        try:
            self.dataplane.attach(self.interfaces, self._links)
        except BaseException:
            self.dataplane.detach()
            raise
        return []

    @property
    def data_addr(self) -> Addr:
        """No UDP endpoint: workers reach the switch through its ports; a one-armed
        server's INA address: its host's, port INA_UDP_PORT."""
        if self.dataplane.one_armed is not None:
            return (self.dataplane.one_armed, INA_UDP_PORT)
        return ("0.0.0.0", 0)

    def counters(self) -> dict[str, int]:
        """The program's counters plus each emulated link's (``link<PORT>_<dir>_<count>``,
        as the Python data plane names them)."""
        flat = {
            f"link{port}_{direction}_{key}": value
            for port, entry in self.dataplane.link_stats()["ports"].items()
            for direction, counts in entry.items()
            for key, value in counts.items()
        }
        return {**super().counters(), **flat}

    def serve_forever(self) -> dict[str, int]:
        """Serve the control plane until asked to stop; the link stats file is written
        first, once a second while it changes, and last."""
        self.link_stats.write_logged()
        try:
            return super().serve_forever()
        finally:
            self.link_stats.write_logged()

    def write_link_stats(self) -> None:
        """Write the links' counts now.

        Raises:
            OSError: the file cannot be written.
        """
        self.link_stats.write()

    def _drain(self) -> int:
        self.link_stats.tick()
        return 0

    def _idle_timeout(self) -> float:
        return self.poll_interval

    def close(self) -> None:
        """Stop the P4Runtime server, take the program off the ports, free the maps."""
        try:
            super().close()
        finally:
            self.dataplane.close()


_SIOCGIFADDR = 0x8915


def interface_ipv4(name: str) -> str:
    """The IPv4 address of interface ``name`` in this network namespace.

    Raises:
        OSError: no such interface, or it has no IPv4 address.
    """
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError as exc:
            raise OSError(exc.errno, f"{name}: no IPv4 address ({exc.strerror})") from None
    return socket.inet_ntoa(answer[20:24])
