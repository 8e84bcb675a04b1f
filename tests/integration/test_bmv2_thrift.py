"""Bmv2Thrift against a real, in-process Thrift server on 127.0.0.1:0, and against bytes.

The server is the ``thrift`` library's ``TMultiplexedProcessor`` over TBufferedTransport
and TBinaryProtocol, as bmv2 serves it, with a hand-written processor registered as
``"standard"`` (``FakeStandard``). It decodes each call's arguments against the IDL's
field ids and types (a wrong id or type is an error the test sees), answers from
in-memory register and counter arrays with bmv2's error codes, and records every call.

The wire tests do not trust the ``thrift`` library on either side: the bytes the client
sends for ``bm_register_read`` are compared with a strict TBinaryProtocol encoding built
by hand here, and replies built by hand check how the client reads results, application
exceptions, unknown fields and a reply out of step.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from thrift.protocol.TBinaryProtocol import TBinaryProtocol
from thrift.Thrift import TApplicationException, TMessageType, TType
from thrift.TMultiplexedProcessor import TMultiplexedProcessor
from thrift.transport.TSocket import TSocket
from thrift.transport.TTransport import TBufferedTransport, TTransportException

from controller.bmv2_thrift import (
    Bmv2Thrift,
    ThriftApplicationError,
    ThriftCounterError,
    ThriftError,
    ThriftRegisterError,
    ThriftUnreachableError,
)

LANE = "Ingress.values.lane_00"
BITMAP = "Ingress.aggregator.bitmap"
STATS = "Ingress.ina_stats"
SIZE = 8

# The IDL subset: method -> {argument field id: TType}.
ARGS = {
    "bm_register_read": {1: TType.I32, 2: TType.STRING, 3: TType.I32},
    "bm_register_read_all": {1: TType.I32, 2: TType.STRING},
    "bm_register_write": {1: TType.I32, 2: TType.STRING, 3: TType.I32, 4: TType.I64},
    "bm_register_write_range": {
        1: TType.I32,
        2: TType.STRING,
        3: TType.I32,
        4: TType.I32,
        5: TType.I64,
    },
    "bm_register_reset": {1: TType.I32, 2: TType.STRING},
    "bm_counter_read": {1: TType.I32, 2: TType.STRING, 3: TType.I32},
}
# RegisterOperationErrorCode / CounterOperationErrorCode
INVALID_NAME, INVALID_INDEX = 1, 2


class InvalidOperation(Exception):
    """bmv2's Invalid{Register,Counter}Operation: sent as field 1 of the result."""

    def __init__(self, code: int) -> None:
        self.code = code


class FakeStandard:
    """The register and counter calls of bmv2's Standard service, over in-memory arrays.

    Each context (``cxt_id``) holds its own arrays; an unknown context is answered with a
    TApplicationException, as bmv2's ``contexts.at(cxt_id)`` throwing would be.
    """

    def __init__(self, contexts: int = 1) -> None:
        self.lock = threading.Lock()
        self.registers = [{LANE: [0] * SIZE, BITMAP: [0] * SIZE} for _ in range(contexts)]
        self.counters = [{STATS: [(64 * i, i) for i in range(SIZE)]} for _ in range(contexts)]
        self.calls: list[tuple[str, int, dict[int, Any]]] = []  # (method, seqid, args)
        self.unimplemented: set[str] = set()

    def sent(self) -> list[tuple[str, dict[int, Any]]]:
        """(method, arguments by field id) of every call, in order."""
        with self.lock:
            return [(method, args) for method, _, args in self.calls]

    def seqids(self) -> list[int]:
        with self.lock:
            return [seqid for _, seqid, _ in self.calls]

    def process(self, iprot: Any, oprot: Any) -> None:
        method, mtype, seqid = iprot.readMessageBegin()
        if mtype != TMessageType.CALL:
            raise AssertionError(f"message type {mtype} for {method}, not CALL")
        args = _read_args(iprot, ARGS.get(method))
        iprot.readMessageEnd()
        with self.lock:
            self.calls.append((method, seqid, args))
        if method not in ARGS or method in self.unimplemented:
            error = TApplicationException(
                TApplicationException.UNKNOWN_METHOD, f"Invalid method name: '{method}'"
            )
            _write_exception(oprot, method, seqid, error)
            return
        if not 0 <= args[1] < len(self.registers):
            error = TApplicationException(TApplicationException.UNKNOWN, "map::at")
            _write_exception(oprot, method, seqid, error)
            return
        try:
            with self.lock:
                result = getattr(self, method)(*(args[i] for i in sorted(args)))
        except InvalidOperation as exc:
            _write_result(oprot, method, seqid, None, exc.code)
        else:
            _write_result(oprot, method, seqid, result, None)

    def _registers(self, cxt_id: int, name: str) -> list[int]:
        if name not in self.registers[cxt_id]:
            raise InvalidOperation(INVALID_NAME)
        return self.registers[cxt_id][name]

    def _check(self, cells: list[Any], index: int) -> None:
        if not 0 <= index < len(cells):  # bmv2 casts the i32 to size_t
            raise InvalidOperation(INVALID_INDEX)

    def bm_register_read(self, cxt_id: int, name: str, index: int) -> tuple[int, Any]:
        cells = self._registers(cxt_id, name)
        self._check(cells, index)
        return TType.I64, cells[index]

    def bm_register_read_all(self, cxt_id: int, name: str) -> tuple[int, Any]:
        return TType.LIST, list(self._registers(cxt_id, name))

    def bm_register_write(self, cxt_id: int, name: str, index: int, value: int) -> None:
        cells = self._registers(cxt_id, name)
        self._check(cells, index)
        cells[index] = value

    def bm_register_write_range(
        self, cxt_id: int, name: str, start: int, end: int, value: int
    ) -> None:
        cells = self._registers(cxt_id, name)
        # bmv2's Context::register_write_range: end is exclusive.
        if end > len(cells) or start > end:
            raise InvalidOperation(INVALID_INDEX)
        for index in range(start, end):
            cells[index] = value

    def bm_register_reset(self, cxt_id: int, name: str) -> None:
        cells = self._registers(cxt_id, name)
        cells[:] = [0] * len(cells)

    def bm_counter_read(self, cxt_id: int, name: str, index: int) -> tuple[int, Any]:
        if name not in self.counters[cxt_id]:
            raise InvalidOperation(INVALID_NAME)
        cells = self.counters[cxt_id][name]
        self._check(cells, index)
        return TType.STRUCT, cells[index]


def _read_args(iprot: Any, spec: dict[int, int] | None) -> dict[int, Any]:
    """The ``_args`` struct by field id; every field must have the IDL's id and type."""
    readers = {TType.I32: iprot.readI32, TType.I64: iprot.readI64, TType.STRING: iprot.readString}
    args: dict[int, Any] = {}
    iprot.readStructBegin()
    while True:
        _, ftype, fid = iprot.readFieldBegin()
        if ftype == TType.STOP:
            break
        if spec is None:  # an unknown method: skip, as generated processors do
            iprot.skip(ftype)
        elif spec.get(fid) != ftype:
            raise AssertionError(f"argument field {fid} of type {ftype}; the IDL says {spec}")
        else:
            args[fid] = readers[ftype]()
        iprot.readFieldEnd()
    iprot.readStructEnd()
    if spec is not None and set(args) != set(spec):
        raise AssertionError(f"arguments {sorted(args)}, the IDL has {sorted(spec)}")
    return args


def _write_result(
    oprot: Any, method: str, seqid: int, success: tuple[int, Any] | None, code: int | None
) -> None:
    oprot.writeMessageBegin(method, TMessageType.REPLY, seqid)
    oprot.writeStructBegin(f"{method}_result")
    if success is not None:
        ttype, value = success
        oprot.writeFieldBegin("success", ttype, 0)
        if ttype == TType.I64:
            oprot.writeI64(value)
        elif ttype == TType.LIST:
            oprot.writeListBegin(TType.I64, len(value))
            for cell in value:
                oprot.writeI64(cell)
            oprot.writeListEnd()
        else:  # BmCounterValue
            oprot.writeStructBegin("BmCounterValue")
            for fid, number in enumerate(value, start=1):
                oprot.writeFieldBegin("", TType.I64, fid)
                oprot.writeI64(number)
                oprot.writeFieldEnd()
            oprot.writeFieldStop()
            oprot.writeStructEnd()
        oprot.writeFieldEnd()
    if code is not None:
        oprot.writeFieldBegin("ouch", TType.STRUCT, 1)
        oprot.writeStructBegin("InvalidOperation")
        oprot.writeFieldBegin("code", TType.I32, 1)
        oprot.writeI32(code)
        oprot.writeFieldEnd()
        oprot.writeFieldStop()
        oprot.writeStructEnd()
        oprot.writeFieldEnd()
    oprot.writeFieldStop()
    oprot.writeStructEnd()
    oprot.writeMessageEnd()
    oprot.trans.flush()


def _write_exception(oprot: Any, method: str, seqid: int, error: TApplicationException) -> None:
    oprot.writeMessageBegin(method, TMessageType.EXCEPTION, seqid)
    error.write(oprot)
    oprot.writeMessageEnd()
    oprot.trans.flush()


class ThriftServer:
    """A Thrift server on 127.0.0.1:0: one thread per connection, as bmv2's TThreadedServer.

    Errors in the server threads are kept in ``errors`` (the fixture fails on them); a
    client that goes away ends its thread quietly.
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.errors: list[BaseException] = []
        self.connections = 0
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # how often the accept loop looks at _stop
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.connections += 1
            self._conns.append(conn)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        transport = TSocket()
        transport.setHandle(conn)
        protocol = TBinaryProtocol(TBufferedTransport(transport))
        try:
            while True:
                self.processor.process(protocol, protocol)
        except TTransportException:
            pass  # the client closed the connection
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):  # closed already
                conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading
        for thread in self._threads:
            thread.join(timeout=5)


@pytest.fixture
def standard() -> FakeStandard:
    return FakeStandard(contexts=2)


@pytest.fixture
def server(standard: FakeStandard) -> Iterator[ThriftServer]:
    processor = TMultiplexedProcessor()
    processor.registerProcessor("standard", standard)
    srv = ThriftServer(processor)
    yield srv
    srv.close()
    assert not srv.errors, srv.errors


@pytest.fixture
def client(server: ThriftServer) -> Iterator[Bmv2Thrift]:
    with Bmv2Thrift("127.0.0.1", server.port, timeout=2.0) as bmv2:
        yield bmv2


def test_register_write_then_read_round_trips(client: Bmv2Thrift, standard: FakeStandard) -> None:
    client.register_write(LANE, 3, 0xDEADBEEF)
    assert client.register_read(LANE, 3) == 0xDEADBEEF
    assert client.register_read(LANE, 2) == 0
    assert standard.registers[0][LANE][3] == 0xDEADBEEF
    assert standard.sent() == [
        ("bm_register_write", {1: 0, 2: LANE, 3: 3, 4: 0xDEADBEEF}),
        ("bm_register_read", {1: 0, 2: LANE, 3: 3}),
        ("bm_register_read", {1: 0, 2: LANE, 3: 2}),
    ]


def test_read_all_returns_every_cell_in_index_order(
    client: Bmv2Thrift, standard: FakeStandard
) -> None:
    standard.registers[0][LANE][:] = [10 * i for i in range(SIZE)]
    assert client.register_read_all(LANE) == [0, 10, 20, 30, 40, 50, 60, 70]
    assert client.register_read_all(BITMAP) == [0] * SIZE


def test_write_range_is_half_open_and_sends_stop_as_end_index(
    client: Bmv2Thrift, standard: FakeStandard
) -> None:
    client.register_write_range(LANE, 2, 5, 9)
    assert client.register_read_all(LANE) == [0, 0, 9, 9, 9, 0, 0, 0]
    assert standard.sent()[0] == ("bm_register_write_range", {1: 0, 2: LANE, 3: 2, 4: 5, 5: 9})
    client.register_write_range(LANE, 6, SIZE, 4)  # up to the end
    client.register_write_range(LANE, 1, 1, 7)  # empty
    assert client.register_read_all(LANE) == [0, 0, 9, 9, 9, 0, 4, 4]


def test_write_range_past_the_end_is_invalid_index(
    client: Bmv2Thrift, standard: FakeStandard
) -> None:
    with pytest.raises(ThriftRegisterError) as caught:
        client.register_write_range(LANE, 4, SIZE + 1, 1)
    assert caught.value.code == "INVALID_INDEX"
    assert caught.value.index == range(4, SIZE + 1)
    assert standard.registers[0][LANE] == [0] * SIZE


def test_reset_zeroes_every_cell(client: Bmv2Thrift, standard: FakeStandard) -> None:
    client.register_write_range(LANE, 0, SIZE, 5)
    client.register_write(BITMAP, 1, 3)
    client.register_reset(LANE)
    assert client.register_read_all(LANE) == [0] * SIZE
    assert client.register_read(BITMAP, 1) == 3  # another array keeps its cells


CALLS: dict[str, Callable[[Bmv2Thrift, str], object]] = {
    "read": lambda c, name: c.register_read(name, 0),
    "read_all": lambda c, name: c.register_read_all(name),
    "write": lambda c, name: c.register_write(name, 0, 1),
    "write_range": lambda c, name: c.register_write_range(name, 0, 2, 1),
    "reset": lambda c, name: c.register_reset(name),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_unknown_register_name_is_invalid_register_name(client: Bmv2Thrift, call: str) -> None:
    with pytest.raises(ThriftRegisterError) as caught:
        CALLS[call](client, "Ingress.no_such_register")
    assert caught.value.code == "INVALID_REGISTER_NAME"
    assert caught.value.code_number == 1
    assert caught.value.register == "Ingress.no_such_register"
    assert isinstance(caught.value, LookupError)
    assert "Ingress.no_such_register" in str(caught.value)


def test_index_past_the_end_is_invalid_index(client: Bmv2Thrift) -> None:
    with pytest.raises(ThriftRegisterError) as caught:
        client.register_read(LANE, SIZE)
    assert (caught.value.code, caught.value.index) == ("INVALID_INDEX", SIZE)
    with pytest.raises(ThriftRegisterError) as caught:
        client.register_write(LANE, SIZE + 3, 1)
    assert (caught.value.code, caught.value.index) == ("INVALID_INDEX", SIZE + 3)
    assert client.register_read(LANE, SIZE - 1) == 0  # the connection is still good


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.register_read(LANE, -1),
        lambda c: c.register_read(LANE, 2**31),
        lambda c: c.register_write(LANE, 0, -1),
        lambda c: c.register_write(LANE, 0, 2**63),
        lambda c: c.register_write_range(LANE, 5, 2, 0),
        lambda c: c.counter_read(STATS, -1),
    ],
)
def test_bad_arguments_are_refused_before_sending(
    client: Bmv2Thrift, standard: FakeStandard, call: Callable[[Bmv2Thrift], object]
) -> None:
    with pytest.raises(ValueError):
        call(client)
    assert standard.sent() == []
    assert client.register_read(LANE, 0) == 0


def test_counter_read_returns_bytes_and_packets(client: Bmv2Thrift, standard: FakeStandard) -> None:
    assert client.counter_read(STATS, 3) == (192, 3)
    assert standard.sent() == [("bm_counter_read", {1: 0, 2: STATS, 3: 3})]
    with pytest.raises(ThriftCounterError) as caught:
        client.counter_read("Ingress.no_such_counter", 0)
    assert (caught.value.code, caught.value.counter) == (
        "INVALID_COUNTER_NAME",
        "Ingress.no_such_counter",
    )
    with pytest.raises(ThriftCounterError) as caught:
        client.counter_read(STATS, SIZE)
    assert (caught.value.code, caught.value.index) == ("INVALID_INDEX", SIZE)


def test_many_calls_share_one_connection_with_increasing_seqids(
    client: Bmv2Thrift, server: ThriftServer, standard: FakeStandard
) -> None:
    for i in range(40):
        client.register_write(LANE, i % SIZE, i)
        assert client.register_read(LANE, i % SIZE) == i
    assert server.connections == 1
    assert standard.seqids() == list(range(1, 81))


def test_context_id_is_sent_with_every_call(server: ThriftServer, standard: FakeStandard) -> None:
    with Bmv2Thrift("127.0.0.1", server.port, timeout=2.0, context_id=1) as bmv2:
        bmv2.register_write(LANE, 0, 5)
        assert bmv2.counter_read(STATS, 1) == (64, 1)
    assert standard.registers[1][LANE][0] == 5
    assert standard.registers[0][LANE][0] == 0
    assert [args[1] for _, args in standard.sent()] == [1, 1]


def test_application_exception_is_a_typed_error_and_the_connection_survives(
    client: Bmv2Thrift, server: ThriftServer, standard: FakeStandard
) -> None:
    standard.unimplemented.add("bm_register_read_all")
    with pytest.raises(ThriftApplicationError) as caught:
        client.register_read_all(LANE)
    assert caught.value.type_name == "UNKNOWN_METHOD"
    assert caught.value.type == TApplicationException.UNKNOWN_METHOD
    assert caught.value.method == "bm_register_read_all"
    assert "Invalid method name" in caught.value.message
    client.register_write(LANE, 1, 6)
    assert client.register_read(LANE, 1) == 6
    with Bmv2Thrift("127.0.0.1", server.port, timeout=2.0, context_id=7) as bmv2:
        with pytest.raises(ThriftApplicationError) as caught:
            bmv2.register_read(LANE, 0)  # bmv2 has no context 7
        assert caught.value.type_name == "UNKNOWN"
    assert server.connections == 2


def test_nothing_listening_is_unreachable_quickly() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago, now closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ThriftUnreachableError) as caught:
        Bmv2Thrift("127.0.0.1", port, timeout=2.0)
    assert time.monotonic() - started < 1.0
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert isinstance(caught.value, ConnectionError)


def test_closed_client_refuses_calls(server: ThriftServer) -> None:
    with Bmv2Thrift("127.0.0.1", server.port, timeout=2.0) as bmv2:
        assert bmv2.register_read(LANE, 0) == 0
    with pytest.raises(ThriftUnreachableError, match="closed"):
        bmv2.register_read(LANE, 0)
    bmv2.close()  # twice is fine


# ---- the wire, byte by byte -------------------------------------------------------------

# TBinaryProtocol type codes, written out so the library's constants are not trusted.
T_I32, T_I64, T_STRING, T_STRUCT = 8, 10, 11, 12
CALL, REPLY, EXCEPTION = 1, 2, 3


def i32(value: int) -> bytes:
    return struct.pack("!i", value)


def i64(value: int) -> bytes:
    return struct.pack("!q", value)


def string(text: str) -> bytes:
    data = text.encode()
    return i32(len(data)) + data


def message(name: str, mtype: int, seqid: int) -> bytes:
    """A strict message header: version 1 | type, the name, the sequence id."""
    return struct.pack("!I", 0x80010000 | mtype) + string(name) + i32(seqid)


def field(ttype: int, fid: int) -> bytes:
    return struct.pack("!bh", ttype, fid)


STOP = b"\x00"

READ_REQUEST = (
    message("standard:bm_register_read", CALL, 1)
    + field(T_I32, 1)
    + i32(0)  # cxt_id
    + field(T_STRING, 2)
    + string(LANE)  # register_array_name
    + field(T_I32, 3)
    + i32(5)  # idx
    + STOP
)


class RawServer:
    """Accepts one connection, records the request's bytes and answers with ``reply``.

    ``reply`` None sends nothing (the client times out); b"" closes the connection.
    """

    def __init__(self, reply: bytes | None, request_size: int = len(READ_REQUEST)) -> None:
        self.reply = reply
        self.request_size = request_size
        self.received = b""
        self.errors: list[BaseException] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._listener.settimeout(5)
            conn, _ = self._listener.accept()
            with conn:
                conn.settimeout(5)
                while len(self.received) < self.request_size:
                    chunk = conn.recv(self.request_size - len(self.received))
                    if not chunk:
                        break
                    self.received += chunk
                if self.reply == b"":
                    return
                if self.reply is not None:
                    conn.sendall(self.reply)
                while conn.recv(4096):  # until the client closes
                    pass
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self._listener.close()

    def join(self) -> None:
        self._thread.join(timeout=5)
        assert not self._thread.is_alive()
        assert not self.errors, self.errors


def reply(seqid: int = 1, *fields: bytes) -> bytes:
    return message("bm_register_read", REPLY, seqid) + b"".join(fields) + STOP


def test_register_read_goes_out_as_strict_binary_multiplexed_bytes() -> None:
    # An unknown field (7, a string) before the result must be skipped.
    answer = reply(1, field(T_STRING, 7), string("extra"), field(T_I64, 0), i64(0xCAFE))
    raw = RawServer(answer)
    with Bmv2Thrift("127.0.0.1", raw.port, timeout=2.0) as bmv2:
        assert bmv2.register_read(LANE, 5) == 0xCAFE
    raw.join()
    assert raw.received == READ_REQUEST


def test_exception_in_the_result_reads_its_code() -> None:
    ouch = field(T_STRUCT, 1) + field(T_I32, 1) + i32(2) + STOP
    raw = RawServer(reply(1, ouch))
    with (
        Bmv2Thrift("127.0.0.1", raw.port, timeout=2.0) as bmv2,
        pytest.raises(ThriftRegisterError) as caught,
    ):
        bmv2.register_read(LANE, 5)
    raw.join()
    assert (caught.value.code, caught.value.index) == ("INVALID_INDEX", 5)


def test_application_exception_bytes_are_a_typed_error() -> None:
    body = field(T_STRING, 1) + string("Internal error processing") + field(T_I32, 2) + i32(6)
    raw = RawServer(message("bm_register_read", EXCEPTION, 1) + body + STOP)
    with (
        Bmv2Thrift("127.0.0.1", raw.port, timeout=2.0) as bmv2,
        pytest.raises(ThriftApplicationError) as caught,
    ):
        bmv2.register_read(LANE, 5)
    raw.join()
    assert (caught.value.type_name, caught.value.message) == (
        "INTERNAL_ERROR",
        "Internal error processing",
    )


@pytest.mark.parametrize(
    ("answer", "type_name"),
    [
        (reply(99, field(T_I64, 0), i64(1)), "BAD_SEQUENCE_ID"),
        (reply(1), "MISSING_RESULT"),
        (reply(1, field(T_STRING, 0), string("not an i64")), "MISSING_RESULT"),
    ],
    ids=["wrong-seqid", "no-result", "result-of-wrong-type"],
)
def test_malformed_reply_is_an_application_error(answer: bytes, type_name: str) -> None:
    raw = RawServer(answer)
    with Bmv2Thrift("127.0.0.1", raw.port, timeout=2.0) as bmv2:
        with pytest.raises(ThriftApplicationError) as caught:
            bmv2.register_read(LANE, 5)
        assert caught.value.type_name == type_name
    raw.join()


def test_reply_out_of_step_closes_the_connection() -> None:
    raw = RawServer(reply(99, field(T_I64, 0), i64(1)))
    with Bmv2Thrift("127.0.0.1", raw.port, timeout=2.0) as bmv2:
        with pytest.raises(ThriftApplicationError):
            bmv2.register_read(LANE, 5)
        with pytest.raises(ThriftUnreachableError, match="sequence id 99"):
            bmv2.register_read(LANE, 5)
    raw.join()


def test_connection_closed_mid_call_is_unreachable() -> None:
    raw = RawServer(b"")
    with Bmv2Thrift("127.0.0.1", raw.port, timeout=2.0) as bmv2:
        with pytest.raises(ThriftUnreachableError, match="broke during bm_register_read"):
            bmv2.register_read(LANE, 5)
        with pytest.raises(ThriftUnreachableError, match="closed"):
            bmv2.register_read(LANE, 5)
    raw.join()


def test_silent_server_times_out_as_unreachable() -> None:
    raw = RawServer(None)
    started = time.monotonic()
    with (
        Bmv2Thrift("127.0.0.1", raw.port, timeout=0.2) as bmv2,
        pytest.raises(ThriftUnreachableError),
    ):
        bmv2.register_read(LANE, 5)
    assert time.monotonic() - started < 2.0
    raw.join()
    assert raw.received == READ_REQUEST


def test_every_error_is_a_thrift_error() -> None:
    for error in (
        ThriftRegisterError,
        ThriftCounterError,
        ThriftApplicationError,
        ThriftUnreachableError,
    ):
        assert issubclass(error, ThriftError)
