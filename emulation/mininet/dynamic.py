"""``inalab emulate T --jobs A,B --sharing dynamic bench --algos auto``: dynamiccl's choice,
round by round, for jobs that share a switch's memory (issue #41, item 4).

Layer: emulation.mininet, beside :mod:`.multijob`, which runs a job's part through
:func:`run_rounds` instead of one sweep when the policy is ``dynamic``
(:mod:`.sharing`: each job reserves ``pool // 2N`` slots and shares the pool's top half,
with the fallback node behind its switch).

A job's part is ``--rounds`` rounds. Before each round, at each size, the job reads its
contention from its switch (:meth:`~emulation.mininet.network.Emulation.region_owners`:
how much of the region other jobs hold now; :func:`dynamiccl.contention.prospective`),
and its own :class:`~dynamiccl.agent.Agent` picks one of four arms:

- **INA reserved**: INA with a window of the reservation, all of it the job's own;
- **INA shared**: INA over the whole window, its slots past the reservation in the
  region, where a cell another job holds sends that slot to the fallback;
- **ring** and **tree**: hostlib's, on the same UDP transport, no switch memory.

The round runs that arm (one sweep of the size, the job installed for it and removed
after: what its INA held of the region is free again between rounds), and the agent
records its time (the slowest rank's mean per call). A round's row says what ran and
why; the job's row in the table is the mean over its rounds, exploration included: that
is what a job pays for deciding online.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamiccl.actions import Action
from dynamiccl.agent import Agent
from dynamiccl.contention import Contention, prospective
from dynamiccl.model import DEFAULT_PROFILE, Profile
from emulation.bench.config import BenchConfig
from emulation.bench.cpu import RowCpu
from emulation.bench.rows import Row
from emulation.mininet.fabric import EmulatedFabric
from emulation.mininet.network import Emulation
from emulation.mininet.sharing import DEFAULT_ROUNDS, SharingPlan
from emulation.topology import TopologyJob

__all__ = [
    "DEFAULT_ROUNDS",
    "Round",
    "arms",
    "cpu_brief",
    "job_agent",
    "round_row",
    "rounds_cpu",
    "run_rounds",
]


@dataclasses.dataclass(frozen=True)
class Round:
    """One round of a job at one size: what the agent read and chose, and how it ran."""

    index: int
    arm: str
    """``ina-reserved``, ``ina-shared``, ``ring`` or ``tree``."""
    action: Action
    phase: str
    """The agent's: explore, exploit, refresh, re-explore."""
    reason: str
    contention: Contention
    row: Row

    def to_json(self) -> dict[str, Any]:
        row = self.row
        return {
            "round": self.index,
            "arm": self.arm,
            "action": self.action.label,
            "phase": self.phase,
            "reason": self.reason,
            "contention": self.contention.to_dict(),
            "size_bytes": row.nbytes,
            "time_us": row.time_us_max,
            "wrong": row.wrong,
            "retransmits": row.retransmits,
            "cpu": cpu_brief(row.cpu),
        }


def arms(cfg: BenchConfig, plan: SharingPlan) -> dict[str, Action]:
    """The four arms of a job under ``plan``, by name."""
    return {
        "ina-reserved": Action("ina", cfg.lanes, plan.reserved),
        "ina-shared": Action("ina", cfg.lanes, plan.window),
        "ring": Action("ring", cfg.lanes, cfg.p2p_window),
        "tree": Action("tree", cfg.lanes, cfg.p2p_window),
    }


def job_agent(
    em: Emulation, job: TopologyJob, cfg: BenchConfig, profile: Profile | None = None
) -> Agent:
    """A fresh agent for ``job``'s part: the cost model's prior for its network
    (:func:`~emulation.topology.summary.summarize_topology`), its four arms."""
    from emulation.topology.summary import summarize_topology

    assert em.sharing is not None
    summary = summarize_topology(em.topology, job.job_id, slots=em.sharing.window)
    actions = {"allreduce": tuple(arms(cfg, em.sharing).values())}
    return Agent(profile or DEFAULT_PROFILE, cfg.workers, summary, actions,
                 job=f"job{job.job_id}", seed=job.job_id)  # fmt: skip


def run_rounds(
    em: Emulation, job: TopologyJob, cfg: BenchConfig, run_dir: Path, rounds: int,
    profile: Profile | None = None,
) -> list[Round]:  # fmt: skip
    """``rounds`` rounds of ``job`` (each size of ``cfg`` in each), the agent deciding
    each from the contention it reads just before.

    Raises:
        BenchError: a round's run failed (:func:`emulation.bench.sweep.run_sweep`).
    """
    from emulation.bench.sweep import run_sweep

    plan = em.sharing
    assert plan is not None and plan.policy == "dynamic"
    agent = job_agent(em, job, cfg, profile)
    names = {a: n for n, a in arms(cfg, plan).items()}
    out: list[Round] = []
    for k in range(rounds):
        for size in cfg.sizes:
            reading = prospective(plan.reserved, plan.shared, em.region_owners(job.switch))
            decision = agent.decide("allreduce", size, contention=reading)
            action = decision.action
            where = run_dir / f"round{k}-{size}"
            where.mkdir(parents=True, exist_ok=True)
            rows = run_sweep(_round_config(cfg, action, size), where,
                             fabric=EmulatedFabric(em, job)).rows  # fmt: skip
            row = rows[0]
            agent.record("allreduce", size, action, row.time_us_max * 1e-6,
                         retransmissions=row.retransmits)  # fmt: skip
            out.append(Round(k, names[action], action, decision.phase, decision.reason,
                             reading, row))  # fmt: skip
    return out


def _round_config(cfg: BenchConfig, action: Action, size: int) -> BenchConfig:
    """``cfg`` for one round: the one size, the action's algorithm and window."""
    if action.algorithm == "ina":
        return dataclasses.replace(cfg, sizes=(size,), algos=("ina",), slots=action.window)
    return dataclasses.replace(cfg, sizes=(size,), algos=(action.algorithm,),
                               window=action.window)  # fmt: skip


def round_row(rounds: Sequence[Round], size: int) -> Row | None:
    """The job's row at ``size`` over its rounds: algorithm ``auto``, the mean of the
    rounds' times (each the slowest rank's mean per call), the calls, wrong elements and
    retransmissions summed, ``chosen`` how often each arm ran; None without rounds."""
    mine = [r for r in rounds if r.row.nbytes == size]
    if not mine:
        return None
    times = [r.row.time_us_max for r in mine]
    tally = Counter(r.arm for r in mine)
    chosen = " ".join(f"{arm}x{n}" for arm, n in tally.most_common())
    return dataclasses.replace(
        mine[-1].row, algo="auto", time_us_max=sum(times) / len(times),
        time_us_mean=sum(r.row.time_us_mean for r in mine) / len(mine),
        time_us_min=min(r.row.time_us_min for r in mine), count=sum(r.row.count for r in mine),
        wrong=sum(r.row.wrong for r in mine), retransmits=sum(r.row.retransmits for r in mine),
        chosen=chosen, cpu=None, transport=None, sent_bytes=None,
    )  # fmt: skip


def cpu_brief(cpu: RowCpu | None) -> dict[str, Any] | None:
    """A row's CPU as the multi-job JSON gives it: the machine's busy share, whether it
    was bound and by what (None: not measured)."""
    if cpu is None:
        return None
    return {"machine": cpu.to_json().get("machine"), "bound": cpu.bound, "bound_by": cpu.bound_by}


def rounds_cpu(rounds: Sequence[Round], size: int) -> dict[str, Any] | None:
    """The CPU of the job's rounds at ``size``, as a row's JSON ``cpu``: the busiest
    round's machine, bound when any round was (and by what); None when none measured."""
    cpus = [r.row.cpu for r in rounds if r.row.nbytes == size and r.row.cpu is not None]
    if not cpus:
        return None
    machines = [m for c in cpus if (m := c.to_json().get("machine")) is not None]
    return {
        "machine": max(machines) if machines else None,
        "bound": any(c.bound for c in cpus),
        "bound_by": sorted({b for c in cpus for b in c.bound_by}),
    }
