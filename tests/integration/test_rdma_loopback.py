"""INA over RoCEv2 on real sockets: workers on emulated RNICs (one loopback address
each, UDP port 4791) and the soft switch's RoCEv2 front, bit-exact under loss.

The switch here is the pipeline and its RoCE front on a socket in a thread, configured
the way a controller will (per worker: the switch's queue pairs, the worker's reply
endpoints); the engine is hostlib's INA engine, as over UDP.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import pytest

from emulation.softswitch.pipeline import DropSimulator, JobConfig, Pipeline
from emulation.softswitch.roce import RoceFront
from emulation.softswitch.roce_tables import RoceReply, RoceRequest
from hostlib.ina import JobSpec, RetryPolicy
from hostlib.protocol import ROCE_UDP_PORT
from hostlib.session import InaSession
from hostlib.transport.base import TransportError
from hostlib.transport.rdma import RdmaTransport
from hostlib.transport.rnic import EmulatedRnic
from hostlib.transport.rnic_native import NativeRnic, rnic_core_unavailable

SWITCH_IP = "127.0.0.1"
LANES = 64
JOB = 4


def worker_ip(rank: int) -> str:
    return f"127.0.0.{21 + rank}"


@contextmanager
def roce_switch(drops: DropSimulator | None = None) -> Iterator[RoceFront]:
    """The pipeline with its RoCE front on SWITCH_IP:4791, served by a thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
    sock.bind((SWITCH_IP, ROCE_UDP_PORT))
    sock.settimeout(0.05)
    front = RoceFront(Pipeline(lanes=LANES, slots=1024, drops=drops), SWITCH_IP)
    stop = threading.Event()

    def serve() -> None:
        buf = bytearray(65536)
        while not stop.is_set():
            try:
                n, src = sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            for out in front.process(memoryview(buf)[:n], src):
                sock.sendto(out.payload, out.dest)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield front
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def install(front: RoceFront, transports: list[RdmaTransport], window: int, m: int) -> None:
    """What the controller does for a RoCEv2 job: the job, then per worker its switch
    queue pairs (requests) and its reply endpoints (replies)."""
    pipe, tables = front.pipeline, front.tables
    pipe.add_job(JobConfig(JOB, tuple(t.local_addr for t in transports), window * m))
    tables.set_job(JOB, m)
    for rank, t in enumerate(transports):
        qpns = []
        for u, ep in enumerate(t.endpoints()):
            reg = rank * window + u
            qpn = 0x800000 | rank << 12 | u
            tables.set_request(qpn, RoceRequest(JOB, rank, reg, t.device.address))  # type: ignore[attr-defined]
            tables.set_reply(JOB, rank, u, RoceReply(ep.qpn, ep.rkey, ep.va, reg))
            tables.set_reply_psn(reg, ep.psn)
            qpns.append(qpn)
        t.connect_switch(SWITCH_IP, qpns)


def run(
    n: int,
    size: int,
    dtype: type,
    window: int,
    m: int,
    drops: DropSimulator | None = None,
    nic: type = EmulatedRnic,
) -> tuple[list[np.ndarray], list[np.ndarray], RoceFront, list[InaSession]]:
    rng = np.random.default_rng(size + n)
    if dtype is np.int32:
        xs = [rng.integers(-(2**24), 2**24, size, dtype=np.int32) for _ in range(n)]
    else:
        xs = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    devices = [nic(worker_ip(r), pmtu=LANES * 4, seed=r) for r in range(n)]
    transports = [RdmaTransport(d, window, m, LANES) for d in devices]
    policy = RetryPolicy(timeout=0.05, min_timeout=0.02, deadline=20.0)
    with roce_switch(drops) as front:
        install(front, transports, window, m)
        sessions = [
            InaSession(JobSpec(JOB, r, n, (SWITCH_IP, ROCE_UDP_PORT), m * LANES, window),
                       transports[r], policy, engine="python")
            for r in range(n)
        ]  # fmt: skip
        with ThreadPoolExecutor(n) as pool:
            outs = list(pool.map(InaSession.allreduce, sessions, xs))
        for s in sessions:
            s.close()
    return xs, outs, front, sessions


# The Python RNIC (the specification) and the native one (hostlib/_rnicore.c).
NICS = [
    EmulatedRnic,
    pytest.param(NativeRnic, marks=pytest.mark.skipif(
        rnic_core_unavailable() is not None, reason=str(rnic_core_unavailable()))),
]  # fmt: skip


@pytest.mark.parametrize("nic", NICS)
@pytest.mark.parametrize(("m", "window"), [(1, 8), (4, 4)])
def test_int32_allreduce_over_roce_is_exact(m: int, window: int, nic: type) -> None:
    xs, outs, front, _ = run(3, 64 * m * window * 3 + 5, np.int32, window, m, nic=nic)
    total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
    for out in outs:
        np.testing.assert_array_equal(out, total)
    c = front.pipeline.counters()
    assert c["completed"] > 0 and not any(v for k, v in c.items() if k.startswith("drop_"))


@pytest.mark.parametrize("nic", NICS)
def test_loss_both_ways_is_repaired_by_whole_messages_and_stays_exact(nic: type) -> None:
    drops = DropSimulator(ingress=0.05, egress=0.05, seed=11)
    xs, outs, front, sessions = run(3, 64 * 4 * 40, np.int32, 4, 4, drops, nic)
    total = np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
    for out in outs:
        np.testing.assert_array_equal(out, total)
    c = front.pipeline.counters()
    assert c["drop_sim_ingress"] > 0 and c["drop_sim_egress"] > 0
    assert c["drop_bad_psn"] > 0  # a lost packet took the rest of its message with it
    assert sum(s.retransmissions for s in sessions) > 0
    rnic = sessions[0].transport.device  # type: ignore[attr-defined]
    assert rnic.counters["psn_gap"] + rnic.counters["completions"] > 0


def test_float32_allreduce_over_roce_is_within_the_bound() -> None:
    xs, outs, _, _ = run(4, 5000, np.float32, 4, 4)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    for out in outs:
        assert np.max(np.abs(out - exact)) <= 1e-5 * np.max(np.abs(exact))


def test_a_second_nic_on_the_same_address_is_one_clear_error() -> None:
    with EmulatedRnic(worker_ip(9)), pytest.raises(TransportError, match="rdma_rxe"):
        EmulatedRnic(worker_ip(9))
