"""CPU use during ``inalab bench``'s timed calls: which core was full while a row was timed.

Emulation layer (bench). On one machine the switch and the ranks share its cores, so a
row's time can measure the CPU rather than the network or the algorithm. This module
owns the measurement: reading ``/proc``, a sampler thread, and the arithmetic that turns
samples into one row's CPU fractions (:class:`RowCpu`), including the CPU-bound flag.

Design. The timed calls run inside the worker processes, so only they know where each
size's timed loop starts and ends. Each worker therefore measures its own CPU
(``time.process_time()``: every thread of the process, nanosecond resolution) and reports
the ``time.monotonic()`` ends of its loop; CLOCK_MONOTONIC is one clock for every process
and every network namespace of the machine, so those ends are comparable with the
coordinator's clock. What no worker owns, the switch processes and the machine as a
whole, the coordinator observes: :class:`CpuSampler` is a thread that, while a sweep runs,
reads ``/proc/stat`` and ``/proc/PID/stat`` of the watched switch processes every
``SAMPLE_PERIOD_S``. :func:`attribute` takes a row's interval (the union of the ranks'
timed loops, so every timed call of every rank is inside), reads each cumulative counter
at both ends by linear interpolation between the two samples around that end, and divides
the difference by the interval.

Alternatives not taken: a sampler inside each worker would run in the very processes
being timed; samples only at the coordinator's barriers would include the untimed warm-up
calls and the correctness check. The price of the sampler is resolution: a row shorter
than the period has no sample inside and gets the average rate over the period around it,
and the kernel counts in clock ticks (``SC_CLK_TCK``, usually 100 per second). Rows say
so instead of hiding it: ``interval_s``, ``samples`` (inside the interval) and ``span_s``
(the time between the samples the numbers rest on) are in their JSON.

Where ``/proc`` cannot be read (not Linux, a process gone) the numbers are ``None``;
nothing here raises for it.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "BOUND_FRACTION",
    "BUSY_OTHER_CORES",
    "CPU_NOTE",
    "MAX_SPAN_OVER",
    "SAMPLE_PERIOD_S",
    "CpuSampler",
    "MachineTicks",
    "RowCpu",
    "Sample",
    "SystemCpu",
    "attribute",
    "busy_cores",
    "clock_ticks",
    "counter_at",
    "program_fds",
    "read_dataplane_ns",
    "read_machine",
    "read_process_ticks",
    "worker_cpu",
]

BOUND_FRACTION = 0.9
"""A process of the bench above this share of one core, or the bench's processes
together above this share of all the machine's cores, during a row's timed calls marks
the row CPU-bound."""

BUSY_OTHER_CORES = 0.25
"""Other processes using more than this many cores during a row's timed calls (or before
a run starts) make the machine "busy with other processes": the row is flagged apart
from CPU-bound, since its time then measures someone else's load too."""

MAX_SPAN_OVER = 0.25
"""Other processes' cores are told only for a row whose samples rest on at most this
fraction more time than its interval (``span_s`` against ``interval_s``). The machine's
share of a shorter row is interpolated over samples around it, which include the bench's
own work between rows (the warm-up calls, the inputs and the check); the ranks' CPU is
exact for the interval, so the difference would blame that work on other processes: the
default loopback bench flagged rows of 4-50 ms resting on 26-80 ms of samples as busy
with other processes (0.3-0.9 of a core) on a quiet machine."""

SAMPLE_PERIOD_S = 0.025
"""Seconds between samples: a few clock ticks (10 ms each at the usual 100 Hz), so each
period sees the counters move; 40 small reads a second cost the coordinator little."""

PROC = Path("/proc")

CPU_NOTE = (
    "cpu: CPU use during the row's timed calls (the union of the ranks' timed loops,"
    " interval_s). workers: each rank's own CPU seconds over its wall seconds (all its"
    " threads), in rank order; switch: each switch process's share of one core, by name"
    " (null when no switch process ran: a loopback algorithm without INA; under inalab"
    " emulate every algorithm's packets cross the switches, so they are reported for"
    " all); switch_dataplane: each switch's BPF programs (an eBPF switch's data plane) in"
    " share of one core, from the kernel's run-time statistics (/proc/PID/fdinfo"
    " run_time_ns; null where not measured): the kernel runs them in softirq on any core,"
    " mostly in the sending rank's context, so this time is in machine, softirq and the"
    " workers' shares, not in switch (it includes handing multicast copies to the egress"
    " ports' shapers: bpf_clone_redirect transmits before it returns); machine and"
    " softirq: share of all cores busy, and busy in softirq (an in-kernel data plane's"
    " time), from /proc/stat; steal: share of"
    " all cores the hypervisor took (a VM stood still, its switch and links with it; not"
    " in machine). switch, switch_dataplane, machine, softirq and steal come from /proc"
    " samples every ~25 ms, interpolated at the interval's ends: samples"
    f" counts those inside, span_s the time they rest on, so short rows are coarse. own:"
    " the bench's processes together (ranks, switches, softirq) in share of all cores;"
    " other_cores: the cores the machine's other processes used meanwhile (null for a"
    f" row whose span_s exceeds interval_s by more than {MAX_SPAN_OVER:.0%}: its machine"
    " share includes the bench's own work around the row), busy_other"
    f" when above {BUSY_OTHER_CORES}. bound: a rank or switch process above"
    f" {BOUND_FRACTION:.0%} of a core or the bench's processes above {BOUND_FRACTION:.0%}"
    " of all cores (bound_by says which, 'bench' for the latter): the time then measures"
    " this machine's CPU, not the network or the algorithm. worker_cpu_s_per_gbit (beside"
    " cpu): the mean rank's CPU seconds per Gbit it sent (INA sends the size once; ring,"
    " tree and Gloo 2(n-1)/n of it), the kernel's work in its context included;"
    " worker_cpu_s_per_gbit_size: the same per Gbit of the size, the bytes every"
    " algorithm reduces alike; switch_dataplane_cpu_s_per_gbit: the switches' data"
    " planes' CPU seconds over the Gbit all ranks sent, per rank (of"
    " worker_cpu_s_per_gbit, about that much was the emulated switch's work rather than"
    " the host's)"
)

log = logging.getLogger(__name__)

ProcKey = tuple[str, int]
"""A watched process: its label (the switch's name) and PID (a restarted switch is new)."""


# ----------------------------------------------------------------- reading /proc
@dataclass(frozen=True)
class MachineTicks:
    """The aggregate ``cpu`` line of ``/proc/stat``, in clock ticks summed over cores."""

    busy: int
    """Everything but idle, iowait and steal: this machine's own work."""
    total: int
    """user + nice + system + idle + iowait + irq + softirq + steal (guest is in user)."""
    softirq: int
    steal: int = 0
    """Time the hypervisor ran something else on this VM's vCPUs: the VM stood still."""


@dataclass(frozen=True)
class Sample:
    """Cumulative counters at one instant (``time.monotonic()``)."""

    t: float
    machine: MachineTicks | None
    procs: Mapping[ProcKey, int] = field(default_factory=dict)
    """Each watched process's user + system CPU time in clock ticks (all its threads)."""
    dataplanes: Mapping[ProcKey, int] = field(default_factory=dict)
    """Each watched process's BPF programs' run time in nanoseconds, while the sampler
    has the kernel's run-time statistics on (:func:`read_dataplane_ns`)."""


def clock_ticks() -> int:
    """The kernel's clock ticks per second for ``/proc`` times (``SC_CLK_TCK``)."""
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100  # Linux's USER_HZ on every architecture we run on


def read_machine(path: Path = PROC / "stat") -> MachineTicks | None:
    """The machine's CPU counters from ``/proc/stat``; ``None`` where unreadable."""
    try:
        with path.open() as f:
            fields = f.readline().split()
        values = [int(v) for v in fields[1:9]]
    except (OSError, ValueError):
        return None
    if not fields or fields[0] != "cpu" or len(values) < 4:
        return None
    values += [0] * (8 - len(values))  # old kernels lack the later columns
    total = sum(values)
    return MachineTicks(
        busy=total - values[3] - values[4] - values[7],
        total=total,
        softirq=values[6],
        steal=values[7],
    )


def read_process_ticks(pid: int, proc: Path = PROC) -> int | None:
    """User + system CPU time of process ``pid`` in clock ticks (``/proc/PID/stat``, every
    thread); ``None`` where unreadable (the process is gone, no ``/proc``)."""
    try:
        # The command name may hold spaces and parentheses: split after the last ")".
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14, 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


_BPF_PROG_LINK = "anon_inode:bpf-prog"
"""What ``/proc/PID/fd/N`` links to for a BPF program's file descriptor."""


def program_fds(pid: int, proc: Path = PROC) -> tuple[str, ...]:
    """The file descriptors (``/proc/PID/fd`` names) by which process ``pid`` holds BPF
    programs; none if it holds none or is gone."""
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return ()
    found = []
    for name in names:
        try:
            if os.readlink(fd_dir / name) == _BPF_PROG_LINK:
                found.append(name)
        except OSError:  # closed meanwhile
            continue
    return tuple(found)


def read_dataplane_ns(pid: int, proc: Path = PROC, fds: Sequence[str] | None = None) -> int | None:
    """Nanoseconds the kernel has spent running the BPF programs process ``pid`` holds
    (each program once, however many descriptors): the sum of their ``run_time_ns`` in
    ``/proc/PID/fdinfo``. An eBPF switch's data plane runs there, in softirq on whatever
    core a frame arrives, and mostly in the sending rank's context, not in the switch
    process. The kernel counts only while run-time statistics are on
    (:func:`~emulation.softswitch.ebpf.libbpf.enable_run_time_stats`). ``fds``: the
    process's program descriptors when known (:func:`program_fds`: listing every
    descriptor costs several times reading the counters). ``None``: the process holds no program
    there, or is gone."""
    runs: dict[str, int] = {}
    for name in program_fds(pid, proc) if fds is None else fds:
        try:
            info = (proc / str(pid) / "fdinfo" / name).read_text()
        except OSError:  # closed meanwhile
            continue
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        try:
            runs[fields["prog_id"].strip()] = int(fields["run_time_ns"])
        except (KeyError, ValueError):  # a kernel without run-time statistics (< 5.1)
            continue
    return sum(runs.values()) if runs else None


def take_sample(
    keys: Iterable[ProcKey],
    proc: Path = PROC,
    dataplanes: Mapping[ProcKey, Sequence[str]] | None = None,
) -> Sample:
    """The machine's and the processes' counters now (unreadable ones left out);
    ``dataplanes``: the BPF programs' run times too of these processes, read through
    these descriptors (:func:`read_dataplane_ns`)."""
    t = time.monotonic()
    machine = read_machine(proc / "stat")
    ticks = {key: read_process_ticks(key[1], proc) for key in keys}
    runs = {key: read_dataplane_ns(key[1], proc, fds) for key, fds in (dataplanes or {}).items()}
    return Sample(
        t,
        machine,
        {k: v for k, v in ticks.items() if v is not None},
        {k: v for k, v in runs.items() if v is not None},
    )


def _enable_run_time_stats() -> int:
    """The kernel's BPF run-time statistics on (imported here: only a run with an eBPF
    switch needs libbpf)."""
    from emulation.softswitch.ebpf.libbpf import enable_run_time_stats

    return enable_run_time_stats()


# ----------------------------------------------------------------- the sampler
class CpuSampler:
    """A thread that samples ``/proc`` every ``period_s`` while started (a sweep runs).

    Processes are watched through :meth:`watching`; each start and end of a watch takes a
    sample at once, so the watched processes have samples just before the first and just
    after the last timed call of a run. Where ``/proc/stat`` cannot be read the sampler
    starts no thread and records nothing.

    The first watched process that holds a BPF program (an eBPF switch) makes the sampler
    turn the kernel's run-time statistics on (``stats``, until :meth:`stop`) and sample
    the programs' run times from then on: the switch's data plane, which the process's
    own CPU time does not include. Where that is refused (not root) the reason is in
    :attr:`dataplane_error` and no data plane time is reported.

    Args:
        period_s: seconds between samples.
        proc: the proc filesystem (tests point it elsewhere).
        stats: turns the statistics on, returning what to close to turn them off again
            (default: :func:`~emulation.softswitch.ebpf.libbpf.enable_run_time_stats`);
            raises ``OSError`` when it cannot.

    Raises:
        ValueError: ``period_s`` is not positive.
    """

    def __init__(
        self,
        period_s: float = SAMPLE_PERIOD_S,
        proc: Path = PROC,
        stats: Callable[[], int] | None = None,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"sampling period {period_s} must be positive")
        self.period_s, self.proc = period_s, proc
        self.available = read_machine(proc / "stat") is not None
        self._watched: Counter[ProcKey] = Counter()
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._enable_stats = stats or _enable_run_time_stats
        self._stats_fd: int | None = None
        self._prog_fds: dict[ProcKey, tuple[str, ...]] = {}
        self.dataplane_error: str | None = None
        """Why the switches' data plane time is not measured, once a switch held a
        program and the kernel's statistics could not be turned on."""

    def __enter__(self) -> CpuSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Take a sample and start sampling in the background (if ``/proc`` is there)."""
        if not self.available or self._thread is not None:
            return
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="inalab-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (the samples stay) and the kernel's run-time statistics."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        """Take one sample now (any thread)."""
        if not self.available:
            return
        # Under the lock, so a sample is never of a set of processes since unwatched.
        with self._lock:
            keys = list(self._watched)
            dataplanes = None
            if self._stats_fd is not None:
                dataplanes = {key: self._program_fds(key) for key in keys}
            sample = take_sample(keys, self.proc, dataplanes)
            self._samples.append(sample)
            for key, fds in (dataplanes or {}).items():
                if fds and key not in sample.dataplanes:  # closed: look again next time
                    del self._prog_fds[key]

    def _program_fds(self, key: ProcKey) -> tuple[str, ...]:
        """The program descriptors of watched process ``key``, looked up once: listing
        every descriptor of a process costs several times reading the programs' counters,
        and a switch holds its program for its life."""
        if key not in self._prog_fds:
            self._prog_fds[key] = program_fds(key[1], self.proc)
        return self._prog_fds[key]

    @contextmanager
    def watching(self, pids: Mapping[str, int]) -> Iterator[None]:
        """Watch the processes ``pids`` (label -> PID) inside the ``with``."""
        keys = list(pids.items())
        with self._lock:
            self._watched.update(keys)
            self._start_stats(keys)
        self.sample()
        try:
            yield
        finally:
            self.sample()
            with self._lock:
                self._watched.subtract(keys)
                self._watched = +self._watched  # drop the keys no longer watched

    def _start_stats(self, keys: Iterable[ProcKey]) -> None:
        """Turn the run-time statistics on once a process of ``keys`` holds a program
        (under the lock: the samples from here on read the programs)."""
        if self._stats_fd is not None or self.dataplane_error is not None or not self.available:
            return
        if not any(self._program_fds(key) for key in keys):
            return
        try:
            self._stats_fd = self._enable_stats()
        except OSError as exc:
            self.dataplane_error = f"the switches' data plane time is not measured: {exc}"
            log.warning("%s", self.dataplane_error)

    def samples(self) -> list[Sample]:
        """The samples so far, oldest first."""
        with self._lock:
            return list(self._samples)

    def discard_before(self, t: float) -> None:
        """Forget samples before ``t`` except the last of them (it brackets ``t``)."""
        with self._lock:
            i = bisect.bisect_right(self._samples, t, key=lambda s: s.t)
            del self._samples[: max(i - 1, 0)]


# ----------------------------------------------------------------- attribution
@dataclass(frozen=True)
class SystemCpu:
    """What the samples say about one interval: the machine's and switches' CPU use."""

    machine: float | None = None
    """Share of all cores busy (0..1)."""
    softirq: float | None = None
    """Share of all cores in softirq (0..1)."""
    steal: float | None = None
    """Share of all cores the hypervisor took (0..1): a VM's stolen time, in which it,
    its switch and its links stood still."""
    switch: tuple[tuple[str, float], ...] | None = None
    """(label, share of one core) of each watched process covering the interval."""
    dataplane: tuple[tuple[str, float], ...] | None = None
    """(label, share of one core) of each watched process's BPF programs (an eBPF
    switch's data plane): time the kernel spent in them, on any core, in any process's
    context (mostly the sending ranks'), so part of ``machine``, ``softirq`` and the
    ranks' CPU, not of ``switch``."""
    samples: int = 0
    """Samples strictly inside the interval."""
    span_s: float | None = None
    """From the last sample at or before the interval to the first at or after it."""


def counter_at(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The value at ``t`` of a cumulative counter sampled at ``points`` ((time, value),
    sorted by time), linear between the samples around ``t``; ``None`` outside them."""
    if not points or not points[0][0] <= t <= points[-1][0]:
        return None
    i = bisect.bisect_left(points, t, key=lambda p: p[0])
    t1, v1 = points[i]
    if t1 == t:
        return v1
    t0, v0 = points[i - 1]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _rate(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Counter units per second over [start, end] (end > start)."""
    a, b = counter_at(points, start), counter_at(points, end)
    return None if a is None or b is None else (b - a) / (end - start)


def _machine(samples: Sequence[Sample], start: float, end: float) -> tuple[float | None, ...]:
    """(busy, softirq, steal) shares of all cores over [start, end], each ``None`` if
    unknown."""
    known = [(s.t, s.machine) for s in samples if s.machine is not None]
    total = _rate([(t, m.total) for t, m in known], start, end)
    if total is None or total <= 0:
        return None, None, None
    busy = _rate([(t, m.busy) for t, m in known], start, end) or 0.0
    softirq = _rate([(t, m.softirq) for t, m in known], start, end) or 0.0
    steal = _rate([(t, m.steal) for t, m in known], start, end) or 0.0
    # iowait may step backwards on tickless kernels: keep the shares inside 0..1.
    return tuple(min(max(x / total, 0.0), 1.0) for x in (busy, softirq, steal))


def _processes(
    samples: Sequence[Sample], start: float, end: float, per_second: float, dataplanes: bool
) -> tuple[tuple[str, float], ...] | None:
    """Each process's share of one core over [start, end], by label (its CPU time, or with
    ``dataplanes`` its programs' run time, counted ``per_second`` units a second); ``None``
    if none."""
    shares: dict[str, float] = {}

    def counts(s: Sample) -> Mapping[ProcKey, int]:
        return s.dataplanes if dataplanes else s.procs

    for key in dict.fromkeys(k for s in samples for k in counts(s)):
        points = [(s.t, counts(s)[key]) for s in samples if key in counts(s)]
        rate = _rate(points, start, end)
        if rate is not None:
            shares[key[0]] = max(shares.get(key[0], 0.0), max(rate, 0.0) / per_second)
    return tuple(sorted(shares.items())) or None


def attribute(
    samples: Sequence[Sample], start: float, end: float, ticks: int | None = None
) -> SystemCpu:
    """The machine's and the watched processes' CPU use over [start, end] (monotonic
    seconds) from ``samples`` (oldest first), interpolated at both ends.

    Args:
        samples: the sampler's samples.
        start, end: the interval.
        ticks: clock ticks per second of the counters (default: this machine's).

    Raises:
        ValueError: ``end`` is not after ``start``.
    """
    if not end > start:
        raise ValueError(f"interval end {end} is not after its start {start}")
    ticks = ticks or clock_ticks()
    before = [s.t for s in samples if s.t <= start]
    after = [s.t for s in samples if s.t >= end]
    machine, softirq, steal = _machine(samples, start, end)
    return SystemCpu(
        machine=machine,
        softirq=softirq,
        steal=steal,
        switch=_processes(samples, start, end, ticks, dataplanes=False),
        dataplane=_processes(samples, start, end, 1e9, dataplanes=True),
        samples=sum(start < s.t < end for s in samples),
        span_s=min(after) - max(before) if before and after else None,
    )


def busy_cores(seconds: float = 0.5, path: Path = PROC / "stat") -> float | None:
    """Cores busy over the next ``seconds`` (before a run starts, all of it is other
    processes'); ``None`` where ``/proc/stat`` cannot be read."""
    first = read_machine(path)
    time.sleep(seconds)
    last = read_machine(path)
    if first is None or last is None or last.total <= first.total:
        return None
    share = (last.busy - first.busy) / (last.total - first.total)
    return max(share, 0.0) * (os.cpu_count() or 1)


# ----------------------------------------------------------------- one row
@dataclass(frozen=True)
class RowCpu:
    """CPU use during one row's timed calls: the ranks' own, then the switches' and the
    machine's (:meth:`with_system`). Processes in shares of one core, the machine in
    shares of all its cores; ``None``: not measured."""

    workers: tuple[float | None, ...]
    """Each rank's CPU seconds over wall seconds of its timed loop, index = rank."""
    start: float
    """``time.monotonic()`` at the first rank's start of its timed calls."""
    end: float
    """``time.monotonic()`` at the last rank's end of its timed calls."""
    system: SystemCpu = field(default_factory=SystemCpu)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    """The machine's cores (the denominator of its shares)."""

    @property
    def own(self) -> float | None:
        """Share of all cores the bench's own processes used: its ranks, its switch
        processes and softirq (an in-kernel data plane's work on their packets)."""
        if self.system.machine is None:
            return None
        procs = sum(w for w in self.workers if w is not None)
        procs += sum(share for _, share in self.system.switch or ())
        # The ranks' own clocks and the sampled /proc counters disagree a little on short
        # rows: never more than the machine was busy in all.
        return min(procs / self.cores + (self.system.softirq or 0.0), self.system.machine)

    @property
    def other_cores(self) -> float | None:
        """Cores other processes used meanwhile (the machine's busy share less the
        bench's own, never negative: counters of different clocks); ``None`` where not
        known, or where the samples rest on more than :data:`MAX_SPAN_OVER` beyond the
        interval (a short row: the bench's work around it would count as others')."""
        own, machine, span = self.own, self.system.machine, self.system.span_s
        if own is None or machine is None:
            return None
        if span is not None and span > self.interval_s * (1 + MAX_SPAN_OVER):
            return None
        return max(machine - own, 0.0) * self.cores

    @property
    def busy_other(self) -> bool:
        """Whether other processes used more than :data:`BUSY_OTHER_CORES` meanwhile."""
        other = self.other_cores
        return other is not None and other > BUSY_OTHER_CORES

    @property
    def interval_s(self) -> float:
        return self.end - self.start

    def with_system(self, samples: Sequence[Sample], ticks: int | None = None) -> RowCpu:
        """This row with the switches' and the machine's use from the sampler's
        ``samples`` (unchanged if the interval is empty)."""
        if self.end <= self.start:
            return self
        return replace(self, system=attribute(samples, self.start, self.end, ticks))

    def shares(self) -> list[tuple[str, float]]:
        """Every known share of the bench's, named as in ``bound_by``: ranks, switches,
        the bench's processes together (``bench``, of all cores)."""
        named = [(f"rank {r}", w) for r, w in enumerate(self.workers) if w is not None]
        for label, share in self.system.switch or ():
            named.append(("switch" if label == "switch" else f"switch {label}", share))
        if self.own is not None:
            named.append(("bench", self.own))
        return named

    @property
    def bound_by(self) -> list[str]:
        """What of the bench's was above :data:`BOUND_FRACTION`: ``rank N``, ``switch
        [NAME]``, ``bench`` (its processes together). Other processes' load is
        :attr:`busy_other`, not this."""
        return [who for who, share in self.shares() if share > BOUND_FRACTION]

    @property
    def bound(self) -> bool:
        """Whether the row's time measures this machine's CPU (see ``bound_by``)."""
        return bool(self.bound_by)

    @property
    def workers_max(self) -> float | None:
        known = [w for w in self.workers if w is not None]
        return max(known) if known else None

    @property
    def switch_max(self) -> float | None:
        return max((s for _, s in self.system.switch), default=None) if self.system.switch else None

    @property
    def switch_shown(self) -> float | None:
        """The busiest switch's share of one core with its data plane: its process plus
        its BPF programs' time (an eBPF switch's work is nearly all the latter)."""
        if not self.system.switch and not self.system.dataplane:
            return None
        total: dict[str, float] = {}
        for label, share in (*(self.system.switch or ()), *(self.system.dataplane or ())):
            total[label] = total.get(label, 0.0) + share
        return max(total.values())

    @property
    def dataplane_cores(self) -> float | None:
        """Cores the switches' data planes used together (``None``: not measured)."""
        if self.system.dataplane is None:
            return None
        return sum(share for _, share in self.system.dataplane)

    def to_json(self) -> dict[str, Any]:
        """The row's ``cpu`` object (``CPU_NOTE`` describes it); shares to 1e-4."""
        known = [w for w in self.workers if w is not None]
        sw, dp = self.system.switch, self.system.dataplane
        return {
            "workers": [_round(w) for w in self.workers],
            "workers_max": _round(self.workers_max),
            "workers_mean": _round(sum(known) / len(known) if known else None),
            "switch": {k: _round(v) for k, v in sw} if sw is not None else None,
            "switch_max": _round(self.switch_max),
            "switch_dataplane": {k: _round(v) for k, v in dp} if dp is not None else None,
            "machine": _round(self.system.machine),
            "softirq": _round(self.system.softirq),
            "steal": _round(self.system.steal),
            "own": _round(self.own),
            "other_cores": _round(self.other_cores),
            "busy_other": self.busy_other,
            "interval_s": _round(self.interval_s, 6),
            "samples": self.system.samples,
            "span_s": _round(self.system.span_s, 6),
            "bound": self.bound,
            "bound_by": self.bound_by,
        }


def _round(x: float | None, digits: int = 4) -> float | None:
    # The counters are no better than this: more digits would only be noise.
    return None if x is None else round(x, digits)


def worker_cpu(per_rank: Sequence[Any]) -> RowCpu | None:
    """The ranks' part of a row from their results at one size (objects with ``cpu_s``,
    ``t_start`` and ``t_end``, index = rank); ``None`` if no rank measured it."""
    fractions: list[float | None] = []
    spans: list[tuple[float, float]] = []
    for r in per_rank:
        t0, t1 = getattr(r, "t_start", 0.0), getattr(r, "t_end", 0.0)
        if t1 > t0 > 0:
            fractions.append(max(getattr(r, "cpu_s", 0.0), 0.0) / (t1 - t0))
            spans.append((t0, t1))
        else:
            fractions.append(None)
    if not spans:
        return None
    return RowCpu(tuple(fractions), min(a for a, _ in spans), max(b for _, b in spans))
