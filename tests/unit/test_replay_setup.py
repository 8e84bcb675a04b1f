"""Unit tests of ``inalab replay``'s set-up: sizes as run, the action spaces, the static
configurations and the flags refused before anything starts. No processes, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynamiccl.actions import Action, parse_action
from emulation.bench.replay_setup import (
    STATIC_PRODUCT_LIMIT,
    ReplaySetup,
    UsageError,
    prepare,
    round_calls,
    static_configs,
)
from emulation.bench.workloads import Call, Workload
from emulation.cli import build_parser


def _setup(tmp_path: Path, trace: str, *flags: str, workers: int = 2) -> ReplaySetup:
    path = tmp_path / "t.trace"
    path.write_text(trace)
    args = build_parser().parse_args(["replay", str(path), "--scale", "1", *flags])
    return prepare(args, workers)


def test_sizes_are_cut_into_equal_parts_where_a_collective_needs_them() -> None:
    workload = Workload("w", (Call("allreduce", 100), Call("reduce_scatter", 100, "int32"),
                              Call("all_gather", 100), Call("all_gather", 96)), "", "")  # fmt: skip
    calls, run_bytes = round_calls(workload, 3)
    assert run_bytes == (100, 108, 108, 96)  # a multiple of 4 x 3 workers where cut
    assert [c.count for c in calls] == [25, 27, 9, 8]  # all_gather: each rank's part
    assert [c.dtype for c in calls] == ["float32", "int32", "float32", "float32"]


def test_small_spaces_run_every_combination() -> None:
    ina, ring = parse_action("ina/l2048/w8"), parse_action("ring/l2048/w8")
    mode, configs = static_configs({"allreduce": (ina, ring), "all_gather": (ring,)})
    assert mode == "product"
    assert configs == {
        "ar=ina/l2048/w8 ag=ring/l2048/w8": {"allreduce": ina, "all_gather": ring},
        "ring/l2048/w8": {"allreduce": ring, "all_gather": ring},
    }


def test_large_spaces_run_one_configuration_per_action(tmp_path: Path) -> None:
    setup = _setup(tmp_path, "allreduce 64K\nreduce_scatter 64K\nall_gather 64K\n")
    sizes = {c: len(s) for c, s in setup.spaces.items()}
    assert sizes == {"allreduce": 10, "reduce_scatter": 6, "all_gather": 4}  # 240 combinations
    assert STATIC_PRODUCT_LIMIT < 10 * 6 * 4 and setup.static_mode == "per-action"
    assert list(setup.statics) == [a.label for a in setup.spaces["allreduce"]]
    tree = setup.statics["tree/l256/w8"]
    assert tree == {"allreduce": Action("tree", 256, 8), "reduce_scatter": Action("ring", 256, 8),
                    "all_gather": Action("ring", 256, 8)}  # fmt: skip
    ina = setup.statics["ina/l2048/w32"]
    assert ina["reduce_scatter"] == Action("ina", 2048, 32)
    assert ina["all_gather"] == Action("ring", 2048, 32)
    assert setup.slots == 32 and setup.lanes == 2048


def test_given_actions_are_the_space(tmp_path: Path) -> None:
    setup = _setup(tmp_path, "allreduce 4K\nall_gather 4K\n",
                   "--actions", "ina/l2048/w16,ring/l256/w4,tree/l256/w4")  # fmt: skip
    assert {c: [a.label for a in s] for c, s in setup.spaces.items()} == {
        "allreduce": ["ina/l2048/w16", "ring/l256/w4", "tree/l256/w4"],
        "all_gather": ["ring/l256/w4"],
    }
    assert setup.slots == 16  # the widest INA window


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--actions", "ina/l2048/w8,tree/l2048/w8"], "no ring action for allreduce"),
        (["--actions", "ina/l256/w8,ring/l256/w8"], "INA packets carry the switch's 2048"),
        (["--actions", "collnet/l2048/w8,ring/l256/w8"], "a replay runs ina, ring, tree"),
        (["--iterations", "4", "--scenario", "competing-job", "--change-at", "4"],
         "--change-at 4 outside 1..3"),
        (["--change-at", "2"], "--change-at without --scenario"),
        (["--scenario", "bandwidth-drop"], "run it under inalab emulate"),
        (["--bw-after", "10"], "--bw-after is the rate after a bandwidth-drop"),
        (["--strategies", "agent,oracle"], "the oracle is computed from the static runs"),
        (["--json", "no/such/dir/x.json"], "--json: directory no/such/dir does not exist"),
        (["--profile", "no-such-profile.json"], "--profile"),
    ],
)  # fmt: skip
def test_flags_that_cannot_run_are_refused(tmp_path: Path, flags: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace(".", r"\.")):
        _setup(tmp_path, "allreduce 4K\n", *flags)


def test_a_bad_trace_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        _setup(tmp_path, "# comment\nallreduce 4K\nallredcue 4K\n")
    assert str(info.value).startswith(f"{tmp_path / 't.trace'}:3: unknown collective")
    assert "\n" not in str(info.value)


def test_the_change_defaults_to_half_way(tmp_path: Path) -> None:
    setup = _setup(tmp_path, "allreduce 4K\n", "--iterations", "7", "--scenario", "competing-job")
    assert setup.change_at == 3 and setup.scenario == "competing-job"
    assert _setup(tmp_path, "allreduce 4K\n").change_at is None


def test_a_saved_agent_must_fit_the_replay(tmp_path: Path) -> None:
    from dynamiccl.agent import Agent
    from dynamiccl.model import DEFAULT_PROFILE

    state = tmp_path / "agent.json"
    state.write_text("{not json")
    with pytest.raises(UsageError, match=r"--agent-state: .*not JSON"):
        _setup(tmp_path, "allreduce 4K\n", "--agent-state", str(state))
    ring = parse_action("ring/l2048/w8")
    Agent(DEFAULT_PROFILE, 2, None, {"allreduce": (ring,)}, job="t").save(state)
    with pytest.raises(UsageError, match="saved for other actions"):
        _setup(tmp_path, "allreduce 4K\n", "--agent-state", str(state))
    Agent(DEFAULT_PROFILE, 2, None, {"allreduce": (ring,)}, job="other").save(state)
    with pytest.raises(UsageError, match="saved for job 'other'"):
        _setup(tmp_path, "allreduce 4K\n", "--agent-state", str(state))
    Agent(DEFAULT_PROFILE, 2, None, {"allreduce": (ring,)}, job="t").save(state)
    setup = _setup(tmp_path, "allreduce 4K\n", "--agent-state", str(state),
                   "--actions", "ring/l2048/w8")  # fmt: skip
    assert setup.workload.name == "t"  # the trace file's stem
