"""The P4Runtime server's tables: their entries and what a write does to the pipeline.

Switch-target layer, part of :mod:`emulation.softswitch.p4runtime`. It owns a table's
stored state (:class:`_Table`: entries keyed by canonical match, the modified default
entry) and the binding of each P4 table to the :class:`Pipeline`'s table API
(:class:`_Hooks`, by table name, with match fields and action parameters already checked
against the P4Info and decoded to integers). :class:`emulation.softswitch.p4rt_entities._Entities`
does the checking and calls the hooks; a new table of the P4 program needs only its
branch in :meth:`_Hooks.apply` (and :meth:`_Hooks.default` if its default action moves
packets) and the pipeline methods it calls: a table without a hook is stored and read
back but changes nothing in the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from p4.v1 import p4runtime_pb2

from controller.p4info import P4Info
from emulation.softswitch.p4rt_p4info import _ipv4
from emulation.softswitch.pipeline import Pipeline
from emulation.softswitch.roce_tables import RoceReply, RoceRequest
from emulation.softswitch.sharing import Fallback, SharedEntry

__all__ = ["_Hooks", "_Key", "_Table", "_initial_default"]

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
        elif table.startswith(("Ingress.roce.", "Egress.roce.")):
            self._roce(table, kind == p4runtime_pb2.Update.DELETE, match, params)
        elif table.startswith("Ingress.sharing."):
            self._sharing(table, kind == p4runtime_pb2.Update.DELETE, match, params)

    def _sharing(
        self, table: str, delete: bool, match: dict[str, int], params: dict[str, int]
    ) -> None:
        """The tables of p4/sharing.p4: the shared region, the fallback, behind."""
        p, job, name = self.pipeline, match["job_id"], table.rsplit(".", 1)[1]
        if delete:
            p.delete_sharing(name, job)
        elif name == "shared":
            size = params["mask"] + 1
            entry = SharedEntry(params["count"], params["base"], size, params["offset"],
                                params["stats"])  # fmt: skip
            p.set_shared(job, entry)
        elif name == "fallback":
            addr = (_ipv4(params["dst_ip"]), params["dst_port"])
            p.set_fallback(job, Fallback(addr, params["dst_mac"], params["egress_port"],
                                         params["stats"]))  # fmt: skip
        else:
            p.set_behind(job)

    def _roce(
        self, table: str, delete: bool, match: dict[str, int], params: dict[str, int]
    ) -> None:
        """The RoCEv2 tables (p4/roce.p4, p4/roce_replies.p4): ``pipeline.roce``."""
        tables = self.pipeline.roce
        if table == "Ingress.roce.roce_requests":
            qpn = match["dest_qp"]
            if delete:
                tables.delete_request(qpn)
            else:
                ip = _ipv4(params["ipv4_src"])
                entry = RoceRequest(params["job_id"], params["rank"], params["qp_reg"], ip)
                tables.set_request(qpn, entry)
        elif table == "Ingress.roce.roce_jobs":
            if delete:
                tables.delete_job(match["job_id"])
            else:
                tables.set_job(match["job_id"], 1 << params["msg_shift"])
        elif table == "Egress.roce.roce_replies":
            key = (match["job_id"], match["rank"], match["position"])
            if delete:
                tables.delete_reply(*key)
            else:
                reply = RoceReply(params["qpn"], params["rkey"], params["va"], params["psn_index"])
                tables.set_reply(*key, reply)

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


def _initial_default(p4info: P4Info, table: Any) -> int:
    """The forwarder's initial default (forward_drop): the one action named ``*_drop``."""
    for ref in table.action_refs:
        if p4info.action(ref.id).name.endswith("drop"):
            return int(ref.id)
    return 0
