"""UDP sockets as a host-library transport."""

from __future__ import annotations

import fcntl
import os
import select
import socket
import struct

from hostlib.transport.base import Addr, TransportError

__all__ = ["UdpTransport", "interface_for", "route_source", "socket_drops"]

_BUFFER_BYTES = 8 << 20  # the kernel caps it at net.core.{r,w}mem_max; large windows burst


class UdpTransport:
    """A bound, non-blocking UDP socket.

    ``native_io`` says that a native core may send and receive on :meth:`fileno` itself
    (what ``send`` and ``recv_into`` do, nothing more); a subclass that changes them (a
    test's lossy transport) sets it false, and sessions then drive calls through them.

    Args:
        local: address to bind; port 0 picks a free one (see :attr:`local_addr`).

    Raises:
        TransportError: the address cannot be bound.
    """

    native_io = True

    def __init__(self, local: Addr = ("127.0.0.1", 0)) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self._sock.setsockopt(socket.SOL_SOCKET, opt, _BUFFER_BYTES)
            self._sock.bind(local)
        except OSError as exc:
            self._sock.close()
            raise TransportError(f"cannot bind UDP {local[0]}:{local[1]}: {exc}") from None
        self._sock.setblocking(False)
        self._addr: Addr = self._sock.getsockname()[:2]
        self._peer: Addr | None = None

    @property
    def local_addr(self) -> Addr:
        return self._addr

    def connect(self, peer: Addr) -> None:
        """Talk to ``peer`` alone from now on (an INA session's switch): the kernel drops
        datagrams from anyone else, and a send or receive no longer carries an address,
        which saves a worker a good part of its per-packet cost at line rate.

        Raises:
            TransportError: ``peer`` is not an address (or not reachable).
        """
        try:
            self._sock.connect(peer)
        except OSError as exc:
            raise TransportError(f"cannot connect to {peer[0]}:{peer[1]}: {exc}") from None
        self._peer = (str(peer[0]), int(peer[1]))

    def send(self, data: bytes | memoryview, dest: Addr) -> None:
        """Send one datagram; a full socket buffer waits for room instead of failing."""
        connected = dest == self._peer
        while True:
            try:
                if connected:
                    self._sock.send(data)
                else:
                    self._sock.sendto(data, dest)
                return
            except BlockingIOError:
                select.select([], [self._sock], [], 0.01)
            except ConnectionRefusedError:
                return  # ICMP port unreachable for an earlier datagram: as if it were lost
            except OSError as exc:
                raise TransportError(f"send to {dest[0]}:{dest[1]} failed: {exc}") from None

    def recv_into(self, buf: bytearray | memoryview, timeout: float) -> tuple[int, Addr | None]:
        got = self._recv(buf)
        if got[0] or timeout <= 0:
            return got
        if select.select([self._sock], [], [], timeout)[0]:
            return self._recv(buf)
        return 0, None

    def _recv(self, buf: bytearray | memoryview) -> tuple[int, Addr | None]:
        try:
            if self._peer is not None:
                return self._sock.recv_into(buf), self._peer
            n, src = self._sock.recvfrom_into(buf)
            return n, src
        except (BlockingIOError, ConnectionRefusedError):
            # Refused: the peer's port was closed when an earlier datagram arrived (ICMP);
            # like a lost datagram, the retransmission timer handles it.
            return 0, None

    def drops(self) -> int | None:
        """Datagrams the kernel dropped for this socket so far because its receive buffer
        was full (the ``drops`` column of ``/proc/net/udp`` in this network namespace):
        losses the host made, not the network; ``None`` where the kernel does not say."""
        return socket_drops(self._sock)

    def fileno(self) -> int:
        """The socket's descriptor, for waiting on it with ``select`` (a session's
        responder does between calls)."""
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> UdpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def route_source(ip: str) -> str:
    """The local IPv4 address this host's routes send from toward ``ip`` (what a socket
    bound to any address would use): where a worker binds to be reachable from there.
    No packet is sent.

    Raises:
        OSError: no route to ``ip``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # a UDP connect only chooses the route and source
        return str(probe.getsockname()[0])


_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's (primary) IPv4 address


def interface_for(ip: str) -> str | None:
    """The name of the interface in this network namespace whose IPv4 address is
    ``ip``, or ``None`` where none has it as its primary address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(answer[20:24]) == ip:
                return name
    return None


def socket_drops(sock: socket.socket) -> int | None:
    """The kernel's receive-drop count of a bound IPv4 UDP socket (``/proc/net/udp``, the
    line whose inode is the socket's), or ``None`` when it cannot be read."""
    try:
        inode = os.fstat(sock.fileno()).st_ino
        with open("/proc/net/udp", encoding="ascii") as table:
            next(table)  # the header
            for line in table:
                fields = line.split()
                if len(fields) >= 13 and fields[9] == str(inode):
                    return int(fields[12])
    except (OSError, ValueError, StopIteration):
        return None
    return None
