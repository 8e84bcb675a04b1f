"""``inalab emulate``: the command users run, end to end in Mininet (root).

Each test runs the real CLI in a subprocess and checks what it prints and writes (the
bench's JSON, the run manifest, the switches' statistics), and that nothing it created
outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"
TINY = ("-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1", "--lanes", "256")


def _interfaces() -> set[str]:
    """Mininet's interfaces (``<node>-eth<N>``); other tests may add veths meanwhile."""
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n}


def _leftovers(run_dir: Path) -> set[int]:
    """PIDs of Mininet host shells, of switch processes of this run (by run dir) and of
    bmv2 switches (whose command line does not name the run dir)."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        program = Path(cmd.split(b"\0")[0].decode(errors="replace")).name
        ours = cmd.startswith(b"mnexec") or str(run_dir).encode() in cmd
        if ours or program == "simple_switch_grpc":
            out.add(int(pid))
    return out


@pytest.fixture
def clean(tmp_path: Path) -> Iterator[None]:
    """The run leaves no interface and no switch or host process behind."""
    before_if, before_pids = _interfaces(), _leftovers(tmp_path)
    yield
    assert _interfaces() - before_if == set()
    assert _leftovers(tmp_path) - before_pids == set()


def _inalab(*args: str, timeout: float = 600, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw,
    )  # fmt: skip


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _kernel_log_count(text: str) -> int:
    log = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    return log.count(text)


def test_bench_on_star4_runs_ina_and_gloo_in_the_hosts(tmp_path: Path, clean: None) -> None:
    out, png = tmp_path / "star4.json", tmp_path / "star4.png"
    htb_warnings = _kernel_log_count("quantum of class")
    proc = _inalab("emulate", str(TOPOLOGIES / "star4.yaml"), "--run-dir",
                   str(tmp_path / "run"), "bench", *TINY, "-d", "int32", "--json", str(out),
                   "--plot", str(png))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert [(r["algo"], r["size_bytes"]) for r in doc["rows"]] == [
        (a, s) for a in ("ina", "gloo") for s in (4096, 65536)
    ]
    assert all(r["wrong"] == 0 for r in doc["rows"])
    meta = doc["metadata"]
    assert meta["workers"] == 4 and meta["emulation"]["topology"] == "star4"
    counters = meta["switch_counters"]["ina"]["s1"]
    # 2 sizes x 3 calls x ceil(count / 256) packets per call, each completed once.
    assert counters["completed"] == 3 * (4 + 64) and counters["drop_bad_source"] == 0
    assert "star4 (Mininet hosts)" in proc.stdout
    assert "on loopback" not in proc.stdout  # the links, not only Python, set the pace here
    assert "# links: every link 1000 Mbit/s, 0 ms one way, loss 0 each way" in proc.stdout
    assert meta["links"].startswith("every link 1000 Mbit/s")
    # No noise: Gloo's reverse lookups in DNS-less hosts, HTB's quantum warnings.
    assert "hostname of the client socket" not in proc.stdout + proc.stderr
    assert _kernel_log_count("quantum of class") == htb_warnings
    # Every algorithm's packets cross s1, so its CPU is in Gloo's rows as in INA's.
    for r in doc["rows"]:
        assert len(r["cpu"]["workers"]) == 4 and set(r["cpu"]["switch"]) == {"s1"}
        assert 0.0 <= r["cpu"]["machine"] <= 1.0
    assert png.read_bytes()[:4] == b"\x89PNG"
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["schema"] == "inalab.emulation/1"
    assert set(manifest["switches"]) == {"s1"} and len(manifest["hosts"]) == 4
    assert manifest["switches"]["s1"]["ina_address"]["ip"] == "10.255.255.1"
    assert (tmp_path / "run" / "s1.log").exists()


def test_collnet_on_two_hosts_of_two_ranks(tmp_path: Path, clean: None) -> None:
    out = tmp_path / "collnet.json"
    proc = _inalab("emulate", str(TOPOLOGIES / "collnet2x2.yaml"), "--run-dir",
                   str(tmp_path / "run"), "bench", *TINY, "-d", "int32",
                   "--algos", "ina,collnet,gloo", "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert {r["algo"] for r in doc["rows"]} == {"ina", "collnet", "gloo"}
    assert all(r["wrong"] == 0 for r in doc["rows"])
    ina = doc["metadata"]["switch_counters"]
    # Flat INA: 4 workers; CollNet: the 2 heads only, so half the contributions.
    assert ina["ina"]["s1"]["aggregated"] == 2 * ina["collnet"]["s1"]["aggregated"]


def test_ring_tree_and_auto_across_the_leaf_spine_links(tmp_path: Path, clean: None) -> None:
    # Ring and tree packets cross the switches as plain IPv4 (forwarded, not aggregated);
    # auto decides with the topology's links (the job's 8 hosts behind a spine).
    out = tmp_path / "peers.json"
    proc = _inalab("emulate", str(TOPOLOGIES / "leaf_spine.yaml"), "--run-dir",
                   str(tmp_path / "run"), "bench", *TINY, "-d", "int32",
                   "--algos", "ring,tree,auto", "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert [(r["algo"], r["size_bytes"]) for r in doc["rows"]] == [
        (a, s) for a in ("ring", "tree", "auto") for s in (4096, 65536)
    ]
    assert all(r["wrong"] == 0 and r["max_abs_err"] == 0 for r in doc["rows"])
    # The forwarding switches' CPU is reported for the point-to-point algorithms too.
    assert all(set(r["cpu"]["switch"]) == {"spine", "leaf1", "leaf2"} for r in doc["rows"])
    section = doc["dynamiccl"]
    assert section["topology"]["link_bandwidth"] == 1000e6 / 8
    chosen = [r["chosen"] for r in doc["rows"] if r["algo"] == "auto"]
    assert chosen == [section["decisions"][str(s)]["algorithm"] for s in (4096, 65536)]
    # The switch aggregated nothing for ring and tree (auto's INA session may have).
    assert set(doc["metadata"]["switch_counters"]) <= {"auto"}


def test_calibrate_across_the_emulated_links(tmp_path: Path, clean: None) -> None:
    profile = tmp_path / "profile.json"
    proc = _inalab("emulate", str(TOPOLOGIES / "star4.yaml"), "--bw", "100", "--run-dir",
                   str(tmp_path / "run"), "calibrate", "-b", "4K", "-e", "64K", "-f", "4",
                   "-n", "1", "-w", "0", "--lanes", "256", "-o", str(profile))  # fmt: skip
    _ok(proc)
    doc = json.loads(profile.read_text())
    assert doc["source"].startswith("inalab calibrate on star4 (Mininet hosts, job 1)")
    assert "workers 4" in doc["source"] and doc["packet_bytes"] == 4 * 256
    assert "mean |error|" in proc.stdout
    assert (tmp_path / "run" / "calibrate" / "workers4").is_dir()


def test_hierarchical_leaf_spine(tmp_path: Path, clean: None) -> None:
    out = tmp_path / "hier.json"
    proc = _inalab("emulate", str(TOPOLOGIES / "leaf_spine_hier.yaml"), "--run-dir",
                   str(tmp_path / "run"), "bench", *TINY, "-d", "int32", "--algos", "ina",
                   "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert all(r["wrong"] == 0 for r in doc["rows"])
    assert doc["metadata"]["emulation"]["hierarchical"] is True
    c = doc["metadata"]["switch_counters"]["ina"]
    packets = 3 * (4 + 64)
    # Each leaf sums its 4 hosts and sends one partial per slot use; the spine sums 2.
    for leaf in ("leaf1", "leaf2"):
        assert c[leaf]["aggregated"] == 4 * packets
        # sent_upstream also counts partials re-sent for retransmitting hosts.
        assert c[leaf]["sent_upstream"] - c[leaf]["upstream_resent"] == packets
        assert c[leaf]["results_from_upstream"] == packets
    assert c["spine"]["aggregated"] == 2 * packets
    assert c["spine"]["completed"] == packets


def test_up_serves_a_manifest_for_inalab_ctl_until_terminated(tmp_path: Path, clean: None) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulation.cli", "emulate", str(TOPOLOGIES / "star4.yaml"),
         "--run-dir", str(run), "up"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        manifest = run / "manifest.json"
        deadline = time.monotonic() + 120
        while not manifest.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no manifest"
            time.sleep(0.2)
        ctl = _inalab("ctl", "--manifest", str(manifest), "--name", "s1", "jobs", timeout=60)
        _ok(ctl)
        assert "job 1" in ctl.stdout or "1" in ctl.stdout.split()
        # The topology's job is installed for rank 0 of each host at the fixed port.
        assert "10.0.0.4:47000" in ctl.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]


def test_cli_reads_mininet_commands_from_stdin(tmp_path: Path, clean: None) -> None:
    proc = _inalab("emulate", str(TOPOLOGIES / "star4.yaml"), "--run-dir", str(tmp_path),
                   "--cli", input="h1 ping -c 1 -W 5 10.0.0.2\n")  # fmt: skip
    _ok(proc)
    assert "1 received" in proc.stdout + proc.stderr  # Mininet prints to stderr


def test_refuses_a_topology_with_errors_before_building(tmp_path: Path, clean: None) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("switches: {s1: {}}\nhosts: {h1: {}}\nlinks: [[h1, s9]]\n")
    proc = _inalab("emulate", str(bad), "up", "--seconds", "0")
    assert proc.returncode == 2
    assert "links[0]" in proc.stderr and "s9" in proc.stderr


def test_a_run_dir_that_is_a_file_is_refused(tmp_path: Path, clean: None) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")
    proc = _inalab("emulate", str(TOPOLOGIES / "star4.yaml"), "--run-dir", str(taken), "up")
    assert proc.returncode == 2
    assert "run directory" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- bmv2
# p4/ina.p4 on simple_switch_grpc, configured by the same controller (tables over
# P4Runtime, registers over Thrift). bmv2 does a few thousand packets a second: small
# sizes. Its lanes default to 64 (p4/'s fixed width) without --lanes.
BMV2_TINY = ("-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1")


@pytest.mark.bmv2
def test_star4_on_bmv2_int32_exact_and_float32_under_loss(tmp_path: Path, clean: None) -> None:
    exact, lossy = tmp_path / "exact.json", tmp_path / "lossy.json"
    star4 = str(TOPOLOGIES / "star4_bmv2.yaml")
    proc = _inalab("emulate", star4, "--bw", "100", "--run-dir", str(tmp_path / "run"),
                   "bench", *BMV2_TINY, "-d", "int32", "--algos", "ina,gloo",
                   "--json", str(exact))  # fmt: skip
    _ok(proc)
    doc = json.loads(exact.read_text())
    assert doc["metadata"]["lanes"] == 64
    assert all(r["wrong"] == 0 and r["max_abs_err"] == 0 for r in doc["rows"])
    counters = doc["metadata"]["switch_counters"]["ina"]["s1"]
    # 2 sizes x 3 calls x count / 64 packets, each slot use completed once.
    assert counters["completed"] == 3 * (16 + 256)
    assert counters["drop_bad_source"] == counters["drop_stale"] == 0

    # The drop simulator (in P4: random() against a register over Thrift) at 2% each
    # way: the hosts retransmit, the switch answers from the stored slot, the sums hold.
    proc = _inalab("emulate", star4, "--run-dir", str(tmp_path / "run2"), "bench",
                   *BMV2_TINY, "--loss", "0.02", "--algos", "ina",
                   "--json", str(lossy))  # fmt: skip
    _ok(proc)
    doc = json.loads(lossy.read_text())
    assert all(r["wrong"] == 0 for r in doc["rows"])  # float32 within the bound
    counters = doc["metadata"]["switch_counters"]["ina"]["s1"]
    assert counters["drop_sim_ingress"] > 0 and counters["drop_sim_egress"] > 0
    assert sum(r["retransmits"] for r in doc["rows"]) > 0
    assert counters["retransmits_answered"] > 0


@pytest.mark.bmv2
def test_hierarchical_leaf_spine_of_three_bmv2_switches(tmp_path: Path, clean: None) -> None:
    out = tmp_path / "hier.json"
    proc = _inalab("emulate", str(TOPOLOGIES / "leaf_spine_hier_bmv2.yaml"), "--run-dir",
                   str(tmp_path / "run"), "bench", "-b", "4K", "-e", "16K", "-f", "4",
                   "-n", "2", "-w", "1", "-d", "int32", "--loss", "0.01", "--algos", "ina",
                   "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    assert all(r["wrong"] == 0 and r["max_abs_err"] == 0 for r in doc["rows"])
    assert doc["metadata"]["emulation"]["hierarchical"] is True
    c = doc["metadata"]["switch_counters"]["ina"]
    packets = 3 * (16 + 64)
    assert c["spine"]["completed"] == packets
    for leaf in ("leaf1", "leaf2"):
        assert c[leaf]["completed"] == packets  # each leaf's 4 hosts, once per use
        assert c[leaf]["results_from_upstream"] == packets
        assert c[leaf]["sent_upstream"] >= packets
    assert sum(c[s]["drop_sim_ingress"] for s in c) > 0


@pytest.mark.bmv2
@pytest.mark.parametrize("topology", ["star4.yaml", "star4_bmv2.yaml"])
def test_switch_only_loads_the_topologys_switch(topology: str, tmp_path: Path, clean: None) -> None:
    # The same 64-lane packets from senders in the hosts, to the soft switch and to bmv2.
    out = tmp_path / "only.json"
    proc = _inalab("emulate", str(TOPOLOGIES / topology), "--run-dir", str(tmp_path / "run"),
                   "switch-only", "--seconds", "1", "--json", str(out))  # fmt: skip
    _ok(proc)
    doc = json.loads(out.read_text())
    meta, numbers = doc["metadata"], doc["switch_only"]
    assert meta["switch"] == ("bmv2" if "bmv2" in topology else "soft")
    assert (meta["workers"], meta["lanes"], meta["topology"]) == (4, 64, topology[:-5])
    assert numbers["worker_bad_results"] == 0
    assert numbers["switch_pps"] > 0 and numbers["switch_elements_per_s"] > 0
    assert "inproc_pps" not in numbers  # the Python pipeline alone says nothing of bmv2


def test_the_header_states_the_links_loss_apart_from_the_switchs(
    tmp_path: Path, clean: None
) -> None:
    out = tmp_path / "loss.json"
    proc = _inalab("emulate", str(TOPOLOGIES / "star4.yaml"), "--bw", "200", "--link-loss",
                   "0.01", "--run-dir", str(tmp_path / "run"), "bench", *TINY, "--algos",
                   "ina", "--json", str(out))  # fmt: skip
    _ok(proc)
    header = [line for line in proc.stdout.splitlines() if line.startswith("# links:")]
    by = "netem" if _has_netem() else "the soft switches' ports"
    assert header == [
        "# links: every link 200 Mbit/s, 0 ms one way, loss 0.01 each way; rate by HTB, delay "
        f"and loss by {by}"
    ]
    assert "switch drop simulator 0 in+out" in proc.stdout  # not the links' loss
    assert "retx" in proc.stdout  # losses recovered show in the table
    doc = json.loads(out.read_text())
    assert "loss 0.01" in doc["metadata"]["links"]
    assert all(r["wrong"] == 0 for r in doc["rows"])


def _has_netem() -> bool:
    from emulation.mininet.datapaths import netem_available

    return netem_available()


def test_a_bad_bench_flag_is_refused_before_the_network(tmp_path: Path, clean: None) -> None:
    before = _interfaces()
    proc = _inalab("emulate", str(TOPOLOGIES / "star4.yaml"), "--run-dir", str(tmp_path / "run"),
                   "bench", "--profile", str(tmp_path / "missing.json"))  # fmt: skip
    assert proc.returncode == 2
    assert "--profile" in proc.stderr and "Traceback" not in proc.stderr
    assert "starting" not in proc.stdout and not (tmp_path / "run").exists()
    assert _interfaces() == before
