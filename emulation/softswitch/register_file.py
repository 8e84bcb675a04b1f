"""The soft switch pipeline's register arrays and the register API over them.

Switch-target layer, part of :mod:`~emulation.softswitch.pipeline` (its base class): the
per-(set, slot) arrays a P4 program declares as registers, how a P4Runtime register read
or write reaches a cell, and clearing a slot range. A backend that keeps its registers
elsewhere (the eBPF data plane: a kernel map) overrides these methods.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from emulation.softswitch.dataplane_types import JobTableError, RegisterCell
from emulation.softswitch.roce_tables import RoceTables
from emulation.softswitch.sharing import Sharing
from hostlib.protocol import EXPONENT_MIN

__all__ = ["RegisterFile"]


class RegisterFile:
    """The register arrays of a pipeline of ``slots`` slots per set and ``lanes`` lanes."""

    slots: int
    lanes: int
    roce: RoceTables
    sharing: Sharing

    def _alloc_registers(self, slots: int, lanes: int) -> None:
        """The register arrays (a backend that keeps them elsewhere overrides this).

        Index [set, slot] / [set * slots + slot]; values are native int32 so the ALU add
        wraps exactly as a switch's does.
        """
        self.bitmap = np.zeros((2, slots), dtype=np.uint32)
        self.counter = np.zeros(2 * slots, dtype=np.int32)
        self.exponent = np.full(2 * slots, EXPONENT_MIN, dtype=np.int8)
        self.seq = np.zeros(2 * slots, dtype=np.uint32)
        self.values = np.zeros((2 * slots, lanes), dtype=np.int32)
        # 1: the slot holds the upstream switch's result, 0: only the local partial sum.
        # The data path uses the bytearray (an item write is half a numpy one's cost, on
        # every first contribution); the register API its numpy view.
        self._final = bytearray(2 * slots)
        self.final = np.frombuffer(self._final, dtype=np.uint8)

    def register_read(self, cells: Sequence[RegisterCell]) -> list[int]:
        """The values of register ``cells`` (signed for :data:`SIGNED_REGISTERS`).

        Raises:
            JobTableError: an unknown array, or an index or lane outside it.
        """
        return [int(self._register_array(c)[c.index]) for c in cells]

    def register_write(self, cell: RegisterCell, value: int) -> None:
        """Write one register cell (a signed value for :data:`SIGNED_REGISTERS`).

        Raises:
            JobTableError: an unknown array, or an index or lane outside it.
        """
        self._register_array(cell)[cell.index] = value

    def _register_array(self, cell: RegisterCell) -> np.ndarray:
        arrays = {
            "seq": self.seq,
            "remaining": self.counter,
            "final": self.final,
            "exponent": self.exponent,
            "bitmap_set0": self.bitmap[0],
            "bitmap_set1": self.bitmap[1],
            "owner": self.sharing.owner,
            **self.roce.arrays(),
        }
        if cell.array == "values":
            if not 0 <= cell.lane < self.lanes:
                raise JobTableError(f"lane {cell.lane} outside 0..{self.lanes - 1}")
            array = self.values[:, cell.lane]
        elif cell.array in arrays:
            array = arrays[cell.array]
        else:
            raise JobTableError(f"no register array {cell.array!r}")
        if not 0 <= cell.index < len(array):
            raise JobTableError(f"{cell.array}[{cell.index}] outside 0..{len(array) - 1}")
        return array

    def _clear(self, base: int, count: int) -> None:
        end = base + count
        self.bitmap[:, base:end] = 0
        for pool_set in (0, 1):
            lo = pool_set * self.slots + base
            self.counter[lo : lo + count] = 0
            self.exponent[lo : lo + count] = EXPONENT_MIN
            self.seq[lo : lo + count] = 0
            self.values[lo : lo + count] = 0
            self.final[lo : lo + count] = 0
