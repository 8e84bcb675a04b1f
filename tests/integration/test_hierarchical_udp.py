"""Hierarchical aggregation end to end over real UDP: two leaf switches and a spine.

Three ``inalab switch`` processes on 127.0.0.1. Each leaf has a job of two local workers
(hostlib sessions on their own sockets) and an upstream entry toward the spine; the
spine has the same job with the two leaves as its workers, bound to the leaves' data
sockets (what the spine sees as the source of their partial sums). Everything is
installed over P4Runtime by :class:`SwitchController`. Results are bit-exact against
references computed without the switches (``helpers.expected``), also with the spine's
drop simulator losing 5% of what enters and leaves it, and the leaves' too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_within_bound, expected, random_inputs

from controller.switch import ControllerError, SwitchController, WorkerAddress
from emulation.softswitch import SoftSwitchProcess
from hostlib import InaSession, JobSpec
from hostlib.transport.udp import UdpTransport

LANES = 64
SLOTS = 16
POOL = 64
LEAVES = 2
PER_LEAF = 2
WORKERS = LEAVES * PER_LEAF
THREAD_TIMEOUT = 60.0


@dataclass
class Switch:
    proc: SoftSwitchProcess
    ctl: SwitchController


@dataclass
class Fabric:
    spine: Switch
    leaves: list[Switch]


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    run_dir = tmp_path_factory.mktemp("hier")
    started: list[Switch] = []
    try:
        for name in ["spine"] + [f"leaf{i}" for i in range(LEAVES)]:
            proc = SoftSwitchProcess(run_dir, name=name, lanes=LANES, slots=POOL).start()
            started.append(Switch(proc, proc.controller()))
        yield Fabric(started[0], started[1:])
    finally:
        codes = []
        for sw in started:
            sw.ctl.close()
            codes.append((sw.proc.stop(), sw.proc.log_path))
    for code, log in codes:
        assert code == 0, log.read_text()


class HierarchicalJob:
    """A job over the fabric: installed on the spine (leaves as workers) and on each
    leaf (its workers, upstream = the spine); one session per worker, leaf by leaf."""

    def __init__(self, fabric: Fabric, job_id: int) -> None:
        self.fabric, self.job_id = fabric, job_id
        spine = fabric.spine
        leaves = [WorkerAddress(*leaf.proc.data_addr) for leaf in fabric.leaves]
        spine.ctl.add_job(job_id, leaves, SLOTS)
        self.transports: list[UdpTransport] = []
        self.sessions: list[InaSession] = []
        for leaf_rank, leaf in enumerate(fabric.leaves):
            local = [UdpTransport(("127.0.0.1", 0)) for _ in range(PER_LEAF)]
            upstream = (leaf_rank, WorkerAddress(*spine.proc.data_addr))
            addrs = [WorkerAddress(*t.local_addr) for t in local]
            leaf.ctl.add_job(job_id, addrs, SLOTS, upstream=upstream)
            leaf.ctl.check_upstream(job_id, spine.ctl)
            for rank, transport in enumerate(local):
                # The rank is the local one (its bit at the leaf); num_workers is the
                # job's total, which float32 quantization needs for its headroom.
                spec = JobSpec(job_id, rank, WORKERS, leaf.proc.data_addr, LANES, SLOTS)
                self.sessions.append(InaSession(spec, transport))
            self.transports += local

    def run(self, calls: Sequence[np.ndarray]) -> None:
        """Every worker makes every call; each result must be the exact reference."""
        out: list[Any] = [None] * WORKERS

        def body(w: int) -> None:
            try:
                out[w] = [self.sessions[w].allreduce(x[w]) for x in calls]
            except Exception as exc:  # handed to the test thread
                out[w] = exc

        threads = [threading.Thread(target=body, args=(w,), daemon=True) for w in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(THREAD_TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a worker thread hung"
        for r in out:
            if isinstance(r, Exception):
                raise r
        for c, inputs in enumerate(calls):
            want = expected(inputs, LANES)
            for results in out:
                np.testing.assert_array_equal(results[c].view(np.uint32), want.view(np.uint32))
            if inputs.dtype == np.float32:
                assert_within_bound(out[0][c], inputs, LANES)

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        for sw in [self.fabric.spine, *self.fabric.leaves]:
            if sw.proc.is_running():
                sw.ctl.remove_job(self.job_id)


@pytest.fixture
def job(fabric: Fabric) -> Iterator[Callable[[int], HierarchicalJob]]:
    made: list[HierarchicalJob] = []

    def make(job_id: int) -> HierarchicalJob:
        made.append(HierarchicalJob(fabric, job_id))
        return made[-1]

    yield make
    for j in made:
        j.close()
    for sw in [fabric.spine, *fabric.leaves]:
        sw.ctl.set_drops(0.0, 0.0)


def counters(fabric: Fabric) -> tuple[dict[str, int], list[dict[str, int]]]:
    return fabric.spine.ctl.counters(), [leaf.ctl.counters() for leaf in fabric.leaves]


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_two_leaves_and_a_spine_sum_exactly(
    fabric: Fabric, job: Callable[[int], HierarchicalJob]
) -> None:
    j = job(1)
    rng = np.random.default_rng(1)
    sizes = [3000, 1, 5 * SLOTS * LANES + 17, 4096]
    calls = [random_inputs(rng, np.int32, WORKERS, n) for n in sizes]
    spine_before, leaves_before = counters(fabric)
    j.run(calls)
    spine_after, leaves_after = counters(fabric)
    packets = sum(-(-n // LANES) for n in sizes)
    # Exact counts, up to retransmissions (a timeout shorter than a round trip through
    # two switches happens on a busy machine): each is answered, never counted twice.
    spine = delta(spine_after, spine_before)
    assert spine["completed"] == packets  # one use per packet number at the spine
    assert spine["aggregated"] == LEAVES * packets  # one partial per leaf, never a worker
    assert spine["results_sent"] == LEAVES * packets + spine["retransmits_answered"]
    for after, before in zip(leaves_after, leaves_before, strict=True):
        leaf = delta(after, before)
        assert leaf["completed"] == packets and leaf["aggregated"] == PER_LEAF * packets
        assert leaf["sent_upstream"] == packets + leaf["upstream_resent"]
        assert leaf["results_from_upstream"] == packets  # further copies: ignored
        multicast = PER_LEAF * packets
        assert leaf["results_sent"] == multicast + leaf["retransmits_answered"]
    # What the registers hold: the spine's result, final, at both levels of slot 0.
    spine_slot = fabric.spine.ctl.read_slot(1, 0, 0)
    for leaf in fabric.leaves:
        leaf_slot = leaf.ctl.read_slot(1, 0, 0)
        assert (leaf_slot.final, leaf_slot.seq, leaf_slot.remaining) == (1, spine_slot.seq, 0)
        assert leaf_slot.values == spine_slot.values


@pytest.mark.timeout(120)
def test_float32_exponents_cross_both_levels(
    fabric: Fabric, job: Callable[[int], HierarchicalJob]
) -> None:
    rng = np.random.default_rng(2)
    calls = [random_inputs(rng, np.float32, WORKERS, n) for n in (2500, 3 * LANES, 1)]
    job(2).run(calls)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("where", "loss"), [("spine", 0.05), ("everywhere", 0.05)])
@pytest.mark.slow
def test_loss_is_repaired_at_both_levels(
    fabric: Fabric, job: Callable[[int], HierarchicalJob], where: str, loss: float
) -> None:
    j = job(3)
    lossy = [fabric.spine] + (fabric.leaves if where == "everywhere" else [])
    for sw in lossy:
        sw.ctl.set_drops(loss, loss)
    rng = np.random.default_rng(3)
    calls = [random_inputs(rng, dtype, WORKERS, 3000) for dtype in (np.int32, np.float32)]
    calls.append(random_inputs(rng, np.int32, WORKERS, 8 * SLOTS * LANES))
    spine_before, leaves_before = counters(fabric)
    j.run(calls)
    spine_after, leaves_after = counters(fabric)
    spine = delta(spine_after, spine_before)
    assert spine["drop_sim_ingress"] + spine["drop_sim_egress"] > 0
    leaves = [delta(a, b) for a, b in zip(leaves_after, leaves_before, strict=True)]
    # Lost partials and lost spine results came back through the leaves' re-sends.
    assert sum(leaf["upstream_resent"] for leaf in leaves) > 0
    assert spine["retransmits_answered"] + spine["duplicates_ignored"] > 0
    for leaf in leaves:
        for reason in ("malformed", "bad_source", "bad_rank", "bad_slot", "unknown_job"):
            assert leaf[f"drop_{reason}"] == 0
    for reason in ("malformed", "bad_source", "bad_rank", "bad_slot", "unknown_job"):
        assert spine[f"drop_{reason}"] == 0


def test_check_upstream_finds_what_does_not_fit(fabric: Fabric, tmp_path: Path) -> None:
    spine, leaf = fabric.spine, fabric.leaves[0]
    address = WorkerAddress(*spine.proc.data_addr)
    leaf.ctl.add_job(9, [WorkerAddress("127.0.0.1", 7009)], SLOTS, upstream=(0, address))
    try:
        with pytest.raises(ControllerError, match="no job 9"):
            leaf.ctl.check_upstream(9, spine.ctl)
        spine.ctl.add_job(9, [WorkerAddress(*leaf.proc.data_addr)], SLOTS // 2)
        with pytest.raises(ControllerError, match=f"{SLOTS} slots here, {SLOTS // 2} on"):
            leaf.ctl.check_upstream(9, spine.ctl)
        spine.ctl.remove_job(9)
        spine.ctl.add_job(9, [WorkerAddress(*leaf.proc.data_addr)], SLOTS)
        leaf.ctl.check_upstream(9, spine.ctl)
        leaf.ctl.set_upstream(9, 1, address)  # the spine's job has rank 0 only
        with pytest.raises(ControllerError, match="rank 1 is not a worker"):
            leaf.ctl.check_upstream(9, spine.ctl)
    finally:
        leaf.ctl.remove_job(9)
        if spine.ctl.jobs.get(9) is not None:
            spine.ctl.remove_job(9)
