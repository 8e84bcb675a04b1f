"""A Linux server as the fallback aggregator, end to end: the eBPF program one-armed.

Two machines of a cluster (``tests/cluster.py``: namespaces on a bridge) run ``inalab
switch --one-armed eth0``: the switch, with a shared region of 8 slots, and a fallback
aggregator with both jobs installed behind it (``add_behind``), both configured over
P4Runtime with mutual TLS, as ``tests/integration/test_sharing_udp.py`` does with soft
switches (the scenario, ``tests/sharing_jobs.py``: job A reserves 4 slots and shares
4; job B reserves none and shares 8 of the same region: their windows of 16 overlap
there, and the rest of each goes to the fallback). The workers are real sessions on UDP
sockets in the root namespace (the bridge's address). Every result is the exact sum;
then A leaves, its cells are freed and cleared, and B's slots move onto the switch, still
exact; the same where both servers' links lose and duplicate frames. Marked ``ebpf``, ``root``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster import Cluster, one_armed_server
from sharing_jobs import LANES, SharingJob, a_leaves, share

from controller.switch import SwitchController, WorkerAddress
from controller.tls import TlsFiles
from hostlib.protocol import INA_UDP_PORT

pytestmark = [
    pytest.mark.root,
    pytest.mark.ebpf,
    pytest.mark.slow,
    pytest.mark.engine_neutral,  # a deployment: the engines' own tests run twice
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]

REPO = Path(__file__).resolve().parents[2]
POOL = 64
NET = 79


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


def test_a_one_armed_fallback_finishes_what_a_one_armed_switch_cannot_hold(
    servers: dict[str, Any],
) -> None:
    rng = np.random.default_rng(11)
    tls = servers["tls"]
    with (
        SwitchController.connect(servers["front"]["p4runtime"], tls=tls, timeout=10) as ctl,
        SwitchController.connect(servers["back"]["p4runtime"], tls=tls, timeout=10) as fb,
    ):
        c: Cluster = servers["cluster"]
        front, back = c["switch"], c["fallback"]
        # The fallback's MAC: a one-armed switch sends there before the fallback has sent
        # it anything (its neighbour table is not asked: eth0 does not forward).
        fallback = WorkerAddress(back.ip, INA_UDP_PORT, servers["fallback_mac"])
        job = partial(SharingJob, ctl, fb, c.bridge_ip, WorkerAddress(front.ip, INA_UDP_PORT),
                      (front.ip, INA_UDP_PORT), fallback, deadline=30.0)  # fmt: skip
        a, b = job(4, 4), job(0, 8)
        try:
            share(ctl, fb, a, b, rng)
            if servers["lossy"]:  # the links' copies were met, and what they lost resent
                front_c, back_c = ctl.counters(), fb.counters()
                assert front_c["duplicates_ignored"] and back_c["duplicates_ignored"], (
                    front_c, back_c)  # fmt: skip
                assert front_c["retransmits_answered"] + back_c["retransmits_answered"], (
                    front_c, back_c)  # fmt: skip
            a_leaves(ctl, fb, a, b, rng)
        finally:
            a.close()
            b.close()
