"""INA over RoCEv2 through ``inalab switch --roce``, configured over P4Runtime by the
controller (controller/roce.py): workers on emulated RNICs, exact sums, the tables read
back, and a removed job's entries gone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from controller.client import P4RuntimeError
from controller.roce import ROCE_QPN_BASE
from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch.process import SoftSwitchProcess
from hostlib.ina import JobSpec, RetryPolicy
from hostlib.protocol import ROCE_UDP_PORT
from hostlib.session import InaSession
from hostlib.transport.rdma import RdmaTransport
from hostlib.transport.rnic import EmulatedRnic

LANES, JOB = 64, 12


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[tuple[SoftSwitchProcess, SwitchController]]:
    proc = SoftSwitchProcess(tmp_path, lanes=LANES, slots=1024, extra_args=("--roce",)).start()
    try:
        ctl = proc.controller()
        try:
            yield proc, ctl
        finally:
            ctl.close()
    finally:
        code = proc.stop()
    assert code == 0, proc.log_path.read_text()


def _ranks(n: int, window: int, m: int) -> list[RdmaTransport]:
    devices = [EmulatedRnic(f"127.0.0.{61 + r}", pmtu=LANES * 4, seed=r) for r in range(n)]
    return [RdmaTransport(d, window, m, LANES) for d in devices]


def test_a_job_installed_over_p4runtime_sums_exactly_over_roce(
    switch: tuple[SoftSwitchProcess, SwitchController],
) -> None:
    proc, ctl = switch
    n, window, m = 3, 4, 4
    transports = _ranks(n, window, m)
    workers = [WorkerAddress(t.device.address, ROCE_UDP_PORT) for t in transports]  # type: ignore[attr-defined]
    ctl.add_job(JOB, workers, window * m)
    ips = [w.ip for w in workers]
    installed = ctl.roce.install(JOB, ips, [t.endpoints() for t in transports], m)
    assert installed.switch_qpns[1] == tuple(ROCE_QPN_BASE + window + u for u in range(window))
    host = proc.data_addr[0]
    for t, qpns in zip(transports, installed.switch_qpns, strict=True):
        t.connect_switch(host, qpns)
    replies = ctl.roce.read_replies(JOB)
    assert [(e.rank, e.position) for e in replies] == [
        (r, u) for r in range(n) for u in range(window)
    ]
    assert replies[5].qpn == transports[1].endpoints()[1].qpn
    assert ctl.roce.msg_packets(JOB) == m

    rng = np.random.default_rng(3)
    xs = [rng.integers(-(2**24), 2**24, 64 * m * window * 5 + 3, dtype=np.int32) for _ in range(n)]
    policy = RetryPolicy(timeout=0.05, min_timeout=0.02, deadline=20.0)
    sessions = [
        InaSession(JobSpec(JOB, r, n, (host, ROCE_UDP_PORT), m * LANES, window), t, policy,
                   engine="python")
        for r, t in enumerate(transports)
    ]  # fmt: skip
    with ThreadPoolExecutor(n) as pool:
        outs = list(pool.map(InaSession.allreduce, sessions, xs))
    total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
    for out in outs:
        np.testing.assert_array_equal(out, total)
    counters = ctl.counters()
    assert counters["completed"] > 0 and counters["drop_bad_icrc"] == 0

    ctl.remove_job(JOB)
    assert ctl.roce.read_requests() == [] and ctl.roce.read_replies() == []
    assert ctl.roce.msg_packets(JOB) is None
    for s in sessions:
        s.close()


def test_bad_roce_requests_are_refused_whole(
    switch: tuple[SoftSwitchProcess, SwitchController],
) -> None:
    _, ctl = switch
    transports = _ranks(2, 2, 2)
    try:
        ctl.add_job(JOB, [WorkerAddress(f"127.0.0.{61 + r}", ROCE_UDP_PORT) for r in range(2)], 4)
        endpoints = [t.endpoints() for t in transports]
        ips = [f"127.0.0.{61 + r}" for r in range(2)]
        with pytest.raises(ValueError, match="power of two"):
            ctl.roce.install(JOB, ips, endpoints, 3)
        with pytest.raises(ValueError, match="windows differ"):
            ctl.roce.install(JOB, ips, [endpoints[0], endpoints[1][:1]], 2)
        with pytest.raises(ValueError, match="1 addresses for 2 ranks"):
            ctl.roce.install(JOB, ips[:1], endpoints, 2)
        ctl.roce.install(JOB, ips, endpoints, 2)
        with pytest.raises(P4RuntimeError):  # the job's roce_jobs entry exists: nothing more
            ctl.roce.install(JOB, ips, endpoints, 2)
        assert {e.ip for e in ctl.roce.read_requests(JOB)} == set(ips)
        assert len(ctl.roce.read_requests(JOB)) == 4
    finally:
        for t in transports:
            t.close()
