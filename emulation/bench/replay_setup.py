"""What an ``inalab replay`` runs, from its flags: the workload at its scale, each call as
a rank runs it, the action spaces and the static configurations. Pure set-up, checked
before a run directory, a switch or a worker exists (a bad trace is refused with its
one-line ``FILE:LINE: ...`` message); nothing here starts a process.

Static configurations (``static``): one action per collective of the workload for a
whole run. When the product of the per-collective action spaces has at most
:data:`STATIC_PRODUCT_LIMIT` members, every combination runs (``product``); otherwise
each action of the spaces is one configuration, applied to every collective whose
algorithms include it and, for the others, the ring with the same lanes and window
(``per-action``: ``all_gather`` under ``ina/l2048/w8`` runs ``ring/l2048/w8``).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dynamiccl.actions import (
    Action,
    ActionError,
    action_space,
    algorithms_for,
    fallback_action,
    parse_action,
)

if TYPE_CHECKING:
    from dynamiccl.model import Profile
    from emulation.bench.replay_worker import ReplayCall
    from emulation.bench.workloads import Workload

__all__ = [
    "ELEMENT_BYTES",
    "REPLAY_ALGORITHMS",
    "SCENARIOS",
    "STATIC_PRODUCT_LIMIT",
    "STRATEGIES",
    "ReplaySetup",
    "UsageError",
    "action_list",
    "prepare",
    "round_calls",
    "static_configs",
    "strategy_list",
]

STRATEGIES = ("static", "model", "agent", "oracle")
"""The strategies, in the order they run (the oracle is computed after the static runs)."""

SCENARIOS = ("none", "bandwidth-drop", "competing-job")

REPLAY_ALGORITHMS = ("ina", "ring", "tree")
"""What a replay's actions run: one rank per host, so no CollNet."""

STATIC_PRODUCT_LIMIT = 16
"""Static configurations run as every combination of the per-collective actions when
there are at most this many; beyond, one configuration per action (module docstring)."""

ELEMENT_BYTES = 4
"""Bytes per element of both dtypes a trace may use (float32, int32)."""


class UsageError(Exception):
    """Flags or a workload that cannot run: exit status 2, before anything starts."""


# ----------------------------------------------------------------- flags
def action_list(text: str) -> tuple[Action, ...]:
    try:
        return tuple(dict.fromkeys(parse_action(t) for t in text.split(",") if t.strip()))
    except ActionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def strategy_list(text: str) -> tuple[str, ...]:
    names = {s.strip().lower() for s in text.split(",") if s.strip()}
    if not names or names - set(STRATEGIES):
        raise argparse.ArgumentTypeError(
            f"invalid strategies {text!r}: a comma-separated subset of {','.join(STRATEGIES)}"
        )
    return tuple(s for s in STRATEGIES if s in names)


# ----------------------------------------------------------------- set-up
@dataclass(frozen=True)
class ReplaySetup:
    """A replay, validated before anything starts.

    Attributes:
        workload: the workload at its scale.
        scale: the factor applied to the trace's sizes.
        calls: each call as a rank runs it (its element count).
        run_bytes: each call's bytes as run (sizes rounded, see :func:`round_calls`).
        workers: ranks.
        lanes: the switch's lanes per INA packet.
        slots: the INA job's slots: the widest INA window.
        spaces: the actions per collective of the workload.
        statics: the static configurations by name (an action per collective).
        static_mode: ``product`` or ``per-action`` (module docstring).
        strategies: those to run, a subset of :data:`STRATEGIES`.
        iterations: per strategy.
        scenario: one of :data:`SCENARIOS`.
        change_at: the scenario's iteration (None: no scenario).
        profile: the model's and the agent's profile.
    """

    workload: Workload
    scale: float
    calls: tuple[ReplayCall, ...]
    run_bytes: tuple[int, ...]
    workers: int
    lanes: int
    slots: int
    spaces: dict[str, tuple[Action, ...]]
    statics: dict[str, dict[str, Action]]
    static_mode: str
    strategies: tuple[str, ...]
    iterations: int
    scenario: str
    change_at: int | None
    profile: Profile

    @property
    def collectives(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.collective for c in self.calls))


def prepare(args: argparse.Namespace, workers: int, emulated: bool = False) -> ReplaySetup:
    """Everything the replay needs from the flags, checked before a run directory, a
    switch or a worker exists.

    Raises:
        UsageError: a bad workload or trace (its one-line ``FILE:LINE: ...`` message), a
            bad profile or agent state, flags that do not fit together.
    """
    _check_flags(args, emulated)
    profile = _profile(args.profile)
    workload, scale = _workload(args.workload, args.scale)
    calls, run_bytes = round_calls(workload, workers)
    collectives = tuple(dict.fromkeys(c.collective for c in calls))
    spaces, slots = _spaces(args, collectives)
    mode, statics = static_configs(spaces)
    if args.agent_state is not None and Path(args.agent_state).exists():
        _check_agent_state(Path(args.agent_state), profile, workload.name, workers, spaces)
    iterations = args.iterations
    change_at = None
    if args.scenario != "none":
        change_at = args.change_at if args.change_at is not None else iterations // 2
        if not 1 <= change_at < iterations:
            raise UsageError(f"--change-at {change_at} outside 1..{iterations - 1}")
    return ReplaySetup(workload, scale, calls, run_bytes, workers, args.lanes, slots, spaces,
                       statics, mode, args.strategies, iterations, args.scenario, change_at,
                       profile)  # fmt: skip


def _check_flags(args: argparse.Namespace, emulated: bool) -> None:
    if args.scenario == "bandwidth-drop" and not emulated:
        raise UsageError(
            "--scenario bandwidth-drop changes the rate of emulated links: run it under "
            "inalab emulate TOPOLOGY replay (loopback has no links to shape)"
        )
    if args.bw_after is not None and args.scenario != "bandwidth-drop":
        raise UsageError("--bw-after is the rate after a bandwidth-drop: add --scenario")
    if args.change_at is not None and args.scenario == "none":
        raise UsageError("--change-at without --scenario: nothing changes")
    if "oracle" in args.strategies and "static" not in args.strategies:
        raise UsageError("the oracle is computed from the static runs: add static")
    for flag, path in (("--json", args.json), ("--plot", args.plot),
                       ("--agent-state", args.agent_state)):  # fmt: skip
        if path is not None and not Path(path).parent.is_dir():
            raise UsageError(f"{flag}: directory {Path(path).parent} does not exist")


def _profile(path: Path | None) -> Profile:
    from dynamiccl.model import DEFAULT_PROFILE, Profile, ProfileError

    try:
        return DEFAULT_PROFILE if path is None else Profile.load(path)
    except (OSError, ProfileError) as exc:
        raise UsageError(f"--profile: {exc}") from None


def _check_agent_state(
    path: Path, profile: Profile, job: str, workers: int, spaces: Mapping[str, Sequence[Action]]
) -> None:
    """A saved agent the replay can continue: this workload's, workers' and actions'.

    Raises:
        UsageError: it cannot be read or was saved for another job, workers or actions.
    """
    from dynamiccl.agent import Agent, AgentError

    try:
        agent = Agent.load(path, profile, None, job=job, workers=workers)
    except AgentError as exc:
        raise UsageError(f"--agent-state: {exc}") from None
    if agent.actions != {c: tuple(a) for c, a in spaces.items()}:
        raise UsageError(f"--agent-state: {path} was saved for other actions")


def _workload(name: str, scale: float | None) -> tuple[Workload, float]:
    from emulation.bench.workloads import TraceError, default_scale, load_workload

    try:
        workload = load_workload(name)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    factor = default_scale(workload) if scale is None else scale
    return workload.scaled(factor), factor


def round_calls(workload: Workload, workers: int) -> tuple[tuple[ReplayCall, ...], tuple[int, ...]]:
    """Each call as a rank runs it, and its bytes as run.

    A ``reduce_scatter`` or ``all_gather`` vector is cut into ``workers`` equal parts, so
    its size is rounded up to a multiple of ``4 * workers`` bytes; an ``all_gather``
    rank passes its part (the size is the gathered output, as in the trace).
    """
    from emulation.bench.replay_worker import ReplayCall

    calls, run_bytes = [], []
    for call in workload.calls:
        unit = ELEMENT_BYTES * (workers if call.collective != "allreduce" else 1)
        nbytes = -(-call.nbytes // unit) * unit
        count = nbytes // ELEMENT_BYTES
        if call.collective == "all_gather":
            count //= workers
        calls.append(ReplayCall(call.collective, count, call.dtype))
        run_bytes.append(nbytes)
    return tuple(calls), tuple(run_bytes)


def _spaces(
    args: argparse.Namespace, collectives: Sequence[str]
) -> tuple[dict[str, tuple[Action, ...]], int]:
    """The action space per collective, and the INA job's slots (its widest window).

    Raises:
        UsageError: ``--actions`` that a replay cannot run.
    """
    if args.actions is not None:
        return _given_spaces(args.actions, args.lanes, collectives)
    slots = max(args.window_choices)
    space = functools.partial(action_space, switch_lanes=args.lanes, slots=slots,
                              algorithms=REPLAY_ALGORITHMS, lane_choices=args.lanes_choices,
                              window_choices=args.window_choices)  # fmt: skip
    return {c: space(c) for c in collectives}, slots


def _given_spaces(
    actions: Sequence[Action], lanes: int, collectives: Sequence[str]
) -> tuple[dict[str, tuple[Action, ...]], int]:
    for a in actions:
        if a.algorithm not in REPLAY_ALGORITHMS:
            raise UsageError(f"--actions: {a.label}: a replay runs {', '.join(REPLAY_ALGORITHMS)}")
        if a.algorithm == "ina" and a.lanes != lanes:
            raise UsageError(f"--actions: {a.label}: INA packets carry the switch's {lanes}"
                             " lanes (--lanes)")  # fmt: skip
    spaces = {c: tuple(a for a in actions if a.algorithm in algorithms_for(c))
              for c in collectives}  # fmt: skip
    for c, space in spaces.items():
        if not any(a.algorithm == "ring" for a in space):
            raise UsageError(f"--actions: no ring action for {c} (each collective needs one: "
                             "what runs without the switch)")  # fmt: skip
    windows = [a.window for a in actions if a.algorithm == "ina"]
    return spaces, max(windows or [a.window for a in actions])


def static_configs(
    spaces: Mapping[str, Sequence[Action]],
) -> tuple[str, dict[str, dict[str, Action]]]:
    """The static configurations (an action per collective) by name, and the mode:
    ``product`` (every combination, when at most :data:`STATIC_PRODUCT_LIMIT`) or
    ``per-action`` (each action for every collective that runs it, the ring with its
    lanes and window for the others)."""
    collectives = list(spaces)
    if math.prod(len(spaces[c]) for c in collectives) <= STATIC_PRODUCT_LIMIT:
        configs = [dict(zip(collectives, combo, strict=True))
                   for combo in itertools.product(*(spaces[c] for c in collectives))]  # fmt: skip
        return "product", {_config_name(c): c for c in configs}
    out: dict[str, dict[str, Action]] = {}
    for action in dict.fromkeys(a for c in collectives for a in spaces[c]):
        config = {c: _run_as(action, c) for c in collectives}
        if config not in out.values():
            out[action.label] = config
    return "per-action", out


def _run_as(action: Action, collective: str) -> Action:
    """``action``, or the ring with its lanes and window where it cannot run."""
    if action.algorithm in algorithms_for(collective):
        return action
    return fallback_action(action.lanes, action.window)


_SHORT = {"allreduce": "ar", "reduce_scatter": "rs", "all_gather": "ag"}


def _config_name(config: Mapping[str, Action]) -> str:
    """``ring/l2048/w8`` when one action runs every collective, else per collective:
    ``ar=ina/l2048/w8 rs=ring/l2048/w8 ag=ring/l2048/w8``."""
    actions = set(config.values())
    if len(actions) == 1:
        return next(iter(actions)).label
    return " ".join(f"{_SHORT[c]}={a.label}" for c, a in config.items())
