"""Controller layer: the P4Runtime transport to one switch, and its error translation.

One :class:`P4RuntimeClient` per switch (there is no module-level client): it opens the
gRPC channel, holds the ``StreamChannel`` open for mastership, and sends Write, Read and
pipeline requests stamped with its device and election id. A failed RPC is raised as a
:class:`P4RuntimeError` subclass chosen by status code, carrying the per-update
``p4.v1.Error`` details a Write failure brings in its ``google.rpc.Status``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4info import P4Info
from controller.tls import TlsFiles, explain_refusal, grpc_channel, require_tls

__all__ = [
    "AlreadyExistsError",
    "InvalidArgumentError",
    "NotFoundError",
    "NotPrimaryError",
    "P4RuntimeClient",
    "P4RuntimeError",
    "PermissionDeniedError",
    "SwitchUnreachableError",
    "UpdateError",
]

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
_CODES = {code.value[0]: code for code in grpc.StatusCode}


@dataclass(frozen=True)
class UpdateError:
    """Why one update of a Write failed."""

    index: int
    """Position of the update in the request."""
    code: grpc.StatusCode
    message: str
    update: Any
    """The ``p4.v1.Update`` that failed (None if the server sent more errors than updates)."""


class P4RuntimeError(Exception):
    """A P4Runtime RPC that failed, with the switch's status code and message.

    Attributes:
        code: the gRPC status code of the RPC (``UNKNOWN`` for a Write whose updates
            failed one by one: the reason is then in ``details``).
        message: the status message.
        details: one entry per failed update of a Write; empty otherwise.
    """

    def __init__(self, code: grpc.StatusCode, message: str, details: Sequence[UpdateError] = ()):
        self.code = code
        self.message = message
        self.details = list(details)
        lines = [f"{code.name}: {message}"]
        lines += [f"  update {d.index}: {d.code.name}: {d.message}" for d in self.details]
        super().__init__("\n".join(lines))


class PermissionDeniedError(P4RuntimeError):
    """An update the switch forbids (a const default action, an action out of its scope)."""


class NotPrimaryError(PermissionDeniedError):
    """The client is not the primary controller, so the switch refuses its writes."""


class AlreadyExistsError(P4RuntimeError):
    """An inserted entry exists already."""


class NotFoundError(P4RuntimeError):
    """A modified, deleted or read entry does not exist."""


class InvalidArgumentError(P4RuntimeError):
    """The switch rejected a malformed request (ids, widths, missing fields)."""


class SwitchUnreachableError(P4RuntimeError):
    """No switch answered at the address within the timeout, or the connection broke."""


_CLASSES: dict[grpc.StatusCode, type[P4RuntimeError]] = {
    grpc.StatusCode.PERMISSION_DENIED: NotPrimaryError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.UNAVAILABLE: SwitchUnreachableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: SwitchUnreachableError,
}


def _update_errors(status: Any, updates: Sequence[Any]) -> list[UpdateError]:
    """The failed updates in a Write's ``google.rpc.Status`` (one p4.v1.Error per update)."""
    errors = []
    for index, detail in enumerate(status.details):
        error = p4runtime_pb2.Error()
        if not detail.Unpack(error) or error.canonical_code == code_pb2.OK:
            continue
        update = updates[index] if index < len(updates) else None
        code = _CODES.get(error.canonical_code, grpc.StatusCode.UNKNOWN)
        errors.append(UpdateError(index, code, error.message, update))
    return errors


def _status_of(error: grpc.RpcError) -> Any:
    """The ``google.rpc.Status`` in the trailing metadata of ``error``, if any."""
    trailers = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    for key, value in trailers or ():
        if key == _STATUS_DETAILS_KEY:
            status = status_pb2.Status()
            status.ParseFromString(value)
            return status
    return None


def _translate(error: grpc.RpcError, updates: Sequence[Any] = ()) -> P4RuntimeError:
    """The :class:`P4RuntimeError` for a failed RPC.

    The class follows the status code; a Write failing as UNKNOWN whose failed updates all
    share one code (P4Runtime's way of reporting a batch) takes the class of that code.
    """
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    message = (error.details() if isinstance(error, grpc.Call) else None) or str(error)
    status = _status_of(error)
    details = _update_errors(status, updates) if status is not None else []
    if code == grpc.StatusCode.UNKNOWN and len({d.code for d in details}) == 1:
        # PERMISSION_DENIED of an update is about the update; only the whole RPC's is
        # about mastership (NotPrimaryError).
        per_update = {**_CLASSES, grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError}
        return per_update.get(details[0].code, P4RuntimeError)(code, message, details)
    return _CLASSES.get(code, P4RuntimeError)(code, message, details)


class P4RuntimeClient:
    """A P4Runtime connection to one device, holding mastership for its election id.

    Connecting waits for the channel, opens the StreamChannel and sends a
    MasterArbitrationUpdate; the answer sets :attr:`is_primary`. A client that is not
    primary may read, but the switch refuses its writes (:class:`NotPrimaryError`).

    Args:
        address: ``host:port`` of the switch's P4Runtime server.
        device_id: the P4Runtime device id.
        election_id: (high, low) halves of the 128-bit election id; the highest wins.
        timeout: seconds to wait for the connection, the arbitration and each RPC.
        arbitrate: open the StreamChannel and arbitrate; False for a read-only client,
            which P4Runtime lets Read without a stream (it never holds mastership).
        tls: mutual TLS: this controller's certificate and key, and the CA that signed
            the switch's (:class:`controller.tls.TlsFiles`); None: plain text, which
            only a loopback ``address`` may use.

    Raises:
        SwitchUnreachableError: nothing answered at ``address`` within ``timeout``, or
            the switch would not take this client (the message says why: TLS wanted,
            TLS not spoken, a certificate refused on either side).
        P4RuntimeError: the switch refused the arbitration (a subclass by code).
        controller.tls.TlsRequiredError: plain text to a non-loopback ``address``.
    """

    def __init__(
        self,
        address: str,
        device_id: int = 0,
        election_id: tuple[int, int] = (0, 1),
        timeout: float = 10.0,
        arbitrate: bool = True,
        tls: TlsFiles | None = None,
    ) -> None:
        require_tls(address, tls, "--tls")
        self.address = address
        self.tls = tls
        self.arbitrate = arbitrate
        self.device_id = device_id
        self.election_id = election_id
        self.timeout = timeout
        self._primary = False
        self._closed = False
        self._arbitration: queue.Queue[Any] = queue.Queue()
        self._requests: queue.Queue[Any] = queue.Queue()
        self._channel = grpc_channel(address, tls)
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            why = explain_refusal(self.address, self.tls)
            raise SwitchUnreachableError(
                grpc.StatusCode.UNAVAILABLE,
                f"the P4Runtime server at {self.address} did not take this client: {why}"
                if why
                else f"no P4Runtime server answered at {self.address} within {self.timeout} s",
            ) from None
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        if not self.arbitrate:
            return
        self._stream = self._stub.StreamChannel(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read_stream, daemon=True)
        self._reader.start()
        self._arbitrate()

    def _election_id(self) -> Any:
        high, low = self.election_id
        return p4runtime_pb2.Uint128(high=high, low=low)

    def _arbitrate(self) -> None:
        update = p4runtime_pb2.MasterArbitrationUpdate(
            device_id=self.device_id, election_id=self._election_id()
        )
        self._requests.put(p4runtime_pb2.StreamMessageRequest(arbitration=update))
        try:
            answer = self._arbitration.get(timeout=self.timeout)
        except queue.Empty:
            raise SwitchUnreachableError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{self.address} sent no arbitration answer within {self.timeout} s",
            ) from None
        if isinstance(answer, P4RuntimeError):
            raise answer

    def _read_stream(self) -> None:
        """Follow the StreamChannel: mastership changes, and the error that ends it."""
        try:
            for response in self._stream:
                if response.WhichOneof("update") == "arbitration":
                    self._primary = response.arbitration.status.code == code_pb2.OK
                    self._arbitration.put(response.arbitration)
        except grpc.RpcError as exc:
            if not self._closed:
                self._arbitration.put(_translate(exc))
        self._primary = False  # the stream is gone, and mastership with it

    def rearbitrate(self, election_id: tuple[int, int]) -> bool:
        """Arbitrate again on this stream with ``election_id``; return whether this
        client is now the primary.

        P4Runtime makes the primary the holder of the highest election id ever seen, so
        after a higher controller left, nobody is primary until one arbitrates with at
        least its id: this is how a controller takes mastership back.

        Raises:
            ValueError: the client was made with ``arbitrate=False``.
            P4RuntimeError: the switch refused the arbitration (a subclass by code).
        """
        if not self.arbitrate:
            raise ValueError("a read-only client (arbitrate=False) has no stream to arbitrate on")
        while True:  # earlier notifications are not the answer to this update
            try:
                self._arbitration.get_nowait()
            except queue.Empty:
                break
        self.election_id = election_id
        self._arbitrate()
        return self._primary

    @property
    def is_primary(self) -> bool:
        """Whether the switch's last arbitration answer made this client the primary."""
        return self._primary

    def set_pipeline(self, p4info: P4Info, device_config: bytes | None = None) -> None:
        """Install a pipeline (SetForwardingPipelineConfig, VERIFY_AND_COMMIT).

        Args:
            p4info: the program's P4Info.
            device_config: the target's binary (bmv2: the JSON p4c wrote), or None.

        Raises:
            P4RuntimeError: the switch refused the pipeline (a subclass by code).
        """
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            election_id=self._election_id(),
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
            config=p4runtime_pb2.ForwardingPipelineConfig(
                p4info=p4info.message, p4_device_config=device_config or b""
            ),
        )
        self._call(self._stub.SetForwardingPipelineConfig, request)

    def get_pipeline(self) -> P4Info:
        """The P4Info of the switch's installed pipeline.

        Raises:
            P4RuntimeError: the switch has no pipeline or refused the request.
        """
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE,
        )
        response = self._call(self._stub.GetForwardingPipelineConfig, request)
        if not response.config.HasField("p4info"):
            raise P4RuntimeError(
                grpc.StatusCode.FAILED_PRECONDITION, f"{self.address} has no pipeline installed"
            )
        return P4Info(response.config.p4info)

    def write(self, updates: Sequence[Any]) -> None:
        """Send ``p4.v1.Update`` messages in one WriteRequest (CONTINUE_ON_ERROR).

        Raises:
            NotPrimaryError: this client is not the primary.
            P4RuntimeError: some updates failed; ``details`` says which and why, and the
                class follows their common code (e.g. :class:`AlreadyExistsError`).
        """
        request = p4runtime_pb2.WriteRequest(
            device_id=self.device_id, election_id=self._election_id(), updates=list(updates)
        )
        self._call(self._stub.Write, request, updates)

    def read(self, entities: Sequence[Any]) -> Iterator[Any]:
        """The ``p4.v1.Entity`` messages matching ``entities`` (one ReadRequest).

        Errors are raised while iterating, as :class:`P4RuntimeError` subclasses.
        """
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id, entities=list(entities))
        try:
            for response in self._stub.Read(request, timeout=self.timeout):
                yield from response.entities
        except grpc.RpcError as exc:
            raise _translate(exc) from None

    def _call(self, method: Any, request: Any, updates: Sequence[Any] = ()) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise _translate(exc, updates) from None

    def close(self) -> None:
        """End the stream (giving up mastership) and the channel; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        stream = getattr(self, "_stream", None)
        if stream is not None:
            stream.cancel()
            self._reader.join(timeout=self.timeout)
        self._channel.close()

    def __enter__(self) -> P4RuntimeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
