"""Controller of ``p4/upstream.p4``: the upstream table, which makes a switch a leaf of
hierarchical aggregation for a job.

An entry for a job says where the leaf sends the job's partial sums: the upstream
(spine) switch's INA address (IPv4, UDP port, MAC), the leaf's egress port toward it,
and the rank the leaf has in the spine's job of the same id. Only RESULTs from that
address are taken as the job's results. Installing the whole hierarchy (the spine's job
with the leaves as workers, each leaf's job and entry) is
:meth:`controller.switch.SwitchController.set_upstream` and ``add_job(upstream=...)``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from controller.p4info import mac_text
from controller.tables import TableManager

__all__ = ["Upstream", "UpstreamEntry"]


@dataclass(frozen=True)
class UpstreamEntry:
    """One upstream-table entry (action ``set_upstream``): job ``job_id``'s partial sums
    go as rank ``rank`` to ``ip:udp_port`` (MAC ``mac``), out of switch port
    ``egress_port``."""

    job_id: int
    rank: int
    ip: str
    udp_port: int
    mac: str
    egress_port: int


class Upstream(TableManager):
    """The ``Ingress.upstream.upstream`` table."""

    table_name = "Ingress.upstream.upstream"
    action = "Ingress.upstream.set_upstream"

    def insert(self, entry: UpstreamEntry) -> None:
        """Raises: AlreadyExistsError for a job with an entry; P4RuntimeError otherwise."""
        self._insert({"job_id": entry.job_id}, self.action, self._params(entry))

    def modify(self, entry: UpstreamEntry) -> None:
        """Raises: NotFoundError for a job without an entry; P4RuntimeError otherwise."""
        self._modify({"job_id": entry.job_id}, self.action, self._params(entry))

    def delete(self, job_id: int) -> None:
        """Raises: NotFoundError for a job without an entry; P4RuntimeError otherwise."""
        self._delete({"job_id": job_id})

    def read(self) -> list[UpstreamEntry]:
        """Every upstream entry on the switch, by job id."""
        entries = [
            UpstreamEntry(
                m["job_id"],
                p["rank"],
                str(ipaddress.IPv4Address(p["dst_ip"])),
                p["dst_port"],
                mac_text(p["dst_mac"]),
                p["egress_port"],
            )
            for m, _, p in self._read()
        ]
        return sorted(entries, key=lambda e: e.job_id)

    def get(self, job_id: int) -> UpstreamEntry | None:
        """The entry of ``job_id``, or None."""
        return next((e for e in self.read() if e.job_id == job_id), None)

    @staticmethod
    def _params(entry: UpstreamEntry) -> dict[str, int | str]:
        return {
            "rank": entry.rank,
            "dst_ip": entry.ip,
            "dst_port": entry.udp_port,
            "dst_mac": entry.mac,
            "egress_port": entry.egress_port,
        }
