"""``inalab replay WORKLOAD``: one training iteration's collective calls, replayed under
every strategy, and how close dynamiccl's agent comes to the best.

A workload (:mod:`emulation.bench.workloads`: a shipped model or a trace file) is one
iteration's calls in order. The replay starts one soft switch (the fabric's, as ``inalab
bench`` does), installs one INA job with the slots of the widest INA window, and spawns
one worker per rank holding an INA, a ring and a tree session
(:mod:`emulation.bench.replay_worker`). Every strategy then runs the workload for
``--iterations`` iterations on the same workers, interleaved: iteration ``i`` of every
strategy (starting with a different one each iteration), then iteration ``i + 1`` of
every strategy, so a machine whose speed drifts (another process, the clock) and the
order within an iteration weigh on all strategies alike. Per iteration the
coordinator sends
every rank the list of actions (:class:`~dynamiccl.actions.Action`: algorithm, lanes,
window) for the iteration's calls and gathers each rank's per-call times (one message
each way per iteration). The strategies:

- ``static``: one configuration for the whole run, for each configuration in turn. A
  configuration is an action per collective. When the product of the per-collective
  action spaces has at most :data:`STATIC_PRODUCT_LIMIT` members, every combination
  runs; otherwise each action of the spaces is one configuration, applied to every
  collective of the workload whose algorithms include it, and to the others the ring
  with the same lanes and window (``all_gather`` under ``ina/l2048/w8`` runs
  ``ring/l2048/w8``). The JSON's ``actions.static_mode`` says which;
- ``model``: dynamiccl's agent without learning (``Agent(learn=False)``: the cost
  model's choice per call);
- ``agent``: the online agent (``Agent(learn=True)``). It decides every call of
  iteration ``i`` from what it recorded through iteration ``i - 1`` (a job decides an
  iteration's calls before it measures them), then records each call's time (the
  slowest rank's) after the iteration. Its exploration is part of its total: that is
  what a job pays;
- ``oracle``: per call, the fastest action's measured time in the static runs; computed
  (:mod:`emulation.bench.replay_report`), never run.

Iteration 0 of every run is a warm-up that no total counts (the agent learns from it).
A scenario changes the network once, before iteration ``--change-at`` of every strategy:
``bandwidth-drop`` (under ``inalab emulate`` only) sets every host link's HTB rate from
the run's rate to ``--bw-after``; ``competing-job`` starts a second INA job on the same
switch (its own id and slots, the same hosts) running int32 allreduces back to back
until the last iteration ends.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dynamiccl.actions import DEFAULT_LANE_CHOICES, DEFAULT_WINDOW_CHOICES, Action
from dynamiccl.cli import int_list
from emulation.argtypes import int_in, positive_float, size
from emulation.bench.replay_setup import (
    ELEMENT_BYTES,
    SCENARIOS,
    STRATEGIES,
    ReplaySetup,
    UsageError,
    action_list,
    prepare,
    strategy_list,
)
from hostlib.protocol import MAX_LANES, MAX_SLOT, MAX_WORKERS

if TYPE_CHECKING:
    from dynamiccl.agent import Agent
    from dynamiccl.model import TopologySummary
    from emulation.bench.config import BenchConfig
    from emulation.bench.fabric import Fabric, InaSwitch
    from emulation.bench.replay_report import CallTime, StrategyRun
    from emulation.bench.replay_worker import ReplayPlan
    from emulation.bench.sweep import _Fleet

__all__ = [
    "COMPETING_JOB_ID",
    "DEFAULT_COMPETING_BYTES",
    "DEFAULT_ITERATIONS",
    "REPLAY_JOB_ID",
    "ReplayInterrupted",
    "add_arguments",
    "run",
    "run_replay",
]

PROG = "inalab replay"

DEFAULT_ITERATIONS = 10
"""Iterations per strategy: one warm-up, nine measured (the agent's budget of four
explorations per context fits in the first half)."""

REPLAY_JOB_ID = 1
COMPETING_JOB_ID = 2

DEFAULT_COMPETING_BYTES = 1 << 20
"""The competing job's allreduce: 1 MiB of int32, about a DDP first bucket."""


# ----------------------------------------------------------------- flags
def add_arguments(parser: argparse.ArgumentParser, emulated: bool = False) -> None:
    """Declare ``inalab replay``'s flags (``emulated``: under ``inalab emulate TOPOLOGY
    replay``, where the topology's job gives the ranks and emulate has ``--run-dir``)."""
    if emulated:
        hints = getattr(parser, "hints", {})  # emulation.cli.CommandParser's
        hints["--workers"] = "under inalab emulate the topology's job gives the ranks"
        hints["--run-dir"] = "give --run-dir to inalab emulate, before the action"
    add = parser.add_argument
    add("workload", help="a shipped workload (python -m emulation.bench.workloads lists "
        "them) or a trace file")  # fmt: skip
    if not emulated:
        add("--workers", type=int_in(2, MAX_WORKERS), default=4, help="ranks (default 4)")
    add("--iterations", type=int_in(2), default=DEFAULT_ITERATIONS,
        help="iterations per strategy, the first a warm-up (default 10)")  # fmt: skip
    add("--scale", type=positive_float,
        help="multiply every call's size (default: an iteration of about 32 MiB)")  # fmt: skip
    add("--strategies", type=strategy_list, default=STRATEGIES,
        help=f"comma list of {','.join(STRATEGIES)} (default all)")  # fmt: skip
    add("--actions", type=action_list, metavar="LABELS",
        help="the action space, comma list of ALGORITHM/lLANES/wWINDOW (e.g. "
        "ina/l2048/w32,ring/l2048/w8); default: ina, ring and tree over the choices")  # fmt: skip
    add("--lanes-choices", type=int_list(1, MAX_LANES), default=DEFAULT_LANE_CHOICES,
        metavar="L,L", help="ring and tree packet widths (default 256,2048)")  # fmt: skip
    add("--window-choices", type=int_list(1, MAX_SLOT + 1), default=DEFAULT_WINDOW_CHOICES,
        metavar="W,W", help="windows (default 8,32)")  # fmt: skip
    add("--lanes", type=int_in(1, MAX_LANES), default=None if emulated else MAX_LANES,
        help="the switch's int32 lanes per INA packet (default 2048"
        + (", or 64 with a bmv2 switch)" if emulated else ")"))  # fmt: skip
    add("--profile", type=Path, metavar="PATH",
        help="the model's and agent's dynamiccl profile (default: the built-in one)")  # fmt: skip
    add("--agent-state", type=Path, metavar="PATH",
        help="start the agent from this saved state if it exists; save it there after")  # fmt: skip
    add("--scenario", choices=SCENARIOS, default="none",
        help="a change at --change-at in every run (bandwidth-drop: emulate only)")  # fmt: skip
    add("--change-at", type=int_in(1), metavar="ITER",
        help="the iteration the scenario's change happens (default: iterations / 2)")  # fmt: skip
    add("--bw-after", type=positive_float, metavar="MBIT",
        help="bandwidth-drop: the host links' rate after (default: a tenth)")  # fmt: skip
    add("--competing-size", type=size, default=DEFAULT_COMPETING_BYTES, metavar="BYTES",
        help="competing-job: its allreduce's size (default 1M)")  # fmt: skip
    add("--seed", type=int, default=0, help="seed of the inputs and the agent")
    add("--timeout", type=positive_float, default=10.0, help="host no-progress deadline (s)")
    if not emulated:
        add("--run-dir", type=Path, help="directory for logs (default: a new temp dir)")
    add("--json", type=Path, metavar="PATH", help="write every call's time and the summary")
    add("--plot", type=Path, metavar="PATH", help="write a PNG of time per iteration")


# ----------------------------------------------------------------- strategies
class _Strategy(Protocol):
    name: str
    kind: str
    config: dict[str, Action] | None
    """A static strategy's action per collective."""

    def decide(self, setup: ReplaySetup) -> tuple[list[Action], list[dict[str, Any]]]:
        """The iteration's actions, and the decisions' explanations (may be empty)."""
        ...

    def observe(self, setup: ReplaySetup, calls: Sequence[CallTime]) -> None:
        """The iteration's measured calls."""
        ...


class _Static:
    kind = "static"

    def __init__(self, name: str, config: Mapping[str, Action]) -> None:
        self.name = f"static {name}"
        self.config: dict[str, Action] | None = dict(config)

    def decide(self, setup: ReplaySetup) -> tuple[list[Action], list[dict[str, Any]]]:
        assert self.config is not None
        return [self.config[c.collective] for c in setup.calls], []

    def observe(self, setup: ReplaySetup, calls: Sequence[CallTime]) -> None:
        return None


class _Learner:
    """The model (an agent that does not learn) or the online agent."""

    config: dict[str, Action] | None = None

    def __init__(self, name: str, agent: Agent) -> None:
        self.name = self.kind = name
        self.agent = agent
        self._actions: list[Action] = []

    def decide(self, setup: ReplaySetup) -> tuple[list[Action], list[dict[str, Any]]]:
        decisions = [
            self.agent.decide(c.collective, nbytes, free_slots=setup.slots)
            for c, nbytes in zip(setup.calls, setup.run_bytes, strict=True)
        ]
        self._actions = [d.action for d in decisions]
        return self._actions, [d.to_dict() for d in decisions]

    def observe(self, setup: ReplaySetup, calls: Sequence[CallTime]) -> None:
        for call, nbytes, action, t in zip(setup.calls, setup.run_bytes, self._actions, calls,
                                           strict=True):  # fmt: skip
            self.agent.record(call.collective, nbytes, action, t.seconds,
                              retransmissions=t.retransmits)  # fmt: skip


def _make_agent(
    setup: ReplaySetup,
    topology: TopologySummary | None,
    learn: bool,
    seed: int,
    state: Path | None = None,
) -> Agent:
    """A fresh agent, or (``state`` exists) the one saved there (:func:`prepare` checked
    it fits this replay)."""
    from dynamiccl.agent import Agent

    job = setup.workload.name
    if state is not None and state.exists():
        return Agent.load(state, setup.profile, topology, job=job, workers=setup.workers)
    return Agent(setup.profile, setup.workers, topology, setup.spaces, job=job, seed=seed,
                 learn=learn)  # fmt: skip


def _strategies(
    setup: ReplaySetup, topology: TopologySummary | None, seed: int, state: Path | None
) -> list[_Strategy]:
    out: list[_Strategy] = []
    if "static" in setup.strategies:
        out += [_Static(name, config) for name, config in setup.statics.items()]
    if "model" in setup.strategies:
        out.append(_Learner("model", _make_agent(setup, topology, False, seed)))
    if "agent" in setup.strategies:
        out.append(_Learner("agent", _make_agent(setup, topology, True, seed, state)))
    return out


# ----------------------------------------------------------------- scenarios
class _Scenario(Protocol):
    def start_run(self) -> None: ...

    def change(self) -> None: ...

    def end_run(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


class _NoChange:
    def start_run(self) -> None:
        return None

    def change(self) -> None:
        return None

    def end_run(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        return None


class _BandwidthDrop(_NoChange):
    """Every host link from ``before`` to ``after`` Mbit/s at the change; back at the
    next run's start and at the end (``fabric.set_link_rate``: emulate's)."""

    def __init__(self, fabric: Any, before: float, after: float) -> None:
        self.fabric, self.before, self.after = fabric, before, after

    def start_run(self) -> None:
        self.fabric.set_link_rate(self.before)

    def change(self) -> None:
        self.fabric.set_link_rate(self.after)

    def close(self) -> None:
        self.fabric.set_link_rate(self.before)


class _CompetingJob(_NoChange):
    """The competitor fleet: ``go`` at the change, ``pause`` at the run's end."""

    def __init__(self, fleet: _Fleet) -> None:
        self.fleet, self.running = fleet, False

    def change(self) -> None:
        self.fleet.send_all(("go",))
        self.running = True

    def end_run(self) -> dict[str, Any] | None:
        if not self.running:
            return None
        self.fleet.send_all(("pause",))
        replies = self.fleet.gather("paused")
        self.running = False
        return {"calls": replies[0][1], "seconds": max(r[2] for r in replies),
                "wrong": sum(r[3] for r in replies)}  # fmt: skip


# ----------------------------------------------------------------- the run
class ReplayInterrupted(KeyboardInterrupt):
    """A stop signal arrived mid-replay; the workers and the switch are stopped, and
    ``runs`` holds what finished (the current run's finished iterations included).

    Attributes:
        runs: every run so far, the last one possibly incomplete.
        cause: the interrupt itself.
    """

    def __init__(self, runs: list[StrategyRun], cause: KeyboardInterrupt) -> None:
        super().__init__(str(cause))
        self.runs = runs
        self.cause = cause


@dataclass
class _Context:
    """What the run of the strategies needs besides the setup."""

    fabric: Fabric
    run_dir: Path
    timeout: float
    seed: int
    log_level: int
    bw: tuple[float, float] | None = None
    """bandwidth-drop: the host links' rate before and after, Mbit/s."""
    competing_bytes: int = DEFAULT_COMPETING_BYTES
    competitor: list[dict[str, Any]] = field(default_factory=list)


def _replay(
    setup: ReplaySetup, ctx: _Context, strategies: Sequence[_Strategy], progress: Any
) -> list[StrategyRun]:
    """Start the switch, the job and the workers; run every strategy; stop everything.

    Raises:
        ReplayInterrupted: a stop signal; BenchError: a rank failed or the switch did.
    """
    from emulation.bench.fabric import FabricError
    from emulation.bench.replay_report import StrategyRun
    from emulation.bench.sweep import BenchError, _join_peers

    runs: list[StrategyRun] = []
    try:
        with ExitStack() as stack:
            switch = stack.enter_context(ctx.fabric.ina_switch(_bench_config(setup, ctx),
                                                                ctx.run_dir))  # fmt: skip
            fleet = stack.enter_context(_spawn("replay", _plans(setup, ctx, "replay"), switch))
            _join_job(fleet, switch, REPLAY_JOB_ID, fleet.plans)
            for _ in ("ring", "tree"):
                _join_peers(fleet)
            scenario = stack.enter_context(_scenario(setup, ctx, switch))
            for strategy in strategies:
                config = _labels_of(strategy.config)
                runs.append(StrategyRun(strategy.name, strategy.kind, config=config))
            _run_interleaved(setup, fleet, strategies, scenario, runs, ctx, progress)
            _exit(fleet)
            switch.remove(REPLAY_JOB_ID)
    except KeyboardInterrupt as exc:
        raise ReplayInterrupted(runs, exc) from exc
    except FabricError as exc:
        raise BenchError(str(exc)) from exc
    return runs


def _labels_of(config: Mapping[str, Action] | None) -> dict[str, str] | None:
    return None if config is None else {c: a.label for c, a in config.items()}


def _run_interleaved(
    setup: ReplaySetup,
    fleet: _Fleet,
    strategies: Sequence[_Strategy],
    scenario: _Scenario,
    runs: Sequence[StrategyRun],
    ctx: _Context,
    progress: Any,
) -> None:
    """Iteration ``i`` of every strategy, then ``i + 1`` of every strategy, and so on: a
    machine whose speed drifts during the replay (another process, the CPU's clock) slows
    every strategy alike, and the scenario's change happens once, at ``change_at``, for
    all of them (a competing job then runs through every strategy's remaining
    iterations). Iteration ``i`` starts with strategy ``i mod n``, so no strategy keeps
    one place: in a fixed order on loopback (tp-dp-mix, 4 workers), the model and the
    best static configuration ran nearly the same actions 9% apart."""
    scenario.start_run()
    for i in range(setup.iterations):
        if i == setup.change_at:
            scenario.change()
        pairs = list(zip(strategies, runs, strict=True))
        for strategy, run in pairs[i % len(pairs) :] + pairs[: i % len(pairs)]:
            _run_iteration(setup, fleet, strategy, run, i)
        progress.step(f"iteration {i}")
    competitor = scenario.end_run()
    if competitor is not None:
        ctx.competitor.append({"strategy": "every strategy (interleaved)", **competitor})
    for run in runs:
        run.complete = True


def _run_iteration(
    setup: ReplaySetup, fleet: _Fleet, strategy: _Strategy, run: StrategyRun, i: int
) -> None:
    """One iteration of one strategy: its actions to every rank, the call times back."""
    from emulation.bench.sweep import BenchError

    actions, decisions = strategy.decide(setup)
    fleet.send_all(("iter", i, [(a.algorithm, a.lanes, a.window) for a in actions]))
    replies = fleet.gather("done")
    if any(r[1] != i for r in replies):
        raise BenchError(f"{strategy.name}: ranks answered for other iterations than {i}")
    calls = _merge(actions, [list(r[2]) for r in replies])
    run.iterations.append(calls)
    if decisions:
        run.decisions.append(decisions)
    strategy.observe(setup, calls)


def _even_out(runs: Sequence[StrategyRun]) -> int:
    """After a stop: cut every run to the iterations all of them finished, so the table
    compares like with like; returns that count (runs with any are marked complete)."""
    done = min((len(r.iterations) for r in runs), default=0)
    for run in runs:
        del run.iterations[done:]
        del run.decisions[done:]
        run.complete = done > 0
    return done


def _merge(actions: Sequence[Action], per_rank: Sequence[Sequence[Any]]) -> list[CallTime]:
    """Each call over the ranks: the slowest rank's time, retransmissions and wrong
    elements summed, the largest error."""
    from emulation.bench.replay_report import CallTime

    out = []
    for j, action in enumerate(actions):
        outcomes = [rank[j] for rank in per_rank]
        out.append(CallTime(action.label, max(o[0] for o in outcomes),
                            sum(o[1] for o in outcomes), sum(o[2] for o in outcomes),
                            max(o[3] for o in outcomes)))  # fmt: skip
    return out


def _bench_config(setup: ReplaySetup, ctx: _Context) -> BenchConfig:
    """What the fabric's switch takes: lanes, the job's slots, the seed."""
    from emulation.bench.config import BenchConfig

    largest = max(setup.run_bytes)
    return BenchConfig(sizes=(largest,), algos=("auto",), workers=setup.workers,
                       lanes=setup.lanes, slots=setup.slots, seed=ctx.seed,
                       timeout=ctx.timeout)  # fmt: skip


def _plans(setup: ReplaySetup, ctx: _Context, role: str) -> list[ReplayPlan]:
    from emulation.bench.replay_worker import ReplayCall, ReplayPlan

    calls = setup.calls
    seed = ctx.seed
    if role == "competitor":
        calls = (ReplayCall("allreduce", max(2, ctx.competing_bytes // ELEMENT_BYTES), "int32"),)
        seed += 1
    peer_lanes = max(a.lanes for s in setup.spaces.values() for a in s)
    peer_window = max(a.window for s in setup.spaces.values() for a in s)
    plans = []
    for r, placement in enumerate(ctx.fabric.placements(setup.workers)):
        log_path = str(ctx.run_dir / f"{role}-rank{r}.log")
        plans.append(ReplayPlan(role, r, setup.workers, calls, seed, setup.lanes, setup.slots,
                                peer_lanes, peer_window, ctx.timeout, log_path, ctx.log_level,
                                placement))  # fmt: skip
    return plans


def _spawn(name: str, plans: Sequence[ReplayPlan], switch: InaSwitch) -> _Fleet:
    from emulation.bench.replay_worker import replay_worker_main
    from emulation.bench.sweep import _Fleet

    stall = max(600.0, 60.0 * plans[0].timeout)  # one message may be a whole iteration
    return _Fleet(name, plans, stall, switch.log_path, target=replay_worker_main)


def _join_job(fleet: _Fleet, switch: InaSwitch, job_id: int, plans: Sequence[Any]) -> None:
    """Install job ``job_id`` with the ranks' INA addresses; tell each rank where to send
    and the rank its packets carry."""
    reported = fleet.gather("addr")
    addrs = [(str(m[1][0]), int(m[1][1])) for m in reported]
    dests = switch.install(job_id, addrs, [p.placement for p in plans])
    for rank, dest in enumerate(dests):
        fleet.send(rank, ("job", job_id, *dest))


def _exit(fleet: _Fleet) -> None:
    """Let the ranks close their sessions and exit."""
    fleet.send_all(("exit",))
    fleet.gather("result")
    fleet._join(30.0)


@contextmanager
def _scenario(setup: ReplaySetup, ctx: _Context, switch: InaSwitch) -> Iterator[_Scenario]:
    """The scenario for every run; its competitor fleet or link rates undone on exit."""
    if setup.scenario == "bandwidth-drop":
        assert ctx.bw is not None  # prepare() refuses it without emulated links
        drop = _BandwidthDrop(ctx.fabric, *ctx.bw)
        try:
            yield drop
        finally:
            drop.close()
    elif setup.scenario == "competing-job":
        with _spawn("competitor", _plans(setup, ctx, "competitor"), switch) as fleet:
            _join_job(fleet, switch, COMPETING_JOB_ID, fleet.plans)
            yield _CompetingJob(fleet)
            _exit(fleet)
        switch.remove(COMPETING_JOB_ID)
    else:
        yield _NoChange()


# ----------------------------------------------------------------- the command
def run(args: argparse.Namespace) -> int:
    """``inalab replay`` on loopback; 0 on success, 1 if a run failed or gave wrong
    results, 2 on bad flags or a bad workload (nothing started)."""
    from emulation.bench.cli import UsageError as EngineError
    from emulation.bench.cli import host_engine, make_run_dir
    from emulation.bench.sweep import BenchError

    try:
        setup = prepare(args, args.workers)
        host_engine()  # the ranks' INALAB_HOST_ENGINE, checked before anything starts
    except (UsageError, EngineError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    run_dir = make_run_dir(args.run_dir, "inalab-replay-")
    try:
        return run_replay(args, setup, run_dir)
    except BenchError as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        print(f"# logs: {run_dir}")


def run_replay(
    args: argparse.Namespace,
    setup: ReplaySetup,
    run_dir: Path,
    fabric: Fabric | None = None,
    topology: TopologySummary | None = None,
    extra_meta: Mapping[str, Any] | None = None,
    bw: tuple[float, float] | None = None,
) -> int:
    """Run the replay on ``fabric`` (default: loopback), print the table, write the JSON
    and the plot; 0 if every result was right, 1 otherwise.

    ``topology`` is the network dynamiccl's model and agent know of (None: the
    profile's own, loopback); ``bw`` the host links' rate before and after a
    bandwidth-drop.

    Raises:
        BenchError: a rank or the switch failed.
        KeyboardInterrupt: a stop signal, after the partial results are written.
    """
    from emulation.bench.progress import TerminalProgress
    from emulation.bench.replay_report import compute_oracle, phases, summarize

    fabric = fabric or _loopback(setup)
    strategies = _strategies(setup, topology, args.seed, args.agent_state)
    ctx = _Context(fabric, run_dir, args.timeout, args.seed,
                   logging.getLogger().getEffectiveLevel(), bw, args.competing_size)  # fmt: skip
    print(_banner(setup, fabric, ctx), flush=True)
    stopped: KeyboardInterrupt | None = None
    try:
        runs = _replay(setup, ctx, strategies, TerminalProgress(setup.iterations))
    except ReplayInterrupted as exc:
        runs, stopped = exc.runs, exc.cause
        done = _even_out(runs)
        print(f"# stopped by {_signal_name(stopped)}: the table holds the {done} iteration(s) "
              "every strategy finished")  # fmt: skip
    static = [r for r in runs if r.kind == "static" and r.complete]
    oracle = None
    if "oracle" in setup.strategies and static:
        measured = min(len(r.iterations) for r in static)  # fewer after a stop
        change = setup.change_at
        if change is not None and change >= measured:
            change = None  # stopped before the change: one phase
        oracle = compute_oracle(static, phases(measured, change))
    summary = summarize(runs, oracle)
    _save_agent(args.agent_state, strategies, runs)
    _report(args, setup, ctx, runs, oracle, summary, stopped, extra_meta)
    if stopped is not None:
        raise stopped
    wrong = sum(r.wrong for r in runs)
    if wrong:
        print(f"{PROG}: {wrong} wrong elements in total", file=sys.stderr)
        return 1
    return 0


def _loopback(setup: ReplaySetup) -> Fabric:
    from emulation.bench.fabric import LoopbackFabric

    return _PooledLoopback(2) if setup.scenario == "competing-job" else LoopbackFabric()


def _save_agent(path: Path | None, strategies: Sequence[_Strategy], runs: Sequence[Any]) -> None:
    """Save the agent's state to ``path`` once its run is complete."""
    complete = any(r.kind == "agent" and r.complete for r in runs)
    agents = [s.agent for s in strategies if isinstance(s, _Learner) and s.kind == "agent"]
    if path is not None and complete and agents:
        agents[0].save(path)
        print(f"# agent state: {path}")


def _report(
    args: argparse.Namespace,
    setup: ReplaySetup,
    ctx: _Context,
    runs: Sequence[StrategyRun],
    oracle: Any,
    summary: Any,
    stopped: KeyboardInterrupt | None,
    extra_meta: Mapping[str, Any] | None,
) -> None:
    from emulation.bench.replay_report import (
        actions_json,
        format_summary,
        make_document,
        workload_json,
        write_json,
        write_plot,
    )

    print(format_summary(summary, f"# {setup.workload.name}"))
    meta = _metadata(args, setup, ctx)
    meta.update(extra_meta or {})
    if stopped is not None:
        meta["stopped_by"] = _signal_name(stopped)
    if args.json is not None:
        extra = {"workload": workload_json(setup), "scenario": _scenario_json(setup, ctx),
                 "actions": actions_json(setup)}  # fmt: skip
        write_json(args.json, make_document(meta, runs, oracle, summary, extra))
        print(f"# json: {args.json}")
    if args.plot is not None:
        change = setup.scenario
        if ctx.bw is not None:
            change += f" {ctx.bw[0]:g} -> {ctx.bw[1]:g} Mbit/s"
        title = (f"replay {setup.workload.name}, {setup.workers} workers on "
                 f"{ctx.fabric.description}; scenario {change}\n"
                 f"{getattr(ctx.fabric, 'links', '')}")  # fmt: skip
        write_plot(args.plot, runs, oracle, summary, setup.change_at, title)
        print(f"# plot: {args.plot}")


def _signal_name(stop: KeyboardInterrupt) -> str:
    import signal

    return signal.Signals(getattr(stop, "signum", signal.SIGINT)).name


# ----------------------------------------------------------------- words
def _banner(setup: ReplaySetup, fabric: Fabric, ctx: _Context) -> str:
    from emulation.bench.cli import host_engine, loopback_note
    from emulation.bench.fabric import LoopbackFabric
    from emulation.bench.replay_report import setup_lines

    lines = [f"# {PROG} on {fabric.description}", *setup_lines(setup),
             f"# scenario: {_scenario_words(setup, ctx)}"]  # fmt: skip
    links = getattr(fabric, "links", "")
    if links:
        lines.append(f"# links: {links}")
    if isinstance(fabric, LoopbackFabric | _PooledLoopback):
        lines.append(loopback_note(host_engine()))
    return "\n".join(lines) + "\n#"


def _scenario_words(setup: ReplaySetup, ctx: _Context) -> str:
    if setup.scenario == "bandwidth-drop" and ctx.bw is not None:
        return (f"bandwidth-drop at iteration {setup.change_at}: every host link"
                f" {ctx.bw[0]:g} -> {ctx.bw[1]:g} Mbit/s (HTB rate, tc class change)")  # fmt: skip
    if setup.scenario == "competing-job":
        return (f"competing-job at iteration {setup.change_at}: job {COMPETING_JOB_ID}"
                f" ({setup.workers} workers, {setup.slots} slots) runs int32 allreduces of"
                f" {ctx.competing_bytes} bytes back to back until the run ends")  # fmt: skip
    return "none"


def _scenario_json(setup: ReplaySetup, ctx: _Context) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": setup.scenario, "change_at": setup.change_at,
                           "description": _scenario_words(setup, ctx)}  # fmt: skip
    if setup.scenario == "bandwidth-drop" and ctx.bw is not None:
        doc["bw_mbit_before"], doc["bw_mbit_after"] = ctx.bw
    if setup.scenario == "competing-job":
        doc["competing"] = {"job_id": COMPETING_JOB_ID, "workers": setup.workers,
                            "slots": setup.slots, "nbytes": ctx.competing_bytes,
                            "dtype": "int32", "per_run": ctx.competitor}  # fmt: skip
    return doc


def _metadata(args: argparse.Namespace, setup: ReplaySetup, ctx: _Context) -> dict[str, Any]:
    import os
    import platform
    import socket
    from datetime import UTC, datetime

    from emulation.bench.cli import _version

    return {
        "command": "replay",
        "workers": setup.workers,
        "iterations": setup.iterations,
        "warmup_iterations": 1,
        "strategies": list(setup.strategies),
        "lanes": setup.lanes,
        "slots": setup.slots,
        "seed": ctx.seed,
        "timeout_s": ctx.timeout,
        "profile": setup.profile.source,
        "profile_path": None if args.profile is None else str(args.profile),
        "agent_state": None if args.agent_state is None else str(args.agent_state),
        "fabric": ctx.fabric.description,
        "links": getattr(ctx.fabric, "links", None),
        "versions": {"python": platform.python_version(), "inalab": _version("inalab")},
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_dir": str(ctx.run_dir),
    }


# ----------------------------------------------------------------- loopback
class _PooledLoopback:
    """Loopback whose soft switch has room for ``jobs`` jobs of the replay's slots (the
    replay's and the competing job's); otherwise :class:`LoopbackFabric`'s."""

    description = "127.0.0.1"
    links = "none: loopback (127.0.0.1), no wire, no shaping"

    def __init__(self, jobs: int) -> None:
        from emulation.bench.fabric import LoopbackFabric

        self.jobs = jobs
        self._base = LoopbackFabric()

    def placements(self, workers: int) -> Any:
        return self._base.placements(workers)

    def gloo_init(self, attempt: int) -> str:
        return self._base.gloo_init(attempt)

    def switch_pids(self) -> Mapping[str, int]:
        return {}

    def link_drops(self) -> Mapping[str, int]:
        return {}

    @contextmanager
    def ina_switch(self, cfg: BenchConfig, run_dir: Path) -> Iterator[InaSwitch]:
        from controller.client import P4RuntimeError
        from controller.switch import ControllerError
        from emulation.bench.fabric import FabricError, _LoopbackSwitch
        from emulation.softswitch.process import SoftSwitchProcess, SwitchStartError

        switch = SoftSwitchProcess(run_dir, lanes=cfg.lanes, slots=cfg.slots * self.jobs,
                                   seed=cfg.seed)  # fmt: skip
        try:
            switch.start()
            with switch.controller() as ctl:
                yield _LoopbackSwitch(switch, ctl, cfg.slots)
        except (SwitchStartError, P4RuntimeError, ControllerError) as exc:
            raise FabricError(f"soft switch: {exc}") from exc
        finally:
            switch.stop()
