"""Controller of ``p4/jobs.p4``: the jobs table, one entry per job (ATP's per-job state).

An entry maps a job id to its number of workers, its slot range in the switch pool and
the multicast group its results go to. Installing a whole job (workers, group, replicas,
cleared slots) is :meth:`controller.switch.SwitchController.add_job`.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.tables import TableManager

__all__ = ["JobEntry", "Jobs"]


@dataclass(frozen=True)
class JobEntry:
    """One jobs-table entry (action ``set_job``)."""

    job_id: int
    num_workers: int
    slot_base: int
    slot_count: int
    mgid: int


class Jobs(TableManager):
    """The ``Ingress.jobs.jobs`` table."""

    table_name = "Ingress.jobs.jobs"
    action = "Ingress.jobs.set_job"

    def insert(self, job: JobEntry) -> None:
        """Raises: AlreadyExistsError for an existing job id; P4RuntimeError otherwise."""
        self._insert({"job_id": job.job_id}, self.action, self._params(job))

    def modify(self, job: JobEntry) -> None:
        """Raises: NotFoundError for an unknown job id; P4RuntimeError otherwise."""
        self._modify({"job_id": job.job_id}, self.action, self._params(job))

    def delete(self, job_id: int) -> None:
        """Raises: NotFoundError for an unknown job id; P4RuntimeError otherwise."""
        self._delete({"job_id": job_id})

    def read(self) -> list[JobEntry]:
        """Every job entry on the switch, by job id."""
        jobs = [
            JobEntry(
                match["job_id"],
                params["num_workers"],
                params["slot_base"],
                params["slot_count"],
                params["mgid"],
            )
            for match, _, params in self._read()
        ]
        return sorted(jobs, key=lambda j: j.job_id)

    def get(self, job_id: int) -> JobEntry | None:
        """The entry of ``job_id``, or None."""
        return next((j for j in self.read() if j.job_id == job_id), None)

    @staticmethod
    def _params(job: JobEntry) -> dict[str, int]:
        return {
            "num_workers": job.num_workers,
            "slot_base": job.slot_base,
            "slot_count": job.slot_count,
            "mgid": job.mgid,
        }
