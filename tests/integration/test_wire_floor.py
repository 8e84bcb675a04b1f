"""``inalab emulate TOPOLOGY wire-floor`` on star4 through the eBPF switch (root, Mininet,
eBPF): every rank sends INA-sized datagrams to the next across shaped links and gets the
previous rank's, every one of them, and the floor comes out per rank and as their mean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hostlib.protocol import MAX_LANES, packet_size

pytestmark = [pytest.mark.ebpf, pytest.mark.root, pytest.mark.mininet]

REPO = Path(__file__).resolve().parents[2]


def test_wire_floor_on_star4_counts_every_datagram_of_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    proc = subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", str(REPO / "topologies" / "star4.yaml"),
         "--bw", "200", "--datapath", "ebpf", "--run-dir", str(tmp_path / "run"), "wire-floor",
         "--seconds", "1.5", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    # The bench's packet (2,048 lanes: a jumbo MTU), 95% of the links' 200 Mbit/s.
    assert (doc["datagram_bytes"], doc["batch"], doc["rate_mbit"]) == (
        packet_size(MAX_LANES), 8, 190.0
    )  # fmt: skip
    ranks = doc["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for i, r in enumerate(ranks):
        assert r["sent"] == 8 * r["periods"] > 0
        assert r["received"] == ranks[i - 1]["sent"]  # across two links and the switch
        assert r["cpu_s_per_gbit"] > 0
    assert doc["lost"] == 0 and doc["link_drops"] == {}
    assert doc["cpu_s_per_gbit"] == pytest.approx(
        sum(r["cpu_s_per_gbit"] for r in ranks) / 4, abs=1e-3
    )
    assert "# floor: " in proc.stdout and "CPU-s per Gbit a rank sent and received" in proc.stdout
