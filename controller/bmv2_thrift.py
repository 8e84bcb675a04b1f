"""Controller layer: bmv2's Thrift runtime interface, for the state P4Runtime cannot reach.

bmv2's P4Runtime server refuses a register Read ("Register reads are not supported
yet"), so the controller reads, writes and resets register arrays on bmv2 over the
Thrift interface simple_switch_CLI uses: a ``TMultiplexedProcessor`` on port 9090 with
the ``Standard`` service registered as ``"standard"``, TBufferedTransport over a TCP
socket, strict TBinaryProtocol. One :class:`Bmv2Thrift` per switch holds one connection.

bmv2's generated ``bm_runtime`` package is not on PyPI, so the calls are encoded here by
hand with the ``thrift`` library, for this subset of bmv2's ``thrift_src/standard.thrift``::

    typedef i64 BmRegisterValue
    enum RegisterOperationErrorCode { INVALID_REGISTER_NAME = 1, INVALID_INDEX = 2, ERROR = 3 }
    exception InvalidRegisterOperation { 1:RegisterOperationErrorCode code }
    struct BmCounterValue { 1:i64 bytes; 2:i64 packets; }
    enum CounterOperationErrorCode { INVALID_COUNTER_NAME = 1, INVALID_INDEX = 2, ERROR = 3 }
    exception InvalidCounterOperation { 1:CounterOperationErrorCode code }

    BmRegisterValue bm_register_read(1:i32 cxt_id, 2:string register_array_name, 3:i32 idx)
    list<BmRegisterValue> bm_register_read_all(1:i32 cxt_id, 2:string register_array_name)
    void bm_register_write(1:i32 cxt_id, 2:string register_array_name, 3:i32 index,
                           4:BmRegisterValue value)
    void bm_register_write_range(1:i32 cxt_id, 2:string register_array_name,
                                 3:i32 start_index, 4:i32 end_index, 5:BmRegisterValue value)
    void bm_register_reset(1:i32 cxt_id, 2:string register_array_name)
    BmCounterValue bm_counter_read(1:i32 cxt_id, 2:string counter_name, 3:i32 index)

(each register call ``throws (1:InvalidRegisterOperation ouch)``, the counter read
``throws (1:InvalidCounterOperation ouch)``). A reply is the ``<method>_result`` struct:
field 0 the return value, field 1 the exception; a void call that succeeded sends neither.

Names are the ones in bmv2's JSON (p4c's fully qualified names, as in the P4Info): the
server looks them up exactly, unlike simple_switch_CLI, which resolves short names itself.

The encoding is tested against a real ``thrift`` multiplexed server in-process and
against hand-built bytes (tests/integration/test_bmv2_thrift.py), not against bmv2.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.protocol.TMultiplexedProtocol import TMultiplexedProtocol
from thrift.protocol.TProtocol import TProtocolException
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.transport.TSocket import TSocket
from thrift.transport.TTransport import TBufferedTransport, TTransportException

__all__ = [
    "Bmv2Thrift",
    "ThriftApplicationError",
    "ThriftCounterError",
    "ThriftError",
    "ThriftRegisterError",
    "ThriftUnreachableError",
]

_SERVICE = "standard"
"""The name bmv2's TMultiplexedProcessor registers the Standard service under."""

_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1

_REGISTER_CODES = {1: "INVALID_REGISTER_NAME", 2: "INVALID_INDEX", 3: "ERROR"}
_COUNTER_CODES = {1: "INVALID_COUNTER_NAME", 2: "INVALID_INDEX", 3: "ERROR"}
_APPLICATION_CODES = {
    TApplicationException.UNKNOWN: "UNKNOWN",
    TApplicationException.UNKNOWN_METHOD: "UNKNOWN_METHOD",
    TApplicationException.INVALID_MESSAGE_TYPE: "INVALID_MESSAGE_TYPE",
    TApplicationException.WRONG_METHOD_NAME: "WRONG_METHOD_NAME",
    TApplicationException.BAD_SEQUENCE_ID: "BAD_SEQUENCE_ID",
    TApplicationException.MISSING_RESULT: "MISSING_RESULT",
    TApplicationException.INTERNAL_ERROR: "INTERNAL_ERROR",
    TApplicationException.PROTOCOL_ERROR: "PROTOCOL_ERROR",
    TApplicationException.INVALID_TRANSFORM: "INVALID_TRANSFORM",
    TApplicationException.INVALID_PROTOCOL: "INVALID_PROTOCOL",
    TApplicationException.UNSUPPORTED_CLIENT_TYPE: "UNSUPPORTED_CLIENT_TYPE",
}

_Arg = tuple[int, int, int | str]
"""One argument: (field id, TType, value)."""

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


@dataclass(frozen=True)
class _Reader(Generic[_T_co]):
    """How to read a result's field 0: the TType it must have, and the reader."""

    ttype: int
    read: Callable[[Any], _T_co]


def _code_name(codes: dict[int, str], code: int) -> str:
    return codes.get(code, f"UNKNOWN({code})")


class ThriftError(Exception):
    """A Thrift call to bmv2 that failed."""


class ThriftRegisterError(ThriftError, LookupError):
    """bmv2 refused a register operation (``InvalidRegisterOperation``).

    Attributes:
        code: the ``RegisterOperationErrorCode`` name: ``INVALID_REGISTER_NAME``,
            ``INVALID_INDEX``, ``ERROR`` (or ``UNKNOWN(n)`` for a number the IDL lacks).
        code_number: the code as sent.
        register: the register array name of the call.
        index: the cell of a read or write, ``range(start, stop)`` of a range write,
            None for a whole-array call.
    """

    def __init__(self, code_number: int, register: str, index: int | range | None) -> None:
        self.code_number = code_number
        self.code = _code_name(_REGISTER_CODES, code_number)
        self.register = register
        self.index = index
        where = "" if index is None else f"[{_format_index(index)}]"
        super().__init__(f"register {register}{where}: {self.code}")


class ThriftCounterError(ThriftError, LookupError):
    """bmv2 refused a counter operation (``InvalidCounterOperation``).

    Attributes:
        code: the ``CounterOperationErrorCode`` name: ``INVALID_COUNTER_NAME``,
            ``INVALID_INDEX``, ``ERROR`` (or ``UNKNOWN(n)``).
        code_number: the code as sent.
        counter: the counter array name of the call.
        index: the cell of the call.
    """

    def __init__(self, code_number: int, counter: str, index: int) -> None:
        self.code_number = code_number
        self.code = _code_name(_COUNTER_CODES, code_number)
        self.counter = counter
        self.index = index
        super().__init__(f"counter {counter}[{index}]: {self.code}")


class ThriftApplicationError(ThriftError):
    """A ``TApplicationException`` from the server, or a reply that broke the protocol.

    The server sends one for a method it does not know (``UNKNOWN_METHOD``) or a call
    that threw outside the IDL's exceptions; the client raises one for a reply out of
    step (``BAD_SEQUENCE_ID``), without a result (``MISSING_RESULT``) or malformed.

    Attributes:
        type: the ``TApplicationException`` type number.
        type_name: its name, e.g. ``UNKNOWN_METHOD``.
        method: the method called.
        message: the server's message (or ours, for a malformed reply).
    """

    def __init__(self, type_: int, method: str, message: str) -> None:
        self.type = type_
        self.type_name = _code_name(_APPLICATION_CODES, type_)
        self.method = method
        self.message = message
        super().__init__(f"{method}: {self.type_name}: {message}")


class ThriftUnreachableError(ThriftError, ConnectionError):
    """Nothing answered at the address within the timeout, or the connection broke."""


def _format_index(index: int | range) -> str:
    return f"{index.start}:{index.stop}" if isinstance(index, range) else str(index)


def _check_i32(what: str, value: int) -> None:
    if not 0 <= value <= _I32_MAX:
        raise ValueError(f"{what} must be in [0, {_I32_MAX}], not {value}")


def _name(name: str) -> _Arg:
    return (2, TType.STRING, name)


def _raise_register_error(error: int | None, name: str, index: int | range | None) -> None:
    if error is not None:
        raise ThriftRegisterError(error, name, index)


def _required(success: _T | None, method: str) -> _T:
    if success is None:
        raise ThriftApplicationError(
            TApplicationException.MISSING_RESULT, method, "the reply carries no result"
        )
    return success


def _check_value(value: int) -> None:
    if not 0 <= value <= _I64_MAX:
        raise ValueError(f"register value must be in [0, {_I64_MAX}] (an i64), not {value}")


class Bmv2Thrift:
    """A Thrift connection to one bmv2 switch's ``standard`` service.

    Calls are serialised on the one connection (a lock makes the object safe to share
    between threads). Register values travel as bmv2's ``BmRegisterValue``, an i64: a
    ``bit<W>`` register with W <= 63 reads back non-negative and is returned as is;
    bmv2 masks a written value to W bits. Wider registers do not fit this interface.

    A broken connection (timeout, reset, a reply out of step) is closed, and every later
    call raises :class:`ThriftUnreachableError`; open a new object to reconnect.

    Args:
        host: address of the switch's Thrift server.
        port: its port (bmv2's ``--thrift-port``, 9090 by default).
        timeout: seconds to wait for the connection and for each reply.
        context_id: the bmv2 context (``cxt_id``) every call addresses; 0 for
            simple_switch.

    Raises:
        ThriftUnreachableError: nothing accepted a connection at ``host:port``.
        ValueError: ``context_id`` is not a non-negative i32.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 9090,
        timeout: float = 5.0,
        context_id: int = 0,
    ) -> None:
        _check_i32("context_id", context_id)
        self.host = host
        self.port = port
        self.timeout = timeout
        self.context_id = context_id
        self._lock = threading.Lock()
        self._seqid = 0
        self._broken: str | None = None
        self._socket = TSocket(host, port)
        self._socket.setTimeout(timeout * 1000.0)
        self._transport = TBufferedTransport(self._socket)
        self._protocol: Any = TMultiplexedProtocol(TBinaryProtocol(self._transport), _SERVICE)
        try:
            self._transport.open()
        except TTransportException as exc:
            self._broken = "never connected"
            raise ThriftUnreachableError(
                f"no Thrift server accepted a connection at {self.address} "
                f"(timeout {timeout} s): {exc.inner or exc}"
            ) from None

    @property
    def address(self) -> str:
        """``host:port`` of the switch."""
        return f"{self.host}:{self.port}"

    def register_read(self, name: str, index: int) -> int:
        """The value of cell ``index`` of register array ``name``.

        Raises:
            ThriftRegisterError: unknown ``name`` (``INVALID_REGISTER_NAME``) or ``index``
                past the end (``INVALID_INDEX``).
            ValueError: ``index`` is negative or beyond an i32.
            ThriftUnreachableError: the connection broke.
            ThriftApplicationError: the server refused the call at the Thrift level.
        """
        _check_i32("index", index)
        method = "bm_register_read"
        success, error = self._call(method, [_name(name), (3, TType.I32, index)], _I64)
        _raise_register_error(error, name, index)
        return _required(success, method)

    def register_read_all(self, name: str) -> list[int]:
        """Every cell of register array ``name``, in index order.

        Raises:
            ThriftRegisterError: unknown ``name`` (``INVALID_REGISTER_NAME``; bmv2 also
                answers so for an array of size 0).
            ThriftUnreachableError: the connection broke.
            ThriftApplicationError: the server refused the call at the Thrift level.
        """
        method = "bm_register_read_all"
        success, error = self._call(method, [_name(name)], _I64_LIST)
        _raise_register_error(error, name, None)
        return _required(success, method)

    def register_write(self, name: str, index: int, value: int) -> None:
        """Set cell ``index`` of register array ``name`` to ``value``.

        Raises:
            ThriftRegisterError: unknown ``name`` or ``index`` past the end.
            ValueError: ``index`` is not a non-negative i32, or ``value`` not a
                non-negative i64.
            ThriftUnreachableError: the connection broke.
            ThriftApplicationError: the server refused the call at the Thrift level.
        """
        _check_i32("index", index)
        _check_value(value)
        args = [_name(name), (3, TType.I32, index), (4, TType.I64, value)]
        _, error = self._call("bm_register_write", args, None)
        _raise_register_error(error, name, index)

    def register_write_range(self, name: str, start: int, stop: int, value: int) -> None:
        """Set cells ``start`` up to, not including, ``stop`` of ``name`` to ``value``.

        The range is half-open as in Python, and so is bmv2's: its
        ``Context::register_write_range`` writes ``idx = start; idx < end_index`` and
        refuses ``end_index > size`` or ``start > end_index``, so ``stop`` is sent as
        ``end_index`` unchanged. ``start == stop`` writes nothing.

        Raises:
            ThriftRegisterError: unknown ``name``, or ``stop`` past the end of the array
                (``INVALID_INDEX``).
            ValueError: ``start`` or ``stop`` is not a non-negative i32, ``start > stop``,
                or ``value`` is not a non-negative i64.
            ThriftUnreachableError: the connection broke.
            ThriftApplicationError: the server refused the call at the Thrift level.
        """
        _check_i32("start", start)
        _check_i32("stop", stop)
        if start > stop:
            raise ValueError(f"register range start {start} is past its stop {stop}")
        _check_value(value)
        args = [_name(name), (3, TType.I32, start), (4, TType.I32, stop), (5, TType.I64, value)]
        _, error = self._call("bm_register_write_range", args, None)
        _raise_register_error(error, name, range(start, stop))

    def register_reset(self, name: str) -> None:
        """Set every cell of register array ``name`` to 0.

        Raises:
            ThriftRegisterError: unknown ``name`` (``INVALID_REGISTER_NAME``).
            ThriftUnreachableError: the connection broke.
            ThriftApplicationError: the server refused the call at the Thrift level.
        """
        _, error = self._call("bm_register_reset", [_name(name)], None)
        _raise_register_error(error, name, None)

    def counter_read(self, name: str, index: int) -> tuple[int, int]:
        """``(bytes, packets)`` of cell ``index`` of counter array ``name``.

        A packets-only counter reads 0 bytes.

        Raises:
            ThriftCounterError: unknown ``name`` (``INVALID_COUNTER_NAME``) or ``index``
                past the end (``INVALID_INDEX``).
            ValueError: ``index`` is negative or beyond an i32.
            ThriftUnreachableError: the connection broke.
            ThriftApplicationError: the server refused the call at the Thrift level.
        """
        _check_i32("index", index)
        method = "bm_counter_read"
        success, error = self._call(method, [_name(name), (3, TType.I32, index)], _COUNTER)
        if error is not None:
            raise ThriftCounterError(error, name, index)
        return _required(success, method)

    def _call(
        self, method: str, args: list[_Arg], success_reader: _Reader[_T] | None
    ) -> tuple[_T | None, int | None]:
        """Send ``method(cxt_id, *args)`` and read its reply.

        Returns:
            The result struct's field 0 (None for a void call) and the ``code`` of its
            field 1, the ``ouch`` exception (None if the call succeeded).
        """
        with self._lock:
            if self._broken is not None:
                raise ThriftUnreachableError(
                    f"the Thrift connection to {self.address} is closed ({self._broken})"
                )
            self._seqid = self._seqid % _I32_MAX + 1
            try:
                self._send(method, self._seqid, [(1, TType.I32, self.context_id), *args])
                return self._receive(method, self._seqid, success_reader)
            except (TTransportException, EOFError, OSError) as exc:
                self._break(f"{type(exc).__name__}: {exc}")
                raise ThriftUnreachableError(
                    f"the Thrift connection to {self.address} broke during {method}: {exc}"
                ) from None
            except TProtocolException as exc:
                self._break(f"malformed reply to {method}")
                raise ThriftApplicationError(
                    TApplicationException.PROTOCOL_ERROR, method, str(exc)
                ) from None
            except ThriftError:
                raise
            except BaseException:
                # Interrupted half-way (Ctrl-C, an unexpected error): a partial call may sit
                # in the write buffer or a partial reply on the socket, so the stream is lost.
                self._break(f"interrupted during {method}")
                raise

    def _send(self, method: str, seqid: int, args: list[_Arg]) -> None:
        proto = self._protocol
        proto.writeMessageBegin(method, TMessageType.CALL, seqid)
        proto.writeStructBegin(f"{method}_args")
        for field_id, ttype, value in args:
            proto.writeFieldBegin("", ttype, field_id)
            if ttype == TType.I32:
                proto.writeI32(value)
            elif ttype == TType.I64:
                proto.writeI64(value)
            else:
                proto.writeString(value)
            proto.writeFieldEnd()
        proto.writeFieldStop()
        proto.writeStructEnd()
        proto.writeMessageEnd()
        proto.trans.flush()

    def _receive(
        self, method: str, seqid: int, success_reader: _Reader[_T] | None
    ) -> tuple[_T | None, int | None]:
        proto = self._protocol
        _method, mtype, reply_seqid = proto.readMessageBegin()
        if mtype == TMessageType.EXCEPTION:
            exc = TApplicationException()
            exc.read(proto)
            proto.readMessageEnd()
            self._check_seqid(method, seqid, reply_seqid)
            raise ThriftApplicationError(exc.type, method, str(exc))
        if mtype != TMessageType.REPLY:
            self._break(f"message type {mtype} in reply to {method}")
            raise ThriftApplicationError(
                TApplicationException.INVALID_MESSAGE_TYPE,
                method,
                f"expected a REPLY ({TMessageType.REPLY}), got message type {mtype}",
            )
        success, error = _read_result(proto, success_reader)
        proto.readMessageEnd()
        self._check_seqid(method, seqid, reply_seqid)
        return success, error

    def _check_seqid(self, method: str, sent: int, received: int) -> None:
        # A reply to another call means the stream is out of step: nothing after it can be
        # trusted to answer what we asked.
        if received != sent:
            self._break(f"reply sequence id {received} to call {sent}")
            raise ThriftApplicationError(
                TApplicationException.BAD_SEQUENCE_ID,
                method,
                f"sent sequence id {sent}, the reply carries {received}",
            )

    def _break(self, reason: str) -> None:
        self._broken = reason
        self._transport.close()

    def close(self) -> None:
        """Close the connection; safe to call twice."""
        with self._lock:
            if self._broken is None:
                self._broken = "closed by the client"
            self._transport.close()

    def __enter__(self) -> Bmv2Thrift:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _read_result(proto: Any, success_reader: _Reader[_T] | None) -> tuple[_T | None, int | None]:
    """Field 0 (read by ``success_reader``) and field 1's ``code`` of a ``_result`` struct.

    Fields of another id or an unexpected type are skipped, as generated code does.
    """
    success: _T | None = None
    error: int | None = None
    proto.readStructBegin()
    while True:
        _fname, ftype, fid = proto.readFieldBegin()
        if ftype == TType.STOP:
            break
        if fid == 0 and success_reader is not None and ftype == success_reader.ttype:
            success = success_reader.read(proto)
        elif fid == 1 and ftype == TType.STRUCT:
            error = _read_error_code(proto)
        else:
            proto.skip(ftype)
        proto.readFieldEnd()
    proto.readStructEnd()
    return success, error


def _read_error_code(proto: Any) -> int:
    """The ``1:code`` of an ``Invalid*Operation`` exception struct (0 if absent)."""
    code = 0
    proto.readStructBegin()
    while True:
        _fname, ftype, fid = proto.readFieldBegin()
        if ftype == TType.STOP:
            break
        if fid == 1 and ftype == TType.I32:
            code = proto.readI32()
        else:
            proto.skip(ftype)
        proto.readFieldEnd()
    proto.readStructEnd()
    return code


def _read_i64(proto: Any) -> int:
    return int(proto.readI64())


def _read_i64_list(proto: Any) -> list[int]:
    etype, size = proto.readListBegin()
    if etype != TType.I64:
        for _ in range(size):
            proto.skip(etype)
        proto.readListEnd()
        raise TProtocolException(
            TProtocolException.INVALID_DATA, f"list<i64> expected, got element type {etype}"
        )
    values = [int(proto.readI64()) for _ in range(size)]
    proto.readListEnd()
    return values


def _read_counter_value(proto: Any) -> tuple[int, int]:
    """A ``BmCounterValue`` struct as ``(bytes, packets)`` (0 for a field absent)."""
    values = {1: 0, 2: 0}
    proto.readStructBegin()
    while True:
        _fname, ftype, fid = proto.readFieldBegin()
        if ftype == TType.STOP:
            break
        if fid in values and ftype == TType.I64:
            values[fid] = int(proto.readI64())
        else:
            proto.skip(ftype)
        proto.readFieldEnd()
    proto.readStructEnd()
    return values[1], values[2]


_I64 = _Reader(TType.I64, _read_i64)
_I64_LIST = _Reader(TType.LIST, _read_i64_list)
_COUNTER = _Reader(TType.STRUCT, _read_counter_value)
