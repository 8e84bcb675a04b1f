"""The P4Runtime server's arbitration: which StreamChannel's controller is primary.

Switch-target layer, part of :mod:`emulation.softswitch.p4runtime`. It owns the open
streams (:class:`_Stream`: a queue of responses and the stream's election id), their
limit (:data:`MAX_STREAMS`) and the rule of who is primary (:class:`_Arbitration`, one of
:data:`ARBITRATIONS`): MasterArbitrationUpdates in, the arbitration each stream hears
out. The service asks it whether a request's election id is the primary's.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2

from emulation.softswitch.p4rt_p4info import _fail

__all__ = ["ARBITRATIONS", "MAX_STREAMS", "_Arbitration", "_Stream", "_no_role", "_u128"]

MAX_STREAMS = 8
"""Controllers connected at once (StreamChannels); one more is refused RESOURCE_EXHAUSTED."""

ARBITRATIONS = ("spec", "bmv2")
"""Who is primary (:class:`SoftSwitchP4Runtime`'s ``arbitration``): ``"spec"``, P4Runtime's
rule, the highest election id ever seen (``election_id_past``) if a live stream holds it
(the default); ``"bmv2"``, the highest live election id, as simple_switch_grpc does."""


@dataclass
class _Stream:
    responses: queue.Queue[Any] = field(default_factory=queue.Queue)
    arbitrated: bool = False
    election_id: int | None = None  # None: unset, a standby that is never primary


class _Arbitration:
    """Who is primary (default role only), by one of two rules (:data:`ARBITRATIONS`).

    ``"bmv2"``: the live stream with the highest election id, as bmv2's PI server does;
    when the primary leaves or lowers its id the next highest takes over (what the
    controller tests and ``inalab ctl`` beside a running bench rely on); an unset id is
    0. ``"spec"``: P4Runtime's rule. The switch keeps ``election_id_past``, the highest id
    any accepted arbitration carried, and the primary is the live stream holding it; when
    the primary leaves or lowers its id nobody is primary (streams hear NOT_FOUND, writes
    are PERMISSION_DENIED) until a stream arbitrates with at least that id, and a stream
    without an id is a standby, never primary.
    """

    def __init__(self, device_id: int, rule: str = "bmv2") -> None:
        if rule not in ARBITRATIONS:
            raise ValueError(f"arbitration {rule!r} is not one of {', '.join(ARBITRATIONS)}")
        self.device_id = device_id
        self._spec = rule == "spec"
        self._lock = threading.Lock()
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count()
        self._past: int | None = None  # "spec": election_id_past; None until a primary

    def open(self) -> tuple[int, _Stream]:
        """Register a new stream.

        Raises:
            _Failure: RESOURCE_EXHAUSTED, :data:`MAX_STREAMS` are open already.
        """
        with self._lock:
            if len(self._streams) >= MAX_STREAMS:
                raise _fail(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{MAX_STREAMS} controllers are connected already",
                )
            key = next(self._ids)
            stream = self._streams[key] = _Stream()
            return key, stream

    def close(self, key: int) -> None:
        with self._lock:
            old = self._primary_id()
            was_primary = key == self._primary_key()
            self._streams.pop(key, None)
            if was_primary or self._primary_id() != old:
                self._notify_all()

    def election_of(self, request: Any) -> int | None:
        """The election id of a request under this rule; None: unset, nobody's."""
        if self._spec and not request.HasField("election_id"):
            return None
        return _u128(request.election_id)

    def update(self, key: int, request: Any) -> None:
        """Handle a MasterArbitrationUpdate from stream ``key``.

        Raises:
            _Failure: wrong device, a role or role config, or an election id another
                stream holds.
        """
        with self._lock:
            stream = self._streams[key]
        # The spec: on a new stream an unknown device is NOT_FOUND; on a stream that
        # arbitrated already, changing the device (or the role) is FAILED_PRECONDITION.
        changed = grpc.StatusCode.FAILED_PRECONDITION if stream.arbitrated else None
        if request.device_id != self.device_id:
            raise _fail(changed or grpc.StatusCode.NOT_FOUND, f"no device {request.device_id}")
        if request.role.name:
            raise _fail(changed or grpc.StatusCode.NOT_FOUND, _no_role(request.role.name))
        if request.role.HasField("config"):
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "the default role takes no config")
        election = self.election_of(request)
        with self._lock:
            others = (s.election_id for k, s in self._streams.items() if k != key)
            if election is not None and election in others:
                raise _fail(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"election id {election} is held by another controller",
                )
            old, was_primary = self._primary_id(), key == self._primary_key()
            stream.arbitrated, stream.election_id = True, election
            if self._spec and election is not None and election >= (self._past or 0):
                self._past = election  # a new primary, or the same: everyone hears
                self._notify_all()
            elif (self._spec and was_primary) or self._primary_id() != old:
                self._notify_all()  # "spec": the primary stepped down, there is none
            else:
                self._notify(stream)

    def is_primary(self, election_id: int | None) -> bool:
        with self._lock:
            primary = self._primary_id()
            return primary is not None and election_id == primary

    def _primary_key(self) -> int | None:
        live = {
            k: s.election_id
            for k, s in self._streams.items()
            if s.arbitrated and s.election_id is not None
        }
        if not self._spec:
            return max(live, key=live.__getitem__, default=None)
        return next((k for k, e in live.items() if e == self._past), None)

    def _primary_id(self) -> int | None:
        key = self._primary_key()
        return None if key is None else self._streams[key].election_id

    def _notify_all(self) -> None:
        for stream in self._streams.values():
            if stream.arbitrated:
                self._notify(stream)

    def _notify(self, stream: _Stream) -> None:
        primary = self._primary_key()
        update = p4runtime_pb2.MasterArbitrationUpdate(device_id=self.device_id)
        # The highest id seen ("spec"; unset while there has never been a primary), or
        # the primary's ("bmv2").
        shown = self._past if self._spec else self._primary_id()
        if shown is not None:
            update.election_id.high, update.election_id.low = divmod(shown, 2**64)
        if primary is None:
            status = status_pb2.Status(code=code_pb2.NOT_FOUND, message="no primary")
        elif self._streams[primary] is stream:
            status = status_pb2.Status(code=code_pb2.OK, message="primary")
        else:
            status = status_pb2.Status(code=code_pb2.ALREADY_EXISTS, message="a backup")
        update.status.CopyFrom(status)
        stream.responses.put(p4runtime_pb2.StreamMessageResponse(arbitration=update))


def _no_role(name: str) -> str:
    return f"no role {name!r}: the switch serves the default role only"


def _u128(election_id: Any) -> int:
    return (int(election_id.high) << 64) | int(election_id.low)
