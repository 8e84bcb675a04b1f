"""Controller layer: register cells of a switch, over P4Runtime or bmv2's Thrift.

bmv2's P4Runtime server cannot read registers ("Register reads are not supported yet"),
so on bmv2 the controller reads and writes them through bmv2's Thrift runtime interface
(what ``simple_switch_CLI`` uses, :mod:`controller.bmv2_thrift`); the soft switch serves
them over P4Runtime. :class:`RegisterAccess` is what the managers see either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controller.bmv2_thrift import Bmv2Thrift
from controller.client import P4RuntimeClient
from controller.entries import entity, modify, register_entry
from controller.p4info import P4Info, decode_value

__all__ = ["Bmv2Registers", "P4RuntimeRegisters", "RegisterAccess"]

_BATCH = 4096  # cells per Write/Read request: well under gRPC's 4 MiB message limit


class RegisterAccess(Protocol):
    """Unsigned register cells by register name (full name, as in the P4Info)."""

    def read(self, name: str, indices: Sequence[int]) -> list[int]: ...
    def fill(self, name: str, start: int, stop: int, value: int) -> None: ...
    def close(self) -> None: ...


class P4RuntimeRegisters:
    """Register cells through P4Runtime RegisterEntry reads and modifies."""

    def __init__(self, client: P4RuntimeClient, p4info: P4Info) -> None:
        self.client = client
        self.p4info = p4info

    def read(self, name: str, indices: Sequence[int]) -> list[int]:
        """The cells ``indices`` of register ``name``, in that order.

        Raises:
            P4InfoError: an unknown register or an index outside it.
            P4RuntimeError: the switch refused the read.
        """
        reg = self.p4info.register(name)
        wanted = [entity(register_entry(self.p4info, reg.id, i)) for i in indices]
        values: dict[int, int] = {}
        for start in range(0, len(wanted), _BATCH):
            for found in self.client.read(wanted[start : start + _BATCH]):
                entry = found.register_entry
                values[entry.index.index] = decode_value(entry.data.bitstring, reg.bitwidth)
        return [values[i] for i in indices]

    def fill(self, name: str, start: int, stop: int, value: int) -> None:
        """Set cells ``start..stop-1`` of register ``name`` to ``value``.

        Raises:
            P4InfoError: an unknown register or a range outside it.
            P4RuntimeError: the switch refused the write.
        """
        updates = [modify(register_entry(self.p4info, name, i, value)) for i in range(start, stop)]
        for first in range(0, len(updates), _BATCH):
            self.client.write(updates[first : first + _BATCH])

    def close(self) -> None:
        """Nothing of its own to close (the client belongs to the controller)."""


class Bmv2Registers:
    """Register cells through bmv2's Thrift server (its P4Runtime server cannot read them)."""

    def __init__(self, thrift: Bmv2Thrift) -> None:
        self.thrift = thrift

    def read(self, name: str, indices: Sequence[int]) -> list[int]:
        """The cells ``indices`` of register ``name`` (Thrift ``bm_register_read``).

        Raises:
            ThriftRegisterError: an unknown register or an index outside it.
            ThriftUnreachableError: the Thrift server is gone.
        """
        return [self.thrift.register_read(name, i) for i in indices]

    def fill(self, name: str, start: int, stop: int, value: int) -> None:
        """Set cells ``start..stop-1`` (Thrift ``bm_register_write_range``)."""
        self.thrift.register_write_range(name, start, stop, value)

    def close(self) -> None:
        self.thrift.close()
