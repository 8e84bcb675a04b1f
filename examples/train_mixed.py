"""Train a tensor- and data-parallel model through the switch, with dynamiccl's agent
learning inside the job, against static configurations, the per-call oracle and Gloo.

One rank of a launcher (``RANK``/``WORLD_SIZE`` set and the ``"ina"`` backend's
``INALAB_*`` variables, as ``inalab emulate TOPOLOGY run`` sets them)::

    sudo .venv/bin/inalab emulate topologies/star4.yaml --bw 1000 run -- \\
        python examples/train_mixed.py --iterations 20 --bw-after 100 \\
        --json mixed.json --plot mixed.png

**The model** is Megatron-style: a replicated input layer (``--features`` to
``--hidden``), ``--blocks`` MLP blocks whose weights are split across the ranks (each
rank holds ``--ffn / n`` of the inner width), and a replicated classifier. The blocks run
sequence-parallel: each rank keeps its own ``--batch`` samples between blocks, a block
all-gathers every rank's activations, applies its shard and reduce-scatters the partial
sums back (backward: the same two the other way round), so every block makes 4 calls of
``n * batch * hidden`` floats per iteration. The replicated layers are data-parallel:
their gradients are summed in one flat allreduce (the large call), and the loss is
summed in a 4-byte one (the tiny call). So an iteration has many mid-size
all-gathers and reduce-scatters, one large allreduce and one tiny one, the mix of a
TP+DP job, where the best algorithm can differ by collective and size. The data are
``--classes`` classes of a fixed random teacher network, a fresh batch per rank and
iteration.

**The strategies** train the same model from the same seed on the same batches, taking
turns iteration by iteration (iteration ``i`` of every strategy, then ``i + 1``; who goes
first rotates), so drift of the machine's speed and the link change hit all alike:

- ``agent``: dynamiccl's online agent chooses each call's action and learns from the
  times the ranks agree on (``dynamiccl.learning.AgreedLearner``);
- static configurations ``AR+RS``: the allreduce's and the reduce-scatter's algorithm
  (``ina``, ``ring``, ``tree``; the reduce-scatter ``ina`` or ``ring``) with the bench's
  ring packet (2048 lanes) and window (32), INA with all the job's slots; all-gathers
  always on hostlib's ring;
- ``gloo``: every call in a plain Gloo group: a reference, not among the choices.

The per-call **oracle** is computed as ``inalab replay``'s: per call, the static
configuration fastest at it over the iterations before (and, apart, after) the change.

``--bw-after MBIT`` changes every host link's rate at ``--change-at`` (default half-way)
through the emulator (``emulation.mininet.linkcontrol.set_link_rate``; needs the emulator's
``--bw``). Rank 0 prints ``inalab replay``'s table (total, per iteration, regret over the
oracle, gain over the best static configuration) and each strategy's loss at the first
and last iteration, and writes ``--json`` and ``--plot`` (time per iteration).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dynamiccl.learning import AgreedLearner
from dynamiccl.model import DEFAULT_PROFILE
from dynamiccl.torch_backend import InaProcessGroup, StaticChooser  # registers "ina"
from emulation.bench.replay_report import (
    CallTime,
    StrategyRun,
    compute_oracle,
    format_summary,
    phases,
    summarize,
    write_plot,
)
from emulation.mininet.linkcontrol import set_link_rate
from hostlib.actions import Action

TIMEOUT = timedelta(minutes=5)
RING_LANES, RING_WINDOW = 2048, 32
STATIC = {  # name: (allreduce's algorithm, reduce-scatter's)
    f"{ar}+{rs}": (ar, rs) for ar in ("ina", "ring", "tree") for rs in ("ina", "ring")
}
STRATEGIES = ("agent", *STATIC, "gloo")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20, help="per strategy (default 20)")
    p.add_argument(
        "--bw-after",
        type=float,
        metavar="MBIT",
        help="set every host link to this rate at --change-at (inalab emulate)",
    )
    p.add_argument(
        "--change-at", type=int, help="the iteration the links change at (default: half-way)"
    )
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated, of {', '.join(STRATEGIES)} (default: all)",
    )
    p.add_argument("--features", type=int, default=1024, help="input width (default 1024)")
    p.add_argument("--hidden", type=int, default=512, help="activation width (default 512)")
    p.add_argument(
        "--ffn",
        type=int,
        default=2048,
        help="the blocks' inner width, split across ranks (default 2048)",
    )
    p.add_argument("--blocks", type=int, default=4, help="tensor-parallel blocks (default 4)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank (default 32)")
    p.add_argument("--classes", type=int, default=16, help="(default 16)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD's (default 0.05)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--agent-state", type=Path, help="continue learning from this saved agent")
    p.add_argument("--save-agent", type=Path, help="rank 0 saves the agent here at the end")
    p.add_argument("--json", type=Path, help="rank 0 writes every call's time and action here")
    p.add_argument("--plot", type=Path, help="rank 0 plots time per iteration here (PNG)")
    args = p.parse_args(argv)
    names = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown or not names:
        p.error(f"--strategies: unknown {', '.join(unknown) or '(none)'}; "
                f"known: {', '.join(STRATEGIES)}")  # fmt: skip
    args.strategies = names
    if args.iterations < 2:
        p.error("--iterations must be at least 2 (the first is a warm-up)")
    if args.change_at is not None and args.bw_after is None:
        p.error("--change-at without --bw-after: nothing changes")
    if args.bw_after is not None:
        args.change_at = args.iterations // 2 if args.change_at is None else args.change_at
        if not 1 <= args.change_at < args.iterations:
            p.error(f"--change-at {args.change_at} outside 1..{args.iterations - 1}")
    return args


# ----------------------------------------------------------------- communication
@dataclass
class Comm:
    """One strategy's collectives, each timed on this rank with what ran it."""

    group: Any  # the ina process group (with the strategy's chooser) or a Gloo group
    calls: list[tuple[str, float]] = field(default_factory=list)

    def _timed(self, run: Any) -> None:
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        action = self.group.last_action if isinstance(self.group, InaProcessGroup) else None
        self.calls.append(("gloo" if action is None else action.label, seconds))

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
        self._timed(lambda: dist.all_gather_single(out, x.contiguous(), group=self.group))
        return out

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        self._timed(lambda: dist.reduce_scatter_single(out, x.contiguous(), group=self.group))
        return out

    def all_reduce(self, x: torch.Tensor) -> None:
        self._timed(lambda: dist.all_reduce(x, group=self.group))


class _GatherSeq(torch.autograd.Function):
    """Every rank's samples in rank order (backward: each rank's part of the summed
    gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm) -> torch.Tensor:
        ctx.comm = comm
        return comm.all_gather(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.comm.reduce_scatter(grad), None


class _ScatterSum(torch.autograd.Function):
    """This rank's samples of the sum of every rank's partial result (backward: the
    gradient of every rank's samples)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Comm) -> torch.Tensor:
        ctx.comm = comm
        return comm.reduce_scatter(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.comm.all_gather(grad), None


# ----------------------------------------------------------------- the model
class Block(nn.Module):
    """An MLP block with its inner width split across the ranks (this rank's shard)."""

    def __init__(self, hidden: int, shard: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, shard)
        self.down = nn.Linear(shard, hidden, bias=False)  # partial sums: no bias here

    def forward(self, h: torch.Tensor, comm: Comm) -> torch.Tensor:
        full = _GatherSeq.apply(h, comm)
        return h + _ScatterSum.apply(self.down(torch.nn.functional.gelu(self.up(full))), comm)


class Net(nn.Module):
    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:
        super().__init__()
        torch.manual_seed(args.seed)  # the replicated layers: alike on every rank
        self.inp = nn.Linear(args.features, args.hidden)
        self.out = nn.Linear(args.hidden, args.classes)
        torch.manual_seed(args.seed * 1000 + 1 + rank)  # this rank's shards
        self.blocks = nn.ModuleList(
            Block(args.hidden, args.ffn // world) for _ in range(args.blocks)
        )

    def replicated(self) -> list[nn.Parameter]:
        return [*self.inp.parameters(), *self.out.parameters()]

    def forward(self, x: torch.Tensor, comm: Comm) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for block in self.blocks:
            h = block(h, comm)
        return self.out(h)


def batch(
    args: argparse.Namespace, teacher: nn.Module, rank: int, i: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s samples of iteration ``i``: the same for every strategy."""
    g = torch.Generator().manual_seed((args.seed * 1_000_003 + rank) * 100_003 + i)
    x = torch.randn(args.batch, args.features, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


@dataclass
class Strategy:
    name: str
    comm: Comm
    chooser: Any  # what the ina group uses for this strategy's calls (None: Gloo's group)
    model: Net
    opt: torch.optim.Optimizer
    calls: list[list[tuple[str, float]]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def step(s: Strategy, x: torch.Tensor, y: torch.Tensor, world: int) -> None:
    """One training iteration of ``s``: forward and backward through the blocks' calls,
    the replicated layers' gradients summed, SGD, the loss summed."""
    s.comm.calls = []
    s.opt.zero_grad()
    loss = nn.functional.cross_entropy(s.model(x, s.comm), y) / world  # the mean over ranks
    loss.backward()
    grads: list[torch.Tensor] = [p.grad for p in s.model.replicated()]  # type: ignore[misc]
    flat = torch.cat([g.reshape(-1) for g in grads])
    s.comm.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))
    s.opt.step()
    total = loss.detach().reshape(1).clone()
    s.comm.all_reduce(total)
    s.losses.append(float(total))
    s.calls.append(s.comm.calls)


def strategies(
    args: argparse.Namespace, ina: InaProcessGroup, gloo: Any, rank: int, world: int
) -> list[Strategy]:
    spec = ina.session.spec

    def action(algo: str) -> Action:
        return (
            Action("ina", spec.lanes, spec.slots)
            if algo == "ina"
            else Action(algo, RING_LANES, RING_WINDOW)
        )

    out = []
    for name in args.strategies:
        if name == "agent":
            chooser: Any = AgreedLearner(DEFAULT_PROFILE, world, state=args.agent_state,
                                         save_to=args.save_agent)  # fmt: skip
        elif name == "gloo":
            chooser = None
        else:
            ar, rs = STATIC[name]
            chooser = StaticChooser({"allreduce": action(ar), "reduce_scatter": action(rs),
                                     "all_gather": action("ring")})  # fmt: skip
        model = Net(args, rank, world)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        out.append(Strategy(name, Comm(gloo if chooser is None else ina), chooser, model, opt))
    return out


# ----------------------------------------------------------------- the run
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(
            "train_mixed.py is one rank of a launcher: run it under inalab emulate TOPOLOGY "
            "run (or torchrun, with the INALAB_* variables of a switch)",
            file=sys.stderr,
        )
        return 2
    dist.init_process_group("ina", timeout=TIMEOUT)  # INALAB_* from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    ina = dist.group.WORLD
    assert isinstance(ina, InaProcessGroup)
    gloo = dist.new_group(backend="gloo")
    if args.ffn % world:
        raise SystemExit(f"--ffn {args.ffn} is not a multiple of the {world} ranks")
    torch.manual_seed(args.seed + 12345)
    teacher = nn.Sequential(nn.Linear(args.features, 64), nn.Tanh(), nn.Linear(64, args.classes))
    runs = strategies(args, ina, gloo, rank, world)
    started = time.perf_counter()
    for i in range(args.iterations):
        if i == args.change_at:
            dist.barrier(group=gloo)
            if rank == 0:
                set_link_rate(args.bw_after)
                print(f"# iteration {i}: host links now {args.bw_after:g} Mbit/s", flush=True)
            dist.barrier(group=gloo)
        x, y = batch(args, teacher, rank, i)
        for s in runs[i % len(runs) :] + runs[: i % len(runs)]:
            if s.chooser is not None:
                ina.use_chooser(s.chooser)
            dist.barrier(group=gloo)  # the ranks start each iteration together
            step(s, x, y, world)
        if rank == 0:
            print(f"# iteration {i + 1}/{args.iterations}: "
                  + ", ".join(f"{s.name} {sum(t for _, t in s.calls[-1]):.3f} s" for s in runs),
                  flush=True)  # fmt: skip
    report(args, runs, gloo, rank, time.perf_counter() - started)
    if rank == 0:
        for s in runs:
            if isinstance(s.chooser, AgreedLearner) and s.chooser.save() is not None:
                print(f"# agent saved to {args.save_agent}")
    dist.destroy_process_group()
    return 0


def report(
    args: argparse.Namespace, runs: list[Strategy], gloo: Any, rank: int, wall: float
) -> None:
    """The slowest rank's time of every call, gathered to rank 0, which prints the table
    and writes the JSON and the plot."""
    mine = {s.name: s.calls for s in runs}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine, group=gloo)
    if rank != 0:
        return
    merged: dict[str, StrategyRun] = {}
    for s in runs:
        kind = "agent" if s.name == "agent" else "static"
        label = s.name if s.name in ("agent", "gloo") else f"static {s.name}"
        run = StrategyRun(label, kind, complete=True)
        for i, calls in enumerate(s.calls):
            slowest = [max(r[s.name][i][j][1] for r in every) for j in range(len(calls))]
            run.iterations.append(
                [CallTime(label, t) for (label, _), t in zip(calls, slowest, strict=True)]
            )
        merged[s.name] = run
    compared = [r for name, r in merged.items() if name != "gloo"]
    static = [r for r in compared if r.kind == "static"]
    spans = phases(args.iterations, args.change_at)
    oracle = compute_oracle(static, spans) if static else None
    summary = summarize(compared, oracle)
    print(format_summary(summary, "# strategies: total = the measured iterations' calls, "
                         "slowest rank per call; iteration 0 a warm-up"))  # fmt: skip
    reference = merged.get("gloo")
    if reference is not None:
        print(f"# gloo (reference, not a choice): total {reference.total():.3f} s")
    for s in runs:
        print(f"# loss {s.name}: {s.losses[0]:.4f} at iteration 0, {s.losses[-1]:.4f} at "
              f"{len(s.losses) - 1}")  # fmt: skip
    if oracle is not None:
        for (lo, hi), labels in zip(oracle.phases, oracle.choices(), strict=True):
            kinds = sorted(set(labels))
            print(f"# oracle, iterations {lo}..{hi - 1}: {', '.join(kinds)}")
    print(f"# wall time {wall:.1f} s (compute and communication, every strategy)")
    title = f"train_mixed: {dist.get_world_size()} ranks" + (
        f", links to {args.bw_after:g} Mbit/s at iteration {args.change_at}"
        if args.change_at
        else ""
    )
    if args.json is not None:
        doc = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "world_size": dist.get_world_size(),
            "summary": summary.to_json(),
            "oracle": oracle.to_json() if oracle is not None else None,
            "runs": {name: r.to_json() for name, r in merged.items()},
            "losses": {s.name: s.losses for s in runs},
            "wall_s": wall,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"# wrote {args.json}")
    if args.plot is not None:
        write_plot(args.plot, compared, oracle, summary, args.change_at, title,
                   references=[reference] if reference is not None else [])  # fmt: skip
        print(f"# wrote {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
