"""The soft switch's P4Runtime server over real gRPC on 127.0.0.1 (port 0).

Each test runs its own :class:`SwitchServer` (4 lanes, 16 slots per set) with
``serve_forever`` in a daemon thread, so every pipeline access the gRPC handlers make
goes through the data-plane thread's control queue, as in ``inalab switch``. Requests are
raw ``p4.v1`` messages where the controller's builders would refuse to build them (the
point is the server's checks), and the asserted codes are exact: a failed Write is
UNKNOWN with one ``p4.v1.Error`` per update in ``grpc-status-details-bin``, OK for the
updates that succeeded.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.rpc import code_pb2, status_pb2
from helpers import bound_udp_sockets
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller import (
    AlreadyExistsError,
    NotFoundError,
    NotPrimaryError,
    P4Info,
    P4RuntimeClient,
    P4RuntimeError,
    PermissionDeniedError,
    counter_entry,
    delete,
    entity,
    insert,
    modify,
    multicast_group_entry,
    register_entry,
    table_entry,
)
from controller.p4info import Value
from emulation.softswitch.p4runtime import (
    API_VERSION,
    MAX_STREAMS,
    READ_CHUNK,
    SoftSwitchP4Runtime,
    serve_p4runtime,
    softswitch_p4info,
)
from emulation.softswitch.pipeline import Pipeline
from emulation.softswitch.process import SoftSwitchProcess
from emulation.softswitch.server import SwitchServer
from hostlib.protocol import (
    HEADER_SIZE,
    SWITCH_DROPS,
    SWITCH_STATS,
    Header,
    PacketType,
    pack_header,
    packet_size,
    unpack_header,
)

LANES = 4
SLOTS = 16
TIMEOUT = 5.0
P4INFO = softswitch_p4info(P4Info.load(), LANES, SLOTS)

JOBS = "Ingress.jobs.jobs"
WORKERS = "Ingress.workers.workers"
FORWARD = "Ingress.forwarder.forward"
REPLICAS = "Egress.replicas.replicas"
UPSTREAM = "Ingress.upstream.upstream"
SET_JOB = "Ingress.jobs.set_job"
SET_UPSTREAM = "Ingress.upstream.set_upstream"
JOB_PARAMS = {"num_workers": 2, "slot_base": 0, "slot_count": 4, "mgid": 1}

OK = "OK"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
OUT_OF_RANGE = "OUT_OF_RANGE"
PERMISSION_DENIED = "PERMISSION_DENIED"
UNIMPLEMENTED = "UNIMPLEMENTED"


# --------------------------------------------------------------------- fixtures


@dataclass
class Switch:
    server: SwitchServer
    address: str


@pytest.fixture
def switch() -> Iterator[Switch]:
    server = SwitchServer(Pipeline(LANES, SLOTS), ("127.0.0.1", 0), ("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, name="switch", daemon=True)
    thread.start()
    host, port = server.p4runtime_addr
    try:
        yield Switch(server, f"{host}:{port}")
    finally:
        server.request_stop()
        thread.join(TIMEOUT)
        server.close()
    assert not thread.is_alive()


@pytest.fixture
def client(switch: Switch) -> Iterator[P4RuntimeClient]:
    """The primary controller, election id (0, 1)."""
    with P4RuntimeClient(switch.address, 0, (0, 1), TIMEOUT) as c:
        yield c


@pytest.fixture
def stub(switch: Switch) -> Iterator[Any]:
    """A raw stub on its own channel, for requests the client library would not send."""
    channel = grpc.insecure_channel(switch.address)
    try:
        yield p4runtime_pb2_grpc.P4RuntimeStub(channel)
    finally:
        channel.close()


@pytest.fixture
def rig(client: P4RuntimeClient, stub: Any) -> Any:
    """The raw stub, with ``client`` holding mastership for election id (0, 1)."""
    return stub


# --------------------------------------------------------------------- helpers


def uint128(low: int, high: int = 0) -> Any:
    return p4runtime_pb2.Uint128(high=high, low=low)


def codes(stub: Any, *updates: Any, strict: bool = True) -> list[str]:
    """Per-update canonical codes of one Write by the primary, election id (0, 1)
    (``OK`` for all when the RPC succeeds). ``strict`` also checks the messages the soft
    switch promises (bmv2 leaves them empty)."""
    request = p4runtime_pb2.WriteRequest(device_id=0, election_id=uint128(1), updates=updates)
    try:
        stub.Write(request, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNKNOWN, exc
        status = status_details(exc)
        assert status.code == code_pb2.UNKNOWN
        assert status.message or not strict
        names = []
        for detail in status.details:
            error = p4runtime_pb2.Error()
            assert detail.Unpack(error)
            names.append(code_pb2.Code.Name(error.canonical_code))
            assert bool(error.message) == (error.canonical_code != code_pb2.OK) or not strict
        assert len(names) == len(updates)
        assert OK not in names or len(updates) > 1
        return names
    return [OK] * len(updates)


def status_details(exc: grpc.RpcError) -> Any:
    assert isinstance(exc, grpc.Call)
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    raise AssertionError(f"no status details in {exc}")


def rpc_code(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call`` fails with."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert isinstance(caught.value, grpc.Call)
    return caught.value.code()


def write_as(stub: Any, low: int | None, role: str = "") -> grpc.StatusCode:
    """The status of one Write stamped with election id ``low`` (None: unset) whose one
    update always succeeds for the primary (reset the forwarder's default entry)."""
    request = p4runtime_pb2.WriteRequest(device_id=0, role=role)
    request.updates.append(update(MODIFY, _default(FORWARD, None)))
    if low is not None:
        request.election_id.CopyFrom(uint128(low))
    try:
        stub.Write(request, timeout=TIMEOUT)
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        return exc.code()
    return grpc.StatusCode.OK


def read(stub: Any, *entities: Any, device_id: int = 0) -> list[Any]:
    request = p4runtime_pb2.ReadRequest(device_id=device_id, entities=[entity(e) for e in entities])
    return [e for response in stub.Read(request, timeout=TIMEOUT) for e in response.entities]


def job(job_id: int = 7, **params: int) -> Any:
    return table_entry(P4INFO, JOBS, {"job_id": job_id}, SET_JOB, {**JOB_PARAMS, **params})


def worker(job_id: int, rank: int, addr: tuple[str, int]) -> Any:
    match: dict[str, Value] = {
        "job_id": job_id,
        "rank": rank,
        "ipv4_src": addr[0],
        "udp_src_port": addr[1],
    }
    return table_entry(P4INFO, WORKERS, match, "Ingress.workers.worker_hit")


def replica(job_id: int, rank: int, addr: tuple[str, int]) -> Any:
    match = {"job_id": job_id, "egress_rid": rank, "egress_port": 0}
    params: dict[str, Value] = {"dst_mac": 0, "dst_ip": addr[0], "dst_port": addr[1]}
    return table_entry(P4INFO, REPLICAS, match, "Egress.replicas.set_destination", params)


def upstream(job_id: int, rank: int, addr: tuple[str, int], mac: int = 0, port: int = 0) -> Any:
    params: dict[str, Value] = {
        "rank": rank,
        "dst_ip": addr[0],
        "dst_port": addr[1],
        "dst_mac": mac,
        "egress_port": port,
    }
    return table_entry(P4INFO, UPSTREAM, {"job_id": job_id}, SET_UPSTREAM, params)


def table(name: str) -> Any:
    """A wildcard read of one table."""
    return p4runtime_pb2.TableEntry(table_id=P4INFO.table(name).id)


def default_of(name: str) -> Any:
    return p4runtime_pb2.TableEntry(table_id=P4INFO.table(name).id, is_default_action=True)


def group(gid: int = 0) -> Any:
    want = p4runtime_pb2.Entity()
    want.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = gid
    return want


def groups(stub: Any, gid: int = 0) -> dict[int, list[tuple[int, int]]]:
    found = read(stub, group(gid))
    return {
        e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id: [
            (r.egress_port, r.instance)
            for r in e.packet_replication_engine_entry.multicast_group_entry.replicas
        ]
        for e in found
    }


def counter(stub: Any, name: str, index: int) -> int:
    (found,) = read(stub, counter_entry(P4INFO, name, index))
    assert found.counter_entry.index.index == index
    return int(found.counter_entry.data.packet_count)


def eventually(stub: Any, name: str, index: int, expected: int) -> None:
    """Wait until counter ``name[index]`` reads ``expected`` (the switch has processed
    the datagrams sent before)."""
    deadline = time.monotonic() + TIMEOUT
    while (value := counter(stub, name, index)) != expected:
        assert value < expected, f"{name}[{index}] = {value} > {expected}"
        assert time.monotonic() < deadline, f"{name}[{index}] stayed {value}, not {expected}"
        time.sleep(0.01)


def action_id(name: str) -> int:
    return P4INFO.action(name).id


def update(kind: Any, message: Any) -> Any:
    return p4runtime_pb2.Update(type=kind, entity=entity(message))


INSERT = p4runtime_pb2.Update.INSERT
MODIFY = p4runtime_pb2.Update.MODIFY
DELETE = p4runtime_pb2.Update.DELETE


def install_job(
    stub: Any, job_id: int, addrs: Sequence[tuple[str, int]], mgid: int = 1, slot_count: int = 4
) -> None:
    """A job by hand: its group, replicas, workers and last its jobs entry."""
    n = len(addrs)
    assert codes(stub, insert(multicast_group_entry(mgid, [(0, r) for r in range(n)]))) == [OK]
    updates = [insert(replica(job_id, r, a)) for r, a in enumerate(addrs)]
    updates += [insert(worker(job_id, r, a)) for r, a in enumerate(addrs)]
    assert codes(stub, *updates) == [OK] * 2 * n
    params = {"num_workers": n, "slot_base": 0, "slot_count": slot_count, "mgid": mgid}
    assert codes(stub, insert(job(job_id, **params))) == [OK]


def send_data(
    sock: socket.socket, to: tuple[str, int], job_id: int, rank: int, slot: int, seq: int
) -> None:
    values = (np.arange(LANES) * (rank + 1)).astype(">i4")  # lane i: i x (rank + 1)
    header = pack_header(Header(PacketType.DATA, job_id, rank, slot, 0, seq, LANES, rank))
    packet = header + values.tobytes()
    assert len(packet) == packet_size(LANES)
    sock.sendto(packet, to)


def receive_result(sock: socket.socket) -> tuple[Header, list[int]]:
    data = sock.recv(4096)
    return unpack_header(data), np.frombuffer(data, ">i4", offset=HEADER_SIZE).tolist()


# --------------------------------------------------------------------- a raw stream


class Stream:
    """A raw StreamChannel whose responses (and final error) a thread collects."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.requests: queue.Queue[Any] = queue.Queue()
        self.responses: queue.Queue[Any] = queue.Queue()
        self.call = stub.StreamChannel(iter(self.requests.get, None))
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        try:
            for response in self.call:
                self.responses.put(response)
        except grpc.RpcError as exc:
            self.responses.put(exc)

    def arbitrate(self, low: int, device_id: int = 0, role: str = "") -> None:
        update = p4runtime_pb2.MasterArbitrationUpdate(
            device_id=device_id, election_id=uint128(low)
        )
        if role:
            update.role.name = role
        self.requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=update))

    def next(self) -> Any:
        """The next response (or the RpcError that ended the stream)."""
        return self.responses.get(timeout=TIMEOUT)

    def arbitration(self) -> tuple[str, int]:
        """The next message, an arbitration update: its status and election id."""
        response = self.next()
        assert not isinstance(response, grpc.RpcError), response
        update = response.arbitration
        assert update.device_id == 0
        assert update.election_id.high == 0
        return code_pb2.Code.Name(update.status.code), update.election_id.low

    def error(self) -> grpc.StatusCode:
        """The code the server ended the stream with."""
        response = self.next()
        assert isinstance(response, grpc.RpcError), response
        assert isinstance(response, grpc.Call)
        return response.code()

    def half_close(self) -> None:
        """End the request stream, as p4runtime-shell's teardown does, and wait for the
        server to end the call."""
        self.requests.put(None)
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the server did not end the stream"
        assert self.call.code() == grpc.StatusCode.OK

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.thread.join(TIMEOUT)
        self.channel.close()


def _streams_to(address: str) -> Iterator[Callable[[], Stream]]:
    opened: list[Stream] = []

    def open_stream() -> Stream:
        stream = Stream(address)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


@pytest.fixture
def streams(switch: Switch) -> Iterator[Callable[[], Stream]]:
    yield from _streams_to(switch.address)


@pytest.fixture
def bmv2_switch() -> Iterator[str]:
    """The address of a P4Runtime server with bmv2's arbitration (the highest live id)."""
    service = SoftSwitchP4Runtime(Pipeline(LANES, SLOTS), P4INFO, arbitration="bmv2")
    server, port = serve_p4runtime(service, "127.0.0.1:0")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()


@pytest.fixture
def bmv2_streams(bmv2_switch: str) -> Iterator[Callable[[], Stream]]:
    yield from _streams_to(bmv2_switch)


@pytest.fixture
def bmv2_stub(bmv2_switch: str) -> Iterator[Any]:
    with grpc.insecure_channel(bmv2_switch) as channel:
        yield p4runtime_pb2_grpc.P4RuntimeStub(channel)


# --------------------------------------------------------------------- arbitration


def test_first_stream_is_primary(streams: Callable[[], Stream]) -> None:
    a = streams()
    a.arbitrate(5)
    assert a.arbitration() == (OK, 5)


def test_higher_election_id_takes_over_and_backups_hear_of_it(
    bmv2_streams: Callable[[], Stream],
) -> None:
    a, b, c = bmv2_streams(), bmv2_streams(), bmv2_streams()
    a.arbitrate(5)
    assert a.arbitration() == (OK, 5)
    b.arbitrate(9)
    assert b.arbitration() == (OK, 9)
    assert a.arbitration() == (ALREADY_EXISTS, 9)
    c.arbitrate(2)  # a backup joining is told alone
    assert c.arbitration() == (ALREADY_EXISTS, 9)
    a.arbitrate(12)  # a backup raising its id takes over: everyone hears
    assert a.arbitration() == (OK, 12)
    assert b.arbitration() == (ALREADY_EXISTS, 12)
    assert c.arbitration() == (ALREADY_EXISTS, 12)
    a.arbitrate(3)  # bmv2's rule: the primary lowering its id hands over to the next
    assert b.arbitration() == (OK, 9)
    assert a.arbitration() == (ALREADY_EXISTS, 9)
    assert c.arbitration() == (ALREADY_EXISTS, 9)


def test_bmv2_rule_primary_leaving_promotes_the_next_highest(
    bmv2_streams: Callable[[], Stream],
) -> None:
    a, b = bmv2_streams(), bmv2_streams()
    a.arbitrate(1)
    assert a.arbitration() == (OK, 1)
    b.arbitrate(2)
    assert b.arbitration() == (OK, 2)
    assert a.arbitration() == (ALREADY_EXISTS, 2)
    b.half_close()  # the server ends the stream when the client half-closes
    assert a.arbitration() == (OK, 1)  # bmv2's rule


def test_bmv2_rule_client_library_follows_mastership(bmv2_switch: str) -> None:
    with P4RuntimeClient(bmv2_switch, 0, (0, 1), TIMEOUT) as low:
        assert low.is_primary
        with P4RuntimeClient(bmv2_switch, 0, (0, 2), TIMEOUT) as high:
            assert high.is_primary
            wait_for(lambda: not low.is_primary)
        wait_for(lambda: low.is_primary)
        low.write([insert(job())])


def test_an_unknown_arbitration_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="'raft' is not one of spec, bmv2"):
        SoftSwitchP4Runtime(Pipeline(LANES, SLOTS), P4INFO, arbitration="raft")


# The spec's rule (the default): the switch remembers the highest election id it has ever
# seen (election_id_past), and only a controller with at least that id is primary.


def test_spec_primary_leaving_leaves_no_primary_until_an_id_as_high(
    streams: Callable[[], Stream], stub: Any
) -> None:
    a, b = streams(), streams()
    a.arbitrate(1)
    assert a.arbitration() == (OK, 1)
    b.arbitrate(2)
    assert b.arbitration() == (OK, 2)
    assert a.arbitration() == (ALREADY_EXISTS, 2)
    b.half_close()
    assert a.arbitration() == (NOT_FOUND, 2)  # the backup at 1 does not take over
    assert write_as(stub, 1) == grpc.StatusCode.PERMISSION_DENIED
    assert write_as(stub, 2) == grpc.StatusCode.PERMISSION_DENIED  # nobody holds 2
    a.arbitrate(1)  # asking again changes nothing (and only the asker hears)
    assert a.arbitration() == (NOT_FOUND, 2)
    a.arbitrate(2)
    assert a.arbitration() == (OK, 2)
    assert write_as(stub, 2) == grpc.StatusCode.OK


def test_spec_primary_lowering_its_id_leaves_no_primary(
    streams: Callable[[], Stream], stub: Any
) -> None:
    a, b, c = streams(), streams(), streams()
    a.arbitrate(5)
    assert a.arbitration() == (OK, 5)
    b.arbitrate(9)
    assert b.arbitration() == (OK, 9)
    assert a.arbitration() == (ALREADY_EXISTS, 9)
    b.arbitrate(9)  # the primary repeating its id stays primary: everyone hears again
    assert b.arbitration() == (OK, 9)
    assert a.arbitration() == (ALREADY_EXISTS, 9)
    b.arbitrate(3)  # a step down: everyone hears there is no primary, 5 included
    assert b.arbitration() == (NOT_FOUND, 9)
    assert a.arbitration() == (NOT_FOUND, 9)
    assert write_as(stub, 5) == grpc.StatusCode.PERMISSION_DENIED
    c.arbitrate(4)  # a newcomer below election_id_past is told alone
    assert c.arbitration() == (NOT_FOUND, 9)
    a.arbitrate(9)  # at least election_id_past, and no longer held: primary
    assert a.arbitration() == (OK, 9)
    assert b.arbitration() == (ALREADY_EXISTS, 9)
    assert c.arbitration() == (ALREADY_EXISTS, 9)
    assert write_as(stub, 9) == grpc.StatusCode.OK


def test_spec_stream_without_an_election_id_is_a_standby(
    streams: Callable[[], Stream],
) -> None:
    s = streams()
    standby = p4runtime_pb2.MasterArbitrationUpdate(device_id=0)  # election_id unset
    s.requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=standby))
    update = s.next().arbitration
    assert update.status.code == code_pb2.NOT_FOUND  # never primary
    assert not update.HasField("election_id")  # there has never been a primary
    z = streams()
    z.arbitrate(0)  # an id of zero is an id: it is primary
    assert z.arbitration() == (OK, 0)
    assert s.arbitration() == (ALREADY_EXISTS, 0)


def test_spec_client_library_keeps_a_lower_id_a_backup(switch: Switch) -> None:
    with P4RuntimeClient(switch.address, 0, (0, 1), TIMEOUT) as low:
        assert low.is_primary
        with P4RuntimeClient(switch.address, 0, (0, 2), TIMEOUT) as high:
            assert high.is_primary
            wait_for(lambda: not low.is_primary)
        with pytest.raises(NotPrimaryError):  # the primary left; the switch remembers 2
            low.write([insert(job())])
        assert not low.is_primary
        with P4RuntimeClient(switch.address, 0, (0, 3), TIMEOUT) as higher:
            assert higher.is_primary
            higher.write([insert(job())])
        assert low.rearbitrate((0, 3))  # taking mastership back: an id as high as any seen
        low.write([delete(job())])


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_backup_can_read_but_not_write_or_set_the_pipeline(switch: Switch) -> None:
    with (
        P4RuntimeClient(switch.address, 0, (0, 2), TIMEOUT) as primary,
        P4RuntimeClient(switch.address, 0, (0, 1), TIMEOUT) as backup,
    ):
        assert primary.is_primary and not backup.is_primary
        primary.write([insert(job(3))])
        with pytest.raises(NotPrimaryError) as caught:
            backup.write([insert(job(4, slot_base=8))])
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(NotPrimaryError) as caught:
            backup.set_pipeline(P4INFO)
        assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
        (found,) = backup.read([entity(table(JOBS))])
        assert found.table_entry == job(3)
        assert backup.get_pipeline().message == P4INFO.message


def test_writes_need_a_primary_stream(switch: Switch, stub: Any) -> None:
    # Nobody arbitrated yet: no election id is the primary's.
    request = p4runtime_pb2.WriteRequest(device_id=0, election_id=uint128(1))
    request.updates.append(insert(job()))
    assert rpc_code(lambda: stub.Write(request, timeout=TIMEOUT)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    with P4RuntimeClient(switch.address, 0, (0, 1), TIMEOUT):
        request.election_id.low = 2  # an id no stream holds
        assert rpc_code(lambda: stub.Write(request, timeout=TIMEOUT)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        request.election_id.low = 1
        stub.Write(request, timeout=TIMEOUT)


def test_an_election_id_in_use_aborts_the_stream(
    switch: Switch, streams: Callable[[], Stream]
) -> None:
    a, b = streams(), streams()
    a.arbitrate(4)
    assert a.arbitration() == (OK, 4)
    b.arbitrate(4)
    assert b.error() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(P4RuntimeError) as caught:
        P4RuntimeClient(switch.address, 0, (0, 4), TIMEOUT)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    c = streams()
    c.arbitrate(3)  # the refused streams changed nothing
    assert c.arbitration() == (ALREADY_EXISTS, 4)
    assert a.responses.empty()


def test_an_unknown_device_is_not_found(
    switch: Switch, streams: Callable[[], Stream], rig: Any
) -> None:
    s = streams()
    s.arbitrate(1, device_id=7)
    assert s.error() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFoundError):
        P4RuntimeClient(switch.address, 7, (0, 2), TIMEOUT)
    write = p4runtime_pb2.WriteRequest(device_id=7, election_id=uint128(1))
    assert rpc_code(lambda: rig.Write(write, timeout=TIMEOUT)) == grpc.StatusCode.NOT_FOUND
    assert rpc_code(lambda: read(rig, table(JOBS), device_id=7)) == grpc.StatusCode.NOT_FOUND
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=7)
    assert rpc_code(lambda: rig.GetForwardingPipelineConfig(get, timeout=TIMEOUT)) == (
        grpc.StatusCode.NOT_FOUND
    )
    set_ = p4runtime_pb2.SetForwardingPipelineConfigRequest(
        device_id=7,
        election_id=uint128(1),
        action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY,
    )
    assert rpc_code(lambda: rig.SetForwardingPipelineConfig(set_, timeout=TIMEOUT)) == (
        grpc.StatusCode.NOT_FOUND
    )


def test_a_stream_cannot_change_its_device(streams: Callable[[], Stream]) -> None:
    s = streams()
    s.arbitrate(1)
    assert s.arbitration() == (OK, 1)
    s.arbitrate(1, device_id=7)
    assert s.error() == grpc.StatusCode.FAILED_PRECONDITION


def test_other_stream_messages_are_unimplemented(streams: Callable[[], Stream]) -> None:
    s = streams()
    s.arbitrate(1)
    assert s.arbitration() == (OK, 1)
    s.requests.put(p4runtime_pb2.StreamMessageRequest(packet=p4runtime_pb2.PacketOut()))
    error = s.next().error
    assert error.canonical_code == code_pb2.UNIMPLEMENTED


def test_roles_the_switch_does_not_know_are_not_found(
    switch: Switch, streams: Callable[[], Stream], rig: Any
) -> None:
    # The switch serves the default role only. P4Runtime: a Write (or pipeline set) for a
    # role the device does not have is NOT_FOUND, even from the primary's election id.
    assert write_as(rig, 1, role="stats") == grpc.StatusCode.NOT_FOUND
    set_ = p4runtime_pb2.SetForwardingPipelineConfigRequest(
        device_id=0,
        role="stats",
        election_id=uint128(1),
        action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY,
    )
    set_.config.p4info.CopyFrom(P4INFO.message)
    assert rpc_code(lambda: rig.SetForwardingPipelineConfig(set_, timeout=TIMEOUT)) == (
        grpc.StatusCode.NOT_FOUND
    )
    # Read's role is a filter by the entities' role: every entity is the default role's.
    assert codes(rig, insert(job(7))) == [OK]
    by_role = p4runtime_pb2.ReadRequest(device_id=0, role="stats", entities=[entity(table(JOBS))])
    assert [r.entities for r in rig.Read(by_role, timeout=TIMEOUT)] == []
    assert [e.table_entry for e in read(rig, table(JOBS))] == [job(7)]
    r = streams()
    r.arbitrate(2, role="stats")  # arbitration for a role it does not know
    assert r.error() == grpc.StatusCode.NOT_FOUND
    configured = p4runtime_pb2.MasterArbitrationUpdate(device_id=0, election_id=uint128(3))
    configured.role.config.Pack(uint128(0))  # a role config no scheme was agreed for
    c = streams()
    c.requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=configured))
    assert c.error() == grpc.StatusCode.INVALID_ARGUMENT
    s = streams()
    s.arbitrate(4)
    assert s.arbitration() == (OK, 4)
    s.arbitrate(4, role="stats")  # a stream cannot change its role
    assert s.error() == grpc.StatusCode.FAILED_PRECONDITION


# --------------------------------------------------------------------- table writes


def _drop_field(e: Any) -> None:
    del e.match[2]


def _duplicate_field(e: Any) -> None:
    e.match.add().CopyFrom(e.match[0])


def _unknown_field(e: Any) -> None:
    e.match[3].field_id = 9


def _ternary_field(e: Any) -> None:
    e.match[0].ternary.value = b"\x07"
    e.match[0].ternary.mask = b"\xff"


def _priority(e: Any) -> None:
    e.priority = 10


def _no_action(e: Any) -> None:
    e.ClearField("action")


def _foreign_action(e: Any) -> None:
    e.action.action.action_id = action_id("Ingress.forwarder.forward_drop")


def _unknown_action(e: Any) -> None:
    e.action.action.action_id = 0x01FFFFFF


def _profile_member(e: Any) -> None:
    e.action.action_profile_member_id = 1


def _extra_param(e: Any) -> None:
    e.action.action.params.add(param_id=9, value=b"\x01")


def _duplicate_param(e: Any) -> None:
    e.action.action.params.add().CopyFrom(e.action.action.params[0])


def _empty_match_value(e: Any) -> None:
    e.match[1].exact.value = b""


def _wide_rank(e: Any) -> None:
    e.match[1].exact.value = b"\x01\x00"  # 256 in the 8-bit rank


def _wide_port(e: Any) -> None:
    e.match[3].exact.value = b"\x01\x00\x00"  # 65536 in the 16-bit UDP port


# A value that is empty or does not fit its field is INVALID_ARGUMENT, as bmv2's server
# answers (the spec's Bytestrings section says OUT_OF_RANGE, its Match Format and Action
# Specification sections INVALID_ARGUMENT; test_bmv2_answers_as_the_soft_switch asks).
@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (_drop_field, INVALID_ARGUMENT),
        (_duplicate_field, INVALID_ARGUMENT),
        (_unknown_field, INVALID_ARGUMENT),
        (_ternary_field, INVALID_ARGUMENT),
        (_priority, INVALID_ARGUMENT),
        (_no_action, INVALID_ARGUMENT),
        (_foreign_action, INVALID_ARGUMENT),
        (_unknown_action, INVALID_ARGUMENT),
        (_profile_member, INVALID_ARGUMENT),
        (_empty_match_value, INVALID_ARGUMENT),
        (_wide_rank, INVALID_ARGUMENT),
        (_wide_port, INVALID_ARGUMENT),
    ],
)
def test_malformed_workers_entries_are_refused(
    rig: Any, mutate: Callable[[Any], None], code: str
) -> None:
    entry = worker(1, 0, ("10.0.0.1", 4000))
    mutate(entry)
    assert codes(rig, update(INSERT, entry)) == [code]
    assert read(rig, table(WORKERS)) == []


def _default_only_action(e: Any) -> None:
    e.action.action.action_id = action_id("Ingress.jobs.job_miss")
    del e.action.action.params[:]


def _missing_param(e: Any) -> None:
    del e.action.action.params[3]


def _wide_param(e: Any) -> None:
    e.action.action.params[0].value = b"\x01\x00"  # 256 in the 8-bit num_workers


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        # P4Runtime: an action the table has, used outside its scope, is PERMISSION_DENIED
        # (bmv2 agrees: "Cannot use DEFAULT_ONLY action in table entry").
        (_default_only_action, PERMISSION_DENIED),
        (_missing_param, INVALID_ARGUMENT),
        (_extra_param, INVALID_ARGUMENT),
        (_duplicate_param, INVALID_ARGUMENT),
        (_wide_param, INVALID_ARGUMENT),
    ],
)
def test_malformed_jobs_actions_are_refused(
    rig: Any, mutate: Callable[[Any], None], code: str
) -> None:
    entry = job()
    mutate(entry)
    assert codes(rig, update(INSERT, entry)) == [code]
    assert read(rig, table(JOBS)) == []


def test_wildcard_table_read_spans_every_table(rig: Any) -> None:
    addr = ("10.0.0.1", 4000)
    assert codes(rig, insert(job(7)), insert(worker(7, 0, addr)), insert(replica(7, 0, addr))) == [
        OK,
        OK,
        OK,
    ]
    found = [e.table_entry for e in read(rig, p4runtime_pb2.TableEntry())]
    assert sorted(found, key=lambda e: e.table_id) == [
        job(7),
        worker(7, 0, addr),
        replica(7, 0, addr),
    ]
    # A match needs a table; the key must be the table's whole key.
    keyed = p4runtime_pb2.TableEntry()
    keyed.match.add(field_id=1).exact.value = b"\x07"
    assert rpc_code(lambda: read(rig, keyed)) == grpc.StatusCode.INVALID_ARGUMENT
    partial = worker(7, 0, addr)
    partial.ClearField("action")
    del partial.match[3]
    assert rpc_code(lambda: read(rig, partial)) == grpc.StatusCode.INVALID_ARGUMENT


def test_reading_an_empty_entity_is_invalid(rig: Any) -> None:
    assert rpc_code(lambda: read(rig, p4runtime_pb2.Entity())) == (grpc.StatusCode.INVALID_ARGUMENT)


def test_unknown_table_is_not_found(rig: Any) -> None:
    entry = job()
    entry.table_id = 0x02FFFFFF
    assert codes(rig, update(INSERT, entry)) == [NOT_FOUND]
    assert rpc_code(lambda: read(rig, entry)) == grpc.StatusCode.NOT_FOUND


def test_only_continue_on_error_is_served(rig: Any) -> None:
    request = p4runtime_pb2.WriteRequest(
        device_id=0,
        election_id=uint128(1),
        updates=[insert(job())],
        atomicity=p4runtime_pb2.WriteRequest.ROLLBACK_ON_ERROR,
    )
    assert rpc_code(lambda: rig.Write(request, timeout=TIMEOUT)) == (grpc.StatusCode.UNIMPLEMENTED)
    assert read(rig, table(JOBS)) == []


def test_update_without_type_or_entity_is_invalid(rig: Any) -> None:
    untyped = update(INSERT, job())
    untyped.type = p4runtime_pb2.Update.UNSPECIFIED
    empty = p4runtime_pb2.Update(type=INSERT)
    assert codes(rig, untyped, empty) == [INVALID_ARGUMENT, INVALID_ARGUMENT]


def test_padded_and_shortest_bytestrings_name_one_entry(rig: Any) -> None:
    padded = job(7)
    padded.match[0].exact.value = b"\x00\x00\x07"  # longer than 16 bits, value fits
    for param in padded.action.action.params:
        param.value = b"\x00" * 3 + param.value
    assert codes(rig, update(INSERT, padded)) == [OK]
    (found,) = read(rig, table(JOBS))
    assert found.table_entry == job(7)  # stored and read back in canonical form
    assert found.table_entry.match[0].exact.value == b"\x07"
    assert [p.value for p in found.table_entry.action.action.params] == [
        b"\x02",
        b"\x00",
        b"\x04",
        b"\x01",
    ]
    assert codes(rig, insert(job(7))) == [ALREADY_EXISTS]
    one = job(7)
    one.match[0].exact.value = b"\x00\x07"
    assert [e.table_entry for e in read(rig, one)] == [job(7)]  # a read by padded key
    assert codes(rig, update(DELETE, one)) == [OK]
    assert read(rig, table(JOBS)) == []


def test_nine_bit_port_takes_values_up_to_511(rig: Any) -> None:
    entry = replica(1, 0, ("10.0.0.1", 4000))
    entry.match[2].exact.value = b"\x01\xff"
    assert codes(rig, update(INSERT, entry)) == [OK]
    entry.match[2].exact.value = b"\x02\x00"
    assert codes(rig, update(INSERT, entry)) == [INVALID_ARGUMENT]


def test_insert_modify_delete_and_their_errors(rig: Any) -> None:
    assert codes(rig, insert(job(7))) == [OK]
    assert codes(rig, insert(job(7, slot_base=8))) == [ALREADY_EXISTS]
    assert codes(rig, modify(job(8))) == [NOT_FOUND]
    assert codes(rig, delete(table_entry(P4INFO, JOBS, {"job_id": 8}, None))) == [NOT_FOUND]
    assert codes(rig, modify(job(7, slot_base=8, num_workers=3))) == [OK]
    assert [e.table_entry for e in read(rig, table(JOBS))] == [job(7, slot_base=8, num_workers=3)]
    # A delete names the key; an action given with it is ignored.
    assert codes(rig, delete(job(7, mgid=99))) == [OK]
    assert read(rig, table(JOBS)) == []


def test_is_const_in_a_write_is_invalid(rig: Any) -> None:
    const = job(7)
    const.is_const = True  # the switch's to say in a read, never a client's to write
    assert codes(rig, update(INSERT, const)) == [INVALID_ARGUMENT]
    assert read(rig, table(JOBS)) == []
    assert codes(rig, insert(job(7))) == [OK]
    default = _default(FORWARD, None)
    default.is_const = True
    assert (
        codes(rig, update(MODIFY, const), update(DELETE, const), update(MODIFY, default))
        == [INVALID_ARGUMENT] * 3
    )
    assert [e.table_entry for e in read(rig, table(JOBS))] == [job(7)]


def test_modify_without_action_changes_nothing(rig: Any) -> None:
    assert codes(rig, insert(job(7))) == [OK]
    bare = table_entry(P4INFO, JOBS, {"job_id": 7}, None)
    assert codes(rig, update(MODIFY, bare)) == [OK]
    assert [e.table_entry for e in read(rig, table(JOBS))] == [job(7)]
    missing = table_entry(P4INFO, JOBS, {"job_id": 8}, None)
    assert codes(rig, update(MODIFY, missing)) == [NOT_FOUND]


def test_entry_metadata_is_read_back(rig: Any) -> None:
    entry = job(7)
    entry.metadata = b"cookie"
    assert codes(rig, insert(entry)) == [OK]
    (found,) = read(rig, table(JOBS))
    assert found.table_entry.metadata == b"cookie"


def test_a_batch_reports_each_update_in_order(client: P4RuntimeClient, rig: Any) -> None:
    assert codes(rig, insert(job(1))) == [OK]
    unknown = job(5)
    unknown.table_id = 0x02FFFFFF
    wide = job(6)
    wide.match[0].exact.value = b"\x01\x00\x00"
    batch = [
        insert(job(1)),  # ALREADY_EXISTS
        insert(job(2, slot_base=4)),  # OK
        modify(job(3)),  # NOT_FOUND
        update(INSERT, unknown),  # NOT_FOUND
        update(INSERT, wide),  # INVALID_ARGUMENT: 3 bytes of value in bit<16>
        insert(job(4, slot_base=8)),  # OK
        insert(job(9, slot_base=14)),  # INVALID_ARGUMENT: slots 14..17 leave the pool
    ]
    assert codes(rig, *batch) == [
        ALREADY_EXISTS,
        OK,
        NOT_FOUND,
        NOT_FOUND,
        INVALID_ARGUMENT,
        OK,
        INVALID_ARGUMENT,
    ]
    installed = [e.table_entry.match[0].exact.value for e in read(rig, table(JOBS))]
    assert sorted(installed) == [b"\x01", b"\x02", b"\x04"]
    # The client library reports the failed updates by index, with their updates.
    with pytest.raises(P4RuntimeError) as caught:
        client.write([insert(job(1)), insert(job(10, slot_base=12)), modify(job(11))])
    assert caught.value.code == grpc.StatusCode.UNKNOWN
    assert [(d.index, d.code) for d in caught.value.details] == [
        (0, grpc.StatusCode.ALREADY_EXISTS),
        (2, grpc.StatusCode.NOT_FOUND),
    ]
    with pytest.raises(AlreadyExistsError):
        client.write([insert(job(1))])


# --------------------------------------------------------------------- default entries


def test_default_entries_read_back(rig: Any) -> None:
    found = {
        P4INFO.table(e.table_entry.table_id).name: e.table_entry
        for e in read(rig, p4runtime_pb2.TableEntry(is_default_action=True))
    }
    roce = ("Ingress.roce.roce_requests", "Ingress.roce.roce_jobs", "Egress.roce.roce_replies")
    sharing = ("Ingress.sharing.shared", "Ingress.sharing.fallback", "Ingress.sharing.behind")
    assert set(found) == {JOBS, WORKERS, UPSTREAM, FORWARD, REPLICAS, *roce, *sharing}
    assert all(e.is_default_action and not e.match for e in found.values())
    actions = {name: P4INFO.action(e.action.action.action_id).name for name, e in found.items()}
    assert actions == {
        JOBS: "Ingress.jobs.job_miss",
        WORKERS: "Ingress.workers.worker_miss",
        UPSTREAM: "Ingress.upstream.upstream_miss",
        FORWARD: "Ingress.forwarder.forward_drop",
        REPLICAS: "Egress.replicas.replica_miss",
        roce[0]: "Ingress.roce.roce_qp_miss",
        roce[1]: "Ingress.roce.roce_job_miss",
        roce[2]: "Egress.roce.roce_reply_miss",
        sharing[0]: "Ingress.sharing.shared_miss",
        sharing[1]: "Ingress.sharing.fallback_miss",
        sharing[2]: "Ingress.sharing.behind_miss",
    }


def _default(name: str, action: str | None, **params: bytes) -> Any:
    entry = default_of(name)
    if action is not None:
        entry.action.action.action_id = action_id(action)
        act = P4INFO.action(action)
        for pname, value in params.items():
            entry.action.action.params.add(param_id=act.param(pname).id, value=value)
    return entry


def test_const_default_action_cannot_change(rig: Any) -> None:
    entry = _default(JOBS, "Ingress.jobs.job_miss")
    assert codes(rig, update(MODIFY, entry)) == [PERMISSION_DENIED]


def test_a_forbidden_update_of_the_primary_is_not_a_mastership_error(
    client: P4RuntimeClient,
) -> None:
    # PERMISSION_DENIED inside a batch is about the update; the client is still primary.
    with pytest.raises(PermissionDeniedError) as caught:
        client.write([update(MODIFY, _default(JOBS, "Ingress.jobs.job_miss"))])
    assert not isinstance(caught.value, NotPrimaryError) and client.is_primary
    assert caught.value.details[0].code == grpc.StatusCode.PERMISSION_DENIED


def test_streams_are_capped_and_reads_still_served(switch: Switch) -> None:
    # Each open stream holds a server thread: past MAX_STREAMS the switch refuses more,
    # so a Read always finds a thread.
    clients = [
        P4RuntimeClient(switch.address, 0, (0, 100 + i), TIMEOUT) for i in range(MAX_STREAMS)
    ]
    try:
        with pytest.raises(P4RuntimeError) as caught:
            P4RuntimeClient(switch.address, 0, (0, 99), TIMEOUT)
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert list(clients[0].read([entity(table(JOBS))])) == []
        assert clients[-1].is_primary
    finally:
        for c in clients:
            c.close()
    with P4RuntimeClient(switch.address, 0, (0, 200), TIMEOUT) as again:
        assert again.is_primary  # the slots were freed (200: above every id seen)


def test_forward_default_action_is_modified_reset_and_read_back(rig: Any) -> None:
    port3 = _default(FORWARD, "Ingress.forwarder.set_egress_port", port=b"\x00\x03")
    assert codes(rig, update(MODIFY, port3)) == [OK]
    (found,) = read(rig, default_of(FORWARD))
    assert found.table_entry == _default(FORWARD, "Ingress.forwarder.set_egress_port", port=b"\x03")
    # Default entries are modified only, with no match and no priority.
    assert codes(
        rig,
        update(INSERT, port3),
        update(DELETE, port3),
    ) == [INVALID_ARGUMENT, INVALID_ARGUMENT]
    keyed = _default(FORWARD, "Ingress.forwarder.forward_drop")
    keyed.match.add(field_id=1).exact.value = b"\x01"
    prioritised = _default(FORWARD, "Ingress.forwarder.forward_drop")
    prioritised.priority = 1
    assert codes(rig, update(MODIFY, keyed), update(MODIFY, prioritised)) == [
        INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ]
    # A MODIFY with no action resets the default entry to the program's.
    assert codes(rig, update(MODIFY, default_of(FORWARD))) == [OK]
    (found,) = read(rig, default_of(FORWARD))
    assert found.table_entry == _default(FORWARD, "Ingress.forwarder.forward_drop")
    assert read(rig, table(FORWARD)) == []  # the default entry is no entry


# --------------------------------------------------------------------- multicast groups


def test_multicast_groups(rig: Any) -> None:
    assert codes(rig, insert(multicast_group_entry(5, [(0, 0), (0, 1)]))) == [OK]
    assert codes(rig, insert(multicast_group_entry(5, [(0, 2)]))) == [ALREADY_EXISTS]
    assert codes(rig, insert(multicast_group_entry(6, [(1, 0)]))) == [OK]
    assert groups(rig) == {5: [(0, 0), (0, 1)], 6: [(1, 0)]}
    assert codes(rig, modify(multicast_group_entry(5, [(0, 2)]))) == [OK]
    assert groups(rig, 5) == {5: [(0, 2)]}
    assert codes(rig, delete(multicast_group_entry(5, []))) == [OK]
    assert groups(rig) == {6: [(1, 0)]}
    assert groups(rig, 5) == {}
    assert codes(
        rig,
        delete(multicast_group_entry(5, [])),
        modify(multicast_group_entry(7, [(0, 0)])),
    ) == [NOT_FOUND, NOT_FOUND]


def test_multicast_group_errors(rig: Any) -> None:
    zero = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=0)
    twice = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=3)
    twice.replicas.add(egress_port=1, instance=1)
    twice.replicas.add(egress_port=1, instance=1)
    assert codes(rig, update(INSERT, zero), update(INSERT, twice)) == [
        INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ]
    assert groups(rig) == {}


def test_replicas_read_back_with_the_port_field_they_were_written_with(
    switch: Switch, rig: Any
) -> None:
    entry = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=4, metadata=b"job 7")
    entry.replicas.add(port=b"\x00\x02", instance=1)  # P4Runtime 1.4's bytes, padded
    entry.replicas.add(egress_port=3, instance=2)  # the deprecated uint32
    entry.replicas.add(egress_port=0, instance=3)
    assert codes(rig, update(INSERT, entry)) == [OK]
    (found,) = read(rig, group(4))
    stored = found.packet_replication_engine_entry.multicast_group_entry
    assert stored.metadata == b"job 7"
    assert [r.WhichOneof("port_kind") for r in stored.replicas] == ["port", *["egress_port"] * 2]
    assert [(r.port, r.egress_port, r.instance) for r in stored.replicas] == [
        (b"\x02", 0, 1),  # canonical, as every bytestring is read back
        (b"", 3, 2),
        (b"", 0, 3),
    ]
    pipeline = switch.server.pipeline
    assert switch.server.control.call(lambda: pipeline.group(4)) == ((2, 1), (3, 2), (0, 3))
    wide = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=5)
    wide.replicas.add(port=b"\x01\x00\x00\x00\x00", instance=1)  # an SDN port is 32 bits
    empty = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=6)
    empty.replicas.add(port=b"", instance=1)
    twice = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=7)
    twice.replicas.add(port=b"\x03", instance=2)
    twice.replicas.add(egress_port=3, instance=2)  # the same replica in the other form
    assert codes(rig, *(update(INSERT, g) for g in (wide, empty, twice))) == [INVALID_ARGUMENT] * 3
    assert list(groups(rig)) == [4]


# --------------------------------------------------------------------- registers


def registers(stub: Any, name: str, index: int | None = None) -> dict[int, int]:
    found = read(stub, register_entry(P4INFO, name, index))
    reg = P4INFO.register(name)
    assert all(e.register_entry.register_id == reg.id for e in found)
    return {
        int(e.register_entry.index.index): int.from_bytes(e.register_entry.data.bitstring, "big")
        for e in found
    }


def test_register_cells_are_modified_and_read(rig: Any) -> None:
    seq = "Ingress.seq"
    assert codes(rig, modify(register_entry(P4INFO, seq, 3, 0xDEADBEEF))) == [OK]
    assert registers(rig, seq, 3) == {3: 0xDEADBEEF}
    cells = registers(rig, seq)
    assert sorted(cells) == list(range(2 * SLOTS))
    assert cells == {i: 0xDEADBEEF if i == 3 else 0 for i in range(2 * SLOTS)}
    (raw,) = read(rig, register_entry(P4INFO, seq, 3))
    assert raw.register_entry.data.bitstring == b"\xde\xad\xbe\xef"
    (zero,) = read(rig, register_entry(P4INFO, seq, 4))
    assert zero.register_entry.data.bitstring == b"\x00"  # canonical zero


def test_signed_registers_keep_their_bits(rig: Any) -> None:
    exponent = "Ingress.exponents.exponent"  # bit<8> over the pipeline's int8 array
    assert registers(rig, exponent, 0) == {0: 0x80}  # EXPONENT_MIN, -128
    assert codes(rig, modify(register_entry(P4INFO, exponent, 0, 0xFF))) == [OK]
    assert registers(rig, exponent, 0) == {0: 0xFF}
    lane = "Ingress.values.lane_02"
    assert codes(rig, modify(register_entry(P4INFO, lane, 5, 0x80000001))) == [OK]
    assert registers(rig, lane, 5) == {5: 0x80000001}
    assert registers(rig, "Ingress.values.lane_01", 5) == {5: 0}


def test_register_without_index_writes_every_cell(rig: Any) -> None:
    name = "Ingress.bitmap.bitmap_set1"
    assert codes(rig, modify(register_entry(P4INFO, name, None, 0b101))) == [OK]
    assert registers(rig, name) == {i: 0b101 for i in range(SLOTS)}
    assert registers(rig, "Ingress.bitmap.bitmap_set0") == {i: 0 for i in range(SLOTS)}


def test_register_errors(rig: Any) -> None:
    seq = P4INFO.register("Ingress.seq")
    outside = p4runtime_pb2.RegisterEntry(register_id=seq.id)
    outside.index.index = 2 * SLOTS
    outside.data.bitstring = b"\x01"
    negative = p4runtime_pb2.RegisterEntry()
    negative.CopyFrom(outside)
    negative.index.index = -1
    wide = register_entry(P4INFO, seq.id, 0, 1)
    wide.data.bitstring = b"\x01\x00\x00\x00\x00"
    unknown = register_entry(P4INFO, seq.id, 0, 1)
    unknown.register_id = 0x16FFFFFF
    cell = register_entry(P4INFO, seq.id, 0, 1)
    assert codes(
        rig,
        update(MODIFY, outside),
        update(MODIFY, negative),
        update(MODIFY, wide),
        update(MODIFY, unknown),
        update(INSERT, cell),
        update(DELETE, cell),
    ) == [
        OUT_OF_RANGE,  # the index: the spec's RegisterEntry code, no disagreement there
        INVALID_ARGUMENT,
        INVALID_ARGUMENT,  # the value: see _uint
        NOT_FOUND,
        INVALID_ARGUMENT,
        INVALID_ARGUMENT,
    ]
    assert rpc_code(lambda: read(rig, outside)) == grpc.StatusCode.OUT_OF_RANGE
    assert rpc_code(lambda: read(rig, negative)) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(lambda: read(rig, unknown)) == grpc.StatusCode.NOT_FOUND
    assert registers(rig, "Ingress.seq") == {i: 0 for i in range(2 * SLOTS)}


def test_drop_probability_registers(rig: Any) -> None:
    name = "Ingress.drop_simulator.probability"
    assert codes(rig, modify(register_entry(P4INFO, name, 0, 2**30))) == [OK]
    assert registers(rig, name, 0) == {0: 2**30}
    assert registers(rig, "Egress.drop_simulator.probability", 0) == {0: 0}
    assert codes(rig, modify(register_entry(P4INFO, name, 0, 2**31 + 1))) == [OUT_OF_RANGE]
    assert codes(rig, modify(register_entry(P4INFO, name, 0, 0))) == [OK]


def test_wildcard_register_read_covers_every_register(rig: Any) -> None:
    found = read(rig, p4runtime_pb2.RegisterEntry())
    assert len(found) == sum(r.size for r in P4INFO.registers)


def test_large_reads_come_in_chunks(rig: Any) -> None:
    cells = sum(r.size for r in P4INFO.registers)
    request = p4runtime_pb2.ReadRequest(
        device_id=0, entities=[entity(p4runtime_pb2.RegisterEntry())] * 3
    )
    responses = list(rig.Read(request, timeout=TIMEOUT))
    assert len(responses) == -(-3 * cells // READ_CHUNK)
    assert all(len(r.entities) <= READ_CHUNK for r in responses)
    assert sum(len(r.entities) for r in responses) == 3 * cells


# --------------------------------------------------------------------- counters


def test_counters_read_by_index_and_wildcard(rig: Any) -> None:
    found = read(rig, counter_entry(P4INFO, "Ingress.ina_stats"))
    assert [e.counter_entry.index.index for e in found] == list(range(len(SWITCH_STATS)))
    assert all(e.counter_entry.data.packet_count == 0 for e in found)
    drops = read(rig, counter_entry(P4INFO, "Egress.drops", 10))
    assert [(e.counter_entry.index.index, e.counter_entry.data.packet_count) for e in drops] == [
        (10, 0)
    ]
    everything = read(rig, p4runtime_pb2.CounterEntry())
    assert len(everything) == sum(c.size for c in P4INFO.counters)
    outside = counter_entry(P4INFO, "Ingress.drops")
    outside.index.index = len(SWITCH_DROPS)
    assert rpc_code(lambda: read(rig, outside)) == grpc.StatusCode.OUT_OF_RANGE
    outside.index.index = -1
    assert rpc_code(lambda: read(rig, outside)) == grpc.StatusCode.INVALID_ARGUMENT
    unknown = p4runtime_pb2.CounterEntry(counter_id=0x12FFFFFF)
    assert rpc_code(lambda: read(rig, unknown)) == grpc.StatusCode.NOT_FOUND


def test_counters_count_real_packets(switch: Switch, rig: Any) -> None:
    with bound_udp_sockets(1, TIMEOUT) as (sock,):
        install_job(rig, 7, [sock.getsockname()])
        send_data(sock, switch.server.data_addr, 7, 0, 2, 1)
        header, values = receive_result(sock)
        assert (header.ptype, header.job_id, header.slot, header.seq) == (
            PacketType.RESULT,
            7,
            2,
            1,
        )
        assert values == list(range(LANES))
        send_data(sock, switch.server.data_addr, 8, 0, 0, 1)  # no such job
        # A Read may run before datagrams already queued on the switch's socket: wait for
        # the last one to be counted.
        eventually(rig, "Ingress.drops", SWITCH_DROPS.index("unknown_job"), 1)
        stats = {name: counter(rig, "Ingress.ina_stats", i) for i, name in enumerate(SWITCH_STATS)}
    assert stats == {
        "received": 2,
        "aggregated": 1,
        "completed": 1,
        "results_sent": 0,  # an egress statistic
        "retransmits_answered": 0,
        "duplicates_ignored": 0,
        "sent_upstream": 0,  # an egress statistic
        "upstream_resent": 0,
        "results_from_upstream": 0,
    }
    assert counter(rig, "Egress.ina_stats", SWITCH_STATS.index("results_sent")) == 1
    assert counter(rig, "Egress.ina_stats", SWITCH_STATS.index("received")) == 0
    assert counter(rig, "Ingress.drops", SWITCH_DROPS.index("unknown_job")) == 1


def counter_cell(name: str, index: int | None, count: int | None) -> Any:
    """A CounterEntry write: cell ``index`` (None: every cell) set to ``count`` packets
    (None: no data)."""
    entry = counter_entry(P4INFO, name, index)
    if count is not None:
        entry.data.packet_count = count
    return entry


def test_counter_cells_are_set_and_reset(switch: Switch, rig: Any) -> None:
    received = SWITCH_STATS.index("received")
    assert codes(rig, modify(counter_cell("Ingress.ina_stats", received, 41))) == [OK]
    assert counter(rig, "Ingress.ina_stats", received) == 41
    with bound_udp_sockets(1, TIMEOUT) as (sock,):
        sock.sendto(b"\x00", switch.server.data_addr)  # a runt: received, then dropped
        eventually(rig, "Ingress.ina_stats", received, 42)  # counting goes on from 41
    truncated = SWITCH_DROPS.index("truncated")
    assert counter(rig, "Ingress.drops", truncated) == 1
    assert codes(rig, modify(counter_cell("Ingress.ina_stats", received, None))) == [OK]
    assert counter(rig, "Ingress.ina_stats", received) == 42  # no data: no change
    # Without an index every cell is set: the usual reset of a whole counter.
    assert codes(rig, modify(counter_cell("Ingress.ina_stats", None, 0))) == [OK]
    assert codes(rig, modify(counter_cell("Ingress.drops", None, 0))) == [OK]
    everything = read(rig, p4runtime_pb2.CounterEntry())
    assert len(everything) == sum(c.size for c in P4INFO.counters)
    assert all(e.counter_entry.data.packet_count == 0 for e in everything)


def test_counter_write_errors(rig: Any) -> None:
    cell = counter_cell("Ingress.ina_stats", 1, 5)
    outside = counter_cell("Ingress.ina_stats", 1, 5)
    outside.index.index = len(SWITCH_STATS)
    negative_index = counter_cell("Ingress.ina_stats", 1, 5)
    negative_index.index.index = -1
    unknown = counter_cell("Ingress.ina_stats", 1, 5)
    unknown.counter_id = 0x12FFFFFF
    negative = counter_cell("Ingress.ina_stats", 1, -1)
    # Ingress.ina_stats[results_sent] is counted by the egress pipe: here it is always 0.
    egress_cell = counter_cell("Ingress.ina_stats", SWITCH_STATS.index("results_sent"), 5)
    every_cell = counter_cell("Ingress.ina_stats", None, 5)
    assert codes(
        rig,
        update(INSERT, cell),
        update(DELETE, cell),
        update(MODIFY, outside),
        update(MODIFY, negative_index),
        update(MODIFY, unknown),
        update(MODIFY, negative),
        update(MODIFY, egress_cell),
        update(MODIFY, every_cell),
    ) == [
        INVALID_ARGUMENT,  # the spec: counter cells are only modified
        INVALID_ARGUMENT,
        OUT_OF_RANGE,
        INVALID_ARGUMENT,
        NOT_FOUND,
        INVALID_ARGUMENT,
        UNIMPLEMENTED,
        UNIMPLEMENTED,  # all or nothing: no cell was set
    ]
    cells = read(rig, counter_cell("Ingress.ina_stats", None, None))
    assert all(e.counter_entry.data.packet_count == 0 for e in cells)
    egress_cell.data.packet_count = 0
    assert codes(rig, update(MODIFY, egress_cell)) == [OK]  # 0 is what it holds


@pytest.mark.ebpf
@pytest.mark.root
def test_counter_writes_reach_the_ebpf_maps() -> None:
    from emulation.softswitch.ebpf.dataplane import EbpfDataplane

    dataplane = EbpfDataplane(LANES, SLOTS)
    try:
        server, port = serve_p4runtime(SoftSwitchP4Runtime(dataplane, P4INFO), "127.0.0.1:0")
        try:
            with (
                P4RuntimeClient(f"127.0.0.1:{port}", 0, (0, 1), TIMEOUT),
                grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
            ):
                stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
                aggregated = SWITCH_STATS.index("aggregated")
                cell = counter_cell("Ingress.ina_stats", aggregated, 2**40)
                assert codes(stub, modify(cell)) == [OK]
                assert counter(stub, "Ingress.ina_stats", aggregated) == 2**40
                assert dataplane.counters()["aggregated"] == 2**40  # the per-CPU sum
                assert codes(stub, modify(counter_cell("Ingress.ina_stats", None, 0))) == [OK]
                assert dataplane.counters()["aggregated"] == 0
        finally:
            server.stop(grace=None).wait()
    finally:
        dataplane.close()


# --------------------------------------------------------------------- the data path


def test_writes_drive_the_data_path(switch: Switch, rig: Any) -> None:
    to = switch.server.data_addr
    with bound_udp_sockets(2, TIMEOUT) as socks:
        addrs = [s.getsockname() for s in socks]
        install_job(rig, 9, addrs, mgid=3)
        for rank, sock in enumerate(socks):
            send_data(sock, to, 9, rank, 0, 1)
        for sock in socks:
            header, values = receive_result(sock)
            assert (header.ptype, header.job_id, header.slot) == (PacketType.RESULT, 9, 0)
            assert header.exponent == 1  # the max of the ranks' exponents
            assert values == [3 * v for v in range(LANES)]  # (1 + 2) x lane
        # Rank 1 unbound: its next packet is a bad source.
        assert codes(rig, delete(worker(9, 1, addrs[1]))) == [OK]
        send_data(socks[1], to, 9, 1, 1, 2)
        bad_source = SWITCH_DROPS.index("bad_source")
        eventually(rig, "Ingress.drops", bad_source, 1)
        # Rank 0 alone cannot finish slot 1, and rank 1 hears nothing.
        send_data(socks[0], to, 9, 0, 1, 2)
        eventually(rig, "Ingress.ina_stats", SWITCH_STATS.index("aggregated"), 3)
        socks[1].settimeout(0.1)
        with pytest.raises(TimeoutError):
            socks[1].recv(4096)


def test_deleting_the_group_stops_the_results(switch: Switch, rig: Any) -> None:
    to = switch.server.data_addr
    with bound_udp_sockets(1, TIMEOUT) as (sock,):
        install_job(rig, 9, [sock.getsockname()], mgid=3)
        assert codes(rig, delete(multicast_group_entry(3, []))) == [OK]
        send_data(sock, to, 9, 0, 0, 1)
        eventually(rig, "Ingress.ina_stats", SWITCH_STATS.index("completed"), 1)
        assert counter(rig, "Egress.ina_stats", SWITCH_STATS.index("results_sent")) == 0
        assert codes(rig, insert(multicast_group_entry(3, [(0, 0)]))) == [OK]
        send_data(sock, to, 9, 0, 1, 1)
        assert receive_result(sock)[0].slot == 1


# --------------------------------------------------------------------- the upstream table


def test_upstream_entries_insert_modify_delete_and_read_back(rig: Any) -> None:
    spine = ("10.0.9.1", 20033)
    assert codes(rig, insert(upstream(7, 1, spine, 0x020000000009, 3))) == [OK]
    assert codes(rig, insert(upstream(7, 2, spine))) == [ALREADY_EXISTS]
    assert codes(rig, modify(upstream(8, 1, spine))) == [NOT_FOUND]
    assert [e.table_entry for e in read(rig, table(UPSTREAM))] == [
        upstream(7, 1, spine, 0x020000000009, 3)
    ]
    assert codes(rig, modify(upstream(7, 4, ("10.0.9.2", 9)))) == [OK]
    (found,) = read(rig, table(UPSTREAM))
    assert found.table_entry == upstream(7, 4, ("10.0.9.2", 9))
    assert [p.value for p in found.table_entry.action.action.params] == [
        b"\x04",
        bytes([10, 0, 9, 2]),
        b"\x09",
        b"\x00",
        b"\x00",
    ]  # canonical bytestrings
    assert codes(rig, delete(upstream(7, 0, spine))) == [OK]
    assert codes(rig, delete(upstream(7, 0, spine))) == [NOT_FOUND]
    assert read(rig, table(UPSTREAM)) == []


def test_malformed_upstream_entries_are_refused(rig: Any) -> None:
    spine = ("10.0.9.1", 20033)
    wide_rank = upstream(7, 0, spine)
    wide_rank.action.action.params[0].value = b"\x01\x00"  # 256 in bit<8>
    wide_port = upstream(7, 0, spine)
    wide_port.action.action.params[4].value = b"\x02\x00"  # 512 in bit<9>
    missing = upstream(7, 0, spine)
    del missing.action.action.params[2]
    miss = upstream(7, 0, spine)
    miss.action.action.ClearField("params")
    miss.action.action.action_id = action_id("Ingress.upstream.upstream_miss")
    default = _default(UPSTREAM, SET_UPSTREAM)
    assert codes(
        rig,
        update(INSERT, wide_rank),
        update(INSERT, wide_port),
        update(INSERT, missing),
        update(INSERT, miss),
        update(MODIFY, default),
    ) == [*[INVALID_ARGUMENT] * 3, PERMISSION_DENIED, PERMISSION_DENIED]
    assert read(rig, table(UPSTREAM)) == []


def test_upstream_writes_drive_the_data_path(switch: Switch, rig: Any) -> None:
    to = switch.server.data_addr
    with bound_udp_sockets(3, TIMEOUT) as (*socks, spine):
        install_job(rig, 9, [s.getsockname() for s in socks], mgid=3)
        assert codes(rig, insert(upstream(9, 5, spine.getsockname()))) == [OK]
        for rank, sock in enumerate(socks):
            send_data(sock, to, 9, rank, 0, 1)
        data, src = spine.recvfrom(4096)
        assert src == to  # the partial comes from the switch's own socket
        header = unpack_header(data)
        assert (header.ptype, header.job_id, header.rank, header.seq) == (PacketType.DATA, 9, 5, 1)
        assert np.frombuffer(data, ">i4", offset=HEADER_SIZE).tolist() == [
            3 * v for v in range(LANES)
        ]
        eventually(rig, "Egress.ina_stats", SWITCH_STATS.index("sent_upstream"), 1)
        # The spine's answer: stored (final) and multicast to both workers.
        reply = pack_header(Header(PacketType.RESULT, 9, 0, 0, 0, 1, LANES, 3))
        spine.sendto(reply + (np.arange(LANES) * 100).astype(">i4").tobytes(), to)
        for sock in socks:
            header, values = receive_result(sock)
            assert (header.ptype, header.seq, header.exponent) == (PacketType.RESULT, 1, 3)
            assert values == [100 * v for v in range(LANES)]
        assert counter(rig, "Ingress.ina_stats", SWITCH_STATS.index("results_from_upstream")) == 1
        assert registers(rig, "Ingress.final", 0) == {0: 1}
        assert registers(rig, "Ingress.values.lane_01", 0) == {0: 100}
        # Without the entry the job is flat again: a RESULT is malformed, slots multicast.
        assert codes(rig, delete(upstream(9, 5, spine.getsockname()))) == [OK]
        spine.sendto(reply + bytes(4 * LANES), to)
        eventually(rig, "Ingress.drops", SWITCH_DROPS.index("malformed"), 1)
        for rank, sock in enumerate(socks):
            send_data(sock, to, 9, rank, 1, 2)
        for sock in socks:
            assert receive_result(sock)[0].slot == 1


def test_the_final_register_is_read_and_written(rig: Any) -> None:
    name = "Ingress.final"
    assert registers(rig, name) == {i: 0 for i in range(2 * SLOTS)}
    assert codes(rig, modify(register_entry(P4INFO, name, 5, 1))) == [OK]
    assert registers(rig, name, 5) == {5: 1}
    wide = register_entry(P4INFO, name, 5, 1)
    wide.data.bitstring = b"\x02"  # bit<1>
    assert codes(rig, update(MODIFY, wide)) == [INVALID_ARGUMENT]
    assert registers(rig, name, 5) == {5: 1}


# --------------------------------------------------------------------- pipeline config


def _set_pipeline(stub: Any, p4info: P4Info, action: Any, cookie: int = 0) -> None:
    request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
        device_id=0, election_id=uint128(1), action=action
    )
    request.config.p4info.CopyFrom(p4info.message)
    request.config.cookie.cookie = cookie
    stub.SetForwardingPipelineConfig(request, timeout=TIMEOUT)


ACTIONS = p4runtime_pb2.SetForwardingPipelineConfigRequest


def test_get_pipeline_returns_the_sized_p4info(client: P4RuntimeClient) -> None:
    p4info = client.get_pipeline()
    assert p4info.message == P4INFO.message
    lanes = [r for r in p4info.registers if r.name.startswith("Ingress.values.lane_")]
    assert len(lanes) == LANES
    assert {r.size for r in lanes} == {2 * SLOTS}
    assert p4info.register("Ingress.bitmap.bitmap_set0").size == SLOTS
    assert p4info.register("Ingress.seq").size == 2 * SLOTS
    assert p4info.register("Ingress.final").size == 2 * SLOTS


def test_verify_refuses_another_p4info(rig: Any) -> None:
    assert codes(rig, insert(job(7))) == [OK]
    for other in (P4Info.load(), softswitch_p4info(P4Info.load(), LANES + 1, SLOTS)):
        for action in (ACTIONS.VERIFY, ACTIONS.VERIFY_AND_COMMIT):
            with pytest.raises(grpc.RpcError) as caught:
                _set_pipeline(rig, other, action)
            assert isinstance(caught.value, grpc.Call)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    broken = P4Info(P4INFO.message.__deepcopy__())
    broken.message.tables.add().CopyFrom(broken.message.tables[0])  # two tables, one id
    with pytest.raises(grpc.RpcError) as caught:
        _set_pipeline(rig, broken, ACTIONS.VERIFY)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _set_pipeline(rig, P4INFO, ACTIONS.VERIFY)  # the same P4Info verifies, changes nothing
    assert len(read(rig, table(JOBS))) == 1


def test_commit_resets_the_switch(switch: Switch, client: P4RuntimeClient, rig: Any) -> None:
    with bound_udp_sockets(1, TIMEOUT) as (sock,):
        install_job(rig, 7, [sock.getsockname()])
        send_data(sock, switch.server.data_addr, 7, 0, 0, 1)
        receive_result(sock)
    forward = table_entry(
        P4INFO, FORWARD, {"eth_dst": "02:00:00:00:00:01"}, "Ingress.forwarder.flood", {"mgid": 1}
    )
    port3 = _default(FORWARD, "Ingress.forwarder.set_egress_port", port=b"\x03")
    assert codes(rig, insert(forward), update(MODIFY, port3)) == [OK, OK]
    assert codes(rig, modify(register_entry(P4INFO, "Ingress.seq", 1, 5))) == [OK]
    _set_pipeline(rig, P4INFO, ACTIONS.VERIFY_AND_COMMIT, cookie=42)
    assert read(rig, p4runtime_pb2.TableEntry()) == []
    assert groups(rig) == {}
    assert counter(rig, "Ingress.ina_stats", 0) == 0
    assert registers(rig, "Ingress.seq", 1) == {1: 0}
    (default,) = read(rig, default_of(FORWARD))
    assert default.table_entry == _default(FORWARD, "Ingress.forwarder.forward_drop")
    get = p4runtime_pb2.GetForwardingPipelineConfigRequest(
        device_id=0, response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY
    )
    config = rig.GetForwardingPipelineConfig(get, timeout=TIMEOUT).config
    assert config.cookie.cookie == 42
    assert not config.HasField("p4info")
    client.set_pipeline(P4INFO)  # the client library's VERIFY_AND_COMMIT
    assert client.is_primary  # mastership survives a new pipeline
    install_job(rig, 7, [("127.0.0.1", 5000)])


# --------------------------------------------------------------------- bmv2, the reference


@pytest.mark.bmv2
@pytest.mark.slow
def test_bmv2_answers_as_the_soft_switch(tmp_path: Path, rig: Any) -> None:
    """simple_switch_grpc asked the same questions: a value too wide for its field is
    INVALID_ARGUMENT, a counter MODIFY sets the cell, and replicas read back with the
    port field they were written with."""
    from emulation.bmv2 import Bmv2Process

    wide_job = job(9)
    wide_job.match[0].exact.value = b"\x01\x00\x00"  # 65536 in bit<16>
    wide_port = replica(1, 0, ("10.0.0.1", 4000))
    wide_port.match[2].exact.value = b"\x02\x00"  # 512 in bit<9>
    received = SWITCH_STATS.index("received")
    mixed = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=4)
    mixed.replicas.add(port=b"\x02", instance=1)
    mixed.replicas.add(egress_port=3, instance=2)
    with (
        Bmv2Process(tmp_path, name="s1") as bmv2,
        bmv2.controller(election_id=(0, 1)),  # pushes the program, holds mastership
        grpc.insecure_channel(bmv2.p4runtime_address) as channel,
    ):
        reference = p4runtime_pb2_grpc.P4RuntimeStub(channel)
        for stub, strict in ((rig, True), (reference, False)):
            wide = [update(INSERT, wide_job), update(INSERT, wide_port)]
            assert codes(stub, *wide, strict=strict) == [INVALID_ARGUMENT] * 2
            cell = counter_cell("Ingress.ina_stats", received, 7)
            assert codes(stub, modify(cell), strict=strict) == [OK]
            assert counter(stub, "Ingress.ina_stats", received) == 7
            assert codes(stub, update(INSERT, mixed), strict=strict) == [OK]
            (found,) = read(stub, group(4))
            replicas = found.packet_replication_engine_entry.multicast_group_entry.replicas
            # (The spec leaves the order of repeated fields free; bmv2 reorders them.)
            kinds = sorted((r.instance, r.WhichOneof("port_kind")) for r in replicas)
            assert kinds == [(1, "port"), (2, "egress_port")]


# --------------------------------------------------------------------- capabilities and process


def test_capabilities_reports_the_api_version(stub: Any) -> None:
    response = stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=TIMEOUT)
    assert response.p4runtime_api_version == API_VERSION
    major, _, _ = (int(part) for part in API_VERSION.split("."))
    assert major == 1


def test_switch_process_serves_p4runtime(tmp_path: Path) -> None:
    with (
        SoftSwitchProcess(tmp_path, lanes=2, slots=8) as process,
        P4RuntimeClient(process.p4runtime_address, process.device_id, (0, 1), TIMEOUT) as c,
    ):
        assert c.is_primary
        assert c.get_pipeline().message == softswitch_p4info(P4Info.load(), 2, 8).message
        c.write([insert(job(3, slot_count=8))])
        assert [e.table_entry for e in c.read([entity(table(JOBS))])] == [job(3, slot_count=8)]
    assert process.returncode == 0, (tmp_path / "switch.log").read_text()
