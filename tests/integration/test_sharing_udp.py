"""Two jobs share one soft switch's region, with a fallback aggregator behind it, end to end.

Two real ``inalab switch`` processes on loopback, both configured by the controller over
P4Runtime: the switch, with a shared region of 8 slots, and a fallback aggregator with
both jobs installed behind the switch (``add_behind``). Job A reserves 4 slots and shares
4; job B reserves none and shares 8 of the same region, so their windows of 16 overlap
there and the rest of each window goes to the fallback. The workers are real sessions
(the native engine where it is built) on UDP sockets, and nothing in their API knows of
the sharing. Every result is the exact sum; then A leaves, its slots are freed and
cleared, and B's slots move onto the switch, still exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import expected, in_threads, random_inputs, worker_addresses

from controller.sharing import OWNER
from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch import SoftSwitchProcess
from hostlib import InaSession, JobSpec, RetryPolicy
from hostlib.transport.udp import UdpTransport

LANES = 64
POOL = 64
WINDOW = 16
WORKERS = 3
_job_ids = itertools.count(500)


@pytest.fixture
def switches(tmp_path: Path) -> Iterator[tuple[SoftSwitchProcess, SoftSwitchProcess]]:
    front = SoftSwitchProcess(tmp_path / "switch", lanes=LANES, slots=POOL).start()
    try:
        back = SoftSwitchProcess(tmp_path / "fallback", lanes=LANES, slots=POOL).start()
    except BaseException:
        front.stop()
        raise
    try:
        yield front, back
    finally:
        codes = (back.stop(), front.stop())
        assert codes == (0, 0), (back.log_path.read_text(), front.log_path.read_text())


class Job:
    """A job's sessions, installed on the switch (sharing) and on the fallback (behind)."""

    def __init__(
        self, ctl: SwitchController, fallback: SwitchController, switch: tuple[str, int],
        back: tuple[str, int], reserved: int, shared: int,
    ) -> None:  # fmt: skip
        self.job_id = next(_job_ids)
        transports = [UdpTransport(("127.0.0.1", 0)) for _ in range(WORKERS)]
        workers = worker_addresses(t.local_addr for t in transports)
        fallback.add_behind(self.job_id, WORKERS, WINDOW, WorkerAddress(*switch))
        ctl.add_job(self.job_id, workers, reserved, shared=shared, region=8,
                    fallback=WorkerAddress(*back))  # fmt: skip
        policy = RetryPolicy(deadline=20.0)
        self.sessions = [
            InaSession(JobSpec(self.job_id, r, WORKERS, switch, LANES, WINDOW), t, policy)
            for r, t in enumerate(transports)
        ]

    def bodies(self, inputs: np.ndarray) -> list[object]:
        return [lambda s=s, x=x: s.allreduce(x) for s, x in zip(self.sessions, inputs, strict=True)]

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        self.sessions = []


def run_together(jobs: list[Job], rng: np.random.Generator, size: int) -> None:
    """One call of every job at once; every rank's result must be the exact sum."""
    inputs = [random_inputs(rng, np.int32, WORKERS, size) for _ in jobs]
    bodies = [b for job, x in zip(jobs, inputs, strict=True) for b in job.bodies(x)]
    results = in_threads(bodies)  # type: ignore[arg-type]
    for j, x in enumerate(inputs):
        for got in results[j * WORKERS : (j + 1) * WORKERS]:
            np.testing.assert_array_equal(got, expected(x, LANES))


def test_two_jobs_share_the_region_and_the_fallback_finishes_the_rest_exactly(
    switches: tuple[SoftSwitchProcess, SoftSwitchProcess],
) -> None:
    front, back = switches
    rng = np.random.default_rng(7)
    with front.controller() as ctl, back.controller() as fb:
        a = Job(ctl, fb, front.data_addr, back.data_addr, reserved=4, shared=4)
        b = Job(ctl, fb, front.data_addr, back.data_addr, reserved=0, shared=8)
        try:
            for size in (40 * LANES + 5, 7 * LANES, 1):
                run_together([a, b], rng, size)
            ca, cb = ctl.job_counters(a.job_id), ctl.job_counters(b.job_id)
            assert ca["shared_uses"] > 0 and ca["to_fallback"] > 0, ca
            assert cb["collisions"] > 0 and cb["from_fallback"] > 0, cb
            assert ctl.counters()["completed"] > 0 and fb.counters()["completed"] > 0
            jobs = {j.job_id: j for j in ctl.installed_jobs()}
            shared = jobs[b.job_id].shared
            assert shared is not None and (shared.count, shared.size) == (8, 8)

            # A leaves: the cells it held are freed and cleared, and B takes them.
            a.close()
            ctl.remove_job(a.job_id)
            fb.remove_job(a.job_id)
            owners = ctl.registers.read(OWNER, shared.cells())
            assert all(v >> 16 != a.job_id for v in owners), owners
            before = ctl.job_counters(b.job_id)["shared_uses"]
            for size in (30 * LANES, 3):
                run_together([b], rng, size)
            assert ctl.job_counters(b.job_id)["shared_uses"] > before
            owners = ctl.registers.read(OWNER, shared.cells())
            assert all(v >> 16 == b.job_id for v in owners), owners
        finally:
            a.close()
            b.close()
