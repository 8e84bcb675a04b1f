"""A fallback aggregator's side of sharing: a job installed behind the switch it serves.

Switch-target layer. A switch passes the packets it cannot aggregate (a collision in its
shared region, a slot past it: :mod:`~emulation.softswitch.sharing`) on, unchanged, to the
job's fallback aggregator, a pipeline on a server. There every rank's packets come from
that switch, and the results go back to it, which multicasts them to the workers.
"""

from __future__ import annotations

from emulation.softswitch.pipeline import Addr, Pipeline

__all__ = ["install_behind"]


def install_behind(
    pipeline: Pipeline, job_id: int, num_workers: int, slot_count: int, switch: Addr
) -> int:
    """Install ``job_id`` on a fallback aggregator that serves it behind ``switch``: every
    rank's packets come from the switch, which passes them on unchanged, and the results
    go back to it; return the job's slot base.

    Raises:
        JobTableError: as :meth:`Pipeline.insert_job` does, or no free range.
    """
    base = pipeline.free_range(slot_count)
    mgid = pipeline.free_mgid()
    pipeline.insert_job(job_id, num_workers, base, slot_count, mgid)
    for rank in range(num_workers):
        pipeline.insert_worker(job_id, rank, switch)
    pipeline.set_replica(job_id, 0, 0, switch)
    pipeline.set_group(mgid, [(0, 0)])
    pipeline.clear_slots(base, slot_count)
    pipeline.set_behind(job_id)
    return base
