"""The soft switch's control channel: JSON lines over TCP, server side and client.

An interim control plane until a P4Runtime server replaces it; every op maps onto writes
a P4Runtime controller would make, so the client's methods keep their names then:

=============  =====================================================================
op             P4Runtime equivalent
=============  =====================================================================
add_job        job-table entry + one worker-table entry per rank + multicast group
remove_job     delete of those entries (and a register clear of the job's slots)
jobs           read of the job table
counters       counter reads
read_slot      register reads of one slot (bitmaps, counter, exponent, values)
set_drops      write of the drop simulator's registers
shutdown       (none: process management)
=============  =====================================================================

Framing: one JSON object per ``\\n``-terminated line, one reply per request, in order.
A request is ``{"op": NAME, ...fields}``; a reply is ``{"ok": true, ...}`` or
``{"ok": false, "error": MESSAGE, "kind": KIND}`` with KIND one of :class:`ErrorKind`.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import logging
import selectors
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np

from emulation.softswitch.pipeline import (
    Addr,
    DropSimulator,
    JobConfig,
    JobTableError,
    Pipeline,
    SlotState,
)

__all__ = [
    "MAX_LINE",
    "ControlHandler",
    "ControlServer",
    "ErrorKind",
    "SwitchControl",
    "SwitchControlError",
]

log = logging.getLogger(__name__)

MAX_LINE = 1 << 20
"""Longest request line accepted (bytes): a request is a few hundred bytes; this only
stops a misbehaving client from growing the switch's memory."""

_RECV_BYTES = 65536


class ErrorKind(enum.StrEnum):
    """The ``kind`` of an error reply (and of :class:`SwitchControlError`)."""

    BAD_JSON = "bad_json"  # the line is not a JSON object
    BAD_REQUEST = "bad_request"  # a field is missing or has the wrong type
    UNKNOWN_OP = "unknown_op"
    JOB_TABLE = "job_table"  # the pipeline refused a job-table write or read
    BAD_VALUE = "bad_value"  # a value out of range (drop probability)
    INTERNAL = "internal"  # a switch bug; the switch logs the traceback
    TRANSPORT = "transport"  # client side only: connection failed, closed or timed out


class SwitchControlError(RuntimeError):
    """A control request failed; ``kind`` says how (an :class:`ErrorKind`)."""

    def __init__(self, message: str, kind: ErrorKind | str) -> None:
        super().__init__(message)
        try:
            self.kind: ErrorKind | str = ErrorKind(kind)
        except ValueError:
            self.kind = kind  # a kind from a newer switch: keep its name


class _RequestError(Exception):
    """Raised inside the handler; becomes an error reply of ``kind``."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------- request fields
def _int(req: dict[str, Any], name: str) -> int:
    value = req.get(name)
    # bool is an int subclass; true/false is never a valid id or count.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _RequestError(f"field {name!r} must be an integer", ErrorKind.BAD_REQUEST)
    return value


def _number(req: dict[str, Any], name: str) -> float:
    value = req.get(name)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _RequestError(f"field {name!r} must be a number", ErrorKind.BAD_REQUEST)
    return float(value)


def _addr(item: Any) -> Addr:
    """Validate one ``[ip, port]`` pair into the tuple the pipeline matches on."""
    if not (isinstance(item, list) and len(item) == 2):
        raise _RequestError(f"worker {item!r} is not [ip, port]", ErrorKind.BAD_REQUEST)
    ip, port = item
    try:
        # Normalised because the pipeline compares with recvfrom()'s dotted quad.
        ip = str(ipaddress.IPv4Address(ip))
    except ValueError:
        raise _RequestError(f"worker ip {ip!r} is not IPv4", ErrorKind.BAD_REQUEST) from None
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 0xFFFF:
        raise _RequestError(f"worker port {port!r} outside 1..65535", ErrorKind.BAD_REQUEST)
    return ip, port


def _job_config(req: dict[str, Any]) -> JobConfig:
    workers = req.get("workers")
    if not isinstance(workers, list):
        raise _RequestError("field 'workers' must be a list", ErrorKind.BAD_REQUEST)
    base = req.get("slot_base")
    return JobConfig(
        job_id=_int(req, "job_id"),
        workers=tuple(_addr(w) for w in workers),
        slot_count=_int(req, "slot_count"),
        slot_base=None if base is None else _int(req, "slot_base"),
    )


# --------------------------------------------------------------------- server side
class ControlHandler:
    """Apply control requests to a :class:`Pipeline`; one reply dict per request.

    Args:
        pipeline: the data plane being configured.
        extra_counters: counters owned by the I/O layer (e.g. ``send_errors``), merged
            into the ``counters`` reply.
        on_shutdown: called by the ``shutdown`` op; the server stops after replying.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        extra_counters: dict[str, int] | None = None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.extra_counters = extra_counters if extra_counters is not None else {}
        self.on_shutdown = on_shutdown
        self._ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "add_job": self._add_job,
            "remove_job": self._remove_job,
            "jobs": self._jobs,
            "counters": self._counters,
            "read_slot": self._read_slot,
            "set_drops": self._set_drops,
            "shutdown": self._shutdown,
        }

    def handle_line(self, line: bytes) -> bytes:
        """Decode one request line, apply it, and return the encoded reply line."""
        try:
            req = json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            return _encode(_error(f"not JSON: {exc}", ErrorKind.BAD_JSON))
        if not isinstance(req, dict):
            return _encode(_error("request is not a JSON object", ErrorKind.BAD_JSON))
        return _encode(self.handle(req))

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Apply one decoded request; every failure becomes an error reply, never raises."""
        op = req.get("op")
        fn = self._ops.get(op) if isinstance(op, str) else None
        if fn is None:
            return _error(f"unknown op {op!r}", ErrorKind.UNKNOWN_OP)
        try:
            return {"ok": True, **fn(req)}
        except _RequestError as exc:
            return _error(str(exc), exc.kind)
        except JobTableError as exc:
            return _error(str(exc), ErrorKind.JOB_TABLE)
        except Exception as exc:
            # A switch bug must not kill the data plane; the client sees it as an error.
            log.exception("control op %r failed", op)
            return _error(f"{type(exc).__name__}: {exc}", ErrorKind.INTERNAL)

    def _add_job(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"slot_base": self.pipeline.add_job(_job_config(req))}

    def _remove_job(self, req: dict[str, Any]) -> dict[str, Any]:
        self.pipeline.remove_job(_int(req, "job_id"))
        return {}

    def _jobs(self, req: dict[str, Any]) -> dict[str, Any]:
        jobs = [
            {
                "job_id": j.job_id,
                "workers": [list(w) for w in j.workers],
                "slot_count": j.slot_count,
                "slot_base": j.slot_base,
            }
            for j in self.pipeline.jobs()
        ]
        return {"jobs": jobs}

    def _counters(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"counters": {**self.pipeline.counters(), **self.extra_counters}}

    def _read_slot(self, req: dict[str, Any]) -> dict[str, Any]:
        st = self.pipeline.read_slot(_int(req, "job_id"), _int(req, "slot"), _int(req, "set"))
        return {
            "bitmap": st.bitmap,
            "other_bitmap": st.other_bitmap,
            "counter": st.counter,
            "exponent": st.exponent,
            "values": st.values.tolist(),
        }

    def _set_drops(self, req: dict[str, Any]) -> dict[str, Any]:
        ingress, egress = _number(req, "ingress"), _number(req, "egress")
        try:
            drops = DropSimulator(ingress, egress, _int(req, "seed"))
        except ValueError as exc:
            raise _RequestError(str(exc), ErrorKind.BAD_VALUE) from None
        self.pipeline.drops = drops
        return {}

    def _shutdown(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.on_shutdown is not None:
            self.on_shutdown()
        return {}


def _error(message: str, kind: ErrorKind) -> dict[str, Any]:
    return {"ok": False, "error": message, "kind": kind.value}


def _encode(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


class _Conn:
    """One client connection: bytes received but not yet a full line, replies unsent."""

    def __init__(self, sock: socket.socket, peer: Any) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()


class ControlServer:
    """The TCP side of the control channel, driven by the switch's one selector.

    Sockets are non-blocking and replies are buffered, so a client that stops reading
    never stalls the data plane.

    Args:
        handler: applies the requests.
        addr: ``(host, port)`` to listen on; port 0 picks a free one.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, handler: ControlHandler, addr: Addr) -> None:
        self.handler = handler
        self._listener = socket.create_server(addr, backlog=16)
        self._listener.setblocking(False)
        self._selector: selectors.BaseSelector | None = None
        self._conns: dict[socket.socket, _Conn] = {}

    @property
    def address(self) -> Addr:
        host, port = self._listener.getsockname()[:2]
        return host, port

    def attach(self, selector: selectors.BaseSelector) -> None:
        """Register the listener with ``selector``; its events go to :meth:`service`."""
        self._selector = selector
        selector.register(self._listener, selectors.EVENT_READ, self)

    def service(self, key: selectors.SelectorKey, mask: int) -> None:
        """Handle one selector event for a socket this server registered."""
        if key.fileobj is self._listener:
            self._accept()
            return
        conn = self._conns.get(key.fileobj)  # type: ignore[call-overload]
        if conn is None:
            return
        if mask & selectors.EVENT_READ:
            self._read(conn)
        if mask & selectors.EVENT_WRITE and conn.sock in self._conns:
            self._flush(conn)

    def close(self) -> None:
        """Send what replies fit, then close every connection and the listener."""
        for conn in list(self._conns.values()):
            if conn.outbuf:
                self._flush(conn)
            self._drop(conn)
        if self._selector is not None and self._listener.fileno() >= 0:
            self._selector.unregister(self._listener)
        self._listener.close()

    def _accept(self) -> None:
        try:
            sock, peer = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        conn = _Conn(sock, peer)
        self._conns[sock] = conn
        if self._selector is not None:
            self._selector.register(sock, selectors.EVENT_READ, self)
        log.debug("control connection from %s", peer)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("control connection %s failed: %s", conn.peer, exc)
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        conn.inbuf += data
        self._answer(conn)

    def _answer(self, conn: _Conn) -> None:
        """Reply to every complete line in the input buffer."""
        while (end := conn.inbuf.find(b"\n")) >= 0:
            line = bytes(conn.inbuf[:end])
            del conn.inbuf[: end + 1]
            conn.outbuf += self.handler.handle_line(line)
        self._flush(conn)
        if len(conn.inbuf) > MAX_LINE and conn.sock in self._conns:
            # The rest of the line would read as a new request: answer once, hang up.
            conn.outbuf += _encode(
                _error(f"request line over {MAX_LINE} bytes", ErrorKind.BAD_REQUEST)
            )
            self._flush(conn)
            if conn.sock in self._conns:
                self._drop(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf) if conn.outbuf else 0
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            log.debug("control connection %s failed: %s", conn.peer, exc)
            self._drop(conn)
            return
        del conn.outbuf[:sent]
        if self._selector is not None:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
            self._selector.modify(conn.sock, events, self)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        if self._selector is not None:
            self._selector.unregister(conn.sock)
        conn.sock.close()


# --------------------------------------------------------------------- client side
class SwitchControl:
    """Client of one switch's control channel; one request at a time.

    Args:
        addr: the switch's control ``(host, port)``.
        timeout: seconds to wait for the connection and for each reply.

    Raises:
        SwitchControlError: kind ``transport`` when the switch cannot be reached.
    """

    def __init__(self, addr: Addr, timeout: float = 5.0) -> None:
        self.addr = addr
        try:
            self._sock: socket.socket | None = socket.create_connection(addr, timeout)
        except OSError as exc:
            raise SwitchControlError(
                f"cannot connect to switch control {addr}: {exc}", ErrorKind.TRANSPORT
            ) from exc
        self._buf = bytearray()

    def __enter__(self) -> SwitchControl:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def add_job(self, job: JobConfig) -> int:
        """Install ``job``; return the slot base the switch gave it.

        Raises:
            SwitchControlError: kind ``job_table`` for a duplicate id, bad workers or no
                free slot range; ``bad_request`` for malformed addresses.
        """
        reply = self.call(
            "add_job",
            job_id=job.job_id,
            workers=[[ip, port] for ip, port in job.workers],
            slot_count=job.slot_count,
            slot_base=job.slot_base,
        )
        return int(reply["slot_base"])

    def remove_job(self, job_id: int) -> None:
        """Remove a job and clear its slots.

        Raises:
            SwitchControlError: kind ``job_table`` when there is no such job.
        """
        self.call("remove_job", job_id=job_id)

    def jobs(self) -> list[JobConfig]:
        """The switch's job table (slot bases resolved)."""
        return [
            JobConfig(
                j["job_id"],
                tuple((ip, port) for ip, port in j["workers"]),
                j["slot_count"],
                j["slot_base"],
            )
            for j in self.call("jobs")["jobs"]
        ]

    def counters(self) -> dict[str, int]:
        """Every pipeline and I/O counter by name."""
        return {k: int(v) for k, v in self.call("counters")["counters"].items()}

    def read_slot(self, job_id: int, slot: int, pool_set: int) -> SlotState:
        """Read the registers of one job-relative slot and set.

        Raises:
            SwitchControlError: kind ``job_table`` for no such job or slot/set out of range.
        """
        r = self.call("read_slot", job_id=job_id, slot=slot, set=pool_set)
        values = np.asarray(r["values"], dtype=np.int32)
        return SlotState(r["bitmap"], r["other_bitmap"], r["counter"], r["exponent"], values)

    def set_drops(self, ingress: float, egress: float, seed: int = 0) -> None:
        """Replace the drop simulator (a fresh random stream seeded with ``seed``).

        Raises:
            SwitchControlError: kind ``bad_value`` for a probability outside 0..1.
        """
        self.call("set_drops", ingress=ingress, egress=egress, seed=seed)

    def shutdown(self) -> None:
        """Ask the switch to stop; it replies first, then logs its counters and exits."""
        self.call("shutdown")

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return the reply of a successful op.

        Raises:
            SwitchControlError: the switch's error reply (its ``kind``), or kind
                ``transport`` when the connection fails; the connection is closed then.
        """
        line = _encode({"op": op, **fields})
        reply = self._exchange(line)
        if not reply.get("ok"):
            kind = reply.get("kind", ErrorKind.INTERNAL.value)
            raise SwitchControlError(f"{op}: {reply.get('error')}", kind)
        return reply

    def _exchange(self, line: bytes) -> dict[str, Any]:
        if self._sock is None:
            raise SwitchControlError("control connection is closed", ErrorKind.TRANSPORT)
        try:
            self._sock.sendall(line)
            raw = self._read_line(self._sock)
            reply = json.loads(raw)
        except (OSError, ValueError) as exc:
            # A half-read reply leaves the stream out of step: never reuse it.
            self.close()
            raise SwitchControlError(
                f"control exchange with {self.addr} failed: {exc}", ErrorKind.TRANSPORT
            ) from exc
        if not isinstance(reply, dict):
            raise SwitchControlError(f"reply is not an object: {raw!r}", ErrorKind.TRANSPORT)
        return reply

    def _read_line(self, sock: socket.socket) -> bytes:
        while (end := self._buf.find(b"\n")) < 0:
            chunk = sock.recv(_RECV_BYTES)
            if not chunk:
                raise ConnectionError("switch closed the control connection")
            self._buf += chunk
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        return line
