"""Controller of the packet replication engine: one multicast group per job.

Not a P4 control: v1model's PRE replicates a packet whose ``mcast_grp`` is set (by
``set_job``'s mgid in ``next_step.p4``) to every (egress port, rid) of the group.
"""

from __future__ import annotations

from collections.abc import Sequence

from p4.v1 import p4runtime_pb2

from controller.client import P4RuntimeClient
from controller.entries import delete, insert, modify, multicast_group_entry

__all__ = ["MulticastGroups", "Replica"]

Replica = tuple[int, int]
"""(egress port, rid): the rid is the worker's rank, seen in egress as egress_rid."""


class MulticastGroups:
    """Multicast group entries of one switch."""

    def __init__(self, client: P4RuntimeClient) -> None:
        self.client = client

    def insert(self, mgid: int, replicas: Sequence[Replica]) -> None:
        """Raises: AlreadyExistsError for an existing group; P4RuntimeError otherwise."""
        self.client.write([insert(multicast_group_entry(mgid, replicas))])

    def modify(self, mgid: int, replicas: Sequence[Replica]) -> None:
        """Raises: NotFoundError for an unknown group; P4RuntimeError otherwise."""
        self.client.write([modify(multicast_group_entry(mgid, replicas))])

    def delete(self, mgid: int) -> None:
        """Raises: NotFoundError for an unknown group; P4RuntimeError otherwise."""
        self.client.write([delete(multicast_group_entry(mgid, []))])

    def read(self) -> dict[int, tuple[Replica, ...]]:
        """Every group: its id and (port, rid) replicas (a wildcard read)."""
        want = p4runtime_pb2.Entity()
        want.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        groups = {}
        for found in self.client.read([want]):
            group = found.packet_replication_engine_entry.multicast_group_entry
            groups[group.multicast_group_id] = tuple(
                (r.egress_port, r.instance) for r in group.replicas
            )
        return dict(sorted(groups.items()))
