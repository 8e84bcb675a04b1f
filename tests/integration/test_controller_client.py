"""P4RuntimeClient against a real, in-process gRPC P4Runtime server on 127.0.0.1:0.

The server (``FakeSwitch``) records every request and answers as a test configures it,
enforcing mastership as a real switch does: the highest election id on a stream is the
primary, and a Write or SetForwardingPipelineConfig from anyone else is refused with
PERMISSION_DENIED. Requests are compared with the golden text protos in tests/golden/
(p4runtime-shell's test.py does the same with inline text).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, text_format
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotPrimaryError,
    P4Info,
    P4InfoError,
    P4RuntimeClient,
    SwitchUnreachableError,
    UpdateError,
    decode_value,
    entity,
    insert,
    multicast_group_entry,
    register_entry,
    table_entry,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
P4INFO = P4Info.load()
JOB_PARAMS = {"num_workers": 4, "slot_base": 256, "slot_count": 128, "mgid": 7}


class FakeSwitch(p4runtime_pb2_grpc.P4RuntimeServicer):
    """A P4Runtime servicer that records requests and answers as configured."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, Any]] = []
        self.elections: dict[object, int] = {}  # open stream -> its election id
        self.write_errors: list[tuple[int, str]] | None = None  # one per update
        self.read_entities: list[Any] = []
        self.config: Any = None

    def _record(self, method: str, request: Any) -> None:
        with self.lock:
            self.requests.append((method, request))

    def sent(self, method: str) -> list[Any]:
        """Every request received on ``method``, in order."""
        with self.lock:
            return [r for m, r in self.requests if m == method]

    def _require_primary(self, election_id: Any, context: grpc.ServicerContext) -> None:
        with self.lock:
            primary = max(self.elections.values(), default=None)
        if primary is None or _uint128(election_id) != primary:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not the primary controller")

    def StreamChannel(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        stream = object()
        try:
            for request in request_iterator:
                self._record("StreamChannel", request)
                if request.WhichOneof("update") != "arbitration":
                    continue
                if self._taken(stream, request.arbitration.election_id):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "election id in use")
                yield self._arbitrate(stream, request.arbitration)
        finally:
            with self.lock:
                self.elections.pop(stream, None)

    def _taken(self, stream: object, election_id: Any) -> bool:
        """Whether another open stream holds ``election_id`` (P4Runtime forbids sharing)."""
        with self.lock:
            others = {e for s, e in self.elections.items() if s is not stream}
        return _uint128(election_id) in others

    def _arbitrate(self, stream: object, update: Any) -> Any:
        with self.lock:
            self.elections[stream] = _uint128(update.election_id)
            primary = max(self.elections.values())
        answer = p4runtime_pb2.MasterArbitrationUpdate(device_id=update.device_id)
        answer.election_id.high, answer.election_id.low = divmod(primary, 2**64)
        mine = _uint128(update.election_id) == primary
        answer.status.code = code_pb2.OK if mine else code_pb2.ALREADY_EXISTS
        return p4runtime_pb2.StreamMessageResponse(arbitration=answer)

    def Write(self, request: Any, context: Any) -> Any:
        self._record("Write", request)
        self._require_primary(request.election_id, context)
        if self.write_errors is not None:
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message="write failed")
            for code, message in self.write_errors:
                detail = any_pb2.Any()
                detail.Pack(p4runtime_pb2.Error(canonical_code=code, message=message))
                status.details.append(detail)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),)
            )
            context.abort(grpc.StatusCode.UNKNOWN, status.message)
        return p4runtime_pb2.WriteResponse()

    def Read(self, request: Any, context: Any) -> Iterator[Any]:
        self._record("Read", request)
        yield p4runtime_pb2.ReadResponse(entities=self.read_entities)

    def SetForwardingPipelineConfig(self, request: Any, context: Any) -> Any:
        self._record("SetForwardingPipelineConfig", request)
        self._require_primary(request.election_id, context)
        self.config = request.config
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request: Any, context: Any) -> Any:
        self._record("GetForwardingPipelineConfig", request)
        response = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        if self.config is not None:
            response.config.p4info.CopyFrom(self.config.p4info)
        return response


def _uint128(election_id: Any) -> int:
    return int(election_id.high) << 64 | int(election_id.low)


@pytest.fixture
def switch() -> Iterator[tuple[FakeSwitch, str]]:
    """A FakeSwitch served on a free loopback port, and its address."""
    servicer = FakeSwitch()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()


def assert_golden(name: str, message: Any) -> None:
    """``message`` equals tests/golden/<name>.txtpb (compared as text for a readable diff)."""
    expected = text_format.Parse((GOLDEN / f"{name}.txtpb").read_text(), type(message)())
    assert text_format.MessageToString(message) == text_format.MessageToString(expected)
    assert message == expected


def jobs_entry(job_id: int = 7) -> Any:
    return table_entry(P4INFO, "Ingress.jobs.jobs", {"job_id": job_id}, "set_job", JOB_PARAMS)


def test_arbitration_makes_the_only_client_primary(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    with P4RuntimeClient(address, timeout=5) as client:
        assert client.is_primary
    (request,) = server.sent("StreamChannel")
    assert_golden("arbitration", request)


def test_close_ends_the_stream_and_gives_up_mastership(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    client = P4RuntimeClient(address, timeout=5)
    assert server.elections
    client.close()
    client.close()
    deadline = time.monotonic() + 5
    while server.elections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.elections


def test_set_and_get_pipeline(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    with P4RuntimeClient(address, timeout=5) as client:
        client.set_pipeline(P4INFO, b'{"bmv2": "json"}')
        installed = client.get_pipeline()
    (request,) = server.sent("SetForwardingPipelineConfig")
    assert request.config.p4info == P4INFO.message
    # The golden leaves the P4Info out: p4/ina.p4info.txtpb stays its only copy.
    request.config.ClearField("p4info")
    assert_golden("set_pipeline", request)
    assert installed.message == P4INFO.message
    assert installed.table(33751041).name == "Ingress.jobs.jobs"
    (get,) = server.sent("GetForwardingPipelineConfig")
    assert_golden("get_pipeline", get)


def test_write_inserts_a_jobs_entry(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    with P4RuntimeClient(address, timeout=5) as client:
        client.write([insert(jobs_entry())])
    (request,) = server.sent("Write")
    assert_golden("write_jobs_entry", request)


def test_write_inserts_a_multicast_group(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    with P4RuntimeClient(address, timeout=5) as client:
        client.write([insert(multicast_group_entry(7, [(1, 0), (2, 1), (3, 2)]))])
    (request,) = server.sent("Write")
    assert_golden("write_multicast_group", request)


def test_read_a_register_cell(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    server.read_entities = [entity(register_entry(P4INFO, "Ingress.seq", 5, 0xDEAD))]
    with P4RuntimeClient(address, timeout=5) as client:
        (found,) = client.read([entity(register_entry(P4INFO, "Ingress.seq", 5))])
    (request,) = server.sent("Read")
    assert_golden("read_register", request)
    assert found.register_entry.index.index == 5
    assert decode_value(found.register_entry.data.bitstring, 32) == 0xDEAD


def test_a_lower_election_id_is_not_primary_and_cannot_write(
    switch: tuple[FakeSwitch, str],
) -> None:
    server, address = switch
    with (
        P4RuntimeClient(address, election_id=(0, 2), timeout=5) as primary,
        P4RuntimeClient(address, election_id=(0, 1), timeout=5) as backup,
    ):
        assert primary.is_primary
        assert not backup.is_primary
        with pytest.raises(NotPrimaryError) as caught:
            backup.write([insert(jobs_entry())])
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert caught.value.__suppress_context__  # raise ... from None
        primary.write([insert(jobs_entry())])
    assert len(server.sent("Write")) == 2


def test_a_shared_election_id_is_refused(switch: tuple[FakeSwitch, str]) -> None:
    _, address = switch
    with P4RuntimeClient(address, election_id=(1, 0), timeout=5) as first:
        with pytest.raises(InvalidArgumentError, match="election id in use"):
            P4RuntimeClient(address, election_id=(1, 0), timeout=5)
        assert first.is_primary


def test_already_exists_names_the_failed_update(switch: tuple[FakeSwitch, str]) -> None:
    server, address = switch
    server.write_errors = [(code_pb2.OK, ""), (code_pb2.ALREADY_EXISTS, "entry exists")]
    updates = [insert(jobs_entry(8)), insert(jobs_entry(7))]
    with P4RuntimeClient(address, timeout=5) as client, pytest.raises(AlreadyExistsError) as caught:
        client.write(updates)
    error = caught.value
    assert error.code == grpc.StatusCode.UNKNOWN
    assert error.details == [
        UpdateError(1, grpc.StatusCode.ALREADY_EXISTS, "entry exists", updates[1])
    ]
    assert "update 1: ALREADY_EXISTS: entry exists" in str(error)


def test_unreachable_address_fails_within_the_timeout() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(SwitchUnreachableError) as caught:
        P4RuntimeClient(f"127.0.0.1:{port}", timeout=0.5)
    assert time.monotonic() - start < 3
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("table", "match", "action", "params"),
    [
        ("Ingress.jobs.nope", {"job_id": 7}, "set_job", JOB_PARAMS),
        ("Ingress.jobs.jobs", {"job_id": 7}, "set_jobs", JOB_PARAMS),
        ("Ingress.jobs.jobs", {"job_id": 7}, "set_job", {**JOB_PARAMS, "slots": 1}),
        ("Ingress.jobs.jobs", {"job": 7}, "set_job", JOB_PARAMS),
    ],
)
def test_unknown_names_fail_before_anything_is_sent(
    switch: tuple[FakeSwitch, str],
    table: str,
    match: dict[str, int],
    action: str,
    params: dict[str, int],
) -> None:
    server, address = switch
    with P4RuntimeClient(address, timeout=5) as client, pytest.raises(P4InfoError):
        client.write([insert(table_entry(P4INFO, table, match, action, params))])
    assert server.sent("Write") == []
