"""``inalab emulate T [--jobs A,B] --sharing POLICY bench``: the policies' plans, what
``check`` says of them, and what is refused before any network exists (no root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from emulation.cli import build_parser
from emulation.mininet.check import CheckError, Machine, check_report
from emulation.mininet.sharing import SharingPlan, plan_sharing
from emulation.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"
STAR8F = load_topology(TOPOLOGIES / "star8_fallback.yaml")
STAR16F = load_topology(TOPOLOGIES / "star16_fallback.yaml")


def _emulate(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emulation.cli", "emulate", *argv],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip


def test_reserve_is_todays_window_in_a_pool_at_least_as_wide() -> None:
    plan = plan_sharing(STAR8F, STAR8F.jobs, "reserve", 8, 1024)
    got = (plan.window, plan.pool, plan.reserved, plan.shared, plan.region)
    assert got == (8, 1024, 8, 0, None)
    assert plan_sharing(STAR8F, STAR8F.jobs, "reserve", 64, 32).pool == 64  # as emulate's pool
    assert plan.fallback_pool == 1024
    described = "sharing: reserve: each job reserves its window of 8 slots in a pool of 1024"
    assert plan.describe() == described


def test_partition_splits_the_pool_evenly_and_that_is_the_window() -> None:
    plan = plan_sharing(STAR16F, STAR16F.jobs, "partition", 8, 1000)
    assert (plan.window, plan.pool, plan.jobs, plan.reserved, plan.shared) == (250, 1000, 4, 250, 0)
    one = plan_sharing(STAR8F, STAR8F.jobs[:1], "partition", 8, 64)
    assert (one.window, one.reserved) == (64, 64)  # one job's bench: the whole pool
    assert plan.to_json() == {
        "policy": "partition", "window": 250, "pool": 1000, "reserved": 250, "shared": 0,
        "region": None, "fallbacks": {},
    }  # fmt: skip


def test_shared_puts_every_window_in_a_region_of_the_whole_pool() -> None:
    plan = plan_sharing(STAR16F, STAR16F.jobs, "shared", 64, 64)
    assert (plan.window, plan.reserved, plan.shared, plan.region) == (64, 0, 64, 64)
    assert plan.fallbacks == {"s1": "f1"}
    # The fallback holds each job's whole window behind the switch, side by side.
    assert plan.fallback_pool == 4 * 64
    assert plan_sharing(STAR8F, STAR8F.jobs, "shared", 8, 1024).fallback_pool == 1024
    assert "fallback (f1 behind s1)" in plan.describe()


def test_dynamic_reserves_a_share_of_the_lower_half_and_shares_the_top_half() -> None:
    plan = plan_sharing(STAR8F, STAR8F.jobs, "dynamic", 8, 256)
    got = (plan.window, plan.reserved, plan.shared, plan.region, plan.jobs)
    assert got == (192, 64, 128, 128, 2)  # 2 x 64 reserved below a region of 128
    four = plan_sharing(STAR16F, STAR16F.jobs, "dynamic", 8, 256)
    assert (four.window, four.reserved, four.shared) == (160, 32, 128)
    assert plan.fallback and plan.fallbacks == {"s1": "f1"}
    assert plan.fallback_pool == 2 * 192
    assert "dynamiccl picks INA within the reservation (window 64)" in plan.describe()


@pytest.mark.parametrize(
    ("topology", "policy", "slots", "pool", "message"),
    [
        ("star8.yaml", "shared", 8, 64, "job 4's switch s1 has no fallback"),
        (
            "star8_fallback.yaml",
            "shared",
            8,
            100,
            "--switch-slots 100: give a power of two (e.g. 64)",
        ),
        ("star8_fallback.yaml", "shared", 128, 64, "a window of 128 slots (--slots) is wider"),
        (
            "star8_fallback.yaml",
            "partition",
            8,
            1,
            "a pool of 1 slots (--switch-slots) cannot be split among 2 jobs",
        ),
        ("star8_fallback.yaml", "dynamic", 8, 4, "leaves no reservation for each of 2 jobs"),
        ("star8.yaml", "dynamic", 8, 64, "--sharing dynamic: job 4's switch s1 has no fallback"),
        (
            "star8_fallback.yaml",
            "lottery",
            8,
            64,
            "--sharing lottery: one of reserve, partition, shared, dynamic",
        ),
    ],
)
def test_what_a_policy_cannot_be(
    topology: str, policy: str, slots: int, pool: int, message: str
) -> None:
    topo = load_topology(TOPOLOGIES / topology)
    jobs = [j for j in topo.jobs if j.job_id in (4, 5)]
    with pytest.raises(ValueError) as caught:
        plan_sharing(topo, jobs, policy, slots, pool)
    assert message in str(caught.value)


@pytest.mark.parametrize("policy", ["partition", "shared", "dynamic"])
def test_hierarchical_jobs_take_reserve_only(policy: str) -> None:
    topo = load_topology(TOPOLOGIES / "leaf_spine_hier.yaml")
    with pytest.raises(ValueError, match=rf"--sharing {policy}: job 1 aggregates on several"
                       r" switches \(leaf1, leaf2, spine\)"):  # fmt: skip
        plan_sharing(topo, topo.jobs, policy, 8, 64)
    assert plan_sharing(topo, topo.jobs, "reserve", 8, 64).policy == "reserve"


def test_shared_is_over_udp_only() -> None:
    with pytest.raises(ValueError, match="INA over UDP only, not --transport rdma"):
        plan_sharing(STAR8F, STAR8F.jobs, "shared", 8, 64, transport="rdma")


def _check(*options: str) -> str:
    args = build_parser().parse_args(
        ["emulate", str(TOPOLOGIES / "star8_fallback.yaml"), *options, "check"]
    )
    return check_report(args, Machine(root=False, netem=False))


def test_check_shows_the_fallback_and_the_policy() -> None:
    report = _check()
    assert "  s1         soft, aggregate (fallback f1), 64 lanes, 1024 slots;" in report
    assert (
        "  f1         soft, fallback (of s1: finishes what its shared region cannot hold)" in report
    )
    assert "sharing:" not in report  # reserve: nothing to say
    lines = _check("--jobs", "4,5", "--sharing", "partition", "--switch-slots", "64").splitlines()
    assert (
        "sharing: partition for the bench of job(s) 4, 5: each reserves 32 of 64 slots, its window"
        in lines
    )
    report = _check("--sharing", "shared", "--switch-slots", "64")
    assert "sharing: shared for the bench of job(s) 4: each reserves none" in report
    assert "fallback f1 behind s1" in report


def test_check_refuses_what_the_bench_would() -> None:
    with pytest.raises(CheckError, match="give a power of two"):
        _check("--sharing", "shared", "--switch-slots", "96")
    with pytest.raises(CheckError, match="has no job 9"):
        _check("--jobs", "4,9", "--sharing", "partition")
    args = build_parser().parse_args(
        ["emulate", str(TOPOLOGIES / "star8.yaml"), "--sharing", "shared", "check"]
    )
    with pytest.raises(CheckError, match="job 1's switch s1 has no fallback"):
        check_report(args, Machine(root=False, netem=False))


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (
            ("topologies/star8.yaml", "--jobs", "4,5", "--sharing", "shared", "bench"),
            "--sharing shared: job 4's switch s1 has no fallback: name a role fallback switch",
        ),
        (
            ("topologies/leaf_spine_hier.yaml", "--sharing", "partition", "bench"),
            "--sharing partition: job 1 aggregates on several switches (leaf1, leaf2, spine);"
            " partition is for jobs on one switch: give --sharing reserve",
        ),
        (
            (
                "topologies/star8_fallback.yaml",
                "--jobs",
                "4,5",
                "--sharing",
                "shared",
                "--switch-slots",
                "100",
                "bench",
            ),
            "--sharing shared: the shared region is the whole pool or its half, --switch-slots 100:"
            " give a power of two (e.g. 64)",
        ),
        (
            (
                "topologies/star8_fallback.yaml",
                "--sharing",
                "shared",
                "--switch-slots",
                "64",
                "bench",
                "--slots",
                "128",
            ),
            "--sharing shared: a window of 128 slots (--slots) is wider than the region of 64",
        ),
        (
            (
                "topologies/star8_fallback.yaml",
                "--jobs",
                "4,5",
                "--sharing",
                "partition",
                "--switch-slots",
                "1",
                "bench",
            ),
            "--sharing partition: a pool of 1 slots (--switch-slots) cannot be split among 2 jobs",
        ),
        (
            ("topologies/star8_fallback.yaml", "--sharing", "shared", "run", "--", "true"),
            "--sharing shared is the bench's: inalab emulate T [--jobs A,B] --sharing shared bench",
        ),
        (
            (
                "topologies/star8_fallback.yaml",
                "--sharing",
                "shared",
                "bench",
                "--transport",
                "rdma",
            ),
            "--sharing shared: INA over UDP only, not --transport rdma",
        ),
        (
            ("topologies/star8_fallback.yaml", "--sharing", "dynamic", "bench"),
            "--sharing dynamic is dynamiccl's choice among several jobs: give --jobs A,B[,...]",
        ),
        (
            ("topologies/star8_fallback.yaml", "--sharing", "lottery", "bench"),
            "argument --sharing: invalid choice: 'lottery'",
        ),
    ],
)
def test_policies_that_cannot_be_are_refused_in_one_line(argv: tuple[str, ...], why: str) -> None:
    proc = _emulate(*argv)
    assert proc.returncode == 2, proc.stderr
    assert why in proc.stderr
    assert "Traceback" not in proc.stderr and "manifest" not in proc.stdout


def test_the_default_plan_is_reserve() -> None:
    args = build_parser().parse_args(["emulate", "topologies/star8.yaml", "bench"])
    assert args.sharing == "reserve"
    assert SharingPlan().policy == "reserve"
