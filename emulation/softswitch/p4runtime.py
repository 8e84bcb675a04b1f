"""The soft switch's P4Runtime server: the same control interface as bmv2's, for ``p4/``.

The server speaks P4Runtime 1.x over gRPC for the P4Info of ``p4/ina.p4`` (sized to the
switch's lanes and slots, see :func:`softswitch_p4info`), so ``inalab ctl``, the
controller library and p4runtime-shell drive the soft switch and ``simple_switch_grpc``
alike. What it serves (docs/p4runtime.md lists where it and bmv2 differ):

- StreamChannel arbitration for one device and the default role: the primary answers
  OK, every other stream ALREADY_EXISTS (NOT_FOUND while there is none), every stream
  hears of a change of primary, two streams may not share an election id
  (INVALID_ARGUMENT). Who is primary follows one of two rules (``arbitration``): by
  default the spec's, the highest id ever seen (``election_id_past``), so when the
  primary leaves nobody is primary until a controller arbitrates with at least that
  id; or bmv2's, the highest live election id, so a backup takes over. Only the
  primary may Write or set the pipeline (PERMISSION_DENIED); anyone may Read. A role
  name is NOT_FOUND (the switch has no roles), in Write and SetForwardingPipelineConfig
  too; Read's role filters by role, so a named role reads nothing.
- Write (CONTINUE_ON_ERROR) and Read of the five tables' entries, multicast group
  entries (the PRE; each replica reads back with the port field it was written with),
  register cells (modify and read, index or wildcard) and counters (read, and modify:
  setting or resetting cells). Every table write is checked against the P4Info as a
  P4Runtime server must: unknown ids NOT_FOUND, a missing/duplicate/non-exact match
  field, a priority, ``is_const``, a wrong action or parameter INVALID_ARGUMENT, an
  empty value or one wider than its field INVALID_ARGUMENT (as bmv2; see
  :func:`.p4rt_p4info._uint`), a duplicate insert ALREADY_EXISTS, a modify/delete of nothing
  NOT_FOUND, a const default action or an action outside its scope (@defaultonly in an
  entry) PERMISSION_DENIED. A failed Write ends with UNKNOWN and one
  ``p4.v1.Error`` per update in the status details (the spec's batch report); entries
  are stored with canonical bytestrings and read back so.
- Get/SetForwardingPipelineConfig and Capabilities. The program is built in: a pushed
  P4Info must name the same objects with the same sizes; committing it resets the
  switch's state, as loading a program into bmv2 does.

Each accepted write is also applied to the :class:`Pipeline`: the jobs, workers,
upstream and replicas tables and the multicast groups are the pipeline's table API;
forwarding entries are stored and read back but move no packet (on loopback the kernel
routes non-INA traffic; the Mininet switch will use them). All pipeline access runs
through ``run``, the data-plane thread's executor, so a packet never sees half a write.

This module is the gRPC service and its server (:class:`SoftSwitchP4Runtime`,
:func:`serve_p4runtime`) and the public face of its parts, whose public names it
re-exports: ``p4rt_p4info`` (the P4Info, the refusal, value codecs), ``p4rt_tables``
(table state and what a table write does to the pipeline: a new table's binding goes
there), ``p4rt_registers`` (register cells and counters), ``p4rt_entities`` (Write and
Read checked against the P4Info) and ``p4rt_arbitration`` (who is primary).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4info import P4Info, P4InfoError
from emulation.softswitch.p4rt_arbitration import (
    ARBITRATIONS,
    MAX_STREAMS,
    _Arbitration,
    _no_role,
)
from emulation.softswitch.p4rt_entities import _Entities
from emulation.softswitch.p4rt_p4info import _Failure, softswitch_p4info
from emulation.softswitch.p4rt_p4info import is_tofino as is_tofino

# tests/unit/test_p4_sources.py holds _EGRESS_STATS to configuration.p4 by this name.
from emulation.softswitch.p4rt_registers import _EGRESS_STATS as _EGRESS_STATS
from emulation.softswitch.pipeline import Pipeline

__all__ = [
    "API_VERSION",
    "ARBITRATIONS",
    "MAX_STREAMS",
    "READ_CHUNK",
    "SoftSwitchP4Runtime",
    "serve_p4runtime",
    "softswitch_p4info",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Runner = Callable[[Callable[[], T]], T]

API_VERSION = "1.4.1"
"""The P4Runtime API version of the ``p4runtime`` protos this server is built on."""

READ_CHUNK = 512
"""Entities per ReadResponse: bounds a response far below gRPC's 4 MiB default limit."""


# --------------------------------------------------------------------- failures


@dataclass(frozen=True)
class _Status(grpc.Status):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...] = ()


def _rpc_code(code: grpc.StatusCode) -> int:
    return int(code.value[0])


def _error_detail(failure: _Failure | None) -> any_pb2.Any:
    error = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
    if failure is not None:
        error = p4runtime_pb2.Error(
            canonical_code=_rpc_code(failure.code), message=failure.message, space="inalab"
        )
    detail = any_pb2.Any()
    detail.Pack(error)
    return detail


# --------------------------------------------------------------------- the service


def _direct(fn: Callable[[], T]) -> T:
    return fn()


class SoftSwitchP4Runtime(p4runtime_pb2_grpc.P4RuntimeServicer):
    """The P4Runtime service of one soft switch.

    Args:
        pipeline: the data plane it configures; no job may be installed yet (state the
            server did not write would be invisible to reads).
        p4info: the pipeline's P4Info (:func:`softswitch_p4info`).
        device_id: the P4Runtime device id requests must name.
        run: executes a callable on the thread that owns ``pipeline`` and returns its
            result (:class:`emulation.softswitch.server.SwitchServer` passes its control
            queue); by default, directly.
        arbitration: who is primary, one of :data:`ARBITRATIONS`: ``"spec"`` (the
            default: P4Runtime's ``election_id_past`` rule) or ``"bmv2"`` (the highest
            live election id, as simple_switch_grpc).

    Raises:
        ValueError: the pipeline already has jobs, or an unknown ``arbitration``.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        p4info: P4Info,
        device_id: int = 0,
        run: Runner[Any] = _direct,
        arbitration: str = "spec",
    ) -> None:
        if pipeline.jobs():
            raise ValueError("the pipeline has jobs the P4Runtime server did not write")
        self.pipeline = pipeline
        self.p4info = p4info
        self.device_id = device_id
        self._run = run
        self._entities = _Entities(pipeline, p4info)
        self._arbitration = _Arbitration(device_id, arbitration)
        self._cookie = 0

    # ---------------------------------------------------------------- helpers
    def _device(self, device_id: int, context: Any) -> None:
        if device_id != self.device_id:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no device {device_id}")

    def _writer(self, request: Any, context: Any) -> None:
        """The spec's checks before a Write or SetForwardingPipelineConfig, in order:
        device and role (NOT_FOUND), then mastership (PERMISSION_DENIED)."""
        self._device(request.device_id, context)
        if request.role:
            context.abort(grpc.StatusCode.NOT_FOUND, _no_role(request.role))
        election = self._arbitration.election_of(request)
        if not self._arbitration.is_primary(election):
            shown = "unset" if election is None else election
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"election id {shown} is not the primary's"
            )

    # ---------------------------------------------------------------- RPCs
    def Capabilities(self, request: Any, context: Any) -> Any:
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def Write(self, request: Any, context: Any) -> Any:
        self._writer(request, context)
        if request.atomicity != p4runtime_pb2.WriteRequest.CONTINUE_ON_ERROR:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "only CONTINUE_ON_ERROR atomicity")
        updates = list(request.updates)
        entities = self._entities
        results: list[_Failure | None] = self._run(lambda: [entities.apply(u) for u in updates])
        failed = [f for f in results if f is not None]
        if failed:
            for index, failure in enumerate(results):
                if failure is not None:
                    log.info("write update %d refused: %s", index, failure.message)
            status = status_pb2.Status(
                code=code_pb2.UNKNOWN,
                message=f"{len(failed)} of {len(results)} updates failed: {failed[0].message}",
                details=[_error_detail(f) for f in results],
            )
            context.abort_with_status(
                _Status(
                    grpc.StatusCode.UNKNOWN,
                    status.message,
                    (("grpc-status-details-bin", status.SerializeToString()),),
                )
            )
        return p4runtime_pb2.WriteResponse()

    def Read(self, request: Any, context: Any) -> Iterator[Any]:
        self._device(request.device_id, context)
        if request.role:  # the spec: a filter by the entities' role; all are the default's
            return
        entities, wanted = self._entities, list(request.entities)

        def read() -> list[Any]:
            # One run on the data-plane thread: the entities of a request are a snapshot
            # (counters read together agree with each other).
            return [found for want in wanted for found in entities.read(want)]

        try:
            found: list[Any] = self._run(read)
        except _Failure as failure:
            context.abort(failure.code, failure.message)
        for start in range(0, len(found), READ_CHUNK):
            yield p4runtime_pb2.ReadResponse(entities=found[start : start + READ_CHUNK])

    def SetForwardingPipelineConfig(self, request: Any, context: Any) -> Any:
        self._writer(request, context)
        action = request.action
        actions = p4runtime_pb2.SetForwardingPipelineConfigRequest
        if action not in (actions.VERIFY, actions.VERIFY_AND_COMMIT, actions.COMMIT):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "VERIFY, VERIFY_AND_COMMIT or COMMIT")
        if action != actions.COMMIT:
            problem = _incompatible(self.p4info, request.config.p4info)
            if problem:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the soft switch runs the INA program built in; the P4Info differs: {problem}",
                )
        if action != actions.VERIFY:
            self._run(self._reset)
            self._cookie = request.config.cookie.cookie
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _reset(self) -> None:
        self.pipeline.reset()
        self._entities = _Entities(self.pipeline, self.p4info)

    def GetForwardingPipelineConfig(self, request: Any, context: Any) -> Any:
        self._device(request.device_id, context)
        config = p4runtime_pb2.ForwardingPipelineConfig()
        config.cookie.cookie = self._cookie
        kinds = p4runtime_pb2.GetForwardingPipelineConfigRequest
        if request.response_type in (kinds.ALL, kinds.P4INFO_AND_COOKIE):
            config.p4info.CopyFrom(self.p4info.message)
        return p4runtime_pb2.GetForwardingPipelineConfigResponse(config=config)

    def StreamChannel(self, request_iterator: Any, context: Any) -> Iterator[Any]:
        try:
            key, stream = self._arbitration.open()
        except _Failure as failure:
            context.abort(failure.code, failure.message)
        done = object()

        def read_requests() -> None:
            try:
                for request in request_iterator:
                    which = request.WhichOneof("update")
                    if which == "arbitration":
                        self._arbitration.update(key, request.arbitration)
                    else:
                        error = p4runtime_pb2.StreamError(
                            canonical_code=code_pb2.UNIMPLEMENTED,
                            message=f"stream message {which} is not supported",
                        )
                        stream.responses.put(p4runtime_pb2.StreamMessageResponse(error=error))
            except _Failure as failure:
                stream.responses.put(failure)
            except grpc.RpcError:
                pass  # the client went away; the stream ends below
            stream.responses.put(done)

        reader = threading.Thread(target=read_requests, name="p4rt-stream", daemon=True)
        context.add_callback(lambda: stream.responses.put(done))
        reader.start()
        try:
            while True:
                item = stream.responses.get()
                if item is done:
                    return
                if isinstance(item, _Failure):
                    context.abort(item.code, item.message)
                yield item
        finally:
            self._arbitration.close(key)


def _incompatible(ours: P4Info, theirs: Any) -> str:
    """What a pushed P4Info changes in the objects this switch implements ('' if nothing)."""
    try:
        other = P4Info(theirs)
    except P4InfoError as exc:  # two objects sharing an id or name, an unsupported register
        return str(exc)
    for kind in ("tables", "actions", "counters", "registers"):
        mine = {o.id: o for o in getattr(ours, kind)}
        pushed = {o.id: o for o in getattr(other, kind)}
        if set(mine) != set(pushed):
            diff = sorted(set(mine) ^ set(pushed))
            return f"{kind} ids differ ({', '.join(hex(i) for i in diff[:4])})"
        for oid, obj in mine.items():
            if obj.name != pushed[oid].name or getattr(obj, "size", 0) != getattr(
                pushed[oid], "size", 0
            ):
                return f"{kind} {obj.name} differs"
    return ""


def serve_p4runtime(
    service: SoftSwitchP4Runtime, address: str, max_workers: int = MAX_STREAMS + 4
) -> tuple[grpc.Server, int]:
    """Start a gRPC server for ``service`` on ``address`` (``host:port``; port 0 picks one).

    gRPC's Python server gives each open StreamChannel a thread for its life: with
    ``max_workers`` above :data:`MAX_STREAMS`, Reads and Writes always find one. Port
    reuse is off (gRPC sets SO_REUSEPORT by default on Linux, which let a second switch
    listen on the same port and controllers reach either at random): a port another
    process listens on is refused.

    Returns:
        the started server and its bound port.

    Raises:
        OSError: the address cannot be bound (in use, not local, not an address).
    """
    from concurrent.futures import ThreadPoolExecutor

    # gRPC's own refusal says only "Failed to bind" and logs a line of its own: a plain
    # bind first names the reason, e.g. "Address already in use".
    problem = _bind_problem(address)
    if problem:
        raise OSError(f"cannot bind P4Runtime server to {address}: {problem}")
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="p4rt"),
        options=[("grpc.so_reuseport", 0)],
    )
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(service, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot bind P4Runtime server to {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot bind P4Runtime server to {address}")
    server.start()
    return server, port


def _bind_problem(address: str) -> str:
    """Why a TCP listener cannot bind ``host:port`` now ('' if it can, or if gRPC is left
    to judge: port 0, a name that does not resolve here)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return ""
    try:
        found = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ""
    for family, kind, proto, _, sockaddr in found:
        with socket.socket(family, kind, proto) as probe:
            # As gRPC's listener: connections left in TIME_WAIT are no conflict.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                return f"{exc.strerror or exc} (another switch on this port?)"
    return ""
