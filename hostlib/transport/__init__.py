"""Transports: UDP sockets (``udp``), a simulated network (``memory``), RoCEv2 (``rdma``)."""

from hostlib.transport.base import Addr, Transport, TransportError

__all__ = ["Addr", "Transport", "TransportError"]
