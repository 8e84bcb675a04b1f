"""``inalab bench --transport rdma``: INA over RoCEv2 on loopback, each rank an emulated
RNIC on its own 127.0.1.x (UDP 4791), the soft switch serving RoCEv2, exact under the
switch's loss; and the flags that cannot go with it refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _bench(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "bench", *argv],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_ina_over_roce_is_exact_under_loss_next_to_ring(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _bench(
        "--transport", "rdma", "-b", "16K", "-e", "256K", "-f", "16", "-n", "2", "-w", "1",
        "--workers", "3", "-d", "int32", "--algos", "ina,ring", "--lanes", "256",
        "--msg-packets", "4", "--loss", "0.02", "--json", str(out), "--run-dir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "INA over RoCEv2 (UC RDMA WRITE from an emulated RNIC per rank" in proc.stdout
    doc = json.loads(out.read_text())
    meta = doc["metadata"]
    assert (meta["transport"], meta["msg_packets"], meta["lanes"]) == ("rdma", 4, 256)
    rows = {(r["algo"], r["size_bytes"]) for r in doc["rows"]}
    assert rows == {(a, s) for a in ("ina", "ring") for s in (16384, 262144)}
    assert all(r["wrong"] == 0 for r in doc["rows"])
    ina = [r for r in doc["rows"] if r["algo"] == "ina"]
    assert sum(r["retransmits"] for r in ina) > 0  # whole messages, after the 2% loss
    counters = meta["switch_counters"]["ina"]
    assert counters["drop_sim_ingress"] > 0 and counters["drop_bad_icrc"] == 0
    assert counters["drop_bad_psn"] + counters["completed"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--lanes", "2048"), "over RDMA a packet is a path MTU"),
        (("--msg-packets", "3"), "msg_packets 3: a power of two"),
        (("--algos", "collnet"), "collnet: not over RDMA yet"),
        (("--slots", "30", "--msg-packets", "4", "--lanes", "256"), "a multiple of msg_packets"),
    ],
)
def test_what_rdma_cannot_do_is_one_line_and_status_2(flags: tuple[str, ...], message: str) -> None:
    proc = _bench("--transport", "rdma", "-b", "4K", "-e", "4K", *flags, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_msg_packets_belongs_to_rdma() -> None:
    proc = _bench("--msg-packets", "2", "-b", "4K", "-e", "4K", timeout=60)
    assert proc.returncode == 2 and "msg_packets: --transport rdma only" in proc.stderr
