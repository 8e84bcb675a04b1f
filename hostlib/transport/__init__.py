"""Transports: UDP sockets (``udp``), RDMA WRITEs (``rdma``) over an emulated RNIC
(``rnic``: RoCEv2 frames on a UDP socket) or a verbs device, and a simulated network
(``memory``)."""

from hostlib.transport.base import Addr, Transport, TransportError

__all__ = ["Addr", "Transport", "TransportError"]
