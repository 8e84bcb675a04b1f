"""A killed rank and a killed switch over RDMA (RoCEv2, emulated RNICs) on loopback: the
ranks left get INA's clear timeout error after their deadline, never a hang.

The switch is ``inalab switch --roce``, a process of its own, configured over P4Runtime
(``SwitchController.roce``); the rank to kill runs in a spawned process, the others in
threads of this one.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch.process import SoftSwitchProcess
from hostlib.ina import InaTimeoutError, JobSpec, RetryPolicy
from hostlib.protocol import ROCE_UDP_PORT
from hostlib.session import InaSession
from hostlib.transport.rdma import RdmaEndpoint, RdmaTransport
from hostlib.transport.rnic import EmulatedRnic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LANES, WINDOW, M, JOB, N = 64, 4, 2, 21, 3
DEADLINE = 1.0
POLICY = RetryPolicy(timeout=0.05, min_timeout=0.02, deadline=DEADLINE)
COUNT = LANES * M * WINDOW * 3 + 5


def _ip(rank: int) -> str:
    return f"127.0.3.{10 + rank}"


def _inputs(call: int) -> list[np.ndarray]:
    rng = np.random.default_rng(call)
    return [rng.integers(-(2**20), 2**20, COUNT, dtype=np.int32) for _ in range(N)]


def _session(rank: int, transport: RdmaTransport, host: str) -> InaSession:
    spec = JobSpec(JOB, rank, N, (host, ROCE_UDP_PORT), M * LANES, WINDOW)
    return InaSession(spec, transport, POLICY)


def _victim(conn: Connection, rank: int) -> None:
    """A rank in a process of its own: its endpoints out, the switch back, one call, then
    it waits (to be killed)."""
    transport = RdmaTransport(EmulatedRnic(_ip(rank), pmtu=LANES * 4), WINDOW, M, LANES)
    conn.send([tuple(e) for e in transport.endpoints()])
    host, qpns = conn.recv()
    transport.connect_switch(host, qpns)
    session = _session(rank, transport, host)
    out = session.allreduce(_inputs(0)[rank])
    conn.send(out.tolist())
    time.sleep(600)


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[tuple[SoftSwitchProcess, SwitchController]]:
    proc = SoftSwitchProcess(tmp_path, lanes=LANES, slots=1024, extra_args=("--roce",)).start()
    try:
        with proc.controller() as ctl:
            yield proc, ctl
    finally:
        proc.stop()


def _install(ctl: SwitchController, endpoints: list[Any]) -> list[tuple[int, ...]]:
    ctl.add_job(JOB, [WorkerAddress(_ip(r), ROCE_UDP_PORT) for r in range(N)], WINDOW * M)
    return list(ctl.roce.install(JOB, [_ip(r) for r in range(N)], endpoints, M).switch_qpns)


def _timed_call(session: InaSession, x: np.ndarray) -> tuple[float, BaseException | None]:
    start = time.perf_counter()
    try:
        session.allreduce(x)
    except InaTimeoutError as exc:
        return time.perf_counter() - start, exc
    return time.perf_counter() - start, None


def _assert_timed_out(results: list[tuple[float, BaseException | None]]) -> None:
    for elapsed, exc in results:
        assert isinstance(exc, InaTimeoutError), exc
        assert "\n" not in str(exc) and str(exc)
        assert DEADLINE <= elapsed <= DEADLINE + POLICY.max_timeout + 2.0, elapsed


def _total(xs: list[np.ndarray]) -> np.ndarray:
    return np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)


def test_a_killed_rank_times_the_others_out(
    switch: tuple[SoftSwitchProcess, SwitchController],
) -> None:
    proc, ctl = switch
    host = proc.data_addr[0]
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    victim = ctx.Process(target=_victim, args=(theirs, N - 1), daemon=True)
    victim.start()
    transports = [RdmaTransport(EmulatedRnic(_ip(r), pmtu=LANES * 4), WINDOW, M, LANES)
                  for r in range(N - 1)]  # fmt: skip
    try:
        assert ours.poll(60), "the victim rank never reported its endpoints"
        endpoints = [t.endpoints() for t in transports] + [[RdmaEndpoint(*e) for e in ours.recv()]]
        qpns = _install(ctl, endpoints)
        ours.send((host, qpns[N - 1]))
        for t, q in zip(transports, qpns, strict=False):
            t.connect_switch(host, q)
        sessions = [_session(r, t, host) for r, t in enumerate(transports)]
        xs = _inputs(0)
        with ThreadPoolExecutor(N - 1) as pool:
            outs = list(pool.map(InaSession.allreduce, sessions, xs))
        assert ours.poll(30)
        outs.append(np.array(ours.recv(), dtype=np.int32))
        for out in outs:
            np.testing.assert_array_equal(out, _total(xs))
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        xs = _inputs(1)
        with ThreadPoolExecutor(N - 1) as pool:
            _assert_timed_out(list(pool.map(_timed_call, sessions, xs)))
    finally:
        if victim.is_alive():
            victim.kill()
        for t in transports:
            t.close()


def test_a_killed_switch_times_every_rank_out(
    switch: tuple[SoftSwitchProcess, SwitchController],
) -> None:
    proc, ctl = switch
    host = proc.data_addr[0]
    transports = [RdmaTransport(EmulatedRnic(_ip(r), pmtu=LANES * 4), WINDOW, M, LANES)
                  for r in range(N)]  # fmt: skip
    try:
        qpns = _install(ctl, [t.endpoints() for t in transports])
        for t, q in zip(transports, qpns, strict=True):
            t.connect_switch(host, q)
        sessions = [_session(r, t, host) for r, t in enumerate(transports)]
        xs = _inputs(0)
        with ThreadPoolExecutor(N) as pool:
            for out in pool.map(InaSession.allreduce, sessions, xs):
                np.testing.assert_array_equal(out, _total(xs))
        os.kill(proc.pid, signal.SIGKILL)
        with ThreadPoolExecutor(N) as pool:
            _assert_timed_out(list(pool.map(_timed_call, sessions, _inputs(1))))
    finally:
        for t in transports:
            t.close()
