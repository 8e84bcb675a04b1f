"""CollNet allreduce end to end: 2 hosts x 2 ranks, spawned processes, the soft switch.

Each host is a :class:`LocalGroup` of two spawned rank processes; each host's head
(local rank 0) is one worker of an INA job on a soft switch process, reached over
loopback UDP. As in ``inalab bench``: the heads bind their :class:`UdpTransport` first and
report the address, the coordinator (this test) installs the job over P4Runtime with the
heads' addresses in host order, then the heads open their sessions. Every rank must end
up with the same bytes: the exact wrapping int32 sum of all four inputs, and for float32
exactly what the INA quantization gives for the two hosts' local sums.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_within_bound, expected, int32_with_limits, wrapping_sum

from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch import SoftSwitchProcess
from hostlib import (
    CollNetAllreduce,
    InaSession,
    JobSpec,
    LocalGroup,
    RetryPolicy,
    ina_inter,
)
from hostlib.transport.udp import UdpTransport

CTX = multiprocessing.get_context("spawn")
HOSTS, LOCAL = 2, 2
LANES = 64
SLOTS = 8
POOL = 256
CAPACITY = 64 * 1024
RUN_S = 120.0
_job_ids = itertools.count(300)

Op = tuple[str, tuple[int, ...], int]
"""One call: (dtype, shape, call index)."""


def make_input(host: int, rank: int, dtype: str, shape: tuple[int, ...], call: int) -> np.ndarray:
    """int32 over the whole range (with its limits: sums wrap, on the host and in the
    switch); float32 whose magnitude changes every few packets."""
    rng = np.random.default_rng([host, rank, call])
    size = int(np.prod(shape))
    if dtype == "int32":
        return int32_with_limits(rng, size).reshape(shape)
    scale = np.exp2((np.arange(size) // (3 * LANES)) % 17 - 8.0)
    return (rng.standard_normal(size) * scale).astype(np.float32).reshape(shape)


def host_sum(host: int, dtype: str, shape: tuple[int, ...], call: int) -> np.ndarray:
    """A host's local sum in CollNetAllreduce's documented order (local rank order)."""
    acc = make_input(host, 0, dtype, shape, call)
    for r in range(1, LOCAL):
        acc = acc + make_input(host, r, dtype, shape, call)
    return acc


# ----------------------------------------------------------------- the rank processes
def rank_main(
    group: LocalGroup, host: int, local_rank: int, ops: tuple[Op, ...], conn: Connection
) -> None:
    """One rank; the head also talks to the coordinator: ("addr", ...) -> ("job", ...)."""
    try:
        session = _head_session(host, conn) if local_rank == 0 else None
        inter = ina_inter(session) if session is not None else None
        outcomes = []
        with contextlib.ExitStack() as stack:
            if session is not None:
                stack.enter_context(session)
            coll = stack.enter_context(CollNetAllreduce(group, local_rank, inter))
            for dtype, shape, call in ops:
                outcomes.append(coll.allreduce(make_input(host, local_rank, dtype, shape, call)))
        resent = session.retransmissions if session is not None else 0
        conn.send(("result", outcomes, resent))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()


def _head_session(host: int, conn: Connection) -> InaSession:
    transport = UdpTransport(("127.0.0.1", 0))
    try:
        conn.send(("addr", transport.local_addr))
        kind, job_id, switch = conn.recv()
        assert kind == "job"
        spec = JobSpec(job_id, host, HOSTS, tuple(switch), LANES, SLOTS)
        return InaSession(spec, transport, RetryPolicy(deadline=20.0))
    except BaseException:
        transport.close()
        raise


class Cluster:
    """HOSTS x LOCAL spawned ranks, one LocalGroup per host (created and unlinked here)."""

    def __init__(self, ops: tuple[Op, ...]) -> None:
        self.groups = [LocalGroup(LOCAL, CAPACITY, CTX, timeout=60.0) for _ in range(HOSTS)]
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        try:
            for host, group in enumerate(self.groups):
                for r in range(LOCAL):
                    parent, child = CTX.Pipe()
                    self.conns.append(parent)
                    args = (group, host, r, ops, child)
                    proc = CTX.Process(target=rank_main, args=args, daemon=True)
                    proc.start()
                    child.close()
                    self.procs.append(proc)
        except BaseException:
            self.close()
            raise

    def heads(self) -> list[Connection]:
        return self.conns[::LOCAL]

    def recv(self, conn: Connection) -> tuple[Any, ...]:
        if not wait([conn], RUN_S):
            raise TimeoutError("a rank sent nothing")
        msg = conn.recv()
        assert msg[0] != "error", msg[1]
        return tuple(msg)

    def install(self, ctl: SwitchController, switch: SoftSwitchProcess) -> int:
        """The job of the heads, in host order; tell them its id and the switch."""
        addrs = [self.recv(c)[1] for c in self.heads()]
        job_id = next(_job_ids)
        ctl.add_job(job_id, [WorkerAddress(ip, port) for ip, port in addrs], slot_count=SLOTS)
        for c in self.heads():
            c.send(("job", job_id, switch.data_addr))
        return job_id

    def results(self) -> tuple[list[list[np.ndarray]], int]:
        """Every rank's results (host-major order) and the heads' retransmissions."""
        msgs = [self.recv(c) for c in self.conns]
        for proc in self.procs:
            proc.join(RUN_S)
        assert [p.exitcode for p in self.procs] == [0] * len(self.procs)
        return [m[1] for m in msgs], sum(m[2] for m in msgs)

    def close(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            proc.close()
        for conn in self.conns:
            conn.close()
        for group in self.groups:
            group.unlink()
            assert not (Path("/dev/shm") / group.name).exists()


# ----------------------------------------------------------------- the switch
@pytest.fixture(scope="module")
def switch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftSwitchProcess]:
    sw = SoftSwitchProcess(tmp_path_factory.mktemp("collnet"), lanes=LANES, slots=POOL).start()
    yield sw
    assert sw.stop() == 0, sw.log_path.read_text()


@pytest.fixture
def ctl(switch: SoftSwitchProcess) -> Iterator[SwitchController]:
    with switch.controller() as c:
        yield c
        for job in c.installed_jobs():
            c.remove_job(job.job_id)
        c.set_drops(0.0, 0.0)


def run(switch: SoftSwitchProcess, ctl: SwitchController, ops: tuple[Op, ...]) -> Any:
    cluster = Cluster(ops)
    try:
        cluster.install(ctl, switch)
        return cluster.results()
    finally:
        cluster.close()


# ----------------------------------------------------------------- tests
OPS: tuple[Op, ...] = (
    ("int32", (1,), 0),
    ("int32", (LANES * SLOTS * 3 + 5,), 1),  # three windows and a partial packet
    ("float32", (4000,), 2),
    ("int32", (3, 100), 3),
    ("float32", (LANES * SLOTS * 2, 2), 4),
    ("int32", (CAPACITY // 4,), 5),
)


@pytest.mark.slow
def test_every_rank_of_every_host_gets_the_sum_of_all_four(
    switch: SoftSwitchProcess, ctl: SwitchController
) -> None:
    before = ctl.counters()
    per_rank, _ = run(switch, ctl, OPS)
    after = ctl.counters()
    for k, (dtype, shape, call) in enumerate(OPS):
        sums = np.stack([host_sum(h, dtype, shape, call).reshape(-1) for h in range(HOSTS)])
        want = expected(sums, LANES).reshape(shape)  # INA over the two heads, bit exact
        for results in per_rank:
            assert results[k].tobytes() == want.tobytes(), (dtype, shape)
        inputs = [make_input(h, r, dtype, shape, call).reshape(-1)
                  for h in range(HOSTS) for r in range(LOCAL)]  # fmt: skip
        if dtype == "int32":
            np.testing.assert_array_equal(want.reshape(-1), wrapping_sum(np.stack(inputs)))
        else:
            # The switch's own quantization bound (as ``inalab bench``'s count_wrong
            # checks INA) for the heads' inputs; the local float32 sums add one rounding.
            assert_within_bound(want.reshape(-1), sums, LANES)
            wide = np.stack(inputs).astype(np.float64)
            local_err = np.abs(sums.astype(np.float64).sum(axis=0) - wide.sum(axis=0))
            assert np.all(local_err <= HOSTS * 2.0**-24 * np.abs(wide).sum(axis=0))
    # Only the heads spoke to the switch: one contribution per head per packet.
    packets = sum(-(-int(np.prod(s)) // LANES) for _, s, _ in OPS)
    floats = sum(min(SLOTS, -(-int(np.prod(s)) // LANES)) for d, s, _ in OPS if d == "float32")
    assert after["aggregated"] - before["aggregated"] == HOSTS * (packets + floats)


@pytest.mark.slow
def test_the_heads_recover_lost_packets_while_their_siblings_wait(
    switch: SoftSwitchProcess, ctl: SwitchController
) -> None:
    ctl.set_drops(0.05, 0.05)
    ops: tuple[Op, ...] = (("int32", (LANES * SLOTS * 8,), 0), ("int32", (LANES * SLOTS * 8,), 1))
    per_rank, resent = run(switch, ctl, ops)
    assert resent > 0
    for k, (dtype, shape, call) in enumerate(ops):
        inputs = [make_input(h, r, dtype, shape, call) for h in range(HOSTS) for r in range(LOCAL)]
        want = wrapping_sum(np.stack(inputs))
        for results in per_rank:
            np.testing.assert_array_equal(results[k], want)
