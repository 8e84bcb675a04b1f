"""``inalab emulate star4.yaml --bw 20,200 bench``: the link-rate sweep in Mininet (root).

One network, the links re-shaped in place between rates: the bench's times follow the
rate, and the JSON has one row per (rate, size, algorithm) with its ``bw_mbit``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"


def _interfaces() -> set[str]:
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n and n.startswith("w")}


def _star4(tmp_path: Path) -> Path:
    """star4 with its nodes named wh1.., ws1: names no other test's network uses, so this
    test runs beside them."""
    path = tmp_path / "star4.yaml"
    text = (TOPOLOGIES / "star4.yaml").read_text()
    path.write_text(re.sub(r"\b([hs]\d+)\b", r"w\1", text))
    return path


def test_the_sweep_runs_each_rate_in_one_network(tmp_path: Path) -> None:
    out, png, run = tmp_path / "sweep.json", tmp_path / "sweep.png", tmp_path / "run"
    before = _interfaces()
    proc = subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", str(_star4(tmp_path)),
         "--run-dir", str(run), "bench", "--bw", "20,200", "-b", "64K", "-e", "64K", "-n", "3",
         "-w", "1", "--lanes", "256", "-d", "int32", "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert _interfaces() - before == set()
    assert proc.stdout.count("links; starting") == 1  # one bring-up for both rates
    doc = json.loads(out.read_text())
    keys = [(r["bw_mbit"], r["size_bytes"], r["algo"]) for r in doc["rows"]]
    assert keys == [(rate, 65536, a) for rate in (20.0, 200.0) for a in ("ina", "gloo")]
    assert all(r["wrong"] == 0 and "bound" in r["cpu"] for r in doc["rows"])
    meta = doc["metadata"]
    assert meta["link_rates_mbit"] == [20.0, 200.0]
    assert [p["links"].split(",")[0] for p in meta["per_rate"]] == [
        "every link 20 Mbit/s", "every link 200 Mbit/s"]  # fmt: skip
    # 64 KiB at 20 Mbit/s takes >= 26 ms a way, every call (a floor no load can lower);
    # at 200, a tenth: the rate really changed. The fastest of the 3 calls is compared: a
    # CI run saw one 200 Mbit/s INA call take 12 ms on the busy 2-core machine (its other
    # calls far less). Gloo's 64 KiB call has a fixed cost near the 200 Mbit/s transfer
    # time (CI saw 18 ms there, 43 ms at 20), so it only has to be slower at 20.
    t = {(r["bw_mbit"], r["algo"]): r["time_us"]["min"] for r in doc["rows"]}
    assert t[20.0, "ina"] > 26_000 and t[20.0, "ina"] > 2 * t[200.0, "ina"], t
    assert t[20.0, "gloo"] > 26_000 and t[20.0, "gloo"] > t[200.0, "gloo"], t
    for rate in ("20", "200"):
        per_rate = json.loads((run / f"bench-{rate}mbit.json").read_text())
        assert {r["algo"] for r in per_rate["rows"]} == {"ina", "gloo"}
    assert "# link-rate sweep: star4 (Mininet hosts), job 1, 4 ranks, int32" in proc.stdout
    assert "# 64K: ina " in proc.stdout and "gloo" in proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
