"""``inalab emulate T --jobs A,B,... bench|run``: several jobs on one fabric at once.

Layer: emulation.mininet, beside ``emulate``'s single-job bench. Each topology job runs
the bench's sweep (:func:`emulation.bench.sweep.run_sweep`) on its own hosts, under its
own job id on the switches: first each alone, one after the other, then all together
(job k starting ``k * --stagger`` seconds after the first). Its time per call together
against alone is what sharing the fabric cost it. The switches' slot pool is
``emulate``'s ``--switch-slots``, taken as ``--sharing`` says
(:mod:`emulation.mininet.sharing`): by default each job reserves its ``--slots``, and
jobs whose ranges do not all fit fail to install (a job's slot range is its own for its
whole run); ``partition`` splits the pool evenly, ``shared`` puts every job's window in
one region of the whole pool with the switch's fallback node behind it. Under
``shared`` each job's sharing counters on its switch (``shared_uses``, ``collisions``,
``to_fallback``, ``from_fallback``) are recorded per phase. Under ``dynamic`` (``--algos
auto``) a job's part is ``--rounds`` rounds in which dynamiccl's agent picks INA
reserved, INA shared, ring or tree from the contention it reads
(:mod:`emulation.mininet.dynamic`); its row is the mean over its rounds, and each round
is in the JSON.

``run --jobs`` runs COMMAND once per rank of every job at the same time (two torch
training jobs through one switch, say), each job installed under its own id, its rank
logs in ``RUN_DIR/jobN/`` and its output prefixed ``[job N rank K]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from dynamiccl.model import Profile, ProfileError
from emulation.bench.config import BenchConfig
from emulation.bench.rows import Row
from emulation.mininet.dynamic import Round, cpu_brief, round_row, rounds_cpu, run_rounds
from emulation.mininet.fabric import EmulatedFabric
from emulation.mininet.network import Emulation
from emulation.mininet.sharing import DEFAULT_ROUNDS, SharingPlan
from emulation.topology import TopologyJob

__all__ = ["SCHEMA", "JobRun", "check_jobs", "run_commands", "run_jobs"]

PROG = "inalab emulate"

SCHEMA = "inalab-multijob/1"
"""The JSON document's schema: ``sharing`` (the policy), ``jobs``, each with its
``alone`` and ``together`` rows (and, under ``shared``, its ``counters`` together and
``counters_alone``)."""


@dataclasses.dataclass
class JobRun:
    """One topology job's part: its sweep's config and rows, alone and together."""

    job: TopologyJob
    cfg: BenchConfig
    start_after: float
    alone: list[Row] = dataclasses.field(default_factory=list)
    together: list[Row] = dataclasses.field(default_factory=list)
    error: str | None = None
    """Why its run failed (a run of the other jobs goes on)."""
    counters_alone: dict[str, int] | None = None
    """Its sharing counters on its switch over its run alone (``shared`` only)."""
    counters: dict[str, int] | None = None
    """Its sharing counters on its switch over the run together (``shared`` only)."""
    rounds_alone: list[Round] = dataclasses.field(default_factory=list)
    """``dynamic``: its rounds alone (what the agent read, chose and measured)."""
    rounds: list[Round] = dataclasses.field(default_factory=list)
    """``dynamic``: its rounds together."""
    rounds_wanted: int = DEFAULT_ROUNDS
    """``dynamic``: rounds per phase (``--rounds``)."""
    profile: Profile | None = None
    """``dynamic``: the agent's cost-model profile (``--profile``; None: the built-in)."""


def check_jobs(jobs: Sequence[TopologyJob]) -> str | None:
    """Why these jobs cannot run together (None: they can): fewer than two, one twice, or
    a host in two of them (each host's ranks belong to one job)."""
    ids = [j.job_id for j in jobs]
    if len(ids) < 2:
        return "--jobs needs two jobs or more (one job: --job)"
    if len(set(ids)) != len(ids):
        return f"--jobs {','.join(map(str, ids))}: a job given twice"
    seen: dict[str, int] = {}
    for job in jobs:
        for host in job.workers:
            if host in seen:
                return (f"host {host} is in jobs {seen[host]} and {job.job_id}: give jobs "
                        "on hosts of their own")  # fmt: skip
            seen[host] = job.job_id
    return None


def run_jobs(
    args: argparse.Namespace, em: Emulation, jobs: Sequence[TopologyJob], run_dir: Path
) -> int:
    """Run the jobs alone, then together; print the table, write ``--json``. 0 when
    every run finished with right results, 1 otherwise, 2 on bad flags."""
    from emulation.bench.cli import UsageError, config_from_args

    if args.loss:
        print(f"{PROG}: error: --jobs with --loss: the drop simulator is a switch's, not a "
              "job's (use emulate's --link-loss)", file=sys.stderr)  # fmt: skip
        return 2
    runs = []
    for k, job in enumerate(jobs):
        fabric = EmulatedFabric(em, job)
        try:
            cfg = config_from_args(args, workers=fabric.workers, ranks_per_host=1)
            cfg = dataclasses.replace(cfg, job_id=job.job_id)
            fabric.check(cfg)
        except (UsageError, ValueError) as exc:
            print(f"{PROG}: error: job {job.job_id}: {exc}", file=sys.stderr)
            return 2
        problem = _algos_problem(cfg.algos, em.sharing)
        if problem:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
            return 2
        runs.append(JobRun(job, cfg, k * args.stagger, rounds_wanted=args.rounds))
    if em.sharing is not None and em.sharing.policy == "dynamic" and args.profile is not None:
        try:
            profile = Profile.load(args.profile)
        except (OSError, ProfileError) as exc:
            print(f"{PROG}: error: --profile: {exc}", file=sys.stderr)
            return 2
        for run in runs:
            run.profile = profile
    print(f"# {len(runs)} jobs: " + "; ".join(_describe(r) for r in runs), flush=True)
    em.sharing_counters.clear()
    for run in runs:
        print(f"# job {run.job.job_id} alone ...", flush=True)
        run.alone = _sweep(em, run, run_dir / f"job{run.job.job_id}-alone")
        run.counters_alone = em.sharing_counters.pop(run.job.job_id, None)
    print("# all jobs together ...", flush=True)
    _together(em, runs, run_dir)
    for run in runs:
        run.counters = em.sharing_counters.pop(run.job.job_id, None)
    _print_table(runs, em.sharing)
    if args.json is not None:
        args.json.write_text(json.dumps(_document(runs, args, em.sharing), indent=1) + "\n")
        print(f"# json: {args.json}")
    failed = [r for r in runs if r.error is not None]
    for run in failed:
        print(f"{PROG}: job {run.job.job_id} failed: {run.error}", file=sys.stderr)
    wrong = any(row.wrong for r in runs for row in [*r.alone, *r.together])
    return 1 if failed or wrong else 0


def _algos_problem(algos: Sequence[str], sharing: SharingPlan | None) -> str | None:
    """Why ``--algos`` cannot run under the policy (None: it can): ``dynamic`` is
    dynamiccl's choice, ``--algos auto`` alone; the others run fixed algorithms."""
    dynamic = sharing is not None and sharing.policy == "dynamic"
    if dynamic and tuple(algos) != ("auto",):
        return ("--sharing dynamic is dynamiccl's choice round by round: give --algos auto"
                " (the other policies run fixed algorithms)")  # fmt: skip
    if not dynamic and "auto" in algos:
        return "--jobs runs fixed algorithms, not auto (dynamiccl's choice: --sharing dynamic)"
    return None


def _describe(run: JobRun) -> str:
    start = f", starts {run.start_after:g} s in" if run.start_after else ""
    return f"job {run.job.job_id} on {','.join(run.job.workers)} ({run.cfg.slots} slots{start})"


def _sweep(em: Emulation, run: JobRun, run_dir: Path, together: bool = False) -> list[Row]:
    """One sweep of the job on its own hosts, or under ``dynamic`` its rounds (kept in
    ``run.rounds`` or ``run.rounds_alone``); its rows ([] if it failed: ``run.error``,
    whatever the failure: a thread's exception must not vanish)."""
    from emulation.bench.sweep import run_sweep

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if em.sharing is None or em.sharing.policy != "dynamic":
            return run_sweep(run.cfg, run_dir, fabric=EmulatedFabric(em, run.job)).rows
        rounds = run_rounds(em, run.job, run.cfg, run_dir, run.rounds_wanted, run.profile)
        if together:
            run.rounds = rounds
        else:
            run.rounds_alone = rounds
        return [r for n in run.cfg.sizes if (r := round_row(rounds, n)) is not None]
    except Exception as exc:  # any failure is the job's, reported, not lost
        run.error = f"{type(exc).__name__}: {exc}"
        return []


class _Serialized:
    """The emulation as concurrent sweeps share it: its methods one at a time. Mininet's
    ``Node.cmd`` serves one command at a time (a second thread's ``poll()`` on the same
    shell fails), and the methods that read the hosts' counters or install a job use it.
    Attributes pass through."""

    def __init__(self, em: Emulation) -> None:
        self._em, self._lock = em, threading.Lock()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._em, name)
        if not callable(value):
            return value

        def call(*args: Any, **kw: Any) -> Any:
            with self._lock:
                return value(*args, **kw)

        return call


def _at_once(work: Sequence[tuple[float, Callable[[], None]]]) -> None:
    """Each ``(offset, body)`` in a thread of its own, begun ``offset`` seconds after the
    first; return when every one has ended."""
    start = time.monotonic()

    def run(offset: float, body: Callable[[], None]) -> None:
        time.sleep(max(0.0, start + offset - time.monotonic()))
        body()

    threads = [threading.Thread(target=run, args=w, daemon=True) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _together(em: Emulation, runs: Sequence[JobRun], run_dir: Path) -> None:
    """Every job's sweep at once, each in a thread, started at its offset."""
    em = cast(Emulation, _Serialized(em))

    def body(run: JobRun) -> None:
        if run.error is None:
            run.together = _sweep(em, run, run_dir / f"job{run.job.job_id}-together", True)

    _at_once([(r.start_after, functools.partial(body, r)) for r in runs])


def run_commands(
    args: argparse.Namespace, em: Emulation, jobs: Sequence[TopologyJob], run_dir: Path
) -> int:
    """``run --jobs``: every job's ranks run COMMAND at once (job k ``k * --stagger`` s
    after the first). 0 when every rank of every job exited 0, else the first failing
    job's status."""
    from emulation.mininet.run import run_command

    shared = cast(Emulation, _Serialized(em))
    status: dict[int, int] = {}

    def body(job: TopologyJob) -> None:
        where = run_dir / f"job{job.job_id}"
        where.mkdir(parents=True, exist_ok=True)
        try:
            status[job.job_id] = run_command(args, shared, job, where, f"job {job.job_id} ")
        except Exception as exc:  # any failure is the job's, reported, not lost
            print(f"{PROG}: job {job.job_id} failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)  # fmt: skip
            status[job.job_id] = 1

    _at_once([(k * args.stagger, functools.partial(body, j)) for k, j in enumerate(jobs)])
    for job in jobs:
        print(f"# job {job.job_id}: exit status {status.get(job.job_id, 1)}", flush=True)
    return next((status.get(j.job_id, 1) for j in jobs if status.get(j.job_id, 1)), 0)


def _print_table(runs: Sequence[JobRun], sharing: SharingPlan | None = None) -> None:
    """Per job, algorithm and size: time per call alone and together (slowest rank);
    under ``shared``, each job's sharing counters together after it."""
    print("#")
    if sharing is not None:
        print(f"# {sharing.describe()}")
    print("#  job  workers  algo      size (B)      alone (us)   together (us)   x alone")
    for run in runs:
        together = {(r.algo, r.nbytes): r for r in run.together}
        for row in run.alone:
            both = together.get((row.algo, row.nbytes))
            t = f"{'-':>15} {'-':>9}"
            if both is not None:
                t = f"{both.time_us_max:15.0f} {both.time_us_max / row.time_us_max:9.2f}"
            print(f"{run.job.job_id:6d} {run.cfg.workers:8d}  {row.algo:6s} {row.nbytes:12d}"
                  f" {row.time_us_max:15.0f} {t}")  # fmt: skip
    print("# time = the slowest rank's mean per call; x alone = together / alone")
    for run in runs:
        for phase, rounds in (("alone", run.rounds_alone), ("together", run.rounds)):
            if rounds:
                arms = " ".join(r.arm for r in rounds)
                print(f"# job {run.job.job_id} auto {phase}, {len(rounds)} rounds: {arms}")
    for run in runs:
        if run.counters is not None:
            counts = ", ".join(f"{k} {v}" for k, v in run.counters.items())
            print(f"# job {run.job.job_id} together on {run.job.switch}: {counts}")


def _document(
    runs: Sequence[JobRun], args: argparse.Namespace, sharing: SharingPlan | None = None
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "topology": str(args.topology),
        "stagger_s": args.stagger,
        "sharing": None if sharing is None else sharing.to_json(),
        "jobs": [
            {
                "job": r.job.job_id,
                "hosts": list(r.job.workers),
                "workers": r.cfg.workers,
                "slots": r.cfg.slots,
                "start_after_s": r.start_after,
                "error": r.error,
                "alone": [_row(x, r.rounds_alone) for x in r.alone],
                "together": [_row(x, r.rounds) for x in r.together],
                "counters": r.counters,
                "counters_alone": r.counters_alone,
                "rounds_alone": [x.to_json() for x in r.rounds_alone] or None,
                "rounds": [x.to_json() for x in r.rounds] or None,
            }
            for r in runs
        ],
    }


def _row(row: Row, rounds: Sequence[Round] = ()) -> dict[str, Any]:
    """A row's JSON; an ``auto`` row of ``dynamic`` rounds takes their CPU
    (:func:`~emulation.mininet.dynamic.rounds_cpu`)."""
    if rounds:
        return _row(row) | {"chosen": row.chosen, "cpu": rounds_cpu(rounds, row.nbytes)}
    return {
        "algo": row.algo,
        "size_bytes": row.nbytes,
        "time_us": row.time_us_max,
        "wrong": row.wrong,
        "retransmits": row.retransmits,
        "retransmits_timed": row.retransmits_timed,
        "late_samples": row.late_samples,
        "late_answers": row.late_answers,
        "cpu": cpu_brief(row.cpu),
    }
