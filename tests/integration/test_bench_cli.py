"""``inalab bench`` end to end: real processes, loopback sockets, the soft switch and Gloo.

Each run is a subprocess (the command a user types) with a tiny sweep; the JSON it writes
is the oracle. A few tests drive the coordinator in-process to show a failing or dying
rank ends the run with that rank's story instead of a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from emulation.bench.sweep import BenchError, _Fleet
from emulation.bench.workers import WorkerPlan
from hostlib.protocol import TNA_LANES_PER_PACKET

TINY = ["-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "--workers", "2"]


def _bench(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "bench", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


@pytest.mark.slow
def test_ina_and_gloo_tiny_sweep(tmp_path: Path) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = _bench(*TINY, "--json", str(out), "--plot", str(png), "--run-dir", str(tmp_path))
    _ok(proc)
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [(r["algo"], r["size_bytes"]) for r in rows] == [
        (algo, size) for algo in ("ina", "gloo") for size in (4096, 16384, 65536)
    ]
    assert all(r["wrong"] == 0 for r in rows)
    assert all(r["time_us"]["min"] <= r["time_us"]["mean"] <= r["time_us"]["max"] for r in rows)
    assert all(r["algbw_gbps"] > 0 and r["busbw_gbps"] == r["algbw_gbps"] for r in rows)  # n=2
    meta = doc["metadata"]
    assert meta["workers"] == 2 and meta["dtype"] == "float32"
    assert meta["sweep"]["sizes"] == [4096, 16384, 65536]
    assert set(meta["versions"]) >= {"python", "numpy", "torch"}
    counters = meta["switch_counters"]["ina"]
    assert counters["completed"] > 0 and counters["drop_bad_source"] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "switch.log").exists()
    # Tables on stdout, one per algorithm; no progress bar off a terminal (the pipe here).
    assert proc.stdout.count("# algorithm:") == 2
    assert "Out of bounds values : 0 OK" in proc.stdout
    assert "allreduce:" not in proc.stderr


def test_ina_through_a_switch_serving_the_tofino_programs_p4info(tmp_path: Path) -> None:
    # --program tna: the soft switch serves p4/tna/'s P4Info, the bench's controller
    # installs the job through its names, and the hosts use its TNA_LANES_PER_PACKET lanes.
    out = tmp_path / "bench.json"
    proc = _bench(*TINY, "--program", "tna", "--algos", "ina", "-d", "int32",
                  "--json", str(out), "--run-dir", str(tmp_path))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert (doc["metadata"]["program"], doc["metadata"]["lanes"]) == ("tna", TNA_LANES_PER_PACKET)
    assert all(r["wrong"] == 0 and r["max_abs_err"] == 0 for r in doc["rows"])
    counters = doc["metadata"]["switch_counters"]["ina"]
    # received and completed are the Tofino program's counters of their own.
    assert counters["received"] == counters["aggregated"] > 0 and counters["completed"] > 0
    refused = _bench(*TINY, "--program", "tna", "--lanes", "64")
    want = f"the Tofino program (--program tna) has {TNA_LANES_PER_PACKET}"
    assert refused.returncode == 2 and want in refused.stderr


@pytest.mark.parametrize(
    ("collective", "dtype", "algos"),
    [("reduce_scatter", "int32", ("ina", "ring", "gloo")),
     ("reduce_scatter", "float32", ("ina", "ring", "gloo")),
     ("all_gather", "float32", ("ring", "gloo"))],
)  # fmt: skip
def test_reduce_scatter_and_all_gather_as_nccl_tests_time_them(
    tmp_path: Path, collective: str, dtype: str, algos: tuple[str, ...]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1", "--workers", "4",
            "--collective", collective, "-d", dtype, "--json", str(out)]  # fmt: skip
    if collective == "reduce_scatter":  # all_gather's default: ring and Gloo
        argv += ["--algos", ",".join(algos)]
    proc = _bench(*argv, "--run-dir", str(tmp_path))
    _ok(proc)
    doc = json.loads(out.read_text())
    assert doc["metadata"]["collective"] == collective
    rows = doc["rows"]
    assert [(r["algo"], r["size_bytes"]) for r in rows] == [
        (a, size) for a in algos for size in (4096, 65536)
    ]
    for r in rows:  # each rank checked its part (or every rank's input, in order)
        assert r["wrong"] == 0 and r["collective"] == collective, r
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 3 / 4)  # (n-1)/n
        assert r["redop"] == ("none" if collective == "all_gather" else "sum")
    assert proc.stdout.count(f"# collective: {collective}") == len(algos)
    assert f"# inalab bench: {collective}" in proc.stdout


@pytest.mark.slow
def test_collnet_next_to_flat_ina(tmp_path: Path) -> None:
    out = tmp_path / "collnet.json"
    proc = _bench("-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1", "-d", "int32",
                  "--workers", "4", "--ranks-per-host", "2", "--algos", "ina,collnet",
                  "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert [r["algo"] for r in doc["rows"]] == ["ina", "ina", "collnet", "collnet"]
    assert all(r["wrong"] == 0 for r in doc["rows"])
    counters = doc["metadata"]["switch_counters"]
    # 2 sizes x 3 calls x (1 + 8) packets of 2048 lanes; 4 workers, then 2 heads.
    assert counters["ina"]["aggregated"] == 4 * 27
    assert counters["collnet"]["aggregated"] == 2 * 27
    assert "shared-memory reduce on each of 2 hosts" in proc.stdout
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith("inalab-cn-")]


@pytest.mark.slow
def test_ina_with_loss_is_still_correct(tmp_path: Path) -> None:
    out = tmp_path / "loss.json"
    proc = _bench(*TINY, "--algos", "ina", "--loss", "0.05", "--seed", "3", "--json", str(out))
    _ok(proc)
    doc = json.loads(out.read_text())
    assert all(r["wrong"] == 0 for r in doc["rows"])
    assert sum(r["retransmits"] for r in doc["rows"]) > 0  # the hosts recovered the drops
    counters = doc["metadata"]["switch_counters"]["ina"]
    assert counters["drop_sim_ingress"] > 0
    assert counters["drop_sim_egress"] > 0
    assert doc["metadata"]["loss"] == 0.05


@pytest.mark.slow
def test_pcap_count_records_the_switchs_first_packets(tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    run = tmp_path / "run"
    proc = _bench(*TINY, "--algos", "ina", "--pcap-count", "50", "--run-dir", str(run),
                  "--json", str(out))  # fmt: skip
    _ok(proc)
    pcap = run / "switch.pcap"
    assert json.loads(out.read_text())["metadata"]["pcap"] == str(pcap)
    assert f"# pcap: {pcap}" in proc.stdout
    # pcap global header + 50 records, each of a 16-byte record header, IPv4, UDP, INA.
    size = 16 + 20 + 8 + 16 + 4 * 2048
    assert pcap.stat().st_size == 24 + 50 * size


def test_ina_int32_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "int.json"
    proc = _bench(*TINY, "--algos", "ina", "-d", "int32", "--json", str(out))
    _ok(proc)
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert all(r["wrong"] == 0 and r["max_abs_err"] == 0 and r["type"] == "int32" for r in rows)
    assert doc["summary"]["overall"] == "ina alone: nothing to compare"
    assert doc["metadata"]["host_engine"] in ("native", "python")
    assert f"host engine: {doc['metadata']['host_engine']}" in proc.stdout.replace("\n#   ", " ")
    assert doc["metadata"]["cc_target_s"] is None  # hostlib's default: off


@pytest.mark.parametrize(("given", "seconds"), [("5", 0.005), ("off", None)])
def test_the_congestion_target_reaches_the_run(
    tmp_path: Path, given: str, seconds: float | None
) -> None:
    out = tmp_path / "cc.json"
    _ok(_bench(*TINY, "--algos", "ina", "-d", "int32", "--cc-target", given, "--json", str(out)))
    doc = json.loads(out.read_text())
    assert doc["metadata"]["cc_target_s"] == seconds
    assert all(r["wrong"] == 0 for r in doc["rows"])


@pytest.mark.slow
def test_switch_only(tmp_path: Path) -> None:
    out = tmp_path / "switch.json"
    proc = _bench("--switch-only", "--workers", "2", "--seconds", "1", "--lanes", "64",
                  "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    meta, numbers = doc["metadata"], doc["switch_only"]
    assert (meta["mode"], meta["switch"], meta["lanes"], meta["workers"]) == (
        "switch-only",
        "soft",
        64,
        2,
    )
    assert numbers["worker_bad_results"] == 0 and numbers["switch_elements_per_s"] > 0
    assert "switch_pps" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-b", "4X"], "invalid size"),
        (["-b", "1M", "-e", "4K"], "larger than"),
        (["-b", "2"], "smaller than one float32"),
        (["--algos", "nccl"], "invalid algorithms"),
        (["--loss", "1.5"], "outside"),
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
        (["--algos", "collnet", "--workers", "3"], "not a multiple of ranks per host 2"),
        (["--collective", "all_gather", "--algos", "ina,gloo"], "ina cannot run all_gather"),
        (["--collective", "reduce_scatter", "--algos", "tree"], "tree cannot run reduce_scatter"),
        (["--collective", "reduce_scatter", "--workers", "3"], "whole number of float32"),
        (["--collective", "broadcast"], "invalid choice"),
        (["--cc-target", "0"], "must be positive (or off)"),
        (["--cc-target", "fast"], "milliseconds or off"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str) -> None:
    proc = _bench(*argv, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_unaligned_sizes_are_rounded_down_with_a_note(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _bench(
        "-b", "4097", "-e", "4099", "-n", "1", "-w", "0", "--workers", "2",
        "--algos", "ina", "--json", str(out),
    )  # fmt: skip
    _ok(proc)
    assert "rounded down to 4096" in proc.stderr
    assert [r["size_bytes"] for r in json.loads(out.read_text())["rows"]] == [4096]


# ----------------------------------------------------------------- failures, in-process
def _plans(algo: str, n: int, tmp_path: Path, **kw: Any) -> list[WorkerPlan]:
    base: dict[str, Any] = dict(
        sizes=(4096,), dtype="float32", iters=1, warmup=0, seed=0, lanes=64, slots=8, timeout=5.0
    )
    base.update(kw)
    return [
        WorkerPlan(algo=algo, rank=r, num_workers=n, log_path=str(tmp_path / f"w{r}.log"), **base)
        for r in range(n)
    ]


def test_a_raising_worker_fails_the_run_with_its_traceback(tmp_path: Path) -> None:
    with _Fleet("bogus", _plans("bogus", 2, tmp_path), stall_s=60) as fleet:
        with pytest.raises(BenchError) as info:
            fleet.drive(1, None)
        procs = list(fleet.procs)
    text = str(info.value)
    assert "rank" in text and "Traceback" in text and "unknown algorithm 'bogus'" in text
    assert all(not p.is_alive() for p in procs)


def test_a_dying_worker_fails_the_run_without_a_hang(tmp_path: Path) -> None:
    start = time.monotonic()
    with _Fleet("ina", _plans("ina", 2, tmp_path), stall_s=60) as fleet:
        fleet.gather("addr")  # both ranks are up, now waiting for their job
        victim = fleet.procs[1]
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(BenchError, match=r"rank 1 exited with status -9"):
            fleet.gather("barrier")
        survivor = fleet.procs[0]
    assert not survivor.is_alive()  # stopped by the fleet, not left waiting
    assert time.monotonic() - start < 30


def _crafted_profile(path: Path) -> Path:
    """Tree far ahead below 64 KiB (low latency), ring far ahead above (high bandwidth),
    INA never competitive: auto's choices are known in advance."""
    from dynamiccl.model import AlgoParams, Profile

    Profile(
        ina=AlgoParams(1.0, 1e-3),
        ring=AlgoParams(2e-3, 1e-9),
        tree=AlgoParams(1e-5, 1e-7),
        switch_rate=1e12,
        source="crafted: tree small, ring large",
    ).save(path)
    return path


@pytest.mark.slow
def test_ring_tree_and_auto_next_to_ina(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    profile = _crafted_profile(tmp_path / "profile.json")
    proc = _bench(
        "-b", "4K", "-e", "1M", "-f", "16", "-n", "2", "-w", "1", "--workers", "3",
        "--algos", "ina,ring,tree,auto", "--profile", str(profile), "--json", str(out),
    )  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    sizes = (4096, 65536, 1 << 20)
    assert [(r["algo"], r["size_bytes"]) for r in rows] == [
        (algo, size) for algo in ("ina", "ring", "tree", "auto") for size in sizes
    ]
    assert all(r["wrong"] == 0 for r in rows)
    auto = [r for r in rows if r["algo"] == "auto"]
    assert [r["chosen"] for r in auto] == ["tree", "ring", "ring"]
    assert all("chosen" not in r for r in rows if r["algo"] != "auto")
    ring = [r for r in rows if r["algo"] == "ring"]
    assert all(r["retransmits"] >= 0 for r in ring)
    # The switch ran for INA and auto (which holds an INA session), not for ring or tree.
    assert set(doc["metadata"]["switch_counters"]) == {"ina", "auto"}
    section = doc["dynamiccl"]
    assert section["profile"] == "crafted: tree small, ring large"
    assert "# auto's profile: crafted: tree small, ring large" in proc.stdout
    assert section["decisions"]["4096"]["algorithm"] == "tree"
    oracle = section["oracle"]
    assert oracle["sizes"] == 3
    assert [p["chosen"] for p in oracle["points"]] == ["tree", "ring", "ring"]
    assert oracle["best_static"] in ("ina", "ring", "tree")
    assert oracle["gain_over_best_static"] > 0
    assert "dynamiccl (auto) against the oracle" in proc.stdout
    assert "Mean regret" in proc.stdout and "Mixed workload" in proc.stdout


@pytest.mark.slow
def test_ring_and_tree_int32_are_exact(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _bench(*TINY, "--algos", "ring,tree", "-d", "int32", "--lanes", "64",
                  "--json", str(out))  # fmt: skip
    _ok(proc)
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 6
    assert all(r["wrong"] == 0 and r["max_abs_err"] == 0 for r in rows)


def test_auto_with_an_unreadable_profile_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    proc = _bench(*TINY, "--algos", "auto", "--profile", str(bad))
    assert proc.returncode == 2
    assert "--profile" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_rows_carry_the_cpu_use_of_their_timed_calls(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    proc = _bench(*TINY, "--algos", "ina,ring", "--json", str(out))
    _ok(proc)
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["algo"] for r in rows] == ["ina"] * 3 + ["ring"] * 3
    # One legend before both tables; the answer after them, in the JSON too.
    assert proc.stdout.count("# legend") == 1 and proc.stdout.count("retx =") == 1
    assert proc.stdout.index("# legend") < proc.stdout.index("# algorithm:")
    assert doc["summary"]["subject"] == "ina" and doc["summary"]["baseline"] == "ring"
    assert f"# overall: {doc['summary']['overall'][:40]}" in proc.stdout
    assert proc.stdout.index("# overall:") > proc.stdout.rindex("# algorithm:")
    cores = os.cpu_count() or 1
    for r in rows:
        cpu = r["cpu"]
        assert len(cpu["workers"]) == 2
        # A process's CPU seconds over wall seconds: at most every core, all its threads.
        assert all(0.0 <= w <= cores * 1.05 for w in cpu["workers"])
        assert cpu["workers_max"] == max(cpu["workers"])
        assert 0.0 <= cpu["softirq"] <= cpu["machine"] <= 1.0
        assert cpu["interval_s"] > 0 and cpu["samples"] >= 0
        assert cpu["span_s"] >= cpu["interval_s"] * 0.999
        assert isinstance(cpu["bound"], bool)
        assert cpu["bound"] == bool(cpu["bound_by"])
    # The soft switch runs for INA only: ring's packets never meet it on loopback.
    assert all(set(r["cpu"]["switch"]) == {"switch"} for r in rows if r["algo"] == "ina")
    assert all(0.0 <= r["cpu"]["switch"]["switch"] <= cores for r in rows if r["algo"] == "ina")
    assert all(r["cpu"]["switch"] is None for r in rows if r["algo"] == "ring")
    # The table shows the busiest of each and explains a flag when it raises one.
    assert proc.stdout.count("switch    worker   machine") == 2
    assert proc.stdout.splitlines()[1] == "# links: none: loopback (127.0.0.1), no wire, no shaping"
    assert "on loopback there is no wire" in proc.stdout.splitlines()[2]
    bound = any(r["cpu"]["bound"] for r in rows)
    assert ("# ! CPU-bound" in proc.stdout) == bound
