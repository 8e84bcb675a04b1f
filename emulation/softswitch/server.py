"""The soft switch's I/O: a :class:`Pipeline` on a UDP socket, configured over P4Runtime.

One thread, the data-plane thread, owns the UDP socket and the pipeline. Datagrams are
received into one preallocated buffer and handed to the pipeline as a memoryview; its
:class:`Emit` payload (the pipeline's single output buffer) is sent to every destination
before the next datagram is processed.

The P4Runtime server (``p4runtime.py``) answers on gRPC's own threads; every access it
makes to the pipeline is a callable put on a :class:`ControlQueue` and run by the
data-plane thread between datagrams: when the UDP socket is empty it sleeps in ``select``
on the socket and the queue's wake-up pipe, and when it is busy it runs the queue every
:data:`CONTROL_EVERY` datagrams. No lock is taken per packet.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import FrameType, TracebackType
from typing import Any, TypeVar

from controller.p4info import P4Info
from controller.tls import TlsFiles, require_tls
from emulation.softswitch.p4runtime import (
    SoftSwitchP4Runtime,
    serve_p4runtime,
    softswitch_p4info,
)
from emulation.softswitch.pcap import PcapWriter
from emulation.softswitch.pipeline import Addr, Pipeline
from emulation.softswitch.roce import RoceFront
from emulation.softswitch.tlsfront import SecureP4Runtime
from hostlib.protocol import ROCE_UDP_PORT, packet_size

__all__ = ["CONTROL_EVERY", "SOCKET_BUFFER_BYTES", "ControlQueue", "SwitchServer"]

log = logging.getLogger(__name__)

T = TypeVar("T")

CONTROL_EVERY = 1024
"""Datagrams processed between two runs of the control queue while the data plane is
busy: at ~10 us per datagram that bounds control latency to ~10 ms."""

SOCKET_BUFFER_BYTES = 8 << 20
"""Requested SO_RCVBUF/SO_SNDBUF: a burst of N workers x window packets must queue while
Python processes one datagram at a time (Linux caps it at net.core.rmem_max)."""

CONTROL_TIMEOUT = 30.0
"""Seconds a control request waits for the data-plane thread before failing."""

_MAX_DATAGRAM = 65536  # larger than any UDP payload, so recvfrom_into never truncates


class ControlQueue:
    """Callables from other threads, run on the data-plane thread by :meth:`run_pending`.

    :meth:`call` blocks its caller until the callable has run there and returns its
    result (or raises its exception). A socketpair wakes the data-plane thread's
    ``select`` when a callable arrives.
    """

    def __init__(self) -> None:
        self._pending: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._owner: int | None = None

    def bind_thread(self) -> None:
        """Make the calling thread the one that runs callables (direct calls from it)."""
        self._owner = threading.get_ident()

    def release_thread(self) -> None:
        """No thread serves the queue any more: callers run their callables directly."""
        self._owner = None
        self.run_pending()

    def fileno(self) -> int:
        return self._wake_r.fileno()

    def call(self, fn: Callable[[], T], timeout: float = CONTROL_TIMEOUT) -> T:
        """Run ``fn`` on the data-plane thread and return its result.

        Raises:
            TimeoutError: the data-plane thread did not run it within ``timeout``.
            Exception: whatever ``fn`` raised.
        """
        if self._owner is None or self._owner == threading.get_ident():
            return fn()  # not serving yet (start-up), or already on the owning thread
        future: Future[T] = Future()
        self._pending.put((fn, future))
        # A full pipe already holds wake-ups: the thread will look.
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"x")
        return future.result(timeout)

    def run_pending(self) -> None:
        """Run every queued callable (on the data-plane thread)."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                fn, future = self._pending.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who raises it
                future.set_exception(exc)

    def close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()


class SwitchServer:
    """Run ``pipeline`` on a UDP data socket, configured by a P4Runtime gRPC server.

    Args:
        pipeline: the data plane (no job installed: P4Runtime writes them).
        data_addr: UDP ``(host, port)`` to bind; port 0 picks a free one.
        p4runtime_addr: gRPC ``(host, port)`` of the P4Runtime server; port 0 picks one.
        p4info: the P4Info to serve; by default ``p4/ina.p4info.txtpb`` sized to the
            pipeline (:func:`softswitch_p4info`).
        device_id: the P4Runtime device id.
        poll_interval: seconds to wait in ``select`` when idle (bounds stop latency).
        pcap: where to record every datagram received and sent (none by default); the
            server closes it.
        arbitration: who is P4Runtime primary, ``"spec"`` or ``"bmv2"``
            (:data:`emulation.softswitch.p4runtime.ARBITRATIONS`).
        tls: serve P4Runtime over mutual TLS with these files
            (:class:`~emulation.softswitch.tlsfront.SecureP4Runtime`); None: plain text,
            which only a loopback ``p4runtime_addr`` may use.
        roce: also serve INA over RoCEv2 on ``data_addr``'s address, UDP port 4791
            (:class:`~emulation.softswitch.roce.RoceFront`).

    Raises:
        OSError: an address cannot be bound (RoCEv2's port: say who holds it).
        controller.tls.TlsRequiredError: plain text on a non-loopback address.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        data_addr: Addr,
        p4runtime_addr: Addr,
        p4info: P4Info | None = None,
        device_id: int = 0,
        poll_interval: float = 0.05,
        pcap: PcapWriter | None = None,
        arbitration: str = "spec",
        tls: TlsFiles | None = None,
        roce: bool = False,
    ) -> None:
        require_tls("{}:{}".format(*p4runtime_addr), tls, "--p4runtime-tls")
        self._roce_wanted = roce
        self._roce: tuple[socket.socket, RoceFront] | None = None  # set by _open_io
        self.pipeline = pipeline
        self.poll_interval = poll_interval
        self.device_id = device_id
        self.stats: dict[str, int] = {"send_errors": 0}
        self._stop = False
        self._closed = False
        self.control = ControlQueue()
        p4info = p4info or softswitch_p4info(P4Info.load(), pipeline.lanes, pipeline.slots)
        self.p4runtime = SoftSwitchP4Runtime(
            pipeline, p4info, device_id, self.control.call, arbitration
        )
        self._selector = selectors.DefaultSelector()
        self._sockets = self._open_io(data_addr)
        host = p4runtime_addr[0]
        self._secure: SecureP4Runtime | None = None
        try:
            if tls is None:
                self._grpc, port = serve_p4runtime(self.p4runtime, f"{host}:{p4runtime_addr[1]}")
            else:
                self._secure = SecureP4Runtime(self.p4runtime, host, p4runtime_addr[1], tls)
                self._grpc, port = self._secure.grpc, self._secure.port
        except BaseException:
            for sock in self._sockets:
                sock.close()
            self.control.close()
            raise
        self._p4runtime_addr = (host, port)
        for sock in self._sockets:
            self._selector.register(sock, selectors.EVENT_READ, None)
        self._selector.register(self.control, selectors.EVENT_READ, self.control)
        self._buf = bytearray(_MAX_DATAGRAM)
        self._view = memoryview(self._buf)
        # The one datagram size that is valid: a ready-made view avoids a slice per packet.
        self._full_size = packet_size(pipeline.lanes)
        self._full_view = self._view[: self._full_size]
        self.pcap = pcap
        self._own_addr = self.data_addr

    def _open_io(self, data_addr: Addr) -> list[socket.socket]:
        """Open the data plane's sockets (here: the UDP socket, and RoCEv2's if asked)."""
        self._udp = _bind_udp(data_addr)
        if not self._roce_wanted:
            return [self._udp]
        host = self._udp.getsockname()[0]
        try:
            roce = _bind_udp((host, ROCE_UDP_PORT))
        except OSError as exc:
            self._udp.close()
            raise OSError(
                exc.errno, f"RoCEv2's UDP {host}:{ROCE_UDP_PORT} is taken ({exc.strerror}): "
                "another switch or RNIC on this address, or the kernel's rdma_rxe"
            ) from None
        self._roce = (roce, RoceFront(self.pipeline, host))
        return [self._udp, roce]

    @property
    def data_addr(self) -> Addr:
        host, port = self._udp.getsockname()[:2]
        return host, port

    @property
    def p4runtime_tls(self) -> bool:
        """Whether P4Runtime is served over mutual TLS."""
        return self._secure is not None

    @property
    def p4runtime_addr(self) -> Addr:
        """The gRPC ``(host, port)`` of the P4Runtime server."""
        return self._p4runtime_addr

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
        log.info("switch serving data %s p4runtime %s", self.data_addr, self.p4runtime_addr)
        self.control.bind_thread()
        while not self._stop:
            busy = self._drain() == CONTROL_EVERY
            # After the datagrams queued so far: a counter read sees what was sent before.
            self.control.run_pending()
            if not busy:
                self._selector.select(self._idle_timeout())  # until traffic or control
        self.control.release_thread()
        final = self.counters()
        log.info("switch stopped; counters %s", final)
        return final

    def _idle_timeout(self) -> float:
        """Seconds to sleep in ``select`` when idle: ``poll_interval``, or less in a
        subclass with work due sooner (the frame switch's delayed frames)."""
        return self.poll_interval

    def close(self) -> None:
        """Stop the P4Runtime server and close the sockets; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._secure is not None:
            self._secure.stop()
        else:
            self._grpc.stop(grace=1.0).wait()
        self.control.run_pending()  # nobody waits on these any more, but let them finish
        self.control.close()
        if self.pcap is not None:
            self.pcap.close()
        self._selector.close()
        for sock in self._sockets:
            sock.close()  # a second close of a port closed on failure does nothing

    def _drain(self) -> int:
        """Process up to CONTROL_EVERY queued datagrams of each socket; return the most
        one socket had (CONTROL_EVERY: more may wait)."""
        done = self._drain_ina()
        if self._roce is not None:
            done = max(done, self._drain_roce(*self._roce))
        return done

    def _drain_roce(self, sock: socket.socket, front: RoceFront) -> int:
        """The RoCEv2 socket's queued frames, through the RoCEv2 front."""
        pcap, own = self.pcap, sock.getsockname()[:2]
        for count in range(CONTROL_EVERY):
            try:
                n, src = sock.recvfrom_into(self._buf)
            except BlockingIOError:
                return count
            data = self._view[:n]
            if pcap is not None:
                pcap.record(data, src, own, ip_id=0)
            for out in front.process(data, src):
                try:
                    sock.sendto(out.payload, out.dest)
                except OSError as exc:
                    self._send_error(exc, out.dest)
                    continue
                if pcap is not None:
                    pcap.record(out.payload, own, out.dest, ip_id=0)
        return CONTROL_EVERY

    def _drain_ina(self) -> int:
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
