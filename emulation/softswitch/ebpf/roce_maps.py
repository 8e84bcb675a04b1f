"""The eBPF data plane's RoCEv2 tables and registers: the soft switch's
:class:`~emulation.softswitch.roce_tables.RoceTables`, each write then put into the
program's map of the same table (``roce.bpf.h``).

The checks, errors and the Python view of the entries are the reference's (every write
goes through :class:`RoceTables` first); the registers of each queue pair (the UC
responder's state, the reply PSN) live only in the kernel's ``roce_qps`` map, one
:class:`~emulation.softswitch.ebpf.layout.InaRoceQp` per register index, read and
written under its lock (``BPF_F_LOCK``), as the slots are.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from emulation.softswitch.ebpf import layout
from emulation.softswitch.ebpf.layout import ROCE_FIELD_MASK, be32_ip
from emulation.softswitch.ebpf.libbpf import BPF_F_LOCK, BpfMap
from emulation.softswitch.roce_tables import (
    ROCE_ARRAYS,
    RoceReply,
    RoceRequest,
    RoceTableError,
    RoceTables,
)

__all__ = ["ROCE_MAPS", "EbpfRoceTables", "roce_map_sizes"]

_U32 = ctypes.c_uint32

ROCE_MAPS = ("roce_jobs", "roce_requests", "roce_replies", "roce_qps")
"""The program's RoCEv2 maps (``worker_ranks`` is the workers table's: ``dataplane.py``)."""

_QP_FIELDS = dict(zip(ROCE_ARRAYS, (f[0] for f in layout.InaRoceQp._fields_[1:]), strict=True))
"""Register array (``roce_tables.ROCE_ARRAYS``) -> its field in a ``roce_qps`` cell."""


def roce_map_sizes() -> dict[str, tuple[int, int]]:
    """Key and value bytes of each of :data:`ROCE_MAPS`."""
    return {
        "roce_jobs": (4, 4),
        "roce_requests": (4, ctypes.sizeof(layout.InaRoceRequest)),
        "roce_replies": (
            ctypes.sizeof(layout.InaRoceReplyKey),
            ctypes.sizeof(layout.InaRoceReply),
        ),
        "roce_qps": (4, ctypes.sizeof(layout.InaRoceQp)),
    }


class EbpfRoceTables(RoceTables):
    """:class:`RoceTables` whose entries are also the program's maps ``maps`` (by
    :data:`ROCE_MAPS` name) and whose registers are only there.

    Args:
        lanes, registers: as for :class:`RoceTables` (``registers``: the ``roce_qps``
            map's size).
        maps: the opened maps.
    """

    def __init__(self, lanes: int, registers: int, maps: dict[str, BpfMap]) -> None:
        super().__init__(lanes, registers)
        self._maps = maps
        self.clear_registers()

    # ----------------------------------------------------------------- tables
    def set_job(self, job_id: int, msg_packets: int) -> None:
        super().set_job(job_id, msg_packets)
        self._maps["roce_jobs"].update(_U32(job_id), _U32(msg_packets.bit_length() - 1))

    def delete_job(self, job_id: int) -> None:
        super().delete_job(job_id)
        self._maps["roce_jobs"].delete(_U32(job_id))

    def set_request(self, qpn: int, entry: RoceRequest) -> None:
        super().set_request(qpn, entry)
        value = layout.InaRoceRequest(entry.job_id, entry.rank, entry.qp_reg, be32_ip(entry.ip))
        self._maps["roce_requests"].update(_U32(qpn), value)
        self.register_write("roce_open", entry.qp_reg, 0)  # as the reference: closed

    def delete_request(self, qpn: int) -> None:
        super().delete_request(qpn)
        self._maps["roce_requests"].delete(_U32(qpn))

    def set_reply(self, job_id: int, rank: int, position: int, entry: RoceReply) -> None:
        super().set_reply(job_id, rank, position, entry)
        value = layout.InaRoceReply(va=entry.va, qpn=entry.qpn, rkey=entry.rkey,
                                    psn_reg=entry.psn_reg)  # fmt: skip
        self._maps["roce_replies"].update(_reply_key(job_id, rank, position), value)

    def delete_reply(self, job_id: int, rank: int, position: int) -> None:
        super().delete_reply(job_id, rank, position)
        self._maps["roce_replies"].delete(_reply_key(job_id, rank, position))

    def set_reply_psn(self, psn_reg: int, psn: int) -> None:
        super().set_reply_psn(psn_reg, psn)
        self.register_write("roce_reply_psn", psn_reg, psn)

    def remove_job(self, job_id: int) -> None:
        gone_requests = [q for q, e in self.requests.items() if e.job_id == job_id]
        gone_replies = [k for k in self.replies if k[0] == job_id]
        super().remove_job(job_id)
        self._maps["roce_jobs"].delete(_U32(job_id))
        for qpn in gone_requests:
            self._maps["roce_requests"].delete(_U32(qpn))
        for key in gone_replies:
            self._maps["roce_replies"].delete(_reply_key(*key))

    def reset(self) -> None:
        """Every entry and register cleared, in the maps too."""
        super().reset()
        for name, key_type in (("roce_jobs", _U32), ("roce_requests", _U32),
                               ("roce_replies", layout.InaRoceReplyKey)):  # fmt: skip
            table = self._maps[name]
            for key in list(table.keys(key_type)):
                table.delete(key)
        self.clear_registers()

    # ----------------------------------------------------------------- registers
    def arrays(self) -> dict[str, np.ndarray]:
        """The register arrays as read from the kernel now (a copy: writes go through
        :meth:`register_write`)."""
        cells = [self._cell(reg) for reg in range(self.registers)]
        return {
            name: np.array([self._field(cell, name) for cell in cells], dtype=np.int64)
            for name in ROCE_ARRAYS
        }

    def clear_registers(self) -> None:
        """Every queue pair register cell 0."""
        empty = layout.InaRoceQp()
        for reg in range(self.registers):
            self._maps["roce_qps"].update(_U32(reg), empty, BPF_F_LOCK)

    def register_read(self, array: str, index: int) -> int:
        """Register ``array`` (one of ``ROCE_ARRAYS``) at queue pair register ``index``.

        Raises:
            RoceTableError: no such array, or the index outside it.
        """
        self._check_array(array)
        return self._field(self._cell(index), array)

    def register_write(self, array: str, index: int, value: int) -> None:
        """Write one cell (read, change the field, write back, each under the cell's
        lock: the controller writes the registers of queue pairs no frame uses).

        Raises:
            RoceTableError: no such array, or the index outside it.
        """
        self._check_array(array)
        cell = self._cell(index)
        setattr(cell, _QP_FIELDS[array], value)
        self._maps["roce_qps"].update(_U32(index), cell, BPF_F_LOCK)

    def _cell(self, index: int) -> Any:
        self._check_reg(index)
        cell = layout.InaRoceQp()
        if not self._maps["roce_qps"].lookup(_U32(index), cell, BPF_F_LOCK):
            raise RoceTableError(f"queue pair register {index} outside the map")
        return cell

    @staticmethod
    def _field(cell: Any, array: str) -> int:
        value = int(getattr(cell, _QP_FIELDS[array]))
        # The program takes reply PSNs by a 32-bit atomic add: the PSN is its low 24 bits.
        return value & ROCE_FIELD_MASK if array == "roce_reply_psn" else value

    @staticmethod
    def _check_array(array: str) -> None:
        if array not in _QP_FIELDS:
            raise RoceTableError(f"no RoCEv2 register array {array!r}")


def _reply_key(job_id: int, rank: int, position: int) -> Any:
    return layout.InaRoceReplyKey(job=job_id, rank=rank, position=position)
