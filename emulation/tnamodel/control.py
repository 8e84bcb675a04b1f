"""The control plane's side of the TNA model: the tables and multicast groups it
writes, by the program's table and action names (:class:`ControlPlane`, which
:class:`emulation.tnamodel.model.TnaModel` is).

Part of the executable TNA model (:mod:`emulation.tnamodel`): each method writes one
table's entry as its action's parameters say (tests/unit/test_tna_model.py holds their
names to the P4Info), and refuses what the table cannot hold.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import NamedTuple

from emulation.tnamodel.phv import Fallback, Shared, Upstream
from emulation.tnamodel.roce import RoceProgram, RoceReply, RoceRequest
from emulation.tnamodel.sharing import SharingProgram
from emulation.tnamodel.stateful import Register

__all__ = ["ControlPlane", "Destination", "Job", "TableError"]


class TableError(ValueError):
    """A table, group or register write the program's tables cannot hold."""


class Job(NamedTuple):
    """set_job's parameters."""

    num_workers: int
    slot_base: int
    slot_count: int
    mgid: int


class Destination(NamedTuple):
    """set_destination's parameters."""

    dst_mac: int
    dst_ip: int
    dst_port: int


@dataclass
class _Tables:
    """The control plane's tables (the const ones are the program's)."""

    jobs: dict[int, Job] = field(default_factory=dict)
    workers: set[tuple[int, int, int, int]] = field(default_factory=set)
    upstream: dict[int, Upstream] = field(default_factory=dict)
    forward: dict[int, tuple[str, int]] = field(default_factory=dict)
    replicas: dict[tuple[int, int, int], Destination] = field(default_factory=dict)
    groups: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)


def _ip(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


class ControlPlane:
    """The table writes of the TNA program (a mixin of TnaModel, which holds the state)."""

    tables: _Tables
    roce: RoceProgram
    sharing: SharingProgram
    registers: dict[str, Register]
    slots: int

    def set_job(
        self, job_id: int, num_workers: int, slot_base: int, slot_count: int, mgid: int
    ) -> None:
        """Ingress.jobs.jobs: job_id -> set_job(num_workers, slot_base, slot_count, mgid).

        Raises:
            TableError: a field outside its width, or a range leaving the set's slots
                (jobs.p4: the controller keeps slot_base + slot_count <= the set's slots).
        """
        _check_bits("job_id", job_id, 16)
        _check_bits("num_workers", num_workers, 8)
        _check_bits("mgid", mgid, 16)
        if slot_base < 0 or slot_count < 0 or slot_base + slot_count > self.slots:
            raise TableError(f"slots {slot_base}+{slot_count} leave the set of {self.slots}")
        self.tables.jobs[job_id] = Job(num_workers, slot_base, slot_count, mgid)

    def worker_hit(self, job_id: int, rank: int, ipv4_src: str, udp_src_port: int) -> None:
        """Ingress.workers.workers: (job_id, rank, ipv4_src, udp_src_port) -> worker_hit."""
        _check_bits("rank", rank, 8)
        self.tables.workers.add((job_id, rank, _ip(ipv4_src), udp_src_port))

    def set_upstream(
        self, job_id: int, rank: int, dst_ip: str, dst_port: int, dst_mac: str, egress_port: int
    ) -> None:
        """Ingress.upstream.upstream: job_id -> set_upstream(rank, dst_ip, dst_port,
        dst_mac, egress_port)."""
        _check_bits("rank", rank, 8)
        up = Upstream(rank, _ip(dst_ip), dst_port, _mac(dst_mac), egress_port)
        self.tables.upstream[job_id] = up

    def set_shared(
        self, job_id: int, count: int, base: int, mask: int, offset: int, stats: int
    ) -> None:
        """Ingress.sharing.shared: job_id -> set_shared(count, base, mask, offset, stats)."""
        for name, value in (("count", count), ("base", base), ("mask", mask),
                            ("offset", offset), ("stats", stats)):  # fmt: skip
            _check_bits(name, value, 16)
        self.sharing.tables.shared[job_id] = Shared(count, base, mask, offset, stats)

    def set_fallback(
        self, job_id: int, dst_ip: str, dst_port: int, dst_mac: str, egress_port: int, stats: int
    ) -> None:
        """Ingress.sharing.fallback: job_id -> set_fallback(dst_ip, dst_port, dst_mac,
        egress_port, stats)."""
        _check_bits("stats", stats, 16)
        entry = Fallback(_ip(dst_ip), dst_port, _mac(dst_mac), egress_port, stats)
        self.sharing.tables.fallback[job_id] = entry

    def set_behind(self, job_id: int) -> None:
        """Ingress.sharing.behind: job_id -> set_behind."""
        self.sharing.tables.behind.add(job_id)

    def set_destination(
        self, job_id: int, egress_rid: int, egress_port: int, dst_mac: str, dst_ip: str,
        dst_port: int,
    ) -> None:  # fmt: skip
        """Egress.replicas.replicas: (job_id, egress_rid, egress_port) ->
        set_destination(dst_mac, dst_ip, dst_port)."""
        dest = Destination(_mac(dst_mac), _ip(dst_ip), dst_port)
        self.tables.replicas[(job_id, egress_rid, egress_port)] = dest

    def set_roce_qp(self, dest_qp: int, job_id: int, rank: int, qp_reg: int, ipv4_src: str) -> None:
        """Ingress.roce.roce_requests: dest_qp -> set_roce_qp(job_id, rank, qp_reg, ipv4_src).

        Raises:
            TableError: a field outside its width.
        """
        _check_bits("dest_qp", dest_qp, 24)
        _check_bits("rank", rank, 8)
        _check_bits("qp_reg", qp_reg, 16)
        self.roce.tables.requests[dest_qp] = RoceRequest(job_id, rank, qp_reg, _ip(ipv4_src))

    def set_roce_job(self, job_id: int, msg_shift: int) -> None:
        """Ingress.roce.roce_jobs: job_id -> set_roce_job(msg_shift)."""
        _check_bits("msg_shift", msg_shift, 8)
        self.roce.tables.jobs[job_id] = msg_shift

    def set_roce_reply(
        self, job_id: int, rank: int, position: int, qpn: int, rkey: int, va: int, psn_index: int
    ) -> None:
        """Egress.roce.roce_replies: (job_id, rank, position) -> set_roce_reply(qpn, rkey,
        va, psn_index)."""
        _check_bits("qpn", qpn, 24)
        _check_bits("va", va, 64)
        self.roce.tables.replies[(job_id, rank, position)] = RoceReply(qpn, rkey, va, psn_index)

    def set_reply_psn(self, index: int, psn: int) -> None:
        """Egress.roce.reply_psn[index] = psn: the worker queue pair's first reply PSN."""
        _check_bits("psn", psn, 24)
        self.registers["Egress.roce.reply_psn"].cells[index] = psn

    def set_egress_port(self, eth_dst: str, port: int) -> None:
        """Ingress.forwarder.forward: eth_dst -> set_egress_port(port)."""
        self.tables.forward[_mac(eth_dst)] = ("port", port)

    def flood(self, eth_dst: str, mgid: int) -> None:
        """Ingress.forwarder.forward: eth_dst -> flood(mgid)."""
        self.tables.forward[_mac(eth_dst)] = ("flood", mgid)

    def set_group(self, mgid: int, members: list[tuple[int, int]]) -> None:
        """Multicast group ``mgid`` (1..65535): its replicas as (egress port, rid).

        Raises:
            TableError: mgid 0 (no group on Tofino) or outside 16 bits.
        """
        if not 1 <= mgid <= 0xFFFF:
            raise TableError(f"multicast group {mgid} outside 1..65535")
        self.tables.groups[mgid] = tuple(members)

    def set_drops(self, ingress: float, egress: float) -> None:
        """The drop simulators' probabilities: round(p * 2**31) in each probability register.

        Raises:
            ValueError: a probability outside 0..1.
        """
        for name, p in (("ingress", ingress), ("egress", egress)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} drop probability {p} outside 0..1")
        self.registers["Ingress.drop_simulator.probability"].cells[0] = round(ingress * 2**31)
        self.registers["Egress.drop_simulator.probability"].cells[0] = round(egress * 2**31)


def _check_bits(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise TableError(f"{name} {value} outside {bits} bits")
