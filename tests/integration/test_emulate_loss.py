"""Every host algorithm under link loss on the emulated network (root, Mininet, eBPF).

star8 at 200 Mbit/s with 5% loss on every link, each way, applied by the eBPF switch
(this kernel has no netem): INA, CollNet, the ring and the tree each finish every size
of ``-b 64K -e 1M -n 5`` with no wrong element, two runs in a row. Before the
end-of-call responder a ring or tree run failed one time in two with a rank waiting for
the ack of its last packet (#18): what matters is the number of calls and losses, so the
sizes stop at 1 MiB (with 4 MiB a run took 45 s in CI, now about 23 s), and two runs (a
third took 23 s of CI; test_p2p_end_of_call's hundred calls under faults soak the same
path).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.ebpf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ALGOS = ("ina", "collnet", "ring", "tree")
SIZES = [64 << 10, 256 << 10, 1 << 20]


@pytest.mark.parametrize("run", range(2))
def test_star8_under_five_percent_link_loss(tmp_path: Path, run: int) -> None:
    out = tmp_path / "loss.json"
    proc = subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", str(REPO / "topologies/star8.yaml"),
         "--bw", "200", "--link-loss", "0.05", "--datapath", "ebpf",
         "--run-dir", str(tmp_path / "run"), "bench", "-b", "64K", "-e", "1M", "-n", "5",
         "-w", "1", "-d", "float32", "--algos", ",".join(ALGOS), "--seed", str(run),
         "--json", str(out)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algo"], r["size_bytes"]) for r in rows] == [(a, s) for a in ALGOS for s in SIZES]
    assert all(r["wrong"] == 0 for r in rows)
    # The links lost packets and the hosts recovered them, mostly without timers.
    assert sum(r["retransmits"] for r in rows) > 0
    assert sum(r["retransmits_fast"] for r in rows) > 0
