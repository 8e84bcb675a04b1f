"""The soft switch's RoCEv2 tables and registers: the state p4/roce.p4 and
p4/roce_replies.p4 declare, kept by the :class:`~emulation.softswitch.pipeline.Pipeline`
beside its other tables, written by P4Runtime (``p4rt_tables.py``) or directly.

``roce.py`` (:class:`~emulation.softswitch.roce.RoceFront`) runs frames through them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hostlib.protocol import (
    LANE_BYTES,
    MAX_WORKERS,
    ROCE_MAX_MSG_PACKETS,
    ROCE_PMTUS,
    ROCE_QP_REGISTERS,
)

__all__ = [
    "ROCE_ARRAYS",
    "RoceReply",
    "RoceRequest",
    "RoceTables",
    "qp_registers",
]

ROCE_ARRAYS = (
    "roce_open",
    "roce_expect_psn",
    "roce_base",
    "roce_seq",
    "roce_exponent",
    "roce_place",
    "roce_reply_psn",
)
"""The register arrays, as the pipeline names them (``Ingress.roce.open`` ...,
``Egress.roce.reply_psn``), each of :data:`ROCE_QP_REGISTERS` cells."""


def qp_registers(slots: int) -> int:
    """Cells of each per-queue-pair register of a soft switch with ``slots`` slots per
    set: as many queue pairs as the pool can use (every worker of every slot), at most
    p4/'s :data:`ROCE_QP_REGISTERS`. The soft switch's P4Info has this size."""
    return min(ROCE_QP_REGISTERS, MAX_WORKERS * slots)


class RoceTableError(ValueError):
    """A RoCEv2 table write that cannot be applied (a field out of range)."""


@dataclass(frozen=True, slots=True)
class RoceRequest:
    """A ``roce_requests`` entry: who sends on one of the switch's queue pairs (job,
    rank, and the worker's IPv4: nobody else may touch the queue pair's state), and the
    index of that queue pair's registers."""

    job_id: int
    rank: int
    qp_reg: int
    ip: str


@dataclass(frozen=True, slots=True)
class RoceReply:
    """A ``roce_replies`` entry: where replies for one worker's window position go, and
    the index of its PSN register."""

    qpn: int
    rkey: int
    va: int
    psn_reg: int


class RoceTables:
    """``roce_jobs``, ``roce_requests``, ``roce_replies`` and the per-queue-pair registers.

    Args:
        lanes: the switch's lanes per packet (a message of more than one packet needs
            them to fill a path MTU).
        registers: cells of each per-queue-pair register (:func:`qp_registers`).
    """

    def __init__(self, lanes: int, registers: int = ROCE_QP_REGISTERS) -> None:
        self.lanes = lanes
        self.registers = registers
        self.jobs: dict[int, int] = {}  # job id -> packets per message
        self.requests: dict[int, RoceRequest] = {}  # the switch's dest QP -> entry
        self.replies: dict[tuple[int, int, int], RoceReply] = {}  # (job, rank, position)
        n = registers
        self.open = np.zeros(n, dtype=np.uint8)
        self.expect_psn = np.zeros(n, dtype=np.uint32)
        self.base = np.zeros(n, dtype=np.uint16)
        self.seq = np.zeros(n, dtype=np.uint32)
        self.exponent = np.zeros(n, dtype=np.int8)
        self.place = np.zeros(n, dtype=np.uint16)
        self.reply_psn = np.zeros(n, dtype=np.uint32)

    def arrays(self) -> dict[str, np.ndarray]:
        """The register arrays by :data:`ROCE_ARRAYS` name."""
        arrays = (self.open, self.expect_psn, self.base, self.seq, self.exponent, self.place)
        return dict(zip(ROCE_ARRAYS, (*arrays, self.reply_psn), strict=True))

    def set_job(self, job_id: int, msg_packets: int) -> None:
        """``roce_jobs``: the job's messages have ``msg_packets`` packets.

        Raises:
            RoceTableError: not a power of two up to :data:`ROCE_MAX_MSG_PACKETS` (the P4
                programs find a packet's place with a mask), or more than one packet of
                lanes that are not a path MTU.
        """
        payload = self.lanes * LANE_BYTES
        if not 1 <= msg_packets <= ROCE_MAX_MSG_PACKETS or msg_packets & (msg_packets - 1):
            raise RoceTableError(
                f"job {job_id}: {msg_packets} packets per message: a power of two "
                f"up to {ROCE_MAX_MSG_PACKETS}"
            )
        if msg_packets > 1 and payload not in ROCE_PMTUS:
            raise RoceTableError(
                f"job {job_id}: messages of {msg_packets} packets of {payload} B: a message "
                f"of more than one packet needs packets of a path MTU {ROCE_PMTUS}"
            )
        self.jobs[job_id] = msg_packets

    def delete_job(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)

    def set_request(self, qpn: int, entry: RoceRequest) -> None:
        """``roce_requests``: the switch's queue pair ``qpn`` is ``entry``'s; its message
        state starts closed.

        Raises:
            RoceTableError: qpn outside 24 bits or the register index outside the arrays.
        """
        _check_qpn(qpn)
        self._check_reg(entry.qp_reg)
        self.requests[qpn] = entry
        self.open[entry.qp_reg] = 0

    def delete_request(self, qpn: int) -> None:
        self.requests.pop(qpn, None)

    def set_reply(self, job_id: int, rank: int, position: int, entry: RoceReply) -> None:
        """``roce_replies``: replies for ``rank``'s window ``position`` go to ``entry``
        (the PSN register :meth:`set_reply_psn` writes is the first's).

        Raises:
            RoceTableError: a field out of range.
        """
        _check_qpn(entry.qpn)
        self._check_reg(entry.psn_reg)
        self.replies[(job_id, rank, position)] = entry

    def delete_reply(self, job_id: int, rank: int, position: int) -> None:
        self.replies.pop((job_id, rank, position), None)

    def set_reply_psn(self, psn_reg: int, psn: int) -> None:
        """The base PSN of register ``psn_reg``'s queue pair: its replies carry
        :func:`hostlib.rocev2.reply_psn` of it (the data plane only reads it).

        Raises:
            RoceTableError: the index or the PSN out of range.
        """
        self._check_reg(psn_reg)
        if not 0 <= psn < 1 << 24:
            raise RoceTableError(f"PSN {psn} outside 24 bits")
        self.reply_psn[psn_reg] = psn

    def remove_job(self, job_id: int) -> None:
        """Every entry of ``job_id``."""
        self.jobs.pop(job_id, None)
        self.requests = {q: e for q, e in self.requests.items() if e.job_id != job_id}
        self.replies = {k: e for k, e in self.replies.items() if k[0] != job_id}

    def _check_reg(self, reg: int) -> None:
        if not 0 <= reg < self.registers:
            raise RoceTableError(f"register index {reg} outside 0..{self.registers - 1}")

    def reset(self) -> None:
        """Every entry and register cleared."""
        self.jobs.clear()
        self.requests.clear()
        self.replies.clear()
        for array in self.arrays().values():
            array[:] = 0


def _check_qpn(qpn: int) -> None:
    if not 0 <= qpn < 1 << 24:
        raise RoceTableError(f"queue pair {qpn} outside 24 bits")
