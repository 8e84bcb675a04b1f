"""The soft switch's I/O: a :class:`Pipeline` on a UDP socket, plus its control socket.

One thread owns both sockets. Datagrams are received into one preallocated buffer and
handed to the pipeline as a memoryview; its :class:`Emit` payload (the pipeline's single
output buffer) is sent to every destination before the next datagram is processed. When
the UDP socket is empty the loop sleeps in ``select`` on both sockets; when it is busy
the control socket is still polled every :data:`CONTROL_EVERY` datagrams.
"""

from __future__ import annotations

import logging
import selectors
import signal
import socket
from types import FrameType, TracebackType

from emulation.softswitch.control import ControlHandler, ControlServer
from emulation.softswitch.pcap import PcapWriter
from emulation.softswitch.pipeline import Addr, Pipeline
from hostlib.protocol import packet_size

__all__ = ["CONTROL_EVERY", "SOCKET_BUFFER_BYTES", "SwitchServer"]

log = logging.getLogger(__name__)

CONTROL_EVERY = 1024
"""Datagrams processed between two zero-timeout control polls while the data plane is
busy: at ~10 us per datagram that bounds control latency to ~10 ms."""

SOCKET_BUFFER_BYTES = 8 << 20
"""Requested SO_RCVBUF/SO_SNDBUF: a burst of N workers x window packets must queue while
Python processes one datagram at a time (Linux caps it at net.core.rmem_max)."""

_MAX_DATAGRAM = 65536  # larger than any UDP payload, so recvfrom_into never truncates


class SwitchServer:
    """Run ``pipeline`` on a UDP data socket and a TCP control socket, single-threaded.

    Args:
        pipeline: the data plane.
        data_addr: UDP ``(host, port)`` to bind; port 0 picks a free one.
        control_addr: TCP ``(host, port)`` of the control channel; port 0 picks one.
        poll_interval: seconds to wait in ``select`` when idle (bounds stop latency).
        pcap: where to record every datagram received and sent (none by default); the
            server closes it.

    Raises:
        OSError: an address cannot be bound.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        data_addr: Addr,
        control_addr: Addr,
        poll_interval: float = 0.05,
        pcap: PcapWriter | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.poll_interval = poll_interval
        self.stats: dict[str, int] = {"send_errors": 0}
        self._stop = False
        self._udp = _bind_udp(data_addr)
        try:
            handler = ControlHandler(pipeline, self.stats, self.request_stop)
            self.control = ControlServer(handler, control_addr)
        except BaseException:
            self._udp.close()
            raise
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._udp, selectors.EVENT_READ, None)
        self.control.attach(self._selector)
        self._buf = bytearray(_MAX_DATAGRAM)
        self._view = memoryview(self._buf)
        # The one datagram size that is valid: a ready-made view avoids a slice per packet.
        self._full_size = packet_size(pipeline.lanes)
        self._full_view = self._view[: self._full_size]
        self.pcap = pcap
        self._own_addr = self.data_addr

    @property
    def data_addr(self) -> Addr:
        host, port = self._udp.getsockname()[:2]
        return host, port

    @property
    def control_addr(self) -> Addr:
        return self.control.address

    def __enter__(self) -> SwitchServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def request_stop(self) -> None:
        """Make :meth:`serve_forever` return after the current batch (signal-safe)."""
        self._stop = True

    def install_signal_handlers(self) -> None:
        """Stop cleanly on SIGTERM and SIGINT (call from the main thread only).

        Raises:
            ValueError: called from another thread.
        """

        def _on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping", signum)
            self.request_stop()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)

    def counters(self) -> dict[str, int]:
        """Pipeline counters plus the I/O layer's (``send_errors``, pcap records)."""
        extra = {}
        if self.pcap is not None:
            extra = {"pcap_written": self.pcap.written, "pcap_skipped": self.pcap.skipped}
        return {**self.pipeline.counters(), **self.stats, **extra}

    def serve_forever(self) -> dict[str, int]:
        """Forward datagrams and answer control requests until asked to stop.

        Returns:
            the final counters (also logged).
        """
        log.info("switch serving data %s control %s", self.data_addr, self.control_addr)
        while not self._stop:
            if self._drain() == CONTROL_EVERY:
                self._poll(0.0)  # still busy: look at control without waiting
            else:
                self._poll(self.poll_interval)  # UDP socket empty: sleep until traffic
        final = self.counters()
        log.info("switch stopped; counters %s", final)
        return final

    def close(self) -> None:
        """Close both sockets (flushing pending control replies); idempotent."""
        if self._udp.fileno() < 0:
            return
        self.control.close()
        if self.pcap is not None:
            self.pcap.close()
        self._selector.unregister(self._udp)
        self._selector.close()
        self._udp.close()

    def _drain(self) -> int:
        """Process up to CONTROL_EVERY queued datagrams; return how many were processed."""
        recv = self._udp.recvfrom_into
        sendto = self._udp.sendto
        process = self.pipeline.process
        buf, view, full_size, full_view = self._buf, self._view, self._full_size, self._full_view
        pcap, own = self.pcap, self._own_addr
        for count in range(CONTROL_EVERY):
            try:
                n, src = recv(buf)
            except BlockingIOError:
                return count
            data = full_view if n == full_size else view[:n]
            if pcap is not None:
                pcap.record(data, src, own)
            emit = process(data, src)
            if emit is None:
                continue
            # emit.payload is the pipeline's reusable buffer: all sends before next process().
            for dest in emit.dests:
                try:
                    sendto(emit.payload, dest)
                except OSError as exc:
                    self._send_error(exc, dest)
                    continue
                if pcap is not None:
                    pcap.record(emit.payload, own, dest)
        return CONTROL_EVERY

    def _send_error(self, exc: OSError, dest: Addr) -> None:
        # A full socket buffer (ENOBUFS) or an unreachable worker loses one result; the
        # worker's retransmission recovers it, as with a lost packet on a real link.
        self.stats["send_errors"] += 1
        log.debug("sendto %s failed: %s", dest, exc)

    def _poll(self, timeout: float) -> None:
        for key, mask in self._selector.select(timeout):
            if isinstance(key.data, ControlServer):
                key.data.service(key, mask)


def _bind_udp(addr: Addr) -> socket.socket:
    """A non-blocking UDP socket bound to ``addr`` with the largest buffers allowed.

    Raises:
        OSError: ``addr`` cannot be bound.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            # The kernel silently caps the request (rmem_max/wmem_max); take what it gives.
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        sock.bind(addr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    log.debug(
        "UDP buffers rcv=%d snd=%d",
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    )
    return sock
