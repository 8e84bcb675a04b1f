"""The coordinator of ``inalab bench``: start the switch and the workers, drive the sweep.

For each algorithm the coordinator spawns one process per rank (``workers.py``), for INA
after starting a soft switch process and installing the job with the workers' addresses
in rank order; ring and tree ranks get each other's addresses; ``auto`` does both and is
told per size which of INA, ring and tree to run (a decision function, dynamiccl's). It
then releases the ranks size by size (a barrier it holds) and collects each rank's
timings. It never hangs on a broken rank: it waits on the pipes and the
process sentinels together, with a deadline, reports the first failing rank's traceback,
and stops only the processes it started (the switch by its own PID).

While the sweep runs, a :class:`~emulation.bench.cpu.CpuSampler` thread samples the
machine's CPU counters and those of the switch processes the fabric names (the INA
switch's while it runs, and the fabric's always-running switches), and each row gets
the samples of its timed interval (see :mod:`emulation.bench.cpu`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from emulation.bench.config import (  # BENCH_JOB_ID: re-exported, its old home
    AUTO_CHOICES,
    BENCH_JOB_ID,
    PEER_ALGORITHMS,
    SWITCH_ALGORITHMS,
    BenchConfig,
)
from emulation.bench.cpu import CpuSampler
from emulation.bench.fabric import Fabric, FabricError, InaSwitch, LoopbackFabric
from emulation.bench.report import Row, merge_ranks
from emulation.bench.workers import SizeResult, WorkerPlan, worker_main
from hostlib.transport.rdma import RdmaEndpoint

__all__ = [
    "BENCH_JOB_ID",
    "BenchError",
    "DecideFn",
    "SweepInterrupted",
    "SweepResult",
    "run_sweep",
    "stall_limit",
    "udp_counters",
]

log = logging.getLogger(__name__)

_JOIN_S = 30.0
"""How long finished workers get to exit (Gloo tears down its process group) before the
coordinator terminates them."""

ProgressFn = Callable[[str, int], None]
"""Called with (algorithm, size index) once every rank has finished that size."""

_PEER_SESSIONS = {"ring": 1, "tree": 1, "auto": 2}
"""Ring/tree sessions a rank of each algorithm sets up (auto holds one of each)."""

DecideFn = Callable[[int], str]
"""``auto``'s decision: the algorithm (one of ``AUTO_CHOICES``) for a size in bytes."""


class BenchError(RuntimeError):
    """A worker failed, died, or went silent; or the switch could not be run."""


class SweepInterrupted(KeyboardInterrupt):
    """A stop signal (Ctrl-C, SIGTERM) arrived mid-sweep; the workers and the switch are
    stopped, and ``result`` holds the rows every rank finished.

    Attributes:
        result: what was measured before the signal.
        cause: the interrupt itself (``emulation.cli.Interrupted`` names the signal).
    """

    def __init__(self, result: SweepResult, cause: KeyboardInterrupt) -> None:
        super().__init__(str(cause))
        self.result = result
        self.cause = cause


@dataclass
class SweepResult:
    """What a sweep measured, plus where its logs are."""

    rows: list[Row] = field(default_factory=list)
    switch_counters: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per INA algorithm: the switch's statistics after its run."""
    switch_log: str | None = None
    wall_s: dict[str, float] = field(default_factory=dict)
    udp_kernel_delta: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per algorithm: change of the host's UDP counters (``/proc/net/snmp``) over its run;
    ``RcvbufErrors`` counts datagrams the kernel dropped on full socket buffers, loss the
    switch's drop simulator did not cause. Host-wide, so other traffic adds to it."""
    choices: dict[int, str] = field(default_factory=dict)
    """``auto``: the algorithm it ran per size (bytes)."""
    link_drops: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per algorithm: frames the emulated links dropped during its run (full shaper
    queues, full veth rings), by interface, only those that dropped some."""


def run_sweep(
    cfg: BenchConfig,
    run_dir: Path,
    progress: ProgressFn | None = None,
    log_level: int = logging.WARNING,
    fabric: Fabric | None = None,
    decide: DecideFn | None = None,
) -> SweepResult:
    """Run every algorithm of ``cfg`` over its size sweep; logs go to ``run_dir``.

    ``fabric`` places the ranks and provides the INA switch; by default
    :class:`~emulation.bench.fabric.LoopbackFabric` (127.0.0.1, a soft switch process).
    ``decide`` is ``auto``'s choice per size (required when ``cfg.algos`` has ``auto``).

    Raises:
        ValueError: ``auto`` without ``decide``, or a decision outside ``AUTO_CHOICES``.
        BenchError: a rank failed (its traceback is in the message), died, or sent
            nothing for longer than the stall limit; or the switch failed to start.
    """
    fabric = fabric or LoopbackFabric(cfg.ranks_per_host)
    result = SweepResult()
    if "auto" in cfg.algos:
        if decide is None:
            raise ValueError("the auto algorithm needs a decision function")
        result.choices = {n: decide(n) for n in cfg.sizes}
        wrong = {a for a in result.choices.values() if a not in AUTO_CHOICES}
        if wrong:
            raise ValueError(f"auto may choose {', '.join(AUTO_CHOICES)}, not {sorted(wrong)}")
    with CpuSampler() as sampler, sampler.watching(fabric.switch_pids()):
        for attempt, algo in enumerate(cfg.algos):
            _run_algo(cfg, algo, attempt, fabric, run_dir, progress, log_level, result, sampler)
    return result


def _run_algo(
    cfg: BenchConfig,
    algo: str,
    attempt: int,
    fabric: Fabric,
    run_dir: Path,
    progress: ProgressFn | None,
    log_level: int,
    result: SweepResult,
    sampler: CpuSampler,
) -> None:
    """One algorithm's sweep; its rows, wall time and UDP counters go into ``result``."""
    start = time.perf_counter()
    udp_before = udp_counters()
    links_before = fabric.link_drops()
    partial: list[list[SizeResult]] = [[] for _ in range(cfg.workers)]
    try:
        if algo in SWITCH_ALGORITHMS or algo in PEER_ALGORITHMS:
            choices = [result.choices[n] for n in cfg.sizes] if algo == "auto" else None
            per_rank = _run_udp(
                cfg, algo, fabric, run_dir, progress, log_level, result, choices, sampler, partial
            )
        else:
            plans = _plans(cfg, algo, fabric, run_dir, log_level, fabric.gloo_init(attempt))
            with _Fleet(algo, plans, stall_limit(cfg)) as fleet:
                per_rank = fleet.drive(len(cfg.sizes), progress, None, partial)
    except KeyboardInterrupt as exc:  # a stop signal: keep the sizes every rank finished
        done = min(len(p) for p in partial)
        if done:
            rows = merge_ranks(algo, cfg.dtype, [p[:done] for p in partial], cfg.workers,
                               cfg.collective, _transport(cfg, algo))  # fmt: skip
            result.rows += _with_system_cpu(rows, sampler)
        raise SweepInterrupted(result, exc) from exc
    result.wall_s[algo] = time.perf_counter() - start
    udp_after = udp_counters()
    result.udp_kernel_delta[algo] = {k: v - udp_before[k] for k, v in udp_after.items()}
    links_after = fabric.link_drops()
    result.link_drops[algo] = {
        name: n - links_before.get(name, 0)
        for name, n in links_after.items()
        if n > links_before.get(name, 0)
    }
    rows = merge_ranks(algo, cfg.dtype, per_rank, cfg.workers, cfg.collective,
                       _transport(cfg, algo))  # fmt: skip
    result.rows += _with_system_cpu(rows, sampler)


def _transport(cfg: BenchConfig, algo: str) -> str | None:
    """A row's ``transport``: INA's (``--transport``); None for the other algorithms."""
    return cfg.transport if algo == "ina" else None


def _with_system_cpu(rows: list[Row], sampler: CpuSampler) -> list[Row]:
    """``rows`` with the switches' and the machine's CPU use during their timed calls;
    then the sampler forgets what no later row can need."""
    sampler.sample()  # one sample after the last timed call, to interpolate its end
    samples = sampler.samples()
    out = [replace(r, cpu=r.cpu.with_system(samples)) if r.cpu else r for r in rows]
    ends = [r.cpu.end for r in rows if r.cpu is not None]
    if ends:
        sampler.discard_before(max(ends))
    return out


def udp_counters(path: Path = Path("/proc/net/snmp")) -> dict[str, int]:
    """The host's UDP counters by name (Linux); empty where the file is missing."""
    try:
        lines = [line.split() for line in path.read_text().splitlines()]
    except OSError:
        return {}
    udp = [fields[1:] for fields in lines if fields and fields[0] == "Udp:"]
    if len(udp) < 2:
        return {}
    return {name: int(value) for name, value in zip(udp[0], udp[1], strict=False)}


def stall_limit(cfg: BenchConfig) -> float:
    """Seconds the coordinator waits for any one rank's next message.

    Hosts fail on their own after ``cfg.timeout`` without progress (Gloo after at least a
    minute), and report it; this limit only catches a rank stuck outside a collective, so
    it is generous: one phase may be a whole size's warm-up and timed calls.
    """
    return max(600.0, 60.0 * cfg.timeout)


def _plans(
    cfg: BenchConfig,
    algo: str,
    fabric: Fabric,
    run_dir: Path,
    log_level: int,
    gloo_init: str | None = None,
) -> list[WorkerPlan]:
    placements = fabric.placements(cfg.workers)
    per_host = Counter(p.host for p in placements)
    return [
        WorkerPlan(
            algo=algo,
            rank=r,
            num_workers=cfg.workers,
            sizes=tuple(cfg.sizes),
            dtype=cfg.dtype,
            iters=cfg.iters,
            warmup=cfg.warmup,
            seed=cfg.seed,
            lanes=cfg.lanes,
            slots=cfg.slots,
            window=cfg.p2p_window,
            timeout=cfg.timeout,
            cc_target=cfg.cc_target,
            gloo_init=gloo_init,
            log_path=str(run_dir / f"{algo}-rank{r}.log"),
            log_level=log_level,
            placement=placements[r],
            hosts=len(per_host),
            max_local=max(per_host.values()),
            collective=cfg.collective,
            transport=cfg.transport,
            msg_packets=cfg.msg_packets,
            rdma_device=cfg.rdma_device,
        )
        for r in range(cfg.workers)
    ]


def _run_udp(
    cfg: BenchConfig,
    algo: str,
    fabric: Fabric,
    run_dir: Path,
    progress: ProgressFn | None,
    log_level: int,
    result: SweepResult,
    choices: Sequence[str] | None,
    sampler: CpuSampler,
    partial: list[list[SizeResult]] | None = None,
) -> list[list[SizeResult]]:
    """The algorithms of hostlib: flat INA (every rank a worker of the switch's job),
    CollNet (each host's head rank is; the others reduce into it through shared memory),
    ring and tree (no switch), and auto (a session of each of INA, ring and tree)."""
    plans = _plans(cfg, algo, fabric, run_dir, log_level)
    groups = _local_groups(plans) if algo == "collnet" else {}
    try:
        with ExitStack() as stack:
            switch: InaSwitch | None = None
            if algo in SWITCH_ALGORITHMS:
                switch = stack.enter_context(fabric.ina_switch(cfg, run_dir))
                result.switch_log = str(switch.log_path) if switch.log_path else str(run_dir)
                stack.enter_context(sampler.watching(switch.pids))
            extra = [(groups[p.placement.host],) if groups else () for p in plans]
            log_path = switch.log_path if switch is not None else None
            with _Fleet(algo, plans, stall_limit(cfg), log_path, extra) as fleet:
                if switch is not None:
                    _join_switch(fleet, switch, plans, cfg.job_id, collnet=algo == "collnet")
                for _ in range(_PEER_SESSIONS.get(algo, 0)):
                    _join_peers(fleet)
                per_rank = fleet.drive(len(cfg.sizes), progress, choices, partial)
            if switch is not None:
                result.switch_counters[algo] = switch.counters()
                switch.remove(cfg.job_id)
        return per_rank
    except FabricError as exc:
        raise BenchError(str(exc)) from exc
    finally:
        for group in groups.values():
            group.unlink()


def _join_switch(
    fleet: _Fleet, switch: InaSwitch, plans: Sequence[WorkerPlan], job_id: int, collnet: bool
) -> None:
    """Install the job with the INA workers' addresses; tell each rank where to send and
    the rank its packets carry (a CollNet non-head: ``None``s)."""
    if collnet:
        heads = [p.rank for p in plans if p.placement.local_rank == 0]
    else:
        heads = list(range(len(plans)))
    reported = fleet.gather("addr")
    addrs = [(str(reported[r][1][0]), int(reported[r][1][1])) for r in heads]
    dests = switch.install(job_id, addrs, [plans[r].placement for r in heads])
    if plans[0].transport == "rdma":  # the queue pairs: RdmaSession's exchange
        endpoints = [[RdmaEndpoint(*e) for e in reported[r][2]] for r in heads]
        qpns = switch.install_roce(job_id, [a[0] for a in addrs], endpoints,
                                   plans[0].msg_packets)  # fmt: skip
        for rank, (to, as_rank) in zip(heads, dests, strict=True):
            fleet.send(rank, ("job", job_id, to, as_rank, qpns[heads.index(rank)],
                              switch.roce_icrc))  # fmt: skip
        return
    for rank in range(len(plans)):
        dest = dests[heads.index(rank)] if rank in heads else (None, None)
        fleet.send(rank, ("job", job_id, *dest))


def _join_peers(fleet: _Fleet) -> None:
    """Ring and tree: give every rank all ranks' addresses."""
    reported = fleet.gather("addr")
    addrs = [(str(msg[1][0]), int(msg[1][1])) for msg in reported]
    fleet.send_all(("peers", addrs))


def _local_groups(plans: Sequence[WorkerPlan]) -> dict[int, Any]:
    """One shared-memory group per host for CollNet, sized for the largest message.

    A sibling waits at the group's barriers while its head runs the INA step, so their
    timeout covers a whole call; a rank that dies is caught sooner by the coordinator.
    """
    from hostlib.collnet import LocalGroup

    ctx = multiprocessing.get_context("spawn")
    sizes: dict[int, int] = {}
    for p in plans:
        sizes[p.placement.host] = sizes.get(p.placement.host, 0) + 1
    largest = max(plans[0].sizes)
    groups: dict[int, Any] = {}
    try:
        for host, size in sizes.items():
            groups[host] = LocalGroup(size, largest, ctx, timeout=max(120.0, 10 * plans[0].timeout))
    except BaseException:
        for group in groups.values():
            group.unlink()
        raise
    return groups


class _Fleet:
    """The worker processes of one algorithm: spawned, driven in lock-step, reaped.

    ``target`` is the workers' entry point, called as ``target(plan, conn, *extra)``
    (default the bench's :func:`~emulation.bench.workers.worker_main`; ``inalab replay``
    passes its own); a plan needs ``rank`` and ``log_path``.
    """

    def __init__(
        self,
        algo: str,
        plans: Sequence[Any],
        stall_s: float,
        switch_log: Path | None = None,
        extra_args: Sequence[tuple[Any, ...]] = (),
        target: Callable[..., None] = worker_main,
    ) -> None:
        self.algo = algo
        self.stall_s = stall_s
        self.plans = list(plans)
        self.switch_log = switch_log
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        ctx = multiprocessing.get_context("spawn")
        try:
            for i, plan in enumerate(plans):
                parent, child = ctx.Pipe()
                extra = tuple(extra_args[i]) if extra_args else ()
                proc = ctx.Process(
                    target=target,
                    args=(plan, child, *extra),
                    name=f"inalab-bench-{algo}-{plan.rank}",
                    daemon=True,
                )
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> _Fleet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # Ranks still running are expected after a stop signal, a surprise otherwise.
        self.stop(expected=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))

    def drive(
        self,
        num_sizes: int,
        progress: ProgressFn | None,
        choices: Sequence[str] | None = None,
        partial: list[list[SizeResult]] | None = None,
    ) -> list[list[SizeResult]]:
        """Release the ranks size by size (with ``choices[k]``, the algorithm auto runs at
        size k); return each rank's results, index = rank. Each finished size's results
        are also appended to ``partial`` (per rank) as they come, for a run that stops."""
        for k in range(num_sizes):
            barriers = self.gather("barrier")
            if k and partial is not None:
                for rank, msg in enumerate(barriers):
                    if len(msg) > 2 and msg[2] is not None:
                        partial[rank].append(msg[2])
            if k and progress is not None:
                progress(self.algo, k - 1)
            self.send_all(("go",) if choices is None else ("go", choices[k]))
        results = [list(msg[1]) for msg in self.gather("result")]
        if progress is not None and num_sizes:
            progress(self.algo, num_sizes - 1)
        self._join(_JOIN_S)
        return results

    def send_all(self, msg: tuple[Any, ...]) -> None:
        for rank in range(len(self.conns)):
            self.send(rank, msg)

    def send(self, rank: int, msg: tuple[Any, ...]) -> None:
        try:
            self.conns[rank].send(msg)
        except OSError:
            raise BenchError(self._death_note(rank)) from None

    def gather(self, kind: str) -> list[tuple[Any, ...]]:
        """One message of ``kind`` from every rank, index = rank.

        Raises:
            BenchError: a rank reported an error, exited, or sent nothing for ``stall_s``.
        """
        got: dict[int, tuple[Any, ...]] = {}
        deadline = time.monotonic() + self.stall_s
        while len(got) < len(self.conns):
            pending = {self.conns[r]: r for r in range(len(self.conns)) if r not in got}
            # After its result a rank may exit; before that, exiting means it died.
            sentinels = {
                p.sentinel: r
                for r, p in enumerate(self.procs)
                if not (kind == "result" and r in got)
            }
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ranks = sorted(pending.values())
                raise BenchError(
                    f"{self.algo}: no {kind!r} from rank(s) {ranks} for {self.stall_s:.0f}s"
                    f"{self._logs_note()}"
                )
            ready = wait([*pending, *sentinels], timeout=remaining)
            for obj in ready:
                if isinstance(obj, Connection) and obj in pending:
                    got[pending[obj]] = self._receive(pending[obj], kind)
            for obj in ready:
                if isinstance(obj, int) and obj in sentinels:
                    rank = sentinels[obj]
                    if rank not in got:
                        # An exiting rank may have sent its traceback just before.
                        got[rank] = self._receive(rank, kind)
                    elif kind != "result":
                        # Its message came in this same wait; only after a result may a
                        # rank exit (a rank that sent its result and exited at once had
                        # both ready together, and was taken for dead).
                        raise BenchError(self._death_note(rank))
        return [got[r] for r in range(len(self.conns))]

    def _receive(self, rank: int, kind: str) -> tuple[Any, ...]:
        conn = self.conns[rank]
        try:
            if not conn.poll(0.5):
                raise EOFError
            msg = conn.recv()
        except (EOFError, OSError):
            raise BenchError(self._death_note(rank)) from None
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            raise BenchError(f"{self.algo} rank {rank} failed:\n{msg[1]}{self._logs_note()}")
        if not isinstance(msg, tuple) or not msg or msg[0] != kind:
            raise BenchError(f"{self.algo} rank {rank} sent {msg!r}, expected {kind!r}")
        return msg

    def _death_note(self, rank: int) -> str:
        proc = self.procs[rank]
        proc.join(0.5)
        code = proc.exitcode
        how = "is unresponsive" if code is None else f"exited with status {code}"
        return f"{self.algo} rank {rank} {how} without reporting an error{self._logs_note()}"

    def _logs_note(self) -> str:
        notes = [f"worker logs: {os.path.dirname(self.plans[0].log_path or '')}"]
        if self.switch_log is not None:
            notes.append(f"switch log: {self.switch_log}")
        return "\n(" + "; ".join(notes) + ")"

    def _join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(deadline - time.monotonic(), 0.0))

    def stop(self, expected: bool = False) -> None:
        """Terminate the ranks still running (only the processes this fleet started);
        ``expected``: say so at INFO rather than WARNING (the run was stopped)."""
        for proc in self.procs:
            if proc.is_alive():
                log.log(logging.INFO if expected else logging.WARNING,
                        "terminating %s (pid %s)", proc.name, proc.pid)  # fmt: skip
                proc.terminate()
        for proc in self.procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for conn in self.conns:
            conn.close()
