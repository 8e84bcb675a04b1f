"""INA over RoCEv2 bit-exact under 5% loss, duplication and reordering, on loopback with
any data plane: ``inalab switch --roce`` drops 5% of frames each way (its drop
simulator, over P4Runtime), and each rank's emulated RNIC loses, duplicates and reorders
5% of what it receives (the replies) before its UC responder sees them. Only the eBPF
data plane's links duplicate and reorder in an emulated network
(tests/integration/test_emulate_rdma.py), so this runs the same faults where any switch
serves RoCEv2.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from controller.switch import SwitchController, WorkerAddress
from emulation.softswitch.process import SoftSwitchProcess
from hostlib.ina import JobSpec, RetryPolicy
from hostlib.protocol import ROCE_UDP_PORT
from hostlib.session import InaSession
from hostlib.transport.rdma import RdmaTransport
from hostlib.transport.rnic import EmulatedRnic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LANES, WINDOW, M, JOB, N = 256, 4, 2, 23, 4
P = 0.05


class FaultyRnic(EmulatedRnic):
    """An emulated RNIC whose received frames are lost, sent twice or held back behind
    the next one, each with probability ``P`` (seeded): the wire's faults on the way in."""

    def __init__(self, address: str, seed: int) -> None:
        super().__init__(address, pmtu=LANES * 4, seed=seed)
        self.faults = random.Random(seed)
        self.held: tuple[bytes, tuple[str, int]] | None = None
        self.made = {"lost": 0, "duplicated": 0, "reordered": 0}

    def on_frame(self, data: memoryview, src: tuple[str, int]) -> None:
        x, frame = self.faults.random(), bytes(data)
        if x < P:
            self.made["lost"] += 1
            return
        if x < 2 * P and self.held is None:
            self.made["reordered"] += 1
            self.held = (frame, src)  # delivered after the next frame
            return
        super().on_frame(memoryview(bytearray(frame)), src)
        if x < 3 * P:
            self.made["duplicated"] += 1
            super().on_frame(memoryview(bytearray(frame)), src)
        if self.held is not None:
            late, self.held = self.held, None
            super().on_frame(memoryview(bytearray(late[0])), late[1])


@pytest.fixture
def switch(tmp_path: Path) -> Iterator[tuple[SoftSwitchProcess, SwitchController]]:
    proc = SoftSwitchProcess(tmp_path, lanes=LANES, slots=1024, seed=7,
                             extra_args=("--roce",)).start()  # fmt: skip
    try:
        with proc.controller() as ctl:
            yield proc, ctl
    finally:
        assert proc.stop() == 0, proc.log_path.read_text()


def test_roce_is_bit_exact_under_loss_duplication_and_reordering(
    switch: tuple[SoftSwitchProcess, SwitchController],
) -> None:
    proc, ctl = switch
    host = proc.data_addr[0]
    ips = [f"127.0.6.{10 + r}" for r in range(N)]
    nics = [FaultyRnic(ip, seed=r) for r, ip in enumerate(ips)]
    transports = [RdmaTransport(nic, WINDOW, M, LANES) for nic in nics]
    try:
        ctl.add_job(JOB, [WorkerAddress(ip, ROCE_UDP_PORT) for ip in ips], WINDOW * M)
        qpns = ctl.roce.install(JOB, ips, [t.endpoints() for t in transports], M).switch_qpns
        for t, q in zip(transports, qpns, strict=True):
            t.connect_switch(host, q)
        ctl.set_drops(P, P)
        policy = RetryPolicy(timeout=0.05, min_timeout=0.02, deadline=30.0)
        sessions = [InaSession(JobSpec(JOB, r, N, (host, ROCE_UDP_PORT), M * LANES, WINDOW),
                               t, policy) for r, t in enumerate(transports)]  # fmt: skip
        rng = np.random.default_rng(11)
        # Each slot used 8, then 32 times (1 << 18 took 42 s of CI for 128 uses).
        for count in (1000, LANES * M * WINDOW * 8 + 13, 1 << 16):
            xs = [rng.integers(-(2**24), 2**24, count, dtype=np.int32) for _ in range(N)]
            with ThreadPoolExecutor(N) as pool:
                outs = list(pool.map(InaSession.allreduce, sessions, xs))
            total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
            for out in outs:
                np.testing.assert_array_equal(out, total)
        counters = ctl.counters()
    finally:
        for t in transports:
            t.close()
    made = {k: sum(n.made[k] for n in nics) for k in ("lost", "duplicated", "reordered")}
    assert all(v > 0 for v in made.values()), made
    assert counters["drop_sim_ingress"] > 0 and counters["drop_sim_egress"] > 0, counters
    assert sum(n.counters["duplicate"] for n in nics) > 0  # the RNICs refused the copies
