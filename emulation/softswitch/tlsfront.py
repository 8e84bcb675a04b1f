"""The soft switch's P4Runtime behind mutual TLS: a TLS front that checks each client's
certificate, says in one line who it refused, and passes accepted connections to the
gRPC server on a Unix socket only this process's user can open.

Why a front and not gRPC's own ``ssl_server_credentials``: gRPC refuses a client whose
certificate fails, or that speaks plain text, inside its C core and tells the
application nothing, so the switch could not log who was turned away. Here the
handshake is Python's (:mod:`ssl` over :mod:`asyncio`), and the bytes after it are
HTTP/2 that gRPC serves unchanged. The gRPC server itself listens only on
``RUNDIR/p4runtime.sock`` (a private directory, mode 0700): nothing on the network
reaches it without passing the front.

The front runs an asyncio loop in one daemon thread; P4Runtime connections are few
(controllers), so that thread is never the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import ssl
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from controller.tls import TlsFiles

__all__ = ["SecureP4Runtime", "TlsFront"]

log = logging.getLogger(__name__)

_HANDSHAKE_SECONDS = 10.0
_CHUNK = 1 << 16


class TlsFront:
    """Accept mutual-TLS connections on ``(host, port)`` and relay each to ``backend``.

    Args:
        host: the management address to listen on.
        port: its port; 0 picks a free one (see :attr:`port`).
        backend: path of the gRPC server's Unix socket.
        tls: the server's certificate and key, and the CA client certificates must
            chain to.

    Raises:
        OSError: the address cannot be bound.
        ssl.SSLError: the files cannot be loaded (checked earlier by
            :meth:`TlsFiles.parse`, so only if they changed since).
    """

    def __init__(self, host: str, port: int, backend: str, tls: TlsFiles) -> None:
        self.backend = backend
        self._context = tls.server_context()
        self._tasks: set[asyncio.Future[None]] = set()
        self._accepting: asyncio.Future[None]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="p4rt-tls", daemon=True
        )
        self._thread.start()
        listening = self._listen(host, port)
        started: Future[Any] = asyncio.run_coroutine_threadsafe(listening, self._loop)
        try:
            self._listener: socket.socket = started.result(timeout=10)
        except BaseException:
            self._stop_loop()
            raise
        self.port: int = self._listener.getsockname()[1]

    async def _listen(self, host: str, port: int) -> socket.socket:
        listener = socket.create_server((host, port), family=_family(host), backlog=64)
        listener.setblocking(False)
        self._accepting = asyncio.ensure_future(self._accept(listener))
        return listener

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, peer = await loop.sock_accept(listener)
            # Small RPCs both ways: Nagle with delayed acks would add 40 ms to each.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._tasks.add(task := asyncio.ensure_future(self._serve(conn, peer)))
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket, peer: Any) -> None:
        # The handshake runs before anything reads the socket (a stream opened first
        # would swallow a client's first bytes), and its failure is an exception here,
        # with the peer in hand: asyncio's own TLS server logs none of it.
        who = f"{peer[0]}:{peer[1]}"
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_CHUNK)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, conn, ssl=self._context, ssl_handshake_timeout=_HANDSHAKE_SECONDS
            )
        except (ssl.SSLError, OSError, EOFError) as exc:
            conn.close()
            log.warning("P4Runtime: refused %s: %s", who, _reason(exc))
            return
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        log.info("P4Runtime: %s connected as %s", who, _subject(writer.get_extra_info("peercert")))
        try:
            back_reader, back_writer = await asyncio.open_unix_connection(self.backend)
        except OSError as exc:
            log.error("P4Runtime: %s: the gRPC server's socket %s: %s", who, self.backend, exc)
            transport.abort()
            return
        await asyncio.gather(
            _pipe(reader, back_writer), _pipe(back_reader, writer), return_exceptions=True
        )
        log.info("P4Runtime: %s disconnected", who)

    def close(self) -> None:
        """Stop listening and drop every relayed connection."""
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already stopped
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=5)
            self._stop_loop()

    async def _shutdown(self) -> None:
        self._accepting.cancel()
        self._listener.close()
        for task in list(self._tasks):
            task.cancel()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until ``reader`` ends, then end ``writer``'s side."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError, ssl.SSLError):
            writer.close()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _reason(exc: BaseException) -> str:
    """A refused handshake in words: a plain-text client, no certificate, an untrusted
    one, or the connection's end."""
    if isinstance(exc, (TimeoutError, ConnectionAbortedError)) and "longer" in str(exc):
        return f"no TLS handshake within {_HANDSHAKE_SECONDS:.0f} s"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or ""
        if reason in ("HTTP_REQUEST", "WRONG_VERSION_NUMBER") or "PACKET_LENGTH" in reason:
            return "plain text, not TLS (TLS is required here)"
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return "no client certificate (mutual TLS: the client must present one)"
        if isinstance(exc, ssl.SSLCertVerificationError) or reason == "CERTIFICATE_VERIFY_FAILED":
            detail = getattr(exc, "verify_message", None) or "verification failed"
            return f"client certificate not trusted: {detail}"
        return f"TLS: {(reason or str(exc)).replace('_', ' ').lower()}"
    return f"connection ended during the TLS handshake ({exc or type(exc).__name__})"


def _subject(cert: dict[str, Any] | None) -> str:
    """The certificate's common name (or the whole subject) for the log."""
    cert = cert or {}
    fields = {k: v for rdn in cert.get("subject", ()) for k, v in rdn}
    return str(fields.get("commonName") or fields or "(no subject)")


class SecureP4Runtime:
    """A P4Runtime gRPC server reachable only through a :class:`TlsFront`.

    Args:
        service: the P4Runtime servicer.
        host: the management address clients dial.
        port: its port (0: a free one, then :attr:`port`).
        tls: the server's files (see :class:`TlsFront`).

    Raises:
        OSError: an address cannot be bound, or the private directory made.
    """

    def __init__(self, service: Any, host: str, port: int, tls: TlsFiles) -> None:
        from emulation.softswitch.p4runtime import serve_p4runtime

        self._dir = Path(tempfile.mkdtemp(prefix="inalab-p4rt-"))  # mode 0700
        path = self._dir / "p4runtime.sock"
        try:
            self.grpc, _ = serve_p4runtime(service, f"unix:{path}")
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        try:
            self.front = TlsFront(host, port, str(path), tls)
        except BaseException:
            self.grpc.stop(None)
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.port = self.front.port

    def stop(self, grace: float = 1.0) -> None:
        """Stop the front, then gRPC, and remove the socket's directory."""
        self.front.close()
        self.grpc.stop(grace=grace).wait()
        shutil.rmtree(self._dir, ignore_errors=True)
