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
  :func:`_uint`), a duplicate insert ALREADY_EXISTS, a modify/delete of nothing
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
"""

from __future__ import annotations

import itertools
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from controller.p4info import P4Info, P4InfoError
from controller.slots import MISSING
from controller.stats import OWN_COUNTERS
from emulation.softswitch.pipeline import (
    SIGNED_REGISTERS,
    JobTableError,
    Pipeline,
    RegisterCell,
)
from hostlib.protocol import SWITCH_DROPS, SWITCH_STATS

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

MAX_STREAMS = 8
"""Controllers connected at once (StreamChannels); one more is refused RESOURCE_EXHAUSTED."""

READ_CHUNK = 512
"""Entities per ReadResponse: bounds a response far below gRPC's 4 MiB default limit."""

ARBITRATIONS = ("spec", "bmv2")
"""Who is primary (:class:`SoftSwitchP4Runtime`'s ``arbitration``): ``"spec"``, P4Runtime's
rule, the highest election id ever seen (``election_id_past``) if a live stream holds it
(the default); ``"bmv2"``, the highest live election id, as simple_switch_grpc does."""

_SIM_SCALE = 1 << 31  # configuration.p4: the drop probability register holds p * 2**31
_LANE_PREFIX = "Ingress.values.lane_"
_LANE_ID_BASE = 0x16070000
_EGRESS_STATS = {"results_sent", "sent_upstream"}
_EGRESS_DROPS = {"sim_egress"}


# --------------------------------------------------------------------- the P4Info


_SLOT_REGISTERS = (
    "Ingress.seq",
    "Ingress.remaining",
    "Ingress.final",
    "Ingress.exponents.exponent",
    MISSING,
)
"""Per-(set, slot) registers of either program: 2 * slots cells (``MISSING``: the Tofino
program's workers a use still waits for, which the pipeline keeps as a bitmap per set and
a count)."""

def is_tofino(p4info: P4Info) -> bool:
    """Whether ``p4info`` is the Tofino program's (p4/tna/, ``arch: "tna"``)."""
    return str(p4info.message.pkg_info.arch) == "tna"


def softswitch_p4info(base: P4Info, lanes: int, slots: int) -> P4Info:
    """``base`` (``p4/ina.p4info.txtpb``) as p4c would emit it for this switch's sizes.

    The P4 program's LANES_PER_PACKET and SWITCH_SLOTS are compile-time constants; the
    soft switch takes them as start-up options, so its P4Info has one lane register per
    lane (``Ingress.values.lane_NN``, id 0x1607NNNN) and per-(set, slot) registers of
    2 * ``slots`` cells (the bitmaps, one per set: ``slots``). Indices keep the P4
    layout: set * slots + slot, where ``slots`` is a bitmap register's size.

    The Tofino program's P4Info (p4/tna/ina_tna.p4info.txtpb, :func:`is_tofino`) keeps its
    lane registers and their p4c-barefoot ids: ``lanes`` must be its lane count.

    Raises:
        P4InfoError: no lane registers, or a Tofino P4Info of another lane count.
    """
    message = p4info_pb2.P4Info()
    message.CopyFrom(base.message)
    lane_template = None
    kept = []
    for reg in message.registers:
        if reg.preamble.name.startswith(_LANE_PREFIX):
            lane_template = lane_template or reg
            continue
        kept.append(reg)
    if lane_template is None:
        raise P4InfoError("the base P4Info has no lane registers")
    if is_tofino(base):
        have = len(message.registers) - len(kept)
        if lanes != have:
            raise P4InfoError(f"the Tofino program has {have} lanes, not {lanes}")
        for reg in message.registers:
            if reg.preamble.name in _SLOT_REGISTERS or reg.preamble.name.startswith(
                _LANE_PREFIX
            ):
                reg.size = 2 * slots
        return P4Info(message)
    template = p4info_pb2.Register()
    template.CopyFrom(lane_template)
    del message.registers[:]
    for reg in kept:
        name = reg.preamble.name
        if name.startswith("Ingress.bitmap."):
            reg.size = slots
        elif name in _SLOT_REGISTERS:
            reg.size = 2 * slots
        message.registers.append(reg)
    for lane in range(lanes):
        reg = message.registers.add()
        reg.CopyFrom(template)
        reg.preamble.id = _LANE_ID_BASE + lane
        reg.preamble.name = f"{_LANE_PREFIX}{lane:02d}"
        reg.preamble.alias = f"lane_{lane:02d}"
        reg.size = 2 * slots
    return P4Info(message)


# --------------------------------------------------------------------- failures


class _Failure(Exception):
    """One request or update refused with a gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _fail(code: grpc.StatusCode, message: str) -> _Failure:
    return _Failure(code, message)


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


# --------------------------------------------------------------------- values


def _uint(data: bytes, bitwidth: int, what: str) -> tuple[int, bytes]:
    """A bytestring's value and canonical form (shortest big-endian, at least 1 byte).

    Raises:
        _Failure: INVALID_ARGUMENT, empty or wider than ``bitwidth``. The spec's sections
            disagree on the code: Bytestrings says OUT_OF_RANGE, while Match Format,
            Action Specification and RegisterEntry make any value that breaks those
            rules INVALID_ARGUMENT. bmv2's PI server, the reference target, answers
            INVALID_ARGUMENT ("does not fit within N bits"), so this switch does too.
    """
    if not data:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: empty bytestring")
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise _fail(
            grpc.StatusCode.INVALID_ARGUMENT, f"{what}: {value:#x} does not fit {bitwidth} bits"
        )
    return value, _canonical(value)


def _decode_fields(
    owner: str,
    given: Sequence[tuple[int, Any]],
    lookup: Callable[[int], Any],
    specs: Sequence[Any],
    value_of: Callable[[Any, Any], bytes],
    kind: str,
    missing_kind: str,
) -> dict[int, tuple[int, bytes]]:
    """Decode a table key's match fields or an action's parameters against their P4Info:
    id -> (value, canonical bytes). Each id must be known and given once, each value fit
    its bitwidth (``value_of`` extracts it, checking the item's form), none be missing.

    Raises:
        _Failure: INVALID_ARGUMENT for an unknown, repeated or missing id or a value
            that does not fit (see :func:`_uint`); whatever ``value_of`` raises.
    """
    values: dict[int, tuple[int, bytes]] = {}
    for fid, item in given:
        try:
            spec = lookup(fid)
        except P4InfoError:
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT, f"{owner}: no {kind} with id {fid}"
            ) from None
        if fid in values:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{owner}: {spec.name} twice")
        values[fid] = _uint(value_of(item, spec), spec.bitwidth, f"{owner}.{spec.name}")
    missing = [spec.name for spec in specs if spec.id not in values]
    if missing:
        raise _fail(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{owner}: {missing_kind} {', '.join(missing)} missing",
        )
    return values


def _check_index(name: str, index: int, size: int) -> None:
    """Raises _Failure for an index outside an array: negative (INVALID_ARGUMENT) or past
    its end (OUT_OF_RANGE), the codes the spec gives for counter and meter arrays."""
    if index < 0:
        raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: negative index {index}")
    if index >= size:
        raise _fail(grpc.StatusCode.OUT_OF_RANGE, f"{name}: index {index} outside 0..{size - 1}")


def _canonical(value: int) -> bytes:
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def _ipv4(value: int) -> str:
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))


# --------------------------------------------------------------------- tables

_Key = tuple[tuple[int, bytes], ...]


@dataclass
class _Table:
    """One table's entries, keyed by canonical match, plus its modified default entry."""

    info: Any  # controller.p4info.Table
    entries: dict[_Key, Any] = field(default_factory=dict)
    default: Any = None  # a TableEntry with is_default_action, once modified


class _Hooks:
    """What a table write does to the pipeline, by table name (decoded integers)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def apply(
        self,
        table: str,
        kind: int,
        match: dict[str, int],
        params: dict[str, int],
        action: str = "",
    ) -> None:
        p = self.pipeline
        insert, modify = p4runtime_pb2.Update.INSERT, p4runtime_pb2.Update.MODIFY
        if table == "Ingress.jobs.jobs":
            job = match["job_id"]
            if kind == insert:
                p.insert_job(job, **params)
            elif kind == modify:
                p.modify_job(job, **params)
            else:
                p.delete_job(job)
        elif table == "Ingress.workers.workers":
            addr = (_ipv4(match["ipv4_src"]), match["udp_src_port"])
            if kind == insert:
                p.insert_worker(match["job_id"], match["rank"], addr)
            elif kind != modify:  # modify: worker_hit has no data; nothing changes
                p.delete_worker(match["job_id"], match["rank"], addr)
        elif table == "Egress.replicas.replicas":
            key = (match["job_id"], match["egress_rid"], match["egress_port"])
            if kind == p4runtime_pb2.Update.DELETE:
                p.delete_replica(*key)
            else:
                addr = (_ipv4(params["dst_ip"]), params["dst_port"])
                p.set_replica(*key, addr, params["dst_mac"])
        elif table == "Ingress.upstream.upstream":
            if kind == p4runtime_pb2.Update.DELETE:
                p.delete_upstream(match["job_id"])
            else:
                addr = (_ipv4(params["dst_ip"]), params["dst_port"])
                p.set_upstream(
                    match["job_id"], params["rank"], addr, params["dst_mac"], params["egress_port"]
                )
        elif table == "Ingress.forwarder.forward":
            if kind == p4runtime_pb2.Update.DELETE:
                p.delete_forward(match["eth_dst"])
            else:
                p.set_forward(match["eth_dst"], _forwarding(action, params))

    def default(self, table: str, action: str | None, params: dict[str, int]) -> None:
        """A table's default entry was modified (None: reset to the program's)."""
        if table == "Ingress.forwarder.forward":
            self.pipeline.set_forward_default(
                ("drop", 0) if action is None else _forwarding(action, params)
            )


def _forwarding(action: str, params: dict[str, int]) -> tuple[str, int]:
    """The pipeline's form of a forwarder action: (port, p), (flood, mgid) or (drop, 0)."""
    if action.endswith("set_egress_port"):
        return "port", params["port"]
    if action.endswith("flood"):
        return "flood", params["mgid"]
    return "drop", 0


class _Registers:
    """Register cells of the pipeline by P4Info register id: read and write as P4 does
    (unsigned values of the register's width; the pipeline's signed arrays hold the same
    bits)."""

    def __init__(self, pipeline: Pipeline, p4info: P4Info) -> None:
        self.pipeline = pipeline
        self.p4info = p4info

    def size(self, register_id: int) -> int:
        return int(self.p4info.register(register_id).size)

    def read(self, register_id: int, indices: Sequence[int]) -> list[int]:
        """The unsigned values of cells ``indices`` of one register, in one pipeline call."""
        reg = self.p4info.register(register_id)
        for index in indices:
            _check_index(reg.name, index, reg.size)
        width = int(reg.bitwidth)
        if reg.name == MISSING:
            return [self._missing(index) for index in indices]
        if _register_cell(reg.name, 0) is None:  # a drop simulator's probability
            return [round(self._drops(register_id) * _SIM_SCALE)] * len(indices)
        cells = [_register_cell(reg.name, i) for i in indices]
        values = self.pipeline.register_read([c for c in cells if c is not None])
        return [v & ((1 << width) - 1) for v in values]

    def write(self, register_id: int, index: int, value: int) -> None:
        reg = self.p4info.register(register_id)
        _check_index(reg.name, index, reg.size)
        width = int(reg.bitwidth)
        if reg.name == MISSING:
            self._clear_missing(index, value)
            return
        cell = _register_cell(reg.name, index)
        if cell is None:
            if value > _SIM_SCALE:
                raise _fail(grpc.StatusCode.OUT_OF_RANGE, f"drop probability {value} above 2**31")
            self._set_drops(register_id, value / _SIM_SCALE)
            return
        if cell.array in SIGNED_REGISTERS and value >> (width - 1):
            value -= 1 << width  # the same bits in a signed array
        self.pipeline.register_write(cell, value)

    def _missing(self, index: int) -> int:
        """``Ingress.missing[index]`` from the pipeline's state: the job's workers not in
        the set's bitmap while the use is in progress (its count not 0), else 0."""
        slots = self.pipeline.slots
        pool_set, slot = divmod(index, slots)
        remaining, bitmap = self.pipeline.register_read(
            [RegisterCell("remaining", index), RegisterCell(f"bitmap_set{pool_set}", slot)]
        )
        if remaining == 0:
            return 0
        workers = next(
            (
                len(job.workers)
                for job in self.pipeline.jobs()
                if job.slot_base is not None
                and job.slot_base <= slot < job.slot_base + job.slot_count
            ),
            32,
        )
        return ((1 << workers) - 1) & ~bitmap

    def _clear_missing(self, index: int, value: int) -> None:
        """A write of ``Ingress.missing[index]``: 0 (what the controller writes to free a
        slot) clears the use's count and the set's bitmap; the pipeline has no other
        value's meaning."""
        if value != 0:
            raise _fail(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{MISSING}: the soft switch keeps a bitmap and a count; it takes 0 (free "
                f"the slot), not {value}",
            )
        pool_set, slot = divmod(index, self.pipeline.slots)
        self.pipeline.register_write(RegisterCell("remaining", index), 0)
        self.pipeline.register_write(RegisterCell(f"bitmap_set{pool_set}", slot), 0)

    def _drops(self, register_id: int) -> float:
        drops = self.pipeline.drops
        return drops.ingress if self._is_ingress_sim(register_id) else drops.egress

    def _set_drops(self, register_id: int, p: float) -> None:
        if self._is_ingress_sim(register_id):
            self.pipeline.set_drop_rates(ingress=p)
        else:
            self.pipeline.set_drop_rates(egress=p)

    def _is_ingress_sim(self, register_id: int) -> bool:
        name = self.p4info.register(register_id).name
        if name not in (
            "Ingress.drop_simulator.probability",
            "Egress.drop_simulator.probability",
        ):
            raise _fail(grpc.StatusCode.UNIMPLEMENTED, f"register {name} has no binding")
        return name.startswith("Ingress.")


_REGISTER_ARRAYS = {
    "Ingress.seq": "seq",
    "Ingress.remaining": "remaining",
    "Ingress.final": "final",
    "Ingress.exponents.exponent": "exponent",
    "Ingress.bitmap.bitmap_set0": "bitmap_set0",
    "Ingress.bitmap.bitmap_set1": "bitmap_set1",
}
"""P4 register names -> the pipeline's register arrays (the lanes: ``values``)."""


def _register_cell(name: str, index: int) -> RegisterCell | None:
    """The pipeline cell of P4 register ``name`` at ``index``; None for the drop
    simulator's probabilities, which are the pipeline's drop rates, not cells."""
    if name.startswith(_LANE_PREFIX):
        return RegisterCell("values", index, int(name[len(_LANE_PREFIX) :]))
    array = _REGISTER_ARRAYS.get(name)
    return None if array is None else RegisterCell(array, index)


class _Entities:
    """The switch's P4Runtime-visible state, checked against the P4Info."""

    def __init__(self, pipeline: Pipeline, p4info: P4Info) -> None:
        self.pipeline = pipeline
        self.p4info = p4info
        self.hooks = _Hooks(pipeline)
        self.registers = _Registers(pipeline, p4info)
        self.tables = {t.id: _Table(t) for t in p4info.tables}
        self.groups: dict[int, Any] = {}
        names = {c.name for c in p4info.counters}
        self.own_counters = frozenset(s for c, s in OWN_COUNTERS.items() if c in names)

    # ---------------------------------------------------------------- writes
    def apply(self, update: Any) -> _Failure | None:
        """Apply one ``p4.v1.Update``; the failure, or None."""
        try:
            kind = update.type
            if kind == p4runtime_pb2.Update.UNSPECIFIED:
                raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "update type unspecified")
            which = update.entity.WhichOneof("entity")
            if which == "table_entry":
                self._write_table(kind, update.entity.table_entry)
            elif which == "packet_replication_engine_entry":
                self._write_pre(kind, update.entity.packet_replication_engine_entry)
            elif which == "register_entry":
                self._write_register(kind, update.entity.register_entry)
            elif which == "counter_entry":
                self._write_counter(kind, update.entity.counter_entry)
            elif which is None:
                raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "update without an entity")
            else:
                raise _fail(grpc.StatusCode.UNIMPLEMENTED, f"writing {which} is not supported")
        except _Failure as failure:
            return failure
        except JobTableError as exc:
            return _fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return None

    def _table(self, table_id: int) -> _Table:
        table = self.tables.get(table_id)
        if table is None:
            raise _fail(grpc.StatusCode.NOT_FOUND, f"no table with id {table_id:#x}")
        return table

    def _key(self, table: _Table, entry: Any) -> tuple[_Key, dict[str, int]]:
        info = table.info

        def exact(fm: Any, mf: Any) -> bytes:
            if fm.WhichOneof("field_match_type") != "exact":
                raise _fail(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: {mf.name} is an exact match"
                )
            return bytes(fm.exact.value)

        seen = _decode_fields(
            info.name, [(fm.field_id, fm) for fm in entry.match], info.match_field,
            info.match_fields, exact, "match field", "exact match field(s)",
        )  # fmt: skip
        key = tuple(sorted((fid, canon) for fid, (_, canon) in seen.items()))
        names = {info.match_field(fid).name: value for fid, (value, _) in seen.items()}
        return key, names

    def _action(self, table: _Table, entry: Any, default: bool) -> tuple[Any, dict[str, int]]:
        info = table.info
        which = entry.action.WhichOneof("type")
        if which is None:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: no action given")
        if which != "action":
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: has no action profile ({which})"
            )
        action = entry.action.action
        scope = info.action_scope(action.action_id)
        if scope is None:
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{info.name}: action {action.action_id:#x} is not one of its actions",
            )
        if scope == ("TABLE_ONLY" if default else "DEFAULT_ONLY"):
            raise _fail(  # the spec's code for a scope violation, as bmv2's
                grpc.StatusCode.PERMISSION_DENIED,
                f"{info.name}: action {action.action_id:#x} is {scope.lower()}",
            )
        act = self.p4info.action(action.action_id)
        canonical = p4runtime_pb2.TableAction()
        canonical.action.action_id = action.action_id
        values = _decode_fields(
            act.name, [(p.param_id, p) for p in action.params], act.param, act.params,
            lambda param, _: bytes(param.value), "parameter", "parameter(s)",
        )  # fmt: skip
        for pid in sorted(values):
            canonical.action.params.add(param_id=pid, value=values[pid][1])
        return canonical, {act.param(pid).name: v for pid, (v, _) in values.items()}

    def _write_table(self, kind: int, entry: Any) -> None:
        table = self._table(entry.table_id)
        info = table.info
        if entry.is_const:  # the spec: a server's answer in reads, never a client's write
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: is_const in a write")
        if entry.priority:  # exact tables, and every default entry, have none
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: exact tables take no priority"
            )
        if entry.is_default_action:
            self._write_default(kind, table, entry)
            return
        key, match = self._key(table, entry)
        stored = p4runtime_pb2.TableEntry(table_id=info.id, metadata=entry.metadata)
        for fid, value in key:
            stored.match.add(field_id=fid).exact.value = value
        params: dict[str, int] = {}
        if kind == p4runtime_pb2.Update.DELETE:
            if key not in table.entries:
                raise _fail(grpc.StatusCode.NOT_FOUND, f"{info.name}: no entry {match}")
        elif kind == p4runtime_pb2.Update.MODIFY and entry.action.WhichOneof("type") is None:
            # The spec lets a MODIFY leave the action unset: the entry keeps its action.
            if key not in table.entries:
                raise _fail(grpc.StatusCode.NOT_FOUND, f"{info.name}: no entry {match}")
            return
        else:
            action, params = self._action(table, entry, default=False)
            stored.action.CopyFrom(action)
            exists = key in table.entries
            if kind == p4runtime_pb2.Update.INSERT and exists:
                raise _fail(grpc.StatusCode.ALREADY_EXISTS, f"{info.name}: entry {match} exists")
            if kind == p4runtime_pb2.Update.MODIFY and not exists:
                raise _fail(grpc.StatusCode.NOT_FOUND, f"{info.name}: no entry {match}")
            if kind == p4runtime_pb2.Update.INSERT and len(table.entries) >= info.size:
                raise _fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{info.name} is full")
            if self.p4info.action(action.action.action_id).name.endswith("_miss") and params:
                raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "miss actions take no data")
        name = (
            ""
            if kind == p4runtime_pb2.Update.DELETE
            else self.p4info.action(stored.action.action.action_id).name
        )
        self.hooks.apply(info.name, kind, match, params, name)
        if kind == p4runtime_pb2.Update.DELETE:
            del table.entries[key]
        else:
            table.entries[key] = stored

    def _write_default(self, kind: int, table: _Table, entry: Any) -> None:
        info = table.info
        if kind != p4runtime_pb2.Update.MODIFY:
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: a default entry is only modified"
            )
        if len(entry.match):
            raise _fail(
                grpc.StatusCode.INVALID_ARGUMENT, f"{info.name}: a default entry has no match"
            )
        if info.const_default_action_id:
            raise _fail(
                grpc.StatusCode.PERMISSION_DENIED, f"{info.name}: the default action is const"
            )
        if entry.action.WhichOneof("type") is None:
            table.default = None  # no action: back to the program's default (the spec's reset)
            self.hooks.default(info.name, None, {})
            return
        action, params = self._action(table, entry, default=True)
        stored = p4runtime_pb2.TableEntry(table_id=info.id, is_default_action=True)
        stored.action.CopyFrom(action)
        self.hooks.default(info.name, self.p4info.action(action.action.action_id).name, params)
        table.default = stored

    def _write_pre(self, kind: int, pre: Any) -> None:
        if pre.WhichOneof("type") != "multicast_group_entry":
            raise _fail(grpc.StatusCode.UNIMPLEMENTED, "only multicast group entries")
        group = pre.multicast_group_entry
        gid = group.multicast_group_id
        if gid == 0:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "multicast group id 0")
        exists = gid in self.groups
        if kind == p4runtime_pb2.Update.INSERT and exists:
            raise _fail(grpc.StatusCode.ALREADY_EXISTS, f"multicast group {gid} exists")
        if kind != p4runtime_pb2.Update.INSERT and not exists:
            raise _fail(grpc.StatusCode.NOT_FOUND, f"no multicast group {gid}")
        if kind == p4runtime_pb2.Update.DELETE:
            self.pipeline.delete_group(gid)
            del self.groups[gid]
            return
        replicas = []
        stored = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=gid, metadata=group.metadata)
        for replica in group.replicas:
            # Read back in the form written, replica by replica (bmv2 keeps it too): the
            # 1.4 ``port`` bytes (canonical, as every bytestring) or the deprecated
            # ``egress_port``.
            copy = stored.replicas.add(instance=replica.instance)
            port, kind_of_port = replica.egress_port, replica.WhichOneof("port_kind")
            if kind_of_port == "port":  # an SDN port: 32 bits
                port, copy.port = _uint(replica.port, 32, f"multicast group {gid} port")
            elif kind_of_port == "egress_port":
                copy.egress_port = port
            replicas.append((port, replica.instance))
        if len(set(replicas)) != len(replicas):
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"group {gid} lists a replica twice")
        self.pipeline.set_group(gid, replicas)
        self.groups[gid] = stored

    def _write_register(self, kind: int, entry: Any) -> None:
        if kind != p4runtime_pb2.Update.MODIFY:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "register cells are only modified")
        reg = self._register(entry.register_id)
        if entry.data.WhichOneof("data") != "bitstring":
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{reg.name}: data is a bitstring")
        value, _ = _uint(entry.data.bitstring, reg.bitwidth, reg.name)
        indices = [entry.index.index] if entry.HasField("index") else range(reg.size)
        for index in indices:
            self.registers.write(reg.id, index, value)

    def _register(self, register_id: int) -> Any:
        try:
            return self.p4info.register(register_id)
        except P4InfoError:
            message = f"no register with id {register_id:#x}"
            raise _fail(grpc.StatusCode.NOT_FOUND, message) from None

    def _write_counter(self, kind: int, entry: Any) -> None:
        """Set counter cells (the spec's CounterEntry MODIFY, bmv2's counter reset): the
        cell at ``index``, or every cell without one; no ``data``, no change. The
        counters count packets: ``byte_count`` is not kept."""
        if kind != p4runtime_pb2.Update.MODIFY:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "counter cells are only modified")
        counter = self._counter(entry.counter_id)
        if entry.HasField("index"):
            _check_index(counter.name, entry.index.index, counter.size)
        if not entry.HasField("data"):
            return
        value = entry.data.packet_count
        if value < 0:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{counter.name}: count {value} < 0")
        names = _counter_names(counter.name, self.own_counters)
        indices = [entry.index.index] if entry.HasField("index") else range(counter.size)
        cells = {i: names[i] if i < len(names) else None for i in indices}
        unbound = [i for i, name in cells.items() if name is None]
        if value and unbound:  # the other pipe counts it: the cell reads 0 here, always
            raise _fail(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{counter.name}[{unbound[0]}] counts nothing on this switch; only 0 fits",
            )
        for name in cells.values():
            if name is not None:
                self.pipeline.set_counter(name, value)

    def _counter(self, counter_id: int) -> Any:
        try:
            return self.p4info.counter(counter_id)
        except P4InfoError:
            message = f"no counter with id {counter_id:#x}"
            raise _fail(grpc.StatusCode.NOT_FOUND, message) from None

    # ---------------------------------------------------------------- reads
    def read(self, entity: Any) -> list[Any]:
        """The entities matching one read request entity.

        Raises:
            _Failure: an unknown id or an entity kind this switch does not serve.
        """
        which = entity.WhichOneof("entity")
        if which == "table_entry":
            return self._read_tables(entity.table_entry)
        if which == "packet_replication_engine_entry":
            return self._read_pre(entity.packet_replication_engine_entry)
        if which == "register_entry":
            return self._read_registers(entity.register_entry)
        if which == "counter_entry":
            return self._read_counters(entity.counter_entry)
        if which is None:
            raise _fail(grpc.StatusCode.INVALID_ARGUMENT, "read of an empty entity")
        raise _fail(grpc.StatusCode.UNIMPLEMENTED, f"reading {which} is not supported")

    def _read_tables(self, want: Any) -> list[Any]:
        tables = list(self.tables.values()) if want.table_id == 0 else [self._table(want.table_id)]
        out = []
        for table in tables:
            if want.is_default_action:
                out.append(self._default_entry(table))
                continue
            if len(want.match):
                key, _ = self._key(table, want)
                found = table.entries.get(key)
                entries = [found] if found is not None else []
            else:
                entries = list(table.entries.values())
            out.extend(_entity(table_entry=e) for e in entries)
        return out

    def _default_entry(self, table: _Table) -> Any:
        entry = table.default
        if entry is None:
            info = table.info
            entry = p4runtime_pb2.TableEntry(table_id=info.id, is_default_action=True)
            action_id = info.const_default_action_id or _initial_default(self.p4info, info)
            entry.action.action.action_id = action_id
        return _entity(table_entry=entry)

    def _read_pre(self, want: Any) -> list[Any]:
        if want.WhichOneof("type") != "multicast_group_entry":
            raise _fail(grpc.StatusCode.UNIMPLEMENTED, "only multicast group entries")
        gid = want.multicast_group_entry.multicast_group_id
        groups = list(self.groups.values()) if gid == 0 else [self.groups.get(gid)]
        return [
            _entity(
                packet_replication_engine_entry=p4runtime_pb2.PacketReplicationEngineEntry(
                    multicast_group_entry=g
                )
            )
            for g in groups
            if g is not None
        ]

    def _read_registers(self, want: Any) -> list[Any]:
        regs = (
            list(self.p4info.registers)
            if want.register_id == 0
            else [self._register(want.register_id)]
        )
        out = []
        for reg in regs:
            indices = [want.index.index] if want.HasField("index") else range(reg.size)
            values = self.registers.read(reg.id, indices)
            for index, value in zip(indices, values, strict=True):
                entry = p4runtime_pb2.RegisterEntry(register_id=reg.id)
                entry.index.index = index
                entry.data.bitstring = _canonical(value)
                out.append(_entity(register_entry=entry))
        return out

    def _read_counters(self, want: Any) -> list[Any]:
        if want.counter_id == 0:
            counters = list(self.p4info.counters)
        else:
            counters = [self._counter(want.counter_id)]
        stats = self.pipeline.counters()
        out = []
        for counter in counters:
            names = _counter_names(counter.name, self.own_counters)
            if want.HasField("index"):
                _check_index(counter.name, want.index.index, counter.size)
            indices = [want.index.index] if want.HasField("index") else range(counter.size)
            for index in indices:
                entry = p4runtime_pb2.CounterEntry(counter_id=counter.id)
                entry.index.index = index
                name = names[index] if index < len(names) else None
                entry.data.packet_count = stats.get(name, 0) if name else 0
                out.append(_entity(counter_entry=entry))
        return out


def _initial_default(p4info: P4Info, table: Any) -> int:
    """The forwarder's initial default (forward_drop): the one action named ``*_drop``."""
    for ref in table.action_refs:
        if p4info.action(ref.id).name.endswith("drop"):
            return int(ref.id)
    return 0


def _counter_names(counter: str, own: frozenset[str] = frozenset()) -> list[str | None]:
    """Pipeline statistic at each index of a P4 counter (None: another counter counts it).

    configuration.p4 indexes Ingress/Egress.ina_stats by STAT_* and Ingress/Egress.drops
    by DROP_* (hostlib.protocol.SWITCH_STATS and SWITCH_DROPS); egress counts results
    sent and egress drops, ingress the rest, but for the statistics in ``own`` (the
    Tofino program's ``received`` and ``completed``, counters of their own).
    """
    if counter in OWN_COUNTERS:
        return [OWN_COUNTERS[counter]]
    egress = counter.startswith("Egress.")
    if counter.endswith(".ina_stats"):
        return [
            n if (n in _EGRESS_STATS) == egress and n not in own else None
            for n in SWITCH_STATS
        ]
    if counter.endswith(".drops"):
        return ["drop_" + r if (r in _EGRESS_DROPS) == egress else None for r in SWITCH_DROPS]
    return []


def _entity(**kwargs: Any) -> Any:
    return p4runtime_pb2.Entity(**kwargs)


# --------------------------------------------------------------------- arbitration


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
