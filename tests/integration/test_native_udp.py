"""The native INA core over real UDP sockets: results, resources and failures.

Sessions on 127.0.0.1 against a soft switch in a thread; the native core releases the
GIL for a whole call, so ranks in threads run their calls in parallel. Both engines must
give the same bytes; 1,000 calls must not grow the process's memory or descriptors; a
rank killed mid-call must leave the others with the usual timeout error within the
deadline; bad input must raise, never crash the interpreter.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import SwitchJob, expected, in_threads, random_inputs, switch_thread

from emulation.softswitch.pipeline import Pipeline
from hostlib import InaSession, JobSpec, RetryPolicy
from hostlib.ina import InaTimeoutError
from hostlib.native import native_unavailable
from hostlib.transport.udp import UdpTransport

pytestmark = pytest.mark.skipif(native_unavailable() is not None, reason=str(native_unavailable()))

POLICY = RetryPolicy(deadline=10.0)


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_native_and_python_sessions_give_the_same_bytes(dtype: type) -> None:
    n, rng = 4, np.random.default_rng(3)
    inputs = [random_inputs(rng, dtype, n, size) for size in (1, 255, 64 * 40 + 3, 100_000)]
    results = {}
    for engine in ("native", "python"):
        with switch_thread(Pipeline(64, slots=64)) as server:
            job = SwitchJob(server, 1, n, 16, POLICY)
            for s in job.sessions:
                s.engine = engine
            try:
                results[engine] = in_threads(
                    [lambda s=s, r=r: [s.allreduce(x[r]) for x in inputs]  # type: ignore[misc]
                     for r, s in enumerate(job.sessions)]
                )  # fmt: skip
            finally:
                job.close()
    for call, x in enumerate(inputs):
        want = expected(x, 64)  # int32: the wrapping sum; float32: the quantized sum
        for engine in ("native", "python"):
            for got in (r[call] for r in results[engine]):
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_thousand_calls_grow_neither_memory_nor_descriptors() -> None:
    n = 2
    with switch_thread(Pipeline(256, slots=64)) as server:
        job = SwitchJob(server, 1, n, 32, POLICY)
        for s in job.sessions:
            s.engine = "native"  # whatever INALAB_HOST_ENGINE says
        x = np.ones(256 * 20 + 1, dtype=np.float32)

        def calls(count: int) -> None:
            def body(session: InaSession) -> None:
                for _ in range(count):
                    session.allreduce(x)  # the result dropped at once

            in_threads([lambda s=s: body(s) for s in job.sessions])  # type: ignore[misc]

        try:
            calls(100)  # warm: allocator pools, the switch's buffers
            rss, fds = _rss_kib(), _fds()
            calls(1000)
            assert _fds() == fds
            assert _rss_kib() - rss < 4096, (rss, _rss_kib())
        finally:
            job.close()


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (np.zeros(8, dtype=np.float64), TypeError, "float32 and int32"),
        (np.zeros(8, dtype=np.int16), TypeError, "float32 and int32"),
        (np.array([1.0, np.nan], dtype=np.float32), ValueError, "NaN"),
        ([1, 2, 3], TypeError, "numpy array or torch tensor"),
    ],
)
def test_bad_buffers_raise_one_clear_error(x: object, error: type, match: str) -> None:
    with switch_thread(Pipeline(64, slots=64)) as server:
        job = SwitchJob(server, 1, 1, 4, POLICY)
        try:
            with pytest.raises(error, match=match):
                job.sessions[0].allreduce(x)
            # The session is still usable: the error came before any packet.
            np.testing.assert_array_equal(
                job.sessions[0].allreduce(np.arange(5, dtype=np.int32)), np.arange(5)
            )
        finally:
            job.close()


def test_read_only_output_and_strided_input() -> None:
    with switch_thread(Pipeline(64, slots=64)) as server:
        job = SwitchJob(server, 1, 1, 4, POLICY)
        try:
            session = job.sessions[0]
            x = np.arange(300, dtype=np.int32)
            np.testing.assert_array_equal(session.allreduce(x[::3]), x[::3])
            x.flags.writeable = False
            with pytest.raises(ValueError, match="read-only"):
                session.allreduce(x, inplace=True)
        finally:
            job.close()


def _rank(rank: int, n: int, switch: tuple[str, int], addr_q: object, go: object) -> None:
    transport = UdpTransport(("127.0.0.1", 0))
    addr_q.put((rank, transport.local_addr))  # type: ignore[attr-defined]
    go.wait()  # type: ignore[attr-defined]
    session = InaSession(JobSpec(1, rank, n, switch, 256, 16), transport, RetryPolicy(deadline=3.0))
    x = np.ones(256 * 4000, dtype=np.float32)
    start = time.monotonic()
    try:
        for _ in range(1000):
            session.allreduce(x)
    except InaTimeoutError as exc:
        waited = time.monotonic() - start
        addr_q.put((rank, f"timeout after {waited:.1f} s: {exc}"))  # type: ignore[attr-defined]
        return
    addr_q.put((rank, "finished"))  # type: ignore[attr-defined]


_RETX = re.compile(r"(\d+) retransmissions")


def test_a_rank_killed_mid_call_leaves_the_others_a_timeout_error() -> None:
    from emulation.softswitch.pipeline import JobConfig

    n = 3
    ctx = multiprocessing.get_context("spawn")
    queue, go = ctx.Queue(), ctx.Event()
    with switch_thread(Pipeline(256, slots=64)) as server:
        procs = [
            ctx.Process(target=_rank, args=(r, n, server.data_addr, queue, go), daemon=True)
            for r in range(n)
        ]
        for p in procs:
            p.start()
        addrs = dict(queue.get(timeout=60) for _ in range(n))
        job = JobConfig(1, tuple(addrs[r] for r in range(n)), 16)
        server.control.call(lambda: server.pipeline.add_job(job))
        go.set()
        time.sleep(2.0)  # several calls under way
        assert procs[1].is_alive()
        os.kill(procs[1].pid or 0, signal.SIGKILL)
        killed_at = time.monotonic()
        outcomes = dict(queue.get(timeout=30) for _ in range(n - 1))
        for p in procs:
            p.join(10)
        assert not any(p.is_alive() for p in procs)
    assert set(outcomes) == {0, 2}
    assert all("no result from switch" in o for o in outcomes.values()), outcomes
    # The waiting ranks kept sending again until the deadline, and the message says so
    # (the native engine once read its counters before syncing them: "0 retransmissions").
    counts = [int(m.group(1)) for o in outcomes.values() if (m := _RETX.search(o))]
    assert len(counts) == 2 and min(counts) > 0, outcomes
    assert time.monotonic() - killed_at < 3.0 + 10.0


@pytest.mark.parametrize("batch", [4, 0])
def test_receive_batching_serves_several_results_per_wakeup(batch: int) -> None:
    # While a whole window is in flight the core sleeps for about `batch` results and
    # takes them in one receive; the results are the same bytes either way, and a call
    # of fewer packets than two batches (the window's tail) never sleeps.
    n, lanes, rng = 2, 64, np.random.default_rng(5)
    big = random_inputs(rng, np.int32, n, lanes * 600 + 7)
    small = random_inputs(rng, np.int32, n, lanes * 3)
    with switch_thread(Pipeline(lanes, slots=16)) as server:
        job = SwitchJob(server, 1, n, 16, POLICY)
        for s in job.sessions:
            s.engine, s.batch_results = "native", batch
        try:
            got = in_threads([lambda s=s, r=r: s.allreduce(big[r])  # type: ignore[misc]
                              for r, s in enumerate(job.sessions)])  # fmt: skip
            naps = [s.naps for s in job.sessions]
            per_wakeup = [s.received / s.receives for s in job.sessions]
            got_small = in_threads([lambda s=s, r=r: s.allreduce(small[r])  # type: ignore[misc]
                                    for r, s in enumerate(job.sessions)])  # fmt: skip
            assert [s.naps for s in job.sessions] == naps  # the tail never waits
        finally:
            job.close()
    for results, x in ((got, big), (got_small, small)):
        for r in results:
            np.testing.assert_array_equal(r, expected(x, lanes))
    if batch:
        assert min(naps) > 0 and min(per_wakeup) >= 3.0, (naps, per_wakeup)
    else:
        assert naps == [0] * n, naps
