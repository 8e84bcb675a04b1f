"""``inalab decide`` end to end: the command a user types, in a subprocess.

Runs ``python -m dynamiccl.cli`` (the same parser and ``run`` as ``inalab decide``);
the last test goes through ``emulation.cli`` once the subcommand is registered there.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import save_latency_vs_bandwidth_profile

from dynamiccl.tuner import parse_rules

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _decide(*argv: str, module: str = "dynamiccl.cli") -> subprocess.CompletedProcess[str]:
    prefix = ["decide"] if module == "emulation.cli" else []
    return subprocess.run(
        [sys.executable, "-m", module, *prefix, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def _profile(tmp_path: Path) -> Path:
    return save_latency_vs_bandwidth_profile(tmp_path / "profile.json")


def test_prints_each_algorithm_and_the_choice() -> None:
    out = _ok(_decide("--size", "4M", "--workers", "8"))
    lines = out.splitlines()
    assert "allreduce of 4M (4194304 bytes), 8 workers" in lines[0]
    assert lines[1].startswith("# profile: defaults")
    assert [line.split()[0] for line in lines[2:5]] == ["ina", "ring", "tree"]
    assert lines[5].startswith("choice: ")


def test_json_with_a_profile_follows_it(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    small = json.loads(
        _ok(_decide("--size", "8", "--workers", "8", "--profile", str(profile), "--json"))
    )
    large = json.loads(
        _ok(_decide("--size", "1G", "--workers", "8", "--profile", str(profile), "--json"))
    )
    assert small["algorithm"] == "ina" and large["algorithm"] == "ring"
    assert small["profile"] == "crafted for the test" and not small["profile_is_default"]
    assert set(small["predicted_seconds"]) == {"ina", "ring", "tree"}
    assert small["size_bytes"] == 8 and large["size_bytes"] == 1 << 30


def test_topology_gives_the_workers_and_the_network() -> None:
    doc = json.loads(
        _ok(_decide("--size", "64M", "--topology", str(TOPOLOGIES / "leaf_spine.yaml"), "--json"))
    )
    assert doc["workers"] == 8 and doc["nodes"] == 8
    assert doc["bounds"]["ring"] == "wire"


@pytest.mark.parametrize("flags", [["--no-ina"], ["--slots", "0"]])
def test_ina_is_not_chosen_without_the_switch(tmp_path: Path, flags: list[str]) -> None:
    profile = _profile(tmp_path)
    doc = json.loads(
        _ok(_decide("--size", "8", "--workers", "8", "--profile", str(profile), "--json", *flags))
    )
    assert doc["algorithm"] != "ina" and doc["predicted_seconds"]["ina"] is None


def test_export_tuner_writes_merged_rules(tmp_path: Path) -> None:
    conf = tmp_path / "nccl_tuner.conf"
    out = _ok(
        _decide(
            "--workers",
            "8",
            "--profile",
            str(_profile(tmp_path)),
            "--export-tuner",
            str(conf),
            "--min",
            "4K",
            "--max",
            "1G",
        )
    )
    rules = parse_rules(conf.read_text())
    assert f"wrote {len(rules)} rule(s) to {conf}" in out
    assert 2 <= len(rules) <= 3  # collnet_direct, maybe tree, ring: merged, not 19 steps
    assert all(a.algorithm != b.algorithm for a, b in itertools.pairwise(rules))
    assert (rules[0].min_bytes, rules[0].algorithm) == (4096, "collnet_direct")
    assert rules[-1].max_bytes == 1 << 30 and rules[-1].algorithm == "ring"
    assert all(r.n_ranks == 8 and r.protocol == "simple" for r in rules)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "4X", "--workers", "2"], "invalid size '4X'"),
        (["--size", "4K"], "give --workers"),
        (["--workers", "2"], "give --size, --export-tuner"),
        (["--size", "4K", "--workers", "0"], "outside"),
        (
            ["--size", "4K", "--workers", "2", "--profile", "/nonexistent.json"],
            "cannot read profile",
        ),
        (["--size", "4K", "--topology", "/nonexistent.yaml"], "cannot read topology"),
        (["--size", "4K", "--topology", str(TOPOLOGIES / "star4.yaml"), "--job", "9"], "no job 9"),
        (["--size", "4K", "--workers", "2", "--job", "1"], "--job needs --topology"),
        (["--workers", "2", "--export-tuner", "/nonexistent/dir/t.conf"], "does not exist"),
        (
            ["--workers", "2", "--export-tuner", "t.conf", "--min", "1M", "--max", "1K"],
            "above --max",
        ),
        (["--size", "4K", "--workers", "2", "--collective", "alltoall"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_without_a_traceback(argv: list[str], message: str) -> None:
    proc = _decide(*argv)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_profile_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 2}')
    proc = _decide("--size", "4K", "--workers", "2", "--profile", str(bad))
    assert proc.returncode == 2 and "schema 2 is not 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_inalab_entry_point_once_registered() -> None:
    from emulation.cli import SUBCOMMANDS

    if "decide" not in SUBCOMMANDS:
        pytest.skip("inalab decide is not registered in emulation.cli yet")
    out = _ok(_decide("--size", "4K", "--workers", "4", module="emulation.cli"))
    assert "choice: " in out
