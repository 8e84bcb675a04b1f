"""Controller of ``p4/replicas.p4``: where each replica of a job's multicast result goes.

The job's multicast group (``controller.multicast``) holds one replica per worker,
(the worker's switch port, rid = its rank); this table, keyed by (job, rid, port),
gives the MAC, IPv4 address and UDP port egress writes as the replica's destination.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from controller.p4info import mac_text
from controller.tables import TableManager

__all__ = ["ReplicaEntry", "Replicas"]


@dataclass(frozen=True)
class ReplicaEntry:
    """One replicas-table entry."""

    job_id: int
    rid: int
    egress_port: int
    mac: str
    ip: str
    udp_port: int


class Replicas(TableManager):
    """The ``Egress.replicas.replicas`` table."""

    table_name = "Egress.replicas.replicas"
    action = "Egress.replicas.set_destination"

    def insert(self, replica: ReplicaEntry) -> None:
        """Raises: AlreadyExistsError for an existing key; P4RuntimeError otherwise."""
        params: dict[str, int | str] = {
            "dst_mac": replica.mac,
            "dst_ip": replica.ip,
            "dst_port": replica.udp_port,
        }
        self._insert(self._match(replica), self.action, params)

    def delete(self, replica: ReplicaEntry) -> None:
        """Raises: NotFoundError for an unknown key; P4RuntimeError otherwise."""
        self._delete(self._match(replica))

    def read(self, job_id: int | None = None) -> list[ReplicaEntry]:
        """Every replica entry (of ``job_id`` if given), by job, rid and port."""
        replicas = [
            ReplicaEntry(
                m["job_id"],
                m["egress_rid"],
                m["egress_port"],
                mac_text(p["dst_mac"]),
                str(ipaddress.IPv4Address(p["dst_ip"])),
                p["dst_port"],
            )
            for m, _, p in self._read()
            if job_id is None or m["job_id"] == job_id
        ]
        return sorted(replicas, key=lambda r: (r.job_id, r.rid, r.egress_port))

    @staticmethod
    def _match(replica: ReplicaEntry) -> dict[str, int]:
        return {
            "job_id": replica.job_id,
            "egress_rid": replica.rid,
            "egress_port": replica.egress_port,
        }
