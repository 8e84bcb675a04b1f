"""The P4Runtime server's entities: Write and Read of tables, groups, registers, counters.

Switch-target layer, part of :mod:`emulation.softswitch.p4runtime`. :class:`_Entities` is
the switch's P4Runtime-visible state: it checks each update against the P4Info as a
P4Runtime server must (ids, match fields, actions and their scope, parameters, the codes
of a duplicate insert or a modify of nothing), stores entries in canonical form and reads
them back, and applies each accepted write to the :class:`Pipeline` through
:mod:`emulation.softswitch.p4rt_tables` (tables) and
:mod:`emulation.softswitch.p4rt_registers` (register cells, counters). It runs on the
data-plane thread (the service's ``run``); it knows nothing of gRPC's server.
"""

from __future__ import annotations

from typing import Any

import grpc
from p4.v1 import p4runtime_pb2

from controller.p4info import P4Info, P4InfoError
from controller.sharing import JOB_COUNTERS
from controller.stats import OWN_COUNTERS
from emulation.softswitch.p4rt_p4info import (
    _canonical,
    _check_index,
    _decode_fields,
    _fail,
    _Failure,
    _uint,
)
from emulation.softswitch.p4rt_registers import _counter_names, _Registers
from emulation.softswitch.p4rt_tables import _Hooks, _initial_default, _Key, _Table
from emulation.softswitch.pipeline import JobTableError, Pipeline
from emulation.softswitch.roce_tables import RoceTableError

__all__ = ["_Entities", "_entity"]


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
        except (JobTableError, RoceTableError) as exc:
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
        if counter.name in JOB_COUNTERS:
            jobs = [entry.index.index] if entry.HasField("index") else range(counter.size)
            self.pipeline.set_stats_cell(JOB_COUNTERS[counter.name], jobs, value)
            return
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
            per_job = JOB_COUNTERS.get(counter.name)
            for index in indices:
                entry = p4runtime_pb2.CounterEntry(counter_id=counter.id)
                entry.index.index = index
                name = names[index] if index < len(names) else None
                if per_job is not None:
                    entry.data.packet_count = self.pipeline.stats_cell(index)[per_job]
                else:
                    entry.data.packet_count = stats.get(name, 0) if name else 0
                out.append(_entity(counter_entry=entry))
        return out


def _entity(**kwargs: Any) -> Any:
    return p4runtime_pb2.Entity(**kwargs)
