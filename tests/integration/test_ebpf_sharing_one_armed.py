"""A Linux server as the fallback aggregator, end to end: the eBPF program one-armed.

Two machines of a cluster (``tests/cluster.py``: namespaces on a bridge) run ``inalab
switch --one-armed eth0``: the switch, with a shared region of 8 slots, and a fallback
aggregator with both jobs installed behind it (``add_behind``), both configured over
P4Runtime with mutual TLS, as ``tests/integration/test_sharing_udp.py`` does with soft
switches. Job A reserves 4 slots and shares 4; job B reserves none and shares 8 of the
same region: their windows of 16 overlap there, and the rest of each goes to the
fallback. The workers are real sessions on UDP sockets in the root namespace (the
bridge's address). Every result is the exact sum; then A leaves, its cells are freed and
cleared, and B's slots move onto the switch, still exact; the same where both servers'
links lose and duplicate frames. Marked ``ebpf``, ``root``.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster import Cluster, one_armed_server
from helpers import expected, in_threads, random_inputs, worker_addresses

from controller.sharing import OWNER
from controller.switch import SwitchController, WorkerAddress
from controller.tls import TlsFiles
from hostlib import InaSession, JobSpec, RetryPolicy
from hostlib.protocol import INA_UDP_PORT
from hostlib.transport.udp import UdpTransport

pytestmark = [
    pytest.mark.root,
    pytest.mark.ebpf,
    pytest.mark.slow,
    pytest.mark.engine_neutral,  # a deployment: the engines' own tests run twice
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]

REPO = Path(__file__).resolve().parents[2]
LANES = 64
POOL = 64
WINDOW = 16
WORKERS = 3
NET = 79
_job_ids = itertools.count(600)


@pytest.fixture(scope="module", params=["clean", "lossy"])
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The cluster, its switch and fallback (one-armed eBPF servers), and TLS files;
    lossy: both servers' links lose and duplicate 5% of the frames each way (every packet
    passed on crosses two of them, every result of the fallback three)."""
    d = tmp_path_factory.mktemp("pki")
    ips = ",".join(f"10.{NET}.0.{o}" for o in (10, 20))
    subprocess.run(["bash", str(REPO / "examples" / "make-certs.sh"), str(d), f"switch:{ips}",
                    "ctl"], check=True, capture_output=True, timeout=60)  # fmt: skip
    tls = {n: f"{d / n}.crt,{d / n}.key,{d / 'ca.crt'}" for n in ("switch", "ctl")}
    args: tuple[str, ...] = ("--lanes", str(LANES), "--slots", str(POOL))
    if request.param == "lossy":
        args += ("--link", "1:loss=0.05,dup=0.05,ingress")
    with Cluster({"switch": 10, "fallback": 20}, net=NET) as c:
        with (
            one_armed_server(c["switch"], d / "switch", tls["switch"], *args) as front,
            one_armed_server(c["fallback"], d / "fallback", tls["switch"], *args) as back,
        ):
            read_mac = c["fallback"].command(["cat", "/sys/class/net/eth0/address"])
            mac = subprocess.run(read_mac, check=True, capture_output=True, text=True).stdout
            ctl_tls = TlsFiles.parse(tls["ctl"])
            yield {"cluster": c, "front": front, "back": back, "tls": ctl_tls,
                   "fallback_mac": mac.strip(), "lossy": request.param == "lossy"}  # fmt: skip
        for info in (front, back):
            assert info["proc"].returncode == 0, info["log"].read_text()


class Job:
    """A job's sessions, installed on the switch (sharing) and on the fallback (behind)."""

    def __init__(self, ctl: SwitchController, fb: SwitchController, servers: dict[str, Any],
                 reserved: int, shared: int) -> None:  # fmt: skip
        self.job_id = next(_job_ids)
        c: Cluster = servers["cluster"]
        front, back = c["switch"], c["fallback"]
        transports = [UdpTransport((c.bridge_ip, 0)) for _ in range(WORKERS)]
        workers = worker_addresses(t.local_addr for t in transports)
        fb.add_behind(self.job_id, WORKERS, WINDOW, WorkerAddress(front.ip, INA_UDP_PORT))
        # The fallback's MAC: a one-armed switch sends there before the fallback has sent
        # it anything (its neighbour table is not asked: eth0 does not forward).
        fallback = WorkerAddress(back.ip, INA_UDP_PORT, servers["fallback_mac"])
        ctl.add_job(self.job_id, workers, reserved, shared=shared, region=8, fallback=fallback)
        policy = RetryPolicy(deadline=30.0)
        switch = (front.ip, INA_UDP_PORT)
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


def run_together(jobs: list[Job], rng: np.random.Generator, size: int) -> None:
    """One call of every job at once; every rank's result must be the exact sum."""
    inputs = [random_inputs(rng, np.int32, WORKERS, size) for _ in jobs]
    bodies = [b for job, x in zip(jobs, inputs, strict=True) for b in job.bodies(x)]
    results = in_threads(bodies)
    for j, x in enumerate(inputs):
        for got in results[j * WORKERS : (j + 1) * WORKERS]:
            np.testing.assert_array_equal(got, expected(x, LANES))


def test_a_one_armed_fallback_finishes_what_a_one_armed_switch_cannot_hold(
    servers: dict[str, Any],
) -> None:
    rng = np.random.default_rng(11)
    tls = servers["tls"]
    with (
        SwitchController.connect(servers["front"]["p4runtime"], tls=tls, timeout=10) as ctl,
        SwitchController.connect(servers["back"]["p4runtime"], tls=tls, timeout=10) as fb,
    ):
        a = Job(ctl, fb, servers, reserved=4, shared=4)
        b = Job(ctl, fb, servers, reserved=0, shared=8)
        try:
            for size in (40 * LANES + 5, 7 * LANES, 1):
                run_together([a, b], rng, size)
            ca, cb = ctl.job_counters(a.job_id), ctl.job_counters(b.job_id)
            assert ca["shared_uses"] > 0 and ca["to_fallback"] > 0, ca
            assert cb["collisions"] > 0 and cb["from_fallback"] > 0, cb
            front, back = ctl.counters(), fb.counters()
            assert front["completed"] > 0 and back["completed"] > 0, (front, back)
            if servers["lossy"]:  # the links' copies were met, and what they lost resent
                assert front["duplicates_ignored"] and back["duplicates_ignored"], (front, back)
                assert front["retransmits_answered"] + back["retransmits_answered"], (front, back)
            shared = {j.job_id: j for j in ctl.installed_jobs()}[b.job_id].shared
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
