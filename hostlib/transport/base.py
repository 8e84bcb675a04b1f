"""The transport interface of the host library: datagrams to and from a switch."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Addr", "Transport", "TransportError"]

Addr = tuple[str, int]


class TransportError(OSError):
    """The transport cannot send or receive (closed, unreachable, bad address)."""


@runtime_checkable
class Transport(Protocol):
    """A datagram endpoint. ``hostlib.session`` drives an INA engine over one.

    A transport that also has ``fileno()`` (a descriptor that is readable when a datagram
    waits) lets a point-to-point session answer its peers between calls
    (``hostlib.p2p``); without one, only its calls and ``close`` answer them.

    Implementations: :class:`hostlib.transport.udp.UdpTransport` (sockets),
    :class:`hostlib.transport.rdma.RdmaTransport` (each packet an RDMA message, on an
    emulated RNIC or a verbs device); ``hostlib.transport.memory`` runs the same engine
    on a simulated network instead.
    """

    @property
    def local_addr(self) -> Addr:
        """Where this endpoint receives; the switch binds the worker's rank to it."""
        ...

    def send(self, data: bytes | memoryview, dest: Addr) -> None:
        """Send one datagram to ``dest``."""
        ...

    def recv_into(self, buf: bytearray | memoryview, timeout: float) -> tuple[int, Addr | None]:
        """Wait up to ``timeout`` seconds for a datagram; return ``(nbytes, source)``.

        ``(0, None)`` when nothing arrived in time.
        """
        ...

    def close(self) -> None: ...
