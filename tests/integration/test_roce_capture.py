"""A recorded lossy run of INA over RoCEv2 on loopback, every frame checked by scapy.

``inalab bench --transport rdma --loss`` with the soft switch recording its RoCEv2
socket (``--pcap-count``), then ``inalab pcap``: each frame parses in scapy's RoCE layer
with the ICRC scapy computes; each worker's queue pairs carry consecutive PSNs into the
switch (its frames are recorded as they arrive, before the switch's loss); a worker's
reply queue pairs carry its one R_Key, each its own message-sized place in the worker's
region, and PSNs whose gaps are replies the switch's egress loss dropped after numbering
them."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from emulation.bench import rocepcap

SWITCH = "127.0.0.1"


def _inalab(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "emulation.cli", *argv],
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def test_a_lossy_roce_run_s_capture_passes_scapy_s_checks(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _inalab(
        "bench", "--transport", "rdma", "-b", "16K", "-e", "128K", "-f", "8", "-n", "2",
        "-w", "1", "--workers", "3", "-d", "int32", "--algos", "ina", "--lanes", "256",
        "--msg-packets", "2", "--loss", "0.03", "--pcap-count", "1000000",
        "--json", str(out), "--run-dir", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    doc = json.loads(out.read_text())
    assert all(r["wrong"] == 0 for r in doc["rows"])
    counters = doc["metadata"]["switch_counters"]["ina"]

    check = rocepcap.check_pcap(tmp_path / "switch.pcap")
    assert check.problems == [] and check.frames > 200
    workers = {src for src, _, _ in check.streams if src != SWITCH}
    assert len(workers) == 3
    assert check.psn_problems(workers) == []  # recorded on arrival: nothing lost yet
    replies = check.streams_from(SWITCH)
    assert {dst for _, dst, _ in replies} == workers
    for worker in workers:  # one region per worker, one message's place per queue pair
        mine = [s for (_, dst, _), s in replies.items() if dst == worker]
        assert len({k for s in mine for k in s.rkeys}) == 1
        places = sorted((s.va_low, s.va_high) for s in mine)
        assert all(high - low == 2 * 256 * 4 for low, high in places)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(places))
    # Each reply's PSN is its queue pair's base + its message's and place's: one base per
    # stream, however many re-sends repeat PSNs (the egress drops made some).
    assert counters["drop_sim_egress"] > 0 and sum(s.repeats for s in replies.values()) > 0
    assert all(len(s.bases) == 1 for s in replies.values())

    cli = _inalab("pcap", str(tmp_path / "switch.pcap"), "--consecutive", ",".join(workers))
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert f"{check.frames} RoCEv2 frames" in cli.stdout
