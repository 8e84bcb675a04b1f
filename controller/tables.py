"""Controller layer: what every table manager shares (write, read back, decode).

A manager (``jobs.py``, ``workers.py``, ``replicas.py``, ``forwarder.py``) names one
table of ``p4/`` and turns its entries into small frozen dataclasses and back. The
P4Runtime messages are built by :mod:`controller.entries`, checked against the P4Info.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from p4.v1 import p4runtime_pb2

from controller.client import P4RuntimeClient, P4RuntimeError
from controller.entries import delete, entity, insert, modify, table_entry
from controller.p4info import P4Info, Value, decode_value

__all__ = ["DecodedEntry", "TableManager", "roll_back"]

DecodedEntry = tuple[dict[str, int], str | None, dict[str, int]]
"""An entry read back: match values by field name, action name, parameters by name."""


class TableManager:
    """Insert, modify, delete and read the entries of one exact-match table.

    Args:
        client: the switch's P4Runtime client.
        p4info: the switch's P4Info.
        table: the table's full name.
    """

    table_name: str = ""

    def __init__(self, client: P4RuntimeClient, p4info: P4Info) -> None:
        self.client = client
        self.p4info = p4info
        self.table = p4info.table(self.table_name)

    def _entry(
        self,
        match: Mapping[str, Value],
        action: str | None = None,
        params: Mapping[str, Value] | None = None,
    ) -> Any:
        return table_entry(self.p4info, self.table.id, match, action, params)

    def _insert(self, match: Mapping[str, Value], action: str, params: Mapping[str, Value]) -> None:
        self.client.write([insert(self._entry(match, action, params))])

    def _modify(self, match: Mapping[str, Value], action: str, params: Mapping[str, Value]) -> None:
        self.client.write([modify(self._entry(match, action, params))])

    def _delete(self, match: Mapping[str, Value]) -> None:
        self.client.write([delete(self._entry(match))])

    def _read(self) -> Iterator[DecodedEntry]:
        """Every entry of the table, decoded (P4Runtime read with an empty match)."""
        request = p4runtime_pb2.TableEntry(table_id=self.table.id)
        for found in self.client.read([entity(request)]):
            yield self.decode(found.table_entry)

    def decode(self, entry: Any) -> DecodedEntry:
        """Match, action name and parameters of a ``p4.v1.TableEntry`` of this table."""
        match = {}
        for fm in entry.match:
            field = self.table.match_field(fm.field_id)
            match[field.name] = decode_value(fm.exact.value, field.bitwidth)
        if not entry.action.HasField("action"):
            return match, None, {}
        action = self.p4info.action(entry.action.action.action_id)
        params = {}
        for p in entry.action.action.params:
            spec = action.param(p.param_id)
            params[spec.name] = decode_value(p.value, spec.bitwidth)
        return match, action.name, params


def roll_back(undo: Sequence[Callable[[], None]], what: str) -> None:
    """Undo a half-written change, last write first. A step the switch refuses is logged
    (``rolling back WHAT: ...``), not raised: the caller raises its original error."""
    for step in reversed(undo):
        try:
            step()
        except P4RuntimeError as exc:
            logging.getLogger("controller").error("rolling back %s: %s", what, exc)
