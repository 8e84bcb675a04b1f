"""The cluster path over RDMA: ``"ina"`` torch ranks on machines of their own (network
namespaces on a bridge, ``tests/cluster.py``), configured by ``INALAB_TRANSPORT=rdma`` and
the other ``INALAB_*`` variables as the cluster recipe's ranks are, each an emulated RNIC
on its machine's address; rank 0 installs the job and its RoCEv2 queue pairs over
P4Runtime with mutual TLS on a reduction server on another machine. int32 results are
exact and went through the server.

The server is ``inalab switch --roce``, the eBPF one-armed data plane on its machine's
``eth0`` as the cluster recipe runs it, and the Python data plane on a UDP socket.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster import Cluster, one_armed_server
from ina_worker import inputs

pytest.importorskip("torch")

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]

REPO = Path(__file__).resolve().parents[2]
NET, AGG, RANKS, JOB = 83, 100, 3, 44
LANES = 256
"""1 KiB packets: a RoCE path MTU that a 1500-byte link carries with its headers."""
ELEMENTS, CALLS, SEED = 100_003, 2, 5
FRONTS = [
    pytest.param(("--one-armed", "eth0"), id="ebpf-one-armed", marks=pytest.mark.ebpf),
    pytest.param(("--listen", f"10.{NET}.0.{AGG}:20033"), id="python-socket"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["bash", str(REPO / "examples" / "make-certs.sh"), str(d),
                    f"switch:10.{NET}.0.{AGG}", "ctl"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return d


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    machines = {f"w{r}": r + 1 for r in range(RANKS)} | {"agg": AGG}
    with Cluster(machines, net=NET) as c:
        yield c


def _rank_env(cluster: Cluster, server: dict[str, Any], pki: Path, rank: int) -> dict[str, str]:
    host, port = server["data"]
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
        "RANK": str(rank),
        "WORLD_SIZE": str(RANKS),
        "MASTER_ADDR": cluster["w0"].ip,
        "MASTER_PORT": "29533",
        "INALAB_TRANSPORT": "rdma",
        "INALAB_SWITCH": f"{host}:{port}",
        "INALAB_P4RUNTIME": server["p4runtime"],
        "INALAB_P4RUNTIME_TLS": f"{pki}/ctl.crt,{pki}/ctl.key,{pki}/ca.crt",
        "INALAB_JOB": str(JOB),
        "INALAB_DEADLINE": "20",
    }


@pytest.mark.parametrize("front", FRONTS)
def test_torch_ranks_on_their_machines_sum_exactly_over_roce(
    cluster: Cluster, pki: Path, tmp_path: Path, front: tuple[str, ...]
) -> None:
    tls = f"{pki}/switch.crt,{pki}/switch.key,{pki}/ca.crt"
    with one_armed_server(cluster["agg"], tmp_path / "agg", tls, "--roce", "--lanes", str(LANES),
                          front=front) as server:  # fmt: skip
        spec = json.dumps({"elements": ELEMENTS, "calls": CALLS, "seed": SEED})
        procs = [
            subprocess.Popen(
                cluster[f"w{r}"].command([sys.executable, str(REPO / "tests" / "torch_worker.py"),
                                          spec]),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=_rank_env(cluster, server, pki, r),
            )
            for r in range(RANKS)
        ]  # fmt: skip
        outs = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=180)
            assert p.returncode == 0, (stdout, stderr[-3000:], server["log"].read_text()[-2000:])
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    want = []
    for c in range(CALLS):
        xs = [inputs(SEED, r, c, ELEMENTS, "int32").astype(np.int64) for r in range(RANKS)]
        want.append(hashlib.sha256(np.sum(xs, axis=0).astype(np.int32).tobytes()).hexdigest())
    for out in outs:
        assert out["sha256"] == want and out["through_switch"], out
        assert out["transport"] == "RdmaTransport", out


@pytest.mark.ebpf
@pytest.mark.timeout(300)
def test_the_cluster_bench_counts_roce_traffic_as_the_theory_says(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    calls = 3
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "cluster_bench.py"), "--size", "1M", "--calls",
         str(calls), "--warmup", "0", "--setups", "rdma", "--json", str(out)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["setup"].startswith("ina over RoCEv2") and row["time_s"] > 0
    # Every frame once each way (no loss here), plus the torch ranks' own TCP: the
    # store and Gloo's barriers, most of it at rank 0's machine (the master). A rank that
    # enters a call before the others may time out and resend messages (each answered
    # again once complete): those are counted, a message each way per retransmission.
    worker, message = row["theory_worker_each_way"], row["message_wire_bytes"]
    resent = [row[f"w{r}_retransmissions"] * message / calls for r in range(4)]
    for r in range(4):
        slack = 1.2 if r == 0 else 1.03
        for way in ("sent", "received"):
            got = row[f"w{r}_{way}_per_call"]
            assert worker <= got <= slack * worker + resent[r], (r, way, row)
    aggregator = row["theory_aggregator_each_way"]
    for way in ("sent", "received"):
        got = row[f"agg0_{way}_per_call"]
        assert aggregator <= got <= 1.05 * aggregator + sum(resent), (way, row)
