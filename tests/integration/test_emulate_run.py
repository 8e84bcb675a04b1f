"""``inalab emulate TOPOLOGY run -- COMMAND``: programs of one's own in the emulated hosts
(root, Mininet).

Each test runs the real CLI in a subprocess and checks what the ranks printed (prefixed
``[rank N]``), what the emulator reports (exit status, the switches' counters), and that
nothing it created outlives it: no interface, no Mininet host or switch process, and no
rank process or child of one (found by the run directory in its environment).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"
EXAMPLE = REPO / "examples" / "ddp_digits.py"
MIXED = REPO / "examples" / "train_mixed.py"

ALLREDUCE = """\
import json, os
import torch
import torch.distributed as dist
import dynamiccl.torch_backend  # registers "ina"

dist.init_process_group("ina")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(rank)
f = torch.randn(3000, generator=g) * 2.0 ** torch.randint(-6, 6, (3000,), generator=g)
i = torch.randint(-2**20, 2**20, (3000,), generator=g, dtype=torch.int32)
mine = {"float32": f.tolist(), "int32": i.tolist()}
dist.all_reduce(f)
dist.all_reduce(i)
session = dist.group.WORLD.session
print(json.dumps({"rank": rank, "world": world, "lanes": session.spec.lanes,
                  "packets": session.next_seq - 1, "mine": mine,
                  "float32": f.tolist(), "int32": i.tolist(),
                  "env": {k: os.environ[k] for k in ("MASTER_ADDR", "LOCAL_RANK",
                                                     "LOCAL_WORLD_SIZE")}}))
dist.destroy_process_group()
"""
"""A torchrun-style script: ``init_process_group("ina")`` from the environment alone, a
float32 and an int32 allreduce; each rank prints its inputs and the sums."""


def _interfaces() -> set[str]:
    """Mininet's interfaces (``<node>-eth<N>``)."""
    return {n for n in os.listdir("/sys/class/net") if "-eth" in n}


def _ours(tmp_path: Path) -> set[int]:
    """PIDs of Mininet host shells, and of processes naming ``tmp_path`` in their command
    line (switches), environment (ranks and their children: INALAB_RUN_DIR) or working
    directory (ranks of a run started there)."""
    mark = str(tmp_path)
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cmd.startswith(b"mnexec") or mark.encode() in cmd + env or cwd.startswith(mark):
            out.add(int(pid))
    return out


@pytest.fixture
def clean(tmp_path: Path) -> Iterator[None]:
    before_if, before_pids = _interfaces(), _ours(tmp_path)
    yield
    assert _interfaces() - before_if == set()
    assert _ours(tmp_path) - before_pids == set()


def _run(topology: str, run_dir: Path, *command: str, timeout: float = 300,
         options: tuple[str, ...] = ()) -> Any:  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", str(TOPOLOGIES / topology),
         *options, "--run-dir", str(run_dir), "run", "--grace", "1", "--", *command],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False,
    )  # fmt: skip


def _ok(proc: Any) -> None:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _reports(stdout: str) -> dict[int, dict[str, Any]]:
    """Each rank's JSON line, by the rank of its ``[rank N]`` prefix."""
    out = {}
    for m in re.finditer(r"^\[rank (\d+)\] (\{.*\})$", stdout, re.MULTILINE):
        out[int(m.group(1))] = json.loads(m.group(2))
    return out


def _aggregated(stdout: str) -> dict[str, int]:
    """The emulator's count of packets each switch aggregated during the run."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^# (\S+): aggregated (\d+)", stdout, re.M)}


def _check_sums(reports: dict[int, dict[str, Any]], world: int) -> None:
    from hostlib.quantize import error_bound

    assert sorted(reports) == list(range(world))
    f32 = np.array([reports[r]["mine"]["float32"] for r in range(world)], dtype=np.float64)
    i32 = np.array([reports[r]["mine"]["int32"] for r in range(world)], dtype=np.int64)
    for r, report in reports.items():
        assert report["rank"] == r and report["world"] == world
        np.testing.assert_array_equal(report["int32"], i32.sum(axis=0))
        got, ref = np.array(report["float32"]), f32.sum(axis=0)
        bound = error_bound(np.abs(f32).max(axis=0), world, report["lanes"], ref)
        assert np.all(np.abs(got - ref) <= bound), np.abs(got - ref).max()
        assert report["env"]["MASTER_ADDR"] == "10.0.0.1"  # h1's, rank 0's host


def test_the_ddp_example_runs_one_rank_per_host(tmp_path: Path, clean: None) -> None:
    run = tmp_path / "run"
    proc = _run("star4.yaml", run, "python", str(EXAMPLE), "--epochs", "2")
    _ok(proc)
    reports = _reports(proc.stdout)
    assert sorted(reports) == [0, 1, 2, 3], proc.stdout[-3000:]
    for backend in ("ina", "gloo"):
        accuracies = {r[backend]["accuracy"] for r in reports.values()}
        assert len(accuracies) == 1 and accuracies.pop() >= 0.7, reports  # one DDP model
    packets = {r["ina_packets"] for r in reports.values()}
    assert len(packets) == 1
    # Every rank's gradient packets were summed in s1.
    assert _aggregated(proc.stdout) == {"s1": 4 * packets.pop()}
    assert f"# rank logs: {run}/rank-N.log" in proc.stdout
    assert '"ina_packets"' in (run / "rank-3.log").read_text()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["jobs"][0]["installed_on"] == ["s1"]


def test_the_mixed_training_example_learns_and_changes_the_links(
    tmp_path: Path, clean: None
) -> None:
    doc_path, plot = tmp_path / "mixed.json", tmp_path / "mixed.png"
    strategies = ("agent", "ina+ring", "ring+ina", "gloo")
    proc = _run("star4.yaml", tmp_path / "run", "python", str(MIXED), "--iterations", "4",
                "--bw-after", "100", "--change-at", "2", "--strategies", ",".join(strategies),
                "--features", "256", "--hidden", "128", "--ffn", "512", "--blocks", "1",
                "--json", str(doc_path), "--plot", str(plot), options=("--bw", "1000"))  # fmt: skip
    _ok(proc)
    # The link change came from rank 0, at iteration 2, through the emulator.
    assert "# run: host links set to 100 Mbit/s (asked by a rank)" in proc.stdout
    assert "[rank 0] # iteration 2: host links now 100 Mbit/s" in proc.stdout
    assert "# * best static: static " in proc.stdout
    doc = json.loads(doc_path.read_text())
    assert set(doc["runs"]) == set(strategies)
    calls = 4 * 1 + 2  # a block's 4 calls, the gradients' allreduce, the loss's
    for name, run in doc["runs"].items():
        assert [len(i) for i in run["iterations"]] == [calls] * 4, name
        labels = {c["action"] for i in run["iterations"] for c in i}
        if name == "gloo":
            assert labels == {"gloo"}
        else:
            assert all(a.split("/")[0] in ("ina", "ring", "tree") for a in labels), labels
    # Each static configuration ran what it names; the agent chose among hostlib's.
    first = doc["runs"]["ina+ring"]["iterations"][0]
    assert [c["action"].split("/")[0] for c in first] == ["ring"] * 4 + ["ina"] * 2
    first = doc["runs"]["ring+ina"]["iterations"][0]  # all-gather, reduce-scatter, twice
    assert [c["action"].split("/")[0] for c in first] == ["ring", "ina"] * 2 + ["ring"] * 2
    assert [p["iterations"] for p in doc["oracle"]["phases"]] == [[0, 2], [2, 4]]
    # One model trained alike by every strategy: float32 through the switch within its
    # quantization's reach of Gloo's, and learning.
    losses = doc["losses"]
    for name in strategies:
        assert losses[name][-1] < losses[name][0], losses
        assert abs(losses[name][-1] - losses["gloo"][-1]) < 1e-3, losses
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _aggregated(proc.stdout)["s1"] > 0


def test_a_torchrun_style_script_on_star4(tmp_path: Path, clean: None) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    proc = _run("star4.yaml", tmp_path / "run", "python", str(script))
    _ok(proc)
    reports = _reports(proc.stdout)
    _check_sums(reports, 4)
    assert {(r["env"]["LOCAL_RANK"], r["env"]["LOCAL_WORLD_SIZE"]) for r in reports.values()} == {
        ("0", "1")
    }


def test_hierarchical_leaf_spine_with_a_torchrun_style_script(tmp_path: Path, clean: None) -> None:
    # Each rank sends to its leaf as the leaf's rank 0..3, quantized for all 8.
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    proc = _run("leaf_spine_hier.yaml", tmp_path / "run", "python", str(script))
    _ok(proc)
    reports = _reports(proc.stdout)
    _check_sums(reports, 8)
    packets = reports[0]["packets"]
    assert _aggregated(proc.stdout) == {"spine": 2 * packets, "leaf1": 4 * packets,
                                        "leaf2": 4 * packets}  # fmt: skip


def test_the_first_failing_rank_ends_the_run_with_its_status(tmp_path: Path, clean: None) -> None:
    # Rank 2 fails; the others ignore SIGTERM and leave a child behind: SIGKILL after
    # the grace period takes their whole process groups.
    script = (
        'echo "up $RANK"; if [ "$RANK" = 2 ]; then sleep 1; echo failing >&2; exit 3; fi; '
        'trap "" TERM; sleep 300 & wait'
    )
    start = time.monotonic()
    proc = _run("star4.yaml", tmp_path / "run", "sh", "-c", script)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert time.monotonic() - start < 120
    assert "[rank 2] failing" in proc.stderr and "[rank 0] up 0" in proc.stdout
    assert "rank 2 exited with status 3: stopping the 3 running ranks" in proc.stderr
    assert (tmp_path / "run" / "rank-2.log").read_text() == "up 2\nfailing\n"


def test_the_docs_example_runs_as_written(tmp_path: Path, clean: None) -> None:
    text = (REPO / "docs" / "emulation.md").read_text()
    block = re.search(r"<!-- example: emulate-run .*?-->\n```bash\n(.*?)```", text, re.DOTALL)
    assert block is not None, "docs/emulation.md lost its emulate-run example"
    assert "sudo .venv/bin/inalab emulate" in block.group(1)  # sudo resets PATH
    # The example's paths are the repository's, its .venv the set-up's: this environment.
    for name in ("topologies", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    assert shutil.which("sudo"), "sudo runs the docs' root lines (.ci/run installs it)"
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.group(1)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    run_dir = re.search(r"^# run dir: (.*)$", proc.stdout, re.MULTILINE)
    if run_dir is not None:  # a new temporary directory: the example names none
        shutil.rmtree(run_dir.group(1), ignore_errors=True)
    _ok(proc)
    for rank in range(4):  # 1 + 2 + 3 + 4
        assert f"[rank {rank}] float32 [10.0, 10.0, 10.0, 10.0] int32 10" in proc.stdout


def test_sigterm_stops_the_ranks_and_removes_the_network(tmp_path: Path, clean: None) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulation.cli", "emulate", str(TOPOLOGIES / "star4.yaml"),
         "--run-dir", str(run), "run", "--", "sh", "-c", "echo up; exec sleep 300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    try:
        logs = [run / f"rank-{r}.log" for r in range(4)]
        deadline = time.monotonic() + 120
        while not all(p.exists() and p.read_text() == "up\n" for p in logs):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped by SIGTERM" in err
