"""INA allreduce over real UDP: a soft switch process and worker sessions in threads.

Each worker is an :class:`InaSession` on its own :class:`UdpTransport` (127.0.0.1, a
kernel-chosen port); the job is installed over P4Runtime by the controller library with
the workers' addresses in rank order. Results are compared bit for bit with references
computed without the engine or the switch (``helpers.expected``).
"""

from __future__ import annotations

import functools
import itertools
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_within_bound, expected, in_threads, random_inputs, worker_addresses

from controller.switch import SwitchController
from emulation.softswitch import SoftSwitchProcess
from hostlib import InaError, InaSession, InaTimeoutError, JobSpec, RetryPolicy
from hostlib.protocol import MAX_SLOT, Header, PacketType, pack_header
from hostlib.transport.udp import UdpTransport

SMALL_LANES = 64
BIG_LANES = 2048
SLOTS = 32
THREAD_TIMEOUT = 60.0
_job_ids = itertools.count(100)


# ----------------------------------------------------------------- fixtures and drivers
@dataclass
class Switch:
    """A running switch process and its (primary) controller."""

    proc: SoftSwitchProcess
    ctl: SwitchController

    @property
    def data_addr(self) -> tuple[str, int]:
        return self.proc.data_addr

    def stop(self) -> int | None:
        """Close the controller, then stop the process; return its exit status."""
        try:
            self.ctl.close()
        finally:
            code = self.proc.stop()
        return code


def start_switch(run_dir: Path, lanes: int, **options: Any) -> Switch:
    proc = SoftSwitchProcess(run_dir, lanes=lanes, slots=1024, **options).start()
    try:
        return Switch(proc, proc.controller())
    except BaseException:
        proc.stop()
        raise


@pytest.fixture(scope="module")
def small_switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Switch]:
    sw = start_switch(tmp_path_factory.mktemp("small"), SMALL_LANES)
    yield sw
    assert sw.stop() == 0, sw.proc.log_path.read_text()


@pytest.fixture(scope="module")
def big_switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Switch]:
    sw = start_switch(tmp_path_factory.mktemp("big"), BIG_LANES)
    yield sw
    assert sw.stop() == 0, sw.proc.log_path.read_text()


class UdpJob:
    """A job on a real switch: one session (and UDP socket) per rank."""

    def __init__(
        self,
        switch: Switch,
        workers: int,
        policy: RetryPolicy | None = None,
        slots: int = SLOTS,
    ) -> None:
        self.job_id = next(_job_ids)
        self.switch = switch
        self.transports = [UdpTransport(("127.0.0.1", 0)) for _ in range(workers)]
        addrs = worker_addresses(t.local_addr for t in self.transports)
        switch.ctl.add_job(self.job_id, addrs, slots)
        lanes = switch.ctl.lanes
        assert lanes == switch.proc.ready_info["lanes"]
        self.sessions = [
            InaSession(JobSpec(self.job_id, r, workers, switch.data_addr, lanes, slots), t, policy)
            for r, t in enumerate(self.transports)
        ]

    def close(self) -> None:
        for s in self.sessions:
            s.close()
        if self.switch.proc.is_running():
            self.switch.ctl.remove_job(self.job_id)

    def calls(self, inputs_per_call: Sequence[np.ndarray]) -> list[Callable[[], Any]]:
        """One thread body per rank: make every call in order, return the results."""

        def body(rank: int) -> list[np.ndarray]:
            return [self.sessions[rank].allreduce(x[rank]) for x in inputs_per_call]

        return [functools.partial(body, r) for r in range(len(self.sessions))]


@pytest.fixture
def jobs() -> Iterator[Callable[..., UdpJob]]:
    made: list[UdpJob] = []

    def make(switch: Switch, workers: int, **kwargs: Any) -> UdpJob:
        made.append(UdpJob(switch, workers, **kwargs))
        return made[-1]

    yield make
    for job in made:
        job.close()


def check_calls(per_rank: list[list[np.ndarray]], calls: Sequence[np.ndarray], lanes: int) -> None:
    """Every rank got the exact expected result of every call."""
    for c, inputs in enumerate(calls):
        want = expected(inputs, lanes)
        for got in (rank_results[c] for rank_results in per_rank):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        if inputs.dtype == np.float32:
            assert_within_bound(per_rank[0][c], inputs, lanes)


def make_calls(seed: int, workers: int, plan: Sequence[tuple[type, int]]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_inputs(rng, dtype, workers, size) for dtype, size in plan]


# ----------------------------------------------------------------- exact results
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_allreduce_sizes_from_one_element(
    small_switch: Switch, jobs: Callable[..., UdpJob], workers: int, dtype: type
) -> None:
    lanes = SMALL_LANES
    sizes = [1, lanes - 1, lanes, lanes + 1, 1000, 3 * SLOTS * lanes + 17, 7]
    calls = make_calls(workers, workers, [(dtype, n) for n in sizes])
    job = jobs(small_switch, workers)
    check_calls(in_threads(job.calls(calls), THREAD_TIMEOUT), calls, lanes)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("dtype", "workers", "size"),
    [
        (np.float32, 2, 4 * 2**20 + 3),  # 16 MiB and a bit: not a multiple of the lanes
        (np.int32, 4, 4 * 2**20 + 1),
        (np.float32, 8, 4 * 2**20 + 5),
        (np.float32, 4, 4 * 2**20 + 7),
        (np.int32, 8, 4 * 2**20 + 2),
    ],
)
@pytest.mark.slow
def test_allreduce_up_to_16_mib(
    big_switch: Switch,
    jobs: Callable[..., UdpJob],
    dtype: type,
    workers: int,
    size: int,
) -> None:
    calls = make_calls(size, workers, [(dtype, 1), (dtype, BIG_LANES - 1), (dtype, size)])
    job = jobs(big_switch, workers)
    check_calls(in_threads(job.calls(calls), THREAD_TIMEOUT), calls, BIG_LANES)


@pytest.mark.timeout(60)
def test_torch_tensors_in_and_out(small_switch: Switch, jobs: Callable[..., UdpJob]) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    floats = random_inputs(rng, np.float32, 2, 3 * 70).reshape(2, 3, 70)
    ints = random_inputs(rng, np.int32, 2, 65)
    want_f = expected(floats.reshape(2, -1), SMALL_LANES).reshape(3, 70)
    want_i = expected(ints, SMALL_LANES)
    job = jobs(small_switch, 2)

    def body(rank: int) -> tuple[Any, Any, Any, Any]:
        session = job.sessions[rank]
        x = torch.from_numpy(floats[rank].copy())
        y = session.allreduce(x)
        t = torch.from_numpy(ints[rank].copy())
        z = session.allreduce(t, inplace=True)
        return x, y, t, z

    for rank, (x, y, t, z) in enumerate(
        in_threads([functools.partial(body, r) for r in (0, 1)], THREAD_TIMEOUT)
    ):
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == (3, 70)
        np.testing.assert_array_equal(y.numpy(), want_f)
        np.testing.assert_array_equal(x.numpy(), floats[rank])  # not in place: untouched
        assert z is t and t.dtype == torch.int32
        np.testing.assert_array_equal(t.numpy(), want_i)


# ----------------------------------------------------------------- loss
@pytest.mark.timeout(120)
@pytest.mark.slow
def test_switch_drops_ten_percent_each_way_and_results_stay_identical(
    tmp_path: Path, small_switch: Switch, jobs: Callable[..., UdpJob]
) -> None:
    plan = [(np.int32, 5000), (np.float32, 3001), (np.float32, 1), (np.int32, 64 * SLOTS + 1)]
    calls = make_calls(21, 4, plan)
    lossless = in_threads(jobs(small_switch, 4).calls(calls), THREAD_TIMEOUT)
    check_calls(lossless, calls, SMALL_LANES)
    lossy_switch = start_switch(tmp_path, SMALL_LANES, drop_ingress=0.1, drop_egress=0.1, seed=3)
    try:
        job = jobs(lossy_switch, 4)
        lossy = in_threads(job.calls(calls), THREAD_TIMEOUT)
        assert lossy_switch.ctl.drop_simulator.get() == pytest.approx((0.1, 0.1), abs=2**-31)
        counters = lossy_switch.ctl.counters()
    finally:
        assert lossy_switch.stop() == 0
    for rank_lossy, rank_lossless in zip(lossy, lossless, strict=True):
        for got, want in zip(rank_lossy, rank_lossless, strict=True):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert counters["drop_sim_ingress"] > 0 and counters["drop_sim_egress"] > 0
    assert all(s.retransmissions > 0 for s in job.sessions)


# ----------------------------------------------------------------- isolation
def forge(job_id: int, rank: int, slot: int, seq: int) -> bytes:
    header = Header(PacketType.DATA, job_id, rank, slot, 0, seq, SMALL_LANES, exponent=100)
    return pack_header(header) + np.full(SMALL_LANES, 2**30, ">i4").tobytes()


@pytest.mark.timeout(120)
def test_two_concurrent_jobs_ignore_packets_forged_for_each_other(
    tmp_path: Path, jobs: Callable[..., UdpJob]
) -> None:
    sw = start_switch(tmp_path, SMALL_LANES)
    try:
        a, b = jobs(sw, 3, slots=16), jobs(sw, 2, slots=16)
        bases = {j.job_id: j.entry.slot_base for j in sw.ctl.installed_jobs()}
        before = sw.ctl.counters()
        assert bases[b.job_id] == bases[a.job_id] + 16  # a's slot 16 would be b's slot 0
        calls_a = make_calls(1, 3, [(np.float32, 4000), (np.int32, 3000), (np.float32, 70)])
        calls_b = make_calls(2, 2, [(np.int32, 5000), (np.float32, 2500), (np.int32, 3)])
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stranger.bind(("127.0.0.1", 0))
        forged = {"drop_bad_source": 0, "drop_bad_rank": 0, "drop_bad_slot": 0}

        def forger() -> None:
            for i in range(40):
                seq = 1 + i
                # From a socket no job knows, posing as rank 0 of each job.
                stranger.sendto(forge(a.job_id, 0, i % 16, seq), sw.data_addr)
                stranger.sendto(forge(b.job_id, 0, i % 16, seq), sw.data_addr)
                # From b's rank 1, posing as a's rank 1: the right socket for the wrong job.
                b.transports[1].send(forge(a.job_id, 1, i % 16, seq), sw.data_addr)
                # A rank that job b does not have.
                stranger.sendto(forge(b.job_id, 2, i % 16, seq), sw.data_addr)
                # From a's real rank 0: slots past a's range (b's slots, the header's last).
                a.transports[0].send(forge(a.job_id, 0, 16 + i % 16, seq), sw.data_addr)
                a.transports[0].send(forge(a.job_id, 0, MAX_SLOT, seq), sw.data_addr)
                forged["drop_bad_source"] += 3
                forged["drop_bad_rank"] += 1
                forged["drop_bad_slot"] += 2
                time.sleep(0.002)

        bodies = [*a.calls(calls_a), *b.calls(calls_b), forger]
        results = in_threads(bodies, THREAD_TIMEOUT)
        stranger.close()
        check_calls(results[:3], calls_a, SMALL_LANES)
        check_calls(results[3:5], calls_b, SMALL_LANES)
        after = sw.ctl.counters()
    finally:
        assert sw.stop() == 0
    for name, count in forged.items():
        assert after[name] - before[name] == count, name


# ----------------------------------------------------------------- a stopped worker
DEADLINE = 1.0


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_stopped_worker_times_its_peers_out_and_the_switch_serves_on(
    small_switch: Switch, jobs: Callable[..., UdpJob]
) -> None:
    policy = RetryPolicy(deadline=DEADLINE)
    silent = jobs(small_switch, 3, policy=policy)  # rank 2 never calls
    quits = jobs(small_switch, 3, policy=policy)  # rank 1 leaves after one call
    calls = make_calls(4, 3, [(np.int32, 3000), (np.float32, 3000)])

    def timed(session: InaSession, inputs: Sequence[np.ndarray]) -> tuple[float, Any]:
        for x in inputs[:-1]:
            session.allreduce(x)
        start = time.perf_counter()
        try:
            session.allreduce(inputs[-1])
        except InaTimeoutError as exc:
            return time.perf_counter() - start, exc
        return time.perf_counter() - start, None

    def last_call(job: UdpJob, rank: int, ncalls: int) -> Callable[[], Any]:
        return lambda: timed(job.sessions[rank], [c[rank] for c in calls[:ncalls]])

    bodies = [
        last_call(silent, 0, 1),
        last_call(silent, 1, 1),
        last_call(quits, 0, 2),
        last_call(quits, 2, 2),
        lambda: quits.sessions[1].allreduce(calls[0][1]),
    ]
    results = in_threads(bodies, THREAD_TIMEOUT)
    np.testing.assert_array_equal(results[4], expected(calls[0], SMALL_LANES))
    for elapsed, exc in results[:4]:
        assert isinstance(exc, InaTimeoutError)
        assert DEADLINE <= elapsed <= DEADLINE + policy.max_timeout + 1.0, elapsed
    # A failed session refuses further calls: its slot sets no longer match the switch's.
    for session in (silent.sessions[0], quits.sessions[2]):
        with pytest.raises(InaError, match="unusable") as info:
            session.allreduce(calls[0][0])
        assert type(info.value) is InaError
    # The switch serves a new job as before.
    fresh = jobs(small_switch, 3)
    more = make_calls(5, 3, [(np.float32, 777), (np.int32, 64 * SLOTS * 2 + 9)])
    check_calls(in_threads(fresh.calls(more), THREAD_TIMEOUT), more, SMALL_LANES)


# ----------------------------------------------------------------- bad input
def test_session_rejects_bad_input_before_sending(small_switch: Switch) -> None:
    sent_before = small_switch.ctl.counters()["received"]
    with UdpTransport() as transport:
        spec = JobSpec(next(_job_ids), 0, 2, small_switch.data_addr, SMALL_LANES, SLOTS)
        session = InaSession(spec, transport)
        with pytest.raises(TypeError, match="float32 and int32"):
            session.allreduce(np.zeros(10, dtype=np.float64))
        with pytest.raises(TypeError, match="numpy array or torch tensor"):
            session.allreduce([1.0, 2.0])
        bad = np.ones(100, dtype=np.float32)
        bad[50] = np.nan
        with pytest.raises(ValueError, match="NaN or infinity"):
            session.allreduce(bad)
        assert session.next_seq == 1 and not session.uses.any()  # still usable
    assert small_switch.ctl.counters()["received"] == sent_before


# ----------------------------------------------------------------- the transport
def test_a_connected_transport_hears_its_peer_only() -> None:
    with (
        UdpTransport() as worker,
        UdpTransport() as switch,
        UdpTransport() as stranger,
    ):
        worker.connect(switch.local_addr)
        buf = bytearray(64)
        stranger.send(b"forged", worker.local_addr)  # the kernel drops it for us
        switch.send(b"result", worker.local_addr)
        assert worker.recv_into(buf, 2.0) == (6, switch.local_addr) and buf[:6] == b"result"
        assert worker.recv_into(buf, 0.05) == (0, None)
        worker.send(b"data", switch.local_addr)  # to the peer: no address on the wire call
        assert switch.recv_into(buf, 2.0) == (4, worker.local_addr)
        worker.send(b"aside", stranger.local_addr)  # anyone else still works
        assert stranger.recv_into(buf, 2.0) == (5, worker.local_addr)


def test_a_session_connects_its_transport_to_the_switch() -> None:
    with UdpTransport() as switch:
        transport = UdpTransport()
        with InaSession(JobSpec(1, 0, 1, switch.local_addr), transport):
            assert transport._peer == switch.local_addr


def test_an_unreachable_peer_reads_as_silence() -> None:
    with UdpTransport() as worker:
        gone = UdpTransport()
        address = gone.local_addr
        gone.close()
        worker.connect(address)
        worker.send(b"x", address)  # the kernel answers with ICMP port unreachable
        buf = bytearray(8)
        assert worker.recv_into(buf, 0.2) == (0, None)
        worker.send(b"y", address)  # and the next send does not raise either
