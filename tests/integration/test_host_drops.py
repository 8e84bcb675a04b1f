"""A UDP transport reports what its kernel dropped for it (the bench's host_drops)."""

from __future__ import annotations

import socket

from hostlib.transport.udp import UdpTransport, socket_drops


def test_a_full_receive_buffer_shows_as_drops() -> None:
    with UdpTransport(("127.0.0.1", 0)) as receiver:
        assert receiver.drops() == 0
        small = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        small.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        small.bind(("127.0.0.1", 0))
        with small, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for _ in range(200):
                sender.sendto(b"x" * 1000, small.getsockname())
            dropped = socket_drops(small)
            assert dropped is not None and 100 <= dropped < 200
        assert receiver.drops() == 0  # another socket's drops are not its own
