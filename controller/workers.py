"""Controller of ``p4/workers.p4``: the workers table, which binds each rank of a job
to the IPv4 address and UDP port it sends from (a packet from anywhere else is dropped
as ``bad_source``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from controller.tables import TableManager

__all__ = ["WorkerEntry", "Workers"]


@dataclass(frozen=True)
class WorkerEntry:
    """One workers-table entry: rank ``rank`` of ``job_id`` sends from ``ip:udp_port``."""

    job_id: int
    rank: int
    ip: str
    udp_port: int


class Workers(TableManager):
    """The ``Ingress.workers.workers`` table."""

    table_name = "Ingress.workers.workers"
    action = "Ingress.workers.worker_hit"

    def insert(self, worker: WorkerEntry) -> None:
        """Raises: AlreadyExistsError for an existing binding; P4RuntimeError otherwise."""
        self._insert(self._match(worker), self.action, {})

    def delete(self, worker: WorkerEntry) -> None:
        """Raises: NotFoundError for an unknown binding; P4RuntimeError otherwise."""
        self._delete(self._match(worker))

    def read(self, job_id: int | None = None) -> list[WorkerEntry]:
        """Every binding (of ``job_id`` if given), by job and rank."""
        workers = [
            WorkerEntry(
                m["job_id"], m["rank"], str(ipaddress.IPv4Address(m["ipv4_src"])), m["udp_src_port"]
            )
            for m, _, _ in self._read()
            if job_id is None or m["job_id"] == job_id
        ]
        return sorted(workers, key=lambda w: (w.job_id, w.rank, w.ip, w.udp_port))

    @staticmethod
    def _match(worker: WorkerEntry) -> dict[str, int | str]:
        return {
            "job_id": worker.job_id,
            "rank": worker.rank,
            "ipv4_src": worker.ip,
            "udp_src_port": worker.udp_port,
        }
