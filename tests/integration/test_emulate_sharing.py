"""``inalab emulate T --jobs 4,5 --sharing POLICY bench``: two jobs and one switch's memory
(root, Mininet, the eBPF data plane).

``shared``: both jobs reserve nothing and put their whole window (64 slots) in a region
of the switch's whole pool (64 slots), with ``topologies/star8_fallback.yaml``'s
fallback node ``f1`` behind the switch. Together their windows collide; what one job
cannot place on the switch goes to ``f1``, and every result is still exact. Alone, each
job has the region to itself: the first job's slots were freed when its sweep removed
it. ``partition``: the pool of 64 split in two, each job's window is 32.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.ebpf]

REPO = Path(__file__).resolve().parents[2]
SMALL = ("-b", "64K", "-e", "256K", "-n", "2", "-w", "1", "-d", "int32", "--algos", "ina")


def _emulate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    out = tmp_path / "jobs.json"
    proc = subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", "topologies/star8_fallback.yaml",
         "--datapath", "ebpf", "--switch-slots", "64", "--run-dir", str(tmp_path / "run"),
         *args, "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads(out.read_text())


def _exact_alone_and_together(doc: dict[str, Any]) -> None:
    assert doc["schema"] == "inalab-multijob/1"
    assert [j["job"] for j in doc["jobs"]] == [4, 5]
    for job in doc["jobs"]:
        assert job["error"] is None and job["workers"] == 4
        for phase in ("alone", "together"):
            assert [r["algo"] for r in job[phase]] == ["ina", "ina"], (phase, job)
            assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in job[phase]), job


def test_two_jobs_share_the_whole_pool_and_the_fallback_takes_what_collides(
    tmp_path: Path,
) -> None:
    proc, doc = _emulate(tmp_path, "--jobs", "4,5", "--sharing", "shared", "bench", *SMALL,
                         "--slots", "64")  # fmt: skip
    _exact_alone_and_together(doc)
    assert doc["sharing"] == {
        "policy": "shared", "window": 64, "pool": 64, "reserved": 0, "shared": 64,
        "region": 64, "fallbacks": {"s1": "f1"},
    }  # fmt: skip
    assert "# sharing: shared: each job reserves none" in proc.stdout
    jobs = {j["job"]: j for j in doc["jobs"]}
    assert all(j["slots"] == 64 for j in jobs.values())
    # Together: the jobs' windows overlap in the region; the fallback took what collided
    # and its results came back through the switch.
    together = [j["counters"] for j in jobs.values()]
    assert any(c["to_fallback"] > 0 and c["from_fallback"] > 0 for c in together), together
    assert sum(c["shared_uses"] for c in together) > 0, together
    # Alone after job 4 alone: job 4's slots were freed when its sweep removed it.
    assert jobs[5]["counters_alone"]["collisions"] == 0, jobs[5]
    assert jobs[5]["counters_alone"]["shared_uses"] > 0, jobs[5]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["switches"]["s1"]["fallback"] == "f1"
    assert manifest["switches"]["f1"]["role"] == "fallback"


def test_partition_gives_each_job_half_the_pool_as_its_window(tmp_path: Path) -> None:
    proc, doc = _emulate(tmp_path, "--jobs", "4,5", "--sharing", "partition", "bench", *SMALL)
    _exact_alone_and_together(doc)
    assert doc["sharing"]["policy"] == "partition"
    assert (doc["sharing"]["window"], doc["sharing"]["reserved"]) == (32, 32)
    # Each job's hosts ran with the window it reserved: 64 // 2.
    assert [j["slots"] for j in doc["jobs"]] == [32, 32]
    assert all(j["counters"] is None for j in doc["jobs"])
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["slot_count"] == 32  # what each job reserved on s1
    assert "each job's window is its share of the pool, 32 slots" in proc.stderr


def test_dynamic_lets_each_jobs_agent_pick_an_arm_per_round_from_the_region_it_reads(
    tmp_path: Path,
) -> None:
    """dynamiccl's choice: each job reserves 64 // 4 = 16 slots and shares the region of
    32 on top; per round its agent reads the region and runs INA reserved (window 16),
    INA shared (48), ring or tree. Four rounds are its exploration: every arm once,
    exact; every reading is of the region the plan made."""
    proc, doc = _emulate(tmp_path, "--jobs", "4,5", "--sharing", "dynamic", "--rounds", "4",
                         "bench", *SMALL[:-1], "auto", "-e", "64K")  # fmt: skip
    assert doc["sharing"] == {
        "policy": "dynamic", "window": 48, "pool": 64, "reserved": 16, "shared": 32,
        "region": 32, "fallbacks": {"s1": "f1"},
    }  # fmt: skip
    for job in doc["jobs"]:
        assert job["error"] is None, job
        for phase in ("alone", "together"):
            (row,) = job[phase]
            assert row["algo"] == "auto" and row["wrong"] == 0 and row["time_us"] > 0, row
        for rounds in (job["rounds_alone"], job["rounds"]):
            arms = sorted(r["arm"] for r in rounds)
            assert arms == ["ina-reserved", "ina-shared", "ring", "tree"], rounds
            assert all(r["phase"] in ("explore", "re-explore") for r in rounds), rounds
            assert all(r["wrong"] == 0 for r in rounds), rounds
            for r in rounds:
                c = r["contention"]
                assert (c["reserved"], c["shared"]) == (16, 32)
                assert 0 <= c["blocked"] <= 1 and 0 <= c["region_free"] <= 32
                assert c["blocked"] == (32 - c["region_free"]) / 32
    assert "# job 4 auto together, 4 rounds:" in proc.stdout
    assert "each job's window is its reservation and its slots in the region, 48" in proc.stderr


def test_dynamic_takes_auto_alone_and_auto_needs_dynamic(tmp_path: Path) -> None:
    for policy, algos, why in (
        ("dynamic", "ina", "--sharing dynamic is dynamiccl's choice round by round: give"
         " --algos auto"),
        ("partition", "auto", "--jobs runs fixed algorithms, not auto (dynamiccl's choice:"
         " --sharing dynamic)"),
    ):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "emulation.cli", "emulate", "topologies/star8_fallback.yaml",
             "--datapath", "ebpf", "--switch-slots", "64", "--run-dir", str(tmp_path / policy),
             "--jobs", "4,5", "--sharing", policy, "bench", "-b", "64K", "-e", "64K",
             "--algos", algos],
            capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert why in proc.stderr, proc.stderr
