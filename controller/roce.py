"""Controller of ``p4/roce.p4`` and ``p4/roce_replies.p4``: a job's RoCEv2 queue pairs.

A job that runs INA over RoCEv2 is first installed as any job (``SwitchController.add_job``
with each rank at ``(its IPv4, 4791)``: RoCEv2's source ports vary, so the workers table
binds the address at the RoCEv2 port), then :meth:`Roce.install` writes, per job:

- ``roce_jobs``: the job's messages of ``msg_packets = 2^msg_shift`` packets;
- per rank and window position ``u``: the switch's queue pair for it in
  ``roce_requests`` (its number, and the index of its registers), and the worker's
  reply endpoint in ``roce_replies`` (queue pair, R_Key, address, the index of its PSN
  register), whose PSN register it sets to the worker's first PSN: the base of the
  replies' PSNs (docs/protocol.md).

The switch's queue pair numbers are ``ROCE_QPN_BASE + index``, the index being the
lowest free register index; the worker's reply endpoints are what its transport said
(``hostlib.transport.rdma.RdmaTransport.endpoints``), SwitchML's ``RdmaSession``
exchange. :meth:`Roce.remove` deletes them all.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.client import P4RuntimeClient
from controller.p4info import P4Info, P4InfoError
from controller.registers import RegisterAccess
from controller.tables import TableManager, roll_back
from hostlib.protocol import ROCE_MAX_MSG_PACKETS
from hostlib.transport.rdma import RdmaEndpoint

__all__ = [
    "PSN_REGISTER",
    "ROCE_QPN_BASE",
    "Roce",
    "RoceInstalled",
    "RoceReplyEntry",
    "RoceRequestEntry",
]

log = logging.getLogger(__name__)

ROCE_QPN_BASE = 0x800000
"""The switch's queue pair numbers: this plus the register index (bit 23 set, as
SwitchML's, so they stand out in a capture)."""

PSN_REGISTER = "Egress.roce.reply_psn"


@dataclass(frozen=True)
class RoceRequestEntry:
    """A ``roce_requests`` entry: the switch's queue pair ``qpn`` is ``rank``'s of
    ``job_id``, whose IPv4 address is ``ip``; its registers at ``qp_reg``."""

    qpn: int
    job_id: int
    rank: int
    qp_reg: int
    ip: str


@dataclass(frozen=True)
class RoceReplyEntry:
    """A ``roce_replies`` entry: replies for ``rank``'s window ``position`` of
    ``job_id`` go to the worker's queue pair ``qpn``, R_Key ``rkey``, address ``va``;
    their PSNs come from register cell ``psn_reg``."""

    job_id: int
    rank: int
    position: int
    qpn: int
    rkey: int
    va: int
    psn_reg: int


@dataclass(frozen=True)
class RoceInstalled:
    """A job's RoCEv2 state on the switch: packets per message, and per rank the
    switch's queue pair for each window position (what the worker connects to)."""

    job_id: int
    msg_packets: int
    switch_qpns: tuple[tuple[int, ...], ...]


class _RoceJobs(TableManager):
    table_name = "Ingress.roce.roce_jobs"
    action = "Ingress.roce.set_roce_job"


class _RoceRequests(TableManager):
    table_name = "Ingress.roce.roce_requests"
    action = "Ingress.roce.set_roce_qp"


class _RoceReplies(TableManager):
    table_name = "Egress.roce.roce_replies"
    action = "Egress.roce.set_roce_reply"


class Roce:
    """The RoCEv2 tables of one switch, and its PSN register.

    Args:
        client: the switch's P4Runtime client.
        p4info: the switch's P4Info (it must declare p4/roce.p4's tables).
        registers: register access (P4Runtime, or Thrift on bmv2).
    """

    @staticmethod
    def served_by(p4info: P4Info) -> bool:
        """Whether the program declares RoCEv2's tables (``p4/``'s and ``p4/tna/``'s do, by
        the same names, keys and actions)."""
        try:
            p4info.table(_RoceJobs.table_name)
        except P4InfoError:
            return False
        return True

    def __init__(self, client: P4RuntimeClient, p4info: P4Info, registers: RegisterAccess) -> None:
        self.size = int(p4info.register(PSN_REGISTER).size)
        """Queue pairs the switch keeps state for (its registers' cells)."""
        self.jobs = _RoceJobs(client, p4info)
        self.requests = _RoceRequests(client, p4info)
        self.replies = _RoceReplies(client, p4info)
        self.registers = registers

    def install(
        self,
        job_id: int,
        ips: Sequence[str],
        endpoints: Sequence[Sequence[RdmaEndpoint]],
        msg_packets: int,
    ) -> RoceInstalled:
        """Write the job's RoCEv2 entries: rank ``r`` sends from ``ips[r]``, and its window
        position ``u`` replies to ``endpoints[r][u]``. If a write fails, what was written
        is removed first.

        Raises:
            ValueError: ``msg_packets`` not a power of two up to 32, ranks with windows
                of different lengths (or not one address each), or not enough free queue
                pair registers.
            P4RuntimeError | ThriftError: the switch refused a write.
        """
        shift = msg_packets.bit_length() - 1
        if not 1 <= msg_packets <= ROCE_MAX_MSG_PACKETS or msg_packets != 1 << shift:
            raise ValueError(
                f"{msg_packets} packets per message: a power of two up to {ROCE_MAX_MSG_PACKETS}"
            )
        window = {len(e) for e in endpoints}
        if len(window) != 1 or 0 in window:
            raise ValueError(f"ranks' windows differ or are empty: {sorted(window)}")
        if len(ips) != len(endpoints):
            raise ValueError(f"{len(ips)} addresses for {len(endpoints)} ranks")
        regs = self._free_registers(len(endpoints) * window.pop())
        requests, replies = _entries(job_id, ips, endpoints, regs)
        undo: list[Callable[[], None]] = []
        try:
            self.jobs._insert({"job_id": job_id}, self.jobs.action, {"msg_shift": shift})
            undo.append(lambda: self.jobs._delete({"job_id": job_id}))
            for reply, ep in zip(replies, (e for rank in endpoints for e in rank), strict=True):
                self.registers.fill(PSN_REGISTER, reply.psn_reg, reply.psn_reg + 1, ep.psn)
                self.replies._insert(*_reply_write(reply))
                undo.append(lambda r=reply: self.replies._delete(_reply_match(r)))  # type: ignore[misc]
            for request in requests:
                self.requests._insert(*_request_write(request))
                undo.append(lambda q=request: self.requests._delete({"dest_qp": q.qpn}))  # type: ignore[misc]
        except BaseException:
            roll_back(undo, f"RoCEv2 of job {job_id}")
            raise
        per_rank = len(endpoints[0])
        qpns = tuple(
            tuple(q.qpn for q in requests[r * per_rank : (r + 1) * per_rank])
            for r in range(len(endpoints))
        )
        log.info("job %d: RoCEv2, %d queue pairs, %d packets a message", job_id,
                 len(requests), msg_packets)  # fmt: skip
        return RoceInstalled(job_id, msg_packets, qpns)

    def read_requests(self, job_id: int | None = None) -> list[RoceRequestEntry]:
        """Every ``roce_requests`` entry (of ``job_id`` if given), by register index."""
        found = [
            RoceRequestEntry(
                m["dest_qp"],
                p["job_id"],
                p["rank"],
                p["qp_reg"],
                str(ipaddress.IPv4Address(p["ipv4_src"])),
            )
            for m, _, p in self.requests._read()
        ]
        return sorted((e for e in found if job_id in (None, e.job_id)), key=lambda e: e.qp_reg)

    def read_replies(self, job_id: int | None = None) -> list[RoceReplyEntry]:
        """Every ``roce_replies`` entry (of ``job_id`` if given), by rank and position."""
        found = [
            RoceReplyEntry(m["job_id"], m["rank"], m["position"], *_reply_params(p))
            for m, _, p in self.replies._read()
        ]
        return sorted(
            (e for e in found if job_id in (None, e.job_id)), key=lambda e: (e.rank, e.position)
        )

    def msg_packets(self, job_id: int) -> int | None:
        """Packets per message of ``job_id``, or None if it has no RoCEv2 entry."""
        for m, _, p in self.jobs._read():
            if m["job_id"] == job_id:
                return 1 << p["msg_shift"]
        return None

    def remove(self, job_id: int) -> bool:
        """Delete the job's RoCEv2 entries (requests first: its frames stop at once);
        False if it had none.

        Raises:
            P4RuntimeError | ThriftError: the switch refused a write.
        """
        requests = self.read_requests(job_id)
        replies = self.read_replies(job_id)
        has_job = self.msg_packets(job_id) is not None
        for request in requests:
            self.requests._delete({"dest_qp": request.qpn})
        for reply in replies:
            self.replies._delete(_reply_match(reply))
        if has_job:
            self.jobs._delete({"job_id": job_id})
        return bool(requests or replies or has_job)

    def _free_registers(self, count: int) -> list[int]:
        """The ``count`` lowest register indices no request entry holds.

        Raises:
            ValueError: fewer are free.
        """
        used = {e.qp_reg for e in self.read_requests()}
        free = [i for i in range(self.size) if i not in used][:count]
        if len(free) < count:
            raise ValueError(f"{count} queue pairs asked for, {len(free)} free of {self.size}")
        return free


def _entries(
    job_id: int, ips: Sequence[str], endpoints: Sequence[Sequence[RdmaEndpoint]], regs: list[int]
) -> tuple[list[RoceRequestEntry], list[RoceReplyEntry]]:
    """Rank by rank, position by position: the request entry and the reply entry, both
    on one register index (its switch queue pair's state; the worker queue pair's PSN)."""
    requests, replies = [], []
    slots = iter(regs)
    for rank, mine in enumerate(endpoints):
        for position, ep in enumerate(mine):
            reg = next(slots)
            requests.append(RoceRequestEntry(ROCE_QPN_BASE + reg, job_id, rank, reg, ips[rank]))
            replies.append(RoceReplyEntry(job_id, rank, position, ep.qpn, ep.rkey, ep.va, reg))
    return requests, replies


def _request_write(e: RoceRequestEntry) -> tuple[dict[str, int], str, dict[str, int | str]]:
    params: dict[str, int | str] = {
        "job_id": e.job_id, "rank": e.rank, "qp_reg": e.qp_reg, "ipv4_src": e.ip
    }  # fmt: skip
    return {"dest_qp": e.qpn}, _RoceRequests.action, params


def _reply_params(p: dict[str, int]) -> tuple[int, int, int, int]:
    return p["qpn"], p["rkey"], p["va"], p["psn_index"]


def _reply_match(e: RoceReplyEntry) -> dict[str, int]:
    return {"job_id": e.job_id, "rank": e.rank, "position": e.position}


def _reply_write(e: RoceReplyEntry) -> tuple[dict[str, int], str, dict[str, int]]:
    params = {"qpn": e.qpn, "rkey": e.rkey, "va": e.va, "psn_index": e.psn_reg}
    return _reply_match(e), _RoceReplies.action, params
