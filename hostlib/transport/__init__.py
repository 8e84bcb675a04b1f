"""Transports: UDP sockets (``udp``) and a simulated network (``memory``). There is no
RoCEv2 transport yet (issue #40)."""

from hostlib.transport.base import Addr, Transport, TransportError

__all__ = ["Addr", "Transport", "TransportError"]
