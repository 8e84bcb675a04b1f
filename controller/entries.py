"""Controller layer: P4Runtime entity messages built from names in a P4Info.

Generic builders (any P4 program): a table entry from table, match, action and parameter
names; a multicast group; a register or counter cell. Every name and value is checked
against the P4Info here, so a mistake raises before anything reaches a switch. The
INA-specific managers (one module per P4 control) are built on these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from p4.v1 import p4runtime_pb2

from controller.p4info import EncodingError, P4Info, P4InfoError, Value, encode_value

__all__ = [
    "counter_entry",
    "delete",
    "entity",
    "insert",
    "modify",
    "multicast_group_entry",
    "register_entry",
    "table_entry",
]

_UINT32 = 2**32


def table_entry(
    p4info: P4Info,
    table: str | int,
    match: Mapping[str, Value],
    action: str | int | None,
    params: Mapping[str, Value] | None = None,
) -> Any:
    """A ``p4.v1.TableEntry`` of an exact-match table.

    Args:
        p4info: the pipeline's P4Info.
        table: the table's name, alias or id.
        match: a value for every match field, by field name.
        action: the action's name, alias or id; one the table's entries may use. None
            for an entry that names only its key (a delete or a read).
        params: a value for every parameter of the action, by name.

    Raises:
        P4InfoError: an unknown table, action, field or parameter; a field or parameter
            missing; a non-exact match field; an action the table's entries cannot use.
        EncodingError: a value that does not fit its field.
    """
    tbl = p4info.table(table)
    for name in match:
        if tbl.match_field(name).match_type != "EXACT":
            raise P4InfoError(f"{tbl.name}.{name} is not EXACT; only EXACT is supported")
    _require_all(tbl.name, "match field", [f.name for f in tbl.match_fields], match)
    # Fields and params go in P4Info order, whatever the dict order: equal entries are
    # then equal messages (reads compare, golden files pin them).
    entry = p4runtime_pb2.TableEntry(table_id=tbl.id)
    for field in tbl.match_fields:
        value = encode_value(match[field.name], field.bitwidth)
        entry.match.add(field_id=field.id).exact.value = value
    if action is None:
        if params:
            raise P4InfoError(f"parameters for table {tbl.name!r} without an action")
        return entry
    act = p4info.action(action)
    if tbl.action_scope(act.id) in (None, "DEFAULT_ONLY"):
        raise P4InfoError(f"table {tbl.name!r} entries cannot use action {act.name!r}")
    params = params or {}
    for name in params:
        act.param(name)
    _require_all(act.name, "parameter", [p.name for p in act.params], params)
    entry.action.action.action_id = act.id
    for param in act.params:
        value = encode_value(params[param.name], param.bitwidth)
        entry.action.action.params.add(param_id=param.id, value=value)
    return entry


def _require_all(
    owner: str, kind: str, expected: Sequence[str], given: Mapping[str, Value]
) -> None:
    missing = [name for name in expected if name not in given]
    if missing:
        raise P4InfoError(f"{owner}: no value for {kind} {', '.join(missing)}")


def multicast_group_entry(group_id: int, replicas: Sequence[tuple[int, int]]) -> Any:
    """A ``p4.v1.MulticastGroupEntry``: each packet of the group goes to every replica.

    Args:
        group_id: the multicast group id, 1 to 2**32 - 1 (0 means "no group").
        replicas: (egress port, instance) pairs; the instance is the replica's
            ``egress_rid`` in v1model. The port goes in the ``egress_port`` field, the one
            bmv2's P4Runtime server reads.

    Raises:
        EncodingError: a group id, port or instance outside its range, or a pair given
            twice.
    """
    if not 0 < group_id < _UINT32:
        raise EncodingError(f"multicast group id {group_id} is not in 1..2**32-1")
    if len(set(replicas)) != len(replicas):
        raise EncodingError(f"multicast group {group_id} lists a replica twice")
    entry = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=group_id)
    for port, instance in replicas:
        if not (0 <= port < _UINT32 and 0 <= instance < _UINT32):
            raise EncodingError(f"replica ({port}, {instance}) is outside uint32")
        entry.replicas.add(egress_port=port, instance=instance)
    return entry


def _check_index(kind: str, name: str, size: int, index: int | None) -> None:
    if index is not None and not 0 <= index < size:
        raise P4InfoError(f"{kind} {name!r} has {size} cells; index {index} is out of range")


def register_entry(
    p4info: P4Info, register: str | int, index: int | None = None, value: Value | None = None
) -> Any:
    """A ``p4.v1.RegisterEntry``: one cell (or, with no index, every cell when read).

    Args:
        p4info: the pipeline's P4Info.
        register: the register's name, alias or id.
        index: the cell; None reads the whole array.
        value: the cell's new value, for a write; None for a read.

    Raises:
        P4InfoError: an unknown register or an index outside it.
        EncodingError: a value wider than the register's cells.
    """
    reg = p4info.register(register)
    _check_index("register", reg.name, reg.size, index)
    entry = p4runtime_pb2.RegisterEntry(register_id=reg.id)
    if index is not None:
        entry.index.index = index
    if value is not None:
        entry.data.bitstring = encode_value(value, reg.bitwidth)
    return entry


def counter_entry(p4info: P4Info, counter: str | int, index: int | None = None) -> Any:
    """A ``p4.v1.CounterEntry`` to read one cell, or every cell with no index.

    Raises:
        P4InfoError: an unknown counter or an index outside it.
    """
    ctr = p4info.counter(counter)
    _check_index("counter", ctr.name, ctr.size, index)
    entry = p4runtime_pb2.CounterEntry(counter_id=ctr.id)
    if index is not None:
        entry.index.index = index
    return entry


_ENTITY_FIELDS = {
    p4runtime_pb2.TableEntry: "table_entry",
    p4runtime_pb2.RegisterEntry: "register_entry",
    p4runtime_pb2.CounterEntry: "counter_entry",
}


def entity(entry: Any) -> Any:
    """Wrap a table, multicast group, register or counter entry in a ``p4.v1.Entity``.

    An Entity is returned as it is.

    Raises:
        TypeError: ``entry`` is none of those messages.
    """
    if isinstance(entry, p4runtime_pb2.Entity):
        return entry
    result = p4runtime_pb2.Entity()
    if isinstance(entry, p4runtime_pb2.MulticastGroupEntry):
        result.packet_replication_engine_entry.multicast_group_entry.CopyFrom(entry)
        return result
    field = _ENTITY_FIELDS.get(type(entry))
    if field is None:
        raise TypeError(f"cannot wrap {type(entry).__name__} in a p4.v1.Entity")
    getattr(result, field).CopyFrom(entry)
    return result


def _update(kind: Any, entry: Any) -> Any:
    return p4runtime_pb2.Update(type=kind, entity=entity(entry))


def insert(entry: Any) -> Any:
    """A ``p4.v1.Update`` inserting ``entry`` (raises TypeError as :func:`entity`)."""
    return _update(p4runtime_pb2.Update.INSERT, entry)


def modify(entry: Any) -> Any:
    """A ``p4.v1.Update`` modifying ``entry`` (raises TypeError as :func:`entity`)."""
    return _update(p4runtime_pb2.Update.MODIFY, entry)


def delete(entry: Any) -> Any:
    """A ``p4.v1.Update`` deleting ``entry`` (raises TypeError as :func:`entity`)."""
    return _update(p4runtime_pb2.Update.DELETE, entry)
