"""Two jobs sharing one switch's region, with a fallback aggregator behind it, end to end:
the scenario ``test_sharing_udp.py`` (soft switches on loopback) and
``test_ebpf_sharing_one_armed.py`` (one-armed eBPF servers of a cluster) both run.

Job A reserves 4 slots and shares 4; job B reserves none and shares 8 of the same region
of 8: their windows of 16 overlap there, and the rest of each goes to the fallback. Every
result must be the exact sum; then A leaves, its cells are freed and cleared, and B's
slots move onto the switch, still exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial

import numpy as np
from helpers import expected, in_threads, random_inputs, worker_addresses

from controller.sharing import OWNER
from controller.switch import SwitchController, WorkerAddress
from dynamiccl.contention import fallback_fraction, read_contention
from hostlib import InaSession, JobSpec, RetryPolicy
from hostlib.transport.udp import UdpTransport

LANES = 64
WINDOW = 16
WORKERS = 3
REGION = 8
_job_ids = itertools.count(500)


class SharingJob:
    """A job's sessions, installed on the switch (sharing) and on the fallback (behind).

    Args:
        ctl, fb: the switch's and the fallback's controllers.
        bind_ip: where the workers' sockets bind.
        front: the switch's INA address as the fallback sees it (``add_behind``).
        switch: where the workers send.
        fallback: the fallback's INA address as the switch sees it.
        reserved, shared: the job's reserved and shared slots.
        deadline: the sessions' no-progress deadline.
    """

    def __init__(
        self, ctl: SwitchController, fb: SwitchController, bind_ip: str, front: WorkerAddress,
        switch: tuple[str, int], fallback: WorkerAddress, reserved: int, shared: int,
        deadline: float = 20.0,
    ) -> None:  # fmt: skip
        self.job_id = next(_job_ids)
        transports = [UdpTransport((bind_ip, 0)) for _ in range(WORKERS)]
        workers = worker_addresses(t.local_addr for t in transports)
        fb.add_behind(self.job_id, WORKERS, WINDOW, front)
        ctl.add_job(self.job_id, workers, reserved, shared=shared, region=REGION,
                    fallback=fallback)  # fmt: skip
        policy = RetryPolicy(deadline=deadline)
        self.sessions = [
            InaSession(JobSpec(self.job_id, r, WORKERS, switch, LANES, WINDOW), t, policy)
            for r, t in enumerate(transports)
        ]

    def bodies(self, inputs: np.ndarray) -> list[Callable[[], object]]:
        return [partial(s.allreduce, x) for s, x in zip(self.sessions, inputs, strict=True)]

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        self.sessions = []


def run_together(jobs: list[SharingJob], rng: np.random.Generator, size: int) -> None:
    """One call of every job at once; every rank's result must be the exact sum."""
    inputs = [random_inputs(rng, np.int32, WORKERS, size) for _ in jobs]
    bodies = [b for job, x in zip(jobs, inputs, strict=True) for b in job.bodies(x)]
    results = in_threads(bodies)
    for j, x in enumerate(inputs):
        for got in results[j * WORKERS : (j + 1) * WORKERS]:
            np.testing.assert_array_equal(got, expected(x, LANES))


def share(
    ctl: SwitchController, fb: SwitchController, a: SharingJob, b: SharingJob,
    rng: np.random.Generator,
) -> None:  # fmt: skip
    """A and B at once, three calls: exact, A on the switch and at the fallback, B
    colliding, both places completing uses, B's entry as installed."""
    for size in (40 * LANES + 5, 7 * LANES, 1):
        run_together([a, b], rng, size)
    ca, cb = ctl.job_counters(a.job_id), ctl.job_counters(b.job_id)
    assert ca["shared_uses"] > 0 and ca["to_fallback"] > 0, ca
    assert cb["collisions"] > 0 and cb["from_fallback"] > 0, cb
    front, back = ctl.counters(), fb.counters()
    assert front["completed"] > 0 and back["completed"] > 0, (front, back)
    shared = ctl.job(b.job_id).shared
    assert shared is not None and (shared.count, shared.size) == (8, REGION)
    contended(ctl, a, b)


def contended(ctl: SwitchController, a: SharingJob, b: SharingJob) -> None:
    """What dynamiccl reads of the two jobs' contention: the region is full, each job's
    cells are its own or the other's, B's blocked cells are those A holds, and the
    fallback completed part of the uses of whichever job collided."""
    va, vb = (ctl.job_sharing(j.job_id) for j in (a, b))
    assert va.region is not None and vb.region is not None
    assert (va.reserved, va.shared, vb.reserved, vb.shared) == (4, 4, 0, 8)
    assert va.region.free == vb.region.free == 0, (va, vb)
    owners = ctl.region_owners()  # the region, wherever the controller made it
    assert owners is not None and len(owners) == REGION and all(owners), owners
    assert va.region.held + va.region.blocked == 4 and vb.region.held + vb.region.blocked == 8
    assert vb.region.blocked == va.region.held and va.region.blocked <= vb.region.held
    ra, _ = read_contention(ctl, a.job_id)
    rb, _ = read_contention(ctl, b.job_id)
    assert rb.blocked == va.region.held / 8 and ra.blocked == va.region.blocked / 4
    assert rb.fallback_share is not None and 0 < rb.fallback_share <= 1, rb


def a_leaves(
    ctl: SwitchController, fb: SwitchController, a: SharingJob, b: SharingJob,
    rng: np.random.Generator,
) -> None:  # fmt: skip
    """A leaves: the cells it held are freed and cleared, and B takes them, exact."""
    shared = ctl.job(b.job_id).shared
    assert shared is not None
    a.close()
    ctl.remove_job(a.job_id)
    fb.remove_job(a.job_id)
    owners = ctl.registers.read(OWNER, shared.cells())
    assert all(v >> 16 != a.job_id for v in owners), owners
    before = ctl.job_counters(b.job_id)["shared_uses"]
    alone, counters = read_contention(ctl, b.job_id)
    assert alone.blocked == 0 and alone.region_free == REGION - ctl.job_sharing(
        b.job_id).region.held  # fmt: skip
    for size in (30 * LANES, 3):
        run_together([b], rng, size)
    assert ctl.job_counters(b.job_id)["shared_uses"] > before
    after, _ = read_contention(ctl, b.job_id, counters)
    # its region's cells all its own now; slots 8..15 of its window lie past its
    # shared ones, and only they go to the fallback
    assert after.blocked == 0 and after.region_free == 0, after
    assert fallback_fraction(after, WINDOW) == 0.5
    assert after.fallback_share is not None and 0 < after.fallback_share < 1, after
    owners = ctl.registers.read(OWNER, shared.cells())
    assert all(v >> 16 == b.job_id for v in owners), owners
