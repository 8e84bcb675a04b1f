"""Loss, duplication and reordering on every link give the lossless results, bit for bit
(root, Mininet, eBPF).

star4 at 200 Mbit/s with the eBPF switch applying 5% loss, 5% duplication and 10%
reordering on every link, each way (``inalab emulate --link-loss 0.05 --link-dup 0.05
--link-reorder 0.1``), against the same network without them, same inputs: each rank
(``inalab emulate ... run``, one process per rank in its host, the native host engine
unless ``INALAB_HOST_ENGINE`` says otherwise) runs INA through the switch and hostlib's
ring and tree between the hosts (their frames cross the same switch ports), int32 and
float32, odd sizes, and writes a digest of every result. The digests of the two runs
must be equal, rank by rank; the switch's link counts must show that frames were lost
and duplicated on every port, both ways, and held back on their way out of every port,
and the ranks that they retransmitted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from emulation.topology import load_topology

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.ebpf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STAR4 = REPO / "topologies/star4.yaml"
FAULTS = ("--link-loss", "0.05", "--link-dup", "0.05", "--link-reorder", "0.1")

RANK = r"""
import hashlib, json, os, sys
import numpy as np
from hostlib import InaSession, JobSpec, PeerSpec, RetryPolicy, RingAllreduce, TreeAllreduce
from hostlib.transport.udp import UdpTransport

out, peers = sys.argv[1], sys.argv[2].split(",")
env = os.environ
rank, n = int(env["RANK"]), int(env["WORLD_SIZE"])
switch_ip, switch_port = env["INALAB_SWITCH"].rsplit(":", 1)
bind, lanes, slots = env["INALAB_BIND"], int(env["INALAB_LANES"]), int(env["INALAB_SLOTS"])
policy = RetryPolicy(deadline=60.0)
spec = JobSpec(int(env["INALAB_JOB"]), int(env["INALAB_SWITCH_RANK"]),
               int(env["INALAB_WORKERS"]), (switch_ip, int(switch_port)), lanes, slots)
ina = InaSession(spec, UdpTransport((bind, int(env["INALAB_PORT"]))), policy)
ring = RingAllreduce(PeerSpec(rank, [(p, 48000) for p in peers], lanes, 16),
                     UdpTransport((bind, 48000)), policy)
tree = TreeAllreduce(PeerSpec(rank, [(p, 49000) for p in peers], lanes, 16),
                     UdpTransport((bind, 49000)), policy)
digests = {}
for dtype in (np.int32, np.float32):
    for size in (1, 999, 65537, 200003):
        rng = np.random.default_rng([7, rank, size])
        if dtype is np.int32:
            x = rng.integers(-(2**31), 2**31, size=size, dtype=np.int64).astype(np.int32)
        else:
            x = (rng.standard_normal(size) * 1000).astype(np.float32)
        for name, session in (("ina", ina), ("ring", ring), ("tree", tree)):
            y = np.asarray(session.allreduce(x))
            key = f"{name}/{np.dtype(dtype).name}/{size}"
            digests[key] = hashlib.sha256(y.tobytes()).hexdigest()
retransmits = {name: s.retransmissions for name, s in (("ina", ina), ("ring", ring),
                                                       ("tree", tree))}
ina.close()
ring.close(linger=1.0)
tree.close(linger=1.0)
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump({"digests": digests, "retransmits": retransmits}, f)
"""


def _run(tmp_path: Path, name: str, *faults: str) -> tuple[list[dict[str, Any]], Path]:
    """Every rank's digests and retransmissions from one run, and its run directory."""
    script, out, run_dir = tmp_path / "rank.py", tmp_path / name, tmp_path / f"{name}-run"
    script.write_text(RANK)
    out.mkdir()
    hosts = load_topology(STAR4).hosts
    peers = ",".join(h.address for h in hosts)
    proc = subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", str(STAR4), "--bw", "200",
         *faults, "--datapath", "ebpf", "--run-dir", str(run_dir), "run", "--",
         sys.executable, str(script), str(out), peers],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(len(hosts))]
    return ranks, run_dir


def test_star4_results_are_bit_identical_under_loss_duplication_and_reordering(
    tmp_path: Path,
) -> None:
    clean, _ = _run(tmp_path, "clean")
    faulty, run_dir = _run(tmp_path, "faulty", *FAULTS)
    for r, (want, got) in enumerate(zip(clean, faulty, strict=True)):
        assert got["digests"] == want["digests"], f"rank {r}"
        assert len(got["digests"]) == 3 * 2 * 4
    # Every rank ends with the same sums; int32 sums are the same by any algorithm.
    assert all(r["digests"] == clean[0]["digests"] for r in clean)
    for key, digest in clean[0]["digests"].items():
        if "/int32/" in key:
            assert digest == clean[0]["digests"]["ina" + key[key.index("/") :]], key
    # The faults happened on every port of s1, both ways (frames are held back on their
    # way out only), and the ranks recovered.
    ports = json.loads((run_dir / "s1.links.json").read_text())["ports"]
    assert sorted(ports) == ["1", "2", "3", "4"]
    for port, directions in ports.items():
        for direction in ("egress", "ingress"):
            c = directions[direction]
            assert c["lost"] > 0 and c["duplicated"] > 0, (port, direction, c)
            assert c["offered"] == c["lost"] + c["delivered"], (port, direction, c)
        assert directions["egress"]["reordered"] > 0, (port, directions)
        assert directions["ingress"]["reordered"] == 0, (port, directions)
    for algo in ("ina", "ring", "tree"):
        assert sum(r["retransmits"][algo] for r in faulty) > 0, algo
