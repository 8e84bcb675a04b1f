"""Unit tests of the bench's CPU accounting: /proc parsing, the sampler, attributing samples
to a row's timed interval, and the CPU-bound flag. No bench processes; the sampler runs on
a fake /proc tree (and once, briefly, on the real one)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from emulation.bench import cpu as cpu_module
from emulation.bench import workers as workers_module
from emulation.bench.cpu import (
    BOUND_FRACTION,
    MAX_SPAN_OVER,
    CpuSampler,
    MachineTicks,
    RowCpu,
    Sample,
    SystemCpu,
    attribute,
    counter_at,
    program_fds,
    read_dataplane_ns,
    read_machine,
    read_process_ticks,
    worker_cpu,
)
from emulation.bench.report import Row, dataplane_note, format_table, size_cpu_note
from emulation.bench.workers import SizeResult, ThreadsCpu, _timed, cpu_between, threads_cpu

HZ = 100


# ----------------------------------------------------------------- reading /proc
def _stat_line(
    user: int, system: int, idle: int, iowait: int = 0, softirq: int = 0, steal: int = 0
) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {user} 0 {system} {idle} {iowait} 0 {softirq} {steal} 7 0\ncpu0 1 2 3 4\n"


def test_read_machine_counts_busy_total_and_softirq(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat_line(user=100, system=50, idle=300, iowait=20, softirq=10))
    # guest (7) is already inside user: not counted twice.
    assert read_machine(stat) == MachineTicks(busy=160, total=480, softirq=10)


def test_read_machine_keeps_stolen_time_out_of_busy(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat_line(user=100, system=50, idle=300, iowait=20, softirq=10, steal=40))
    assert read_machine(stat) == MachineTicks(busy=160, total=520, softirq=10, steal=40)


def test_read_machine_pads_old_kernels_and_fails_soft(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu 10 0 5 85\n")
    assert read_machine(stat) == MachineTicks(busy=15, total=100, softirq=0)
    stat.write_text("intr 1 2 3\n")
    assert read_machine(stat) is None
    stat.write_text("cpu x y z w\n")
    assert read_machine(stat) is None
    assert read_machine(tmp_path / "missing") is None


def test_read_process_ticks_sums_utime_and_stime(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    # A command name with spaces and a ")" must not shift the fields.
    fields = ["S", *["0"] * 10, "70", "30", *["0"] * 30]
    (tmp_path / "42" / "stat").write_text(f"42 (odd ) name) {' '.join(fields)}\n")
    assert read_process_ticks(42, tmp_path) == 100
    assert read_process_ticks(43, tmp_path) is None
    (tmp_path / "42" / "stat").write_text("42 (short) S 1\n")
    assert read_process_ticks(42, tmp_path) is None


def test_read_process_ticks_of_this_process() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc")
    ticks = read_process_ticks(os.getpid())
    assert ticks is not None and ticks >= 0


# ----------------------------------------------------------------- attribution arithmetic
def _sample(t: float, busy: int, total: int, softirq: int = 0, **procs: int) -> Sample:
    return Sample(t, MachineTicks(busy, total, softirq), {(k, 7): v for k, v in procs.items()})


# Two cores at 100 Hz: 200 ticks of total a second. From t=1 to t=2 both cores are busy.
SAMPLES = [
    _sample(0.0, busy=0, total=0, softirq=0, s1=0),
    _sample(1.0, busy=100, total=200, softirq=20, s1=50),
    _sample(2.0, busy=300, total=400, softirq=20, s1=150),
]


def test_counter_at_interpolates_between_samples() -> None:
    points = [(0.0, 0.0), (1.0, 100.0), (2.0, 300.0)]
    assert counter_at(points, 0.5) == pytest.approx(50.0)
    assert counter_at(points, 1.5) == pytest.approx(200.0)
    assert counter_at(points, 1.0) == 100.0  # on a sample: its value
    assert counter_at(points, 2.0) == 300.0
    assert counter_at(points, -0.1) is None
    assert counter_at(points, 2.1) is None
    assert counter_at([], 1.0) is None


def test_attribute_interpolates_at_both_ends_of_the_interval() -> None:
    cpu = attribute(SAMPLES, 0.5, 1.5, ticks=HZ)
    # busy 50 -> 200 (150) of total 100 -> 300 (200); softirq 10 -> 20 (10 of 200).
    assert cpu.machine == pytest.approx(0.75)
    assert cpu.softirq == pytest.approx(0.05)
    # s1: 25 -> 100 ticks in 1 s at 100 Hz = 0.75 of a core.
    assert dict(cpu.switch or ()) == {"s1": pytest.approx(0.75)}
    assert cpu.samples == 1  # t=1.0 is inside
    assert cpu.span_s == pytest.approx(2.0)  # rests on the samples at 0 and 2


def test_attribute_without_samples_inside_takes_the_surrounding_period() -> None:
    cpu = attribute(SAMPLES, 1.2, 1.3, ticks=HZ)
    assert cpu.machine == pytest.approx(1.0)
    assert cpu.softirq == pytest.approx(0.0)
    assert dict(cpu.switch or ()) == {"s1": pytest.approx(1.0)}
    assert cpu.samples == 0
    assert cpu.span_s == pytest.approx(1.0)  # coarse, and says so


def test_attribute_outside_the_samples_knows_nothing() -> None:
    cpu = attribute(SAMPLES, 1.5, 2.5, ticks=HZ)  # ends after the last sample
    assert cpu == SystemCpu(machine=None, softirq=None, switch=None, samples=1, span_s=None)
    assert attribute([], 0.0, 1.0, ticks=HZ) == SystemCpu()


def test_attribute_needs_the_process_on_both_sides_of_each_end() -> None:
    # The switch is watched from t=1 on (started for this algorithm's run).
    samples = [
        _sample(0.0, 0, 0),
        _sample(1.0, 100, 200, s1=0),
        _sample(2.0, 300, 400, s1=40),
    ]
    assert attribute(samples, 0.5, 1.5, ticks=HZ).switch is None
    late = attribute(samples, 1.5, 2.0, ticks=HZ)
    assert dict(late.switch or ()) == {"s1": pytest.approx(0.4)}
    assert late.machine == pytest.approx(1.0)


def test_a_restarted_switch_is_not_one_counter() -> None:
    # Same name, new PID: its counter restarts at 0 and must not count as negative time.
    samples = [
        Sample(0.0, MachineTicks(0, 0, 0), {("switch", 1): 500}),
        Sample(1.0, MachineTicks(100, 200, 0), {("switch", 1): 600}),
        Sample(2.0, MachineTicks(200, 400, 0), {("switch", 2): 10}),
        Sample(3.0, MachineTicks(300, 600, 0), {("switch", 2): 60}),
    ]
    assert dict(attribute(samples, 0.2, 0.8, ticks=HZ).switch or ()) == {
        "switch": pytest.approx(1.0)
    }
    assert dict(attribute(samples, 2.2, 2.8, ticks=HZ).switch or ()) == {
        "switch": pytest.approx(0.5)
    }


def test_attribute_rejects_an_empty_interval() -> None:
    with pytest.raises(ValueError, match="not after"):
        attribute(SAMPLES, 1.0, 1.0)


def test_machine_share_stays_within_one_when_iowait_steps_back() -> None:
    samples = [_sample(0.0, busy=0, total=0), _sample(1.0, busy=210, total=200)]
    assert attribute(samples, 0.0, 1.0, ticks=HZ).machine == 1.0


# ----------------------------------------------------------------- a row's CPU and the flag
def _result(cpu_s: float, t0: float, t1: float) -> SizeResult:
    return SizeResult(4096, 1024, 1.0, 0, 0.0, cpu_s=cpu_s, t_start=t0, t_end=t1)


def test_worker_cpu_is_each_ranks_own_over_the_union_of_intervals() -> None:
    cpu = worker_cpu([_result(0.5, 10.0, 11.0), _result(0.2, 10.1, 11.2)])
    assert cpu is not None
    assert cpu.workers == pytest.approx((0.5, 0.2 / 1.1))
    assert (cpu.start, cpu.end) == (10.0, 11.2)
    assert cpu.interval_s == pytest.approx(1.2)
    assert worker_cpu([SizeResult(4096, 1024, 1.0, 0, 0.0)]) is None  # not measured
    partial = worker_cpu([_result(0.5, 10.0, 11.0), SizeResult(4096, 1024, 1.0, 0, 0.0)])
    assert partial is not None and partial.workers == (0.5, None)


def test_timed_counts_no_cpu_outside_its_wall_interval() -> None:
    # Another thread of the rank, holding the GIL in switch-interval slices (5 ms), must
    # not lend the timed calls (a tenth of a millisecond each) CPU time it spent before
    # or after their wall interval: no share can exceed every core.
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    def work() -> np.ndarray:
        sum(range(5000))
        return x

    x = np.zeros(1, dtype=np.int32)
    other = threading.Thread(target=spin, daemon=True)
    other.start()
    try:
        shares = []
        for _ in range(400):
            _, (elapsed, cpu_s, t0, t1) = _timed(work, 1, x)
            assert t1 - t0 == elapsed > 0
            shares.append(cpu_s / elapsed)
    finally:
        stop.set()
        other.join()
    assert max(shares) <= (os.cpu_count() or 1) * 1.05, sorted(shares)[-5:]


def test_timed_reads_the_cpu_clocks_inside_the_wall_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[str] = []
    now = iter(range(100))
    monkeypatch.setattr(workers_module.time, "monotonic", lambda: reads.append("wall") or next(now))
    real = workers_module.threads_cpu

    def cpu() -> ThreadsCpu:
        reads.append("cpu")
        return real()

    def call() -> np.ndarray:
        reads.append("call")
        return x

    monkeypatch.setattr(workers_module, "threads_cpu", cpu)
    x = np.zeros(1, dtype=np.int32)
    _, (elapsed, _cpu, t0, t1) = _timed(call, 2, x)
    assert reads == ["wall", "cpu", "call", "call", "cpu", "wall"]
    assert (elapsed, t0, t1) == (1, 0, 1)


def test_cpu_between_sums_threads_and_falls_back_when_one_ended() -> None:
    a = ThreadsCpu(process=10.0, threads={1: 4.0, 2: 5.0})
    # Thread 3 started between the reads: all of its time is inside.
    b = ThreadsCpu(process=10.2, threads={1: 4.5, 2: 5.25, 3: 0.125})
    assert cpu_between(a, b) == pytest.approx(0.875)
    # Thread 2 ended: its time is only in the process clock.
    assert cpu_between(a, ThreadsCpu(process=10.7, threads={1: 4.5})) == pytest.approx(0.7)
    assert cpu_between(ThreadsCpu(1.0, {}), ThreadsCpu(1.5, {})) == pytest.approx(0.5)


def test_threads_cpu_reads_every_thread_of_this_process() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        now = threads_cpu()
        assert os.getpid() in now.threads and other.native_id in now.threads
        assert all(v >= 0 for v in now.threads.values())
        assert sum(now.threads.values()) <= now.process + 0.01
    finally:
        stop.set()
        other.join()


def test_with_system_attaches_the_samples_of_the_rows_interval() -> None:
    row = RowCpu((0.3, 0.4), 0.5, 1.5).with_system(SAMPLES, ticks=HZ)
    assert row.system.machine == pytest.approx(0.75)
    assert row.switch_max == pytest.approx(0.75)
    assert RowCpu((0.3,), 1.0, 1.0).with_system(SAMPLES) == RowCpu((0.3,), 1.0, 1.0)


@pytest.mark.parametrize(
    ("workers", "switch", "machine", "bound_by", "busy_other"),
    [
        ((0.5, 0.6), (("s1", 0.5),), 0.85, [], False),
        ((0.5, 0.95), None, 0.8, ["rank 1"], False),
        ((0.3, 0.3), (("s1", 0.93), ("s2", 0.1)), 0.85, ["switch s1"], False),
        ((0.5,), (("switch", 1.4),), 0.97, ["switch", "bench"], False),
        # A busy machine whose load is not the bench's: flagged apart, not CPU-bound.
        ((0.5,), None, 0.97, [], True),
        ((BOUND_FRACTION,), None, BOUND_FRACTION, [], True),  # at the bound is not above it
        ((None, 0.2), None, None, [], False),
    ],
)
def test_cpu_bound_flag_names_what_was_busy(
    workers: tuple[float | None, ...],
    switch: tuple[tuple[str, float], ...] | None,
    machine: float | None,
    bound_by: list[str],
    busy_other: bool,
) -> None:
    cpu = RowCpu(workers, 0.0, 1.0, SystemCpu(machine=machine, switch=switch), cores=2)
    assert cpu.bound_by == bound_by
    assert cpu.bound is bool(bound_by)
    assert cpu.busy_other is busy_other
    doc = cpu.to_json()
    assert doc["bound"] is bool(bound_by) and doc["bound_by"] == bound_by
    assert doc["busy_other"] is busy_other


def test_other_cores_are_the_machine_less_the_benchs_own() -> None:
    cpu = RowCpu((0.5, 0.5), 0.0, 1.0, SystemCpu(machine=0.8, softirq=0.1), cores=4)
    assert cpu.own == pytest.approx(1.0 / 4 + 0.1)
    assert cpu.other_cores == pytest.approx((0.8 - 0.35) * 4)
    assert RowCpu((1.0,), 0.0, 1.0, SystemCpu(machine=0.2), cores=2).other_cores == 0.0


def test_other_cores_are_not_told_for_a_row_shorter_than_its_samples() -> None:
    # The loopback bench's 4 KiB row: 3.8 ms of timed calls between samples 26 ms apart,
    # around it the ranks' warm-up and checks: the machine 0.8 busy, the ranks' exact
    # clocks 0.41 of it. Not 0.77 of a core of other processes.
    def row(interval: float, span: float) -> RowCpu:
        system = SystemCpu(machine=0.8, samples=0, span_s=span)
        return RowCpu((0.2, 0.2, 0.2, 0.2), 10.0, 10.0 + interval, system, cores=2)

    short = row(0.0038, 0.026)
    assert short.other_cores is None and not short.busy_other
    assert short.to_json()["other_cores"] is None
    assert row(0.25, 0.25 * (1 + MAX_SPAN_OVER)).other_cores == pytest.approx((0.8 - 0.4) * 2)
    assert row(0.25, 0.25 * (1 + MAX_SPAN_OVER) + 0.001).other_cores is None


def test_row_cpu_json_has_every_field() -> None:
    cpu = RowCpu(
        (0.25, 0.75),
        10.0,
        10.004,
        SystemCpu(
            machine=0.5,
            softirq=0.125,
            steal=0.0625,
            switch=(("s1", 0.9375),),
            dataplane=(("s1", 0.375),),
            samples=0,
            span_s=0.03,
        ),
        cores=4,
    )
    assert cpu.to_json() == {
        "workers": [0.25, 0.75],
        "workers_max": 0.75,
        "workers_mean": 0.5,
        "switch": {"s1": 0.9375},
        "switch_max": 0.9375,
        "switch_dataplane": {"s1": 0.375},
        "machine": 0.5,
        "softirq": 0.125,
        "steal": 0.0625,
        "own": 0.5,  # (0.25 + 0.75 + 0.9375) / 4 cores + softirq 0.125, at most the machine
        "other_cores": None,  # 4 ms resting on 30 ms of samples: not told
        "busy_other": False,
        "interval_s": pytest.approx(0.004),
        "samples": 0,
        "span_s": 0.03,
        "bound": True,
        "bound_by": ["switch s1"],
    }
    empty = RowCpu((None,), 0.0, 1.0).to_json()
    assert empty["switch"] is None and empty["machine"] is None and empty["workers_max"] is None
    assert empty["bound"] is False


def _fake_fds(root: Path, pid: int, fds: dict[int, tuple[str, str]]) -> None:
    """Process ``pid``'s descriptors in a fake /proc: fd -> (link target, fdinfo text)."""
    for sub in ("fd", "fdinfo"):
        (root / str(pid) / sub).mkdir(parents=True, exist_ok=True)
    for fd, (target, info) in fds.items():
        link = root / str(pid) / "fd" / str(fd)
        link.unlink(missing_ok=True)
        link.symlink_to(target)  # dangling, as anon_inode targets are
        (root / str(pid) / "fdinfo" / str(fd)).write_text(info)


def _prog_info(prog_id: int, run_ns: int) -> str:
    return (f"pos:\t0\nflags:\t02000002\nprog_type:\t3\nprog_id:\t{prog_id}\n"
            f"run_time_ns:\t{run_ns}\nrun_cnt:\t7\n")  # fmt: skip


def test_read_dataplane_ns_sums_each_program_once(tmp_path: Path) -> None:
    _fake_fds(tmp_path, 42, {
        3: ("anon_inode:bpf-map", "map_type:\t2\nmap_id:\t9\n"),
        4: ("anon_inode:bpf-prog", _prog_info(11, 1500)),
        5: ("anon_inode:bpf-prog", _prog_info(11, 1500)),  # the same program again
        6: ("anon_inode:bpf-prog", _prog_info(12, 250)),
        7: ("anon_inode:bpf_link", "link_type:\ttcx\nprog_id:\t11\n"),
        8: ("/dev/null", "pos:\t0\n"),
    })  # fmt: skip
    assert read_dataplane_ns(42, tmp_path) == 1750
    assert sorted(program_fds(42, tmp_path)) == ["4", "5", "6"]
    assert read_dataplane_ns(42, tmp_path, ["6"]) == 250  # through known descriptors
    assert read_dataplane_ns(42, tmp_path, ["3"]) is None  # a map's: no program there
    _fake_fds(tmp_path, 43, {3: ("anon_inode:bpf-map", "map_id:\t9\n")})
    assert read_dataplane_ns(43, tmp_path) is None  # no program: not a data plane
    assert read_dataplane_ns(44, tmp_path) is None  # no such process
    _fake_fds(tmp_path, 45, {3: ("anon_inode:bpf-prog", "prog_type:\t3\nprog_id:\t1\n")})
    assert read_dataplane_ns(45, tmp_path) is None  # a kernel that does not time programs


@pytest.mark.ebpf
@pytest.mark.root
def test_read_dataplane_ns_of_a_real_program() -> None:
    from emulation.softswitch.ebpf.dataplane import EbpfDataplane

    dataplane = EbpfDataplane(lanes=64, slots=64)
    try:
        with CpuSampler(period_s=60) as sampler, sampler.watching({"s1": os.getpid()}):
            assert sampler.dataplane_error is None
            before = read_dataplane_ns(os.getpid())
            start = time.monotonic()
            runs = [dataplane.run(b"\0" * 60) for _ in range(200)]
            end = time.monotonic()
            after = read_dataplane_ns(os.getpid())
        assert before is not None and after is not None and after > before
        cpu = attribute(sampler.samples(), start, end)
        assert cpu.dataplane is not None and cpu.dataplane[0][0] == "s1"
        assert 0.0 < cpu.dataplane[0][1] <= 1.0
        assert all(r.retval >= 0 for r in runs)
    finally:
        dataplane.close()
    assert read_dataplane_ns(os.getpid()) is None  # the program went with close()


# ----------------------------------------------------------------- the sampler
def _fake_proc(root: Path, busy: int, total: int, switch_ticks: int) -> None:
    (root / "stat").write_text(_stat_line(user=busy, system=0, idle=total - busy))
    (root / "77").mkdir(exist_ok=True)
    fields = ["S", *["0"] * 10, str(switch_ticks), "0", *["0"] * 30]
    (root / "77" / "stat").write_text(f"77 (python) {' '.join(fields)}\n")


def test_sampler_samples_watched_processes_only_while_watched(tmp_path: Path) -> None:
    _fake_proc(tmp_path, busy=10, total=100, switch_ticks=5)
    with CpuSampler(period_s=0.005, proc=tmp_path) as sampler:
        with sampler.watching({"s1": 77}):
            _fake_proc(tmp_path, busy=20, total=200, switch_ticks=9)
            time.sleep(0.05)
        after = time.monotonic()
        time.sleep(0.02)
    samples = sampler.samples()
    assert len(samples) >= 4
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert all(s.machine is not None for s in samples)
    watched = [s for s in samples if ("s1", 77) in s.procs]
    assert watched and watched[-1].procs[("s1", 77)] == 9
    assert not [s for s in samples if s.t > after and s.procs]  # the watch ended
    sampler.discard_before(after)
    kept = sampler.samples()
    assert kept[0].t <= after < kept[1].t  # the sample before ``after`` stays: it brackets it


def test_sampler_times_data_planes_once_a_watched_process_holds_one(tmp_path: Path) -> None:
    _fake_proc(tmp_path, busy=10, total=100, switch_ticks=5)
    (tmp_path / "78").mkdir()
    (tmp_path / "78" / "stat").write_text((tmp_path / "77" / "stat").read_text())
    turned_on: list[int] = []

    def stats() -> int:
        turned_on.append(os.open(os.devnull, os.O_RDONLY))
        return turned_on[-1]

    with CpuSampler(period_s=0.005, proc=tmp_path, stats=stats) as sampler:
        with sampler.watching({"python-switch": 78}):  # no program: no statistics
            time.sleep(0.02)
        assert not turned_on
        _fake_fds(tmp_path, 77, {9: ("anon_inode:bpf-prog", _prog_info(5, 1_000))})
        with sampler.watching({"s1": 77}):
            assert len(turned_on) == 1
            start = time.monotonic()
            _fake_fds(tmp_path, 77, {9: ("anon_inode:bpf-prog", _prog_info(5, 301_000_000))})
            time.sleep(0.05)
            end = time.monotonic()
        with sampler.watching({"s2": 77}):
            pass
        assert len(turned_on) == 1  # once for the run
    with pytest.raises(OSError):
        os.fstat(turned_on[0])  # stop() turned the statistics off
    assert all(("s1", 77) not in s.dataplanes for s in sampler.samples() if s.t < start - 1)
    cpu = attribute(sampler.samples(), start, end)
    assert cpu.dataplane is not None and cpu.dataplane[0][0] == "s1"
    assert cpu.dataplane[0][1] > 0


def test_sampler_lists_descriptors_once_and_again_when_the_program_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_proc(tmp_path, busy=10, total=100, switch_ticks=5)
    _fake_fds(tmp_path, 77, {9: ("anon_inode:bpf-prog", _prog_info(5, 1_000))})
    listed: list[int] = []
    real = cpu_module.program_fds

    def counting(pid: int, proc: Path = cpu_module.PROC) -> tuple[str, ...]:
        listed.append(pid)
        return real(pid, proc)

    monkeypatch.setattr(cpu_module, "program_fds", counting)
    sampler = CpuSampler(period_s=60, proc=tmp_path, stats=lambda: os.open(os.devnull, 0))
    with sampler, sampler.watching({"s1": 77}):
        for _ in range(5):
            sampler.sample()
        assert listed == [77]  # looked up once, read six times since
        for gone in ("fd", "fdinfo"):  # the program moves to descriptor 12
            (tmp_path / "77" / gone / "9").unlink()
        _fake_fds(tmp_path, 77, {12: ("anon_inode:bpf-prog", _prog_info(5, 9_000))})
        sampler.sample()  # finds nothing at 9: looks again at the next
        sampler.sample()
    assert listed == [77, 77]
    watched = [s for s in sampler.samples() if ("s1", 77) in s.procs]
    runs = [s.dataplanes.get(("s1", 77)) for s in watched]  # then the watch's last sample:
    assert runs == [1_000] * 6 + [None, 9_000, 9_000]


def test_sampler_says_why_it_cannot_time_data_planes(tmp_path: Path) -> None:
    _fake_proc(tmp_path, busy=10, total=100, switch_ticks=5)
    _fake_fds(tmp_path, 77, {9: ("anon_inode:bpf-prog", _prog_info(5, 1_000))})

    def refused() -> int:
        raise PermissionError(1, "bpf_enable_stats: Operation not permitted")

    with (
        CpuSampler(period_s=0.005, proc=tmp_path, stats=refused) as sampler,
        sampler.watching({"s1": 77}),
    ):
        time.sleep(0.02)
    assert sampler.dataplane_error is not None and "not permitted" in sampler.dataplane_error
    assert not any(s.dataplanes for s in sampler.samples())  # never a false 0%
    start, end = sampler.samples()[0].t, sampler.samples()[-1].t
    assert attribute(sampler.samples(), start, end).dataplane is None


def test_sampler_without_proc_records_nothing_and_raises_nothing(tmp_path: Path) -> None:
    with CpuSampler(period_s=0.005, proc=tmp_path / "none") as sampler:
        assert not sampler.available
        with sampler.watching({"switch": 1}):
            sampler.sample()
    assert sampler.samples() == []
    assert RowCpu((0.5,), 0.0, 1.0).with_system(sampler.samples()).system == SystemCpu()
    with pytest.raises(ValueError, match="positive"):
        CpuSampler(period_s=0)


def test_sampler_on_this_machine() -> None:
    if read_machine() is None:
        pytest.skip("no /proc/stat")
    with CpuSampler(period_s=0.01) as sampler, sampler.watching({"me": os.getpid()}):
        start = time.monotonic()
        time.sleep(0.05)
        end = time.monotonic()
    cpu = attribute(sampler.samples(), start, end)
    assert cpu.machine is not None and 0.0 <= cpu.machine <= 1.0
    assert cpu.softirq is not None and 0.0 <= cpu.softirq <= cpu.machine
    assert cpu.switch is not None and cpu.switch[0][0] == "me" and cpu.switch[0][1] >= 0.0


@pytest.mark.parametrize(
    ("algo", "chosen", "sent_factor"),
    [("ina", None, 1.0), ("ring", None, 1.5), ("gloo", None, 1.5), ("auto", "ina", 1.0)],
)
def test_worker_cpu_per_gbit_sent(algo: str, chosen: str | None, sent_factor: float) -> None:
    # 4 ranks at 0.3 and 0.5 of a core for 0.5 s calls of 125 MB (1 Gbit of data).
    row = Row(algo, 125_000_000, 31_250_000, "int32", 4, 5e5, 5e5, 5e5, 0, chosen=chosen,
              cpu=RowCpu((0.3, 0.5, 0.3, 0.5), 0.0, 1.0))  # fmt: skip
    want = 0.4 * 0.5 / sent_factor
    assert row.worker_cpu_s_per_gbit == pytest.approx(want, abs=1e-4)
    assert row.to_json()["worker_cpu_s_per_gbit"] == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("algo", ["ina", "ring", "gloo", "collnet"])
def test_worker_cpu_per_gbit_of_the_size_is_the_same_denominator_for_every_algorithm(
    algo: str,
) -> None:
    # 4 ranks at 0.3 and 0.5 of a core for 0.5 s calls of 125 MB (1 Gbit of data).
    row = Row(algo, 125_000_000, 31_250_000, "int32", 4, 5e5, 5e5, 5e5, 0,
              cpu=RowCpu((0.3, 0.5, 0.3, 0.5), 0.0, 1.0))  # fmt: skip
    assert row.worker_cpu_s_per_gbit_size == pytest.approx(0.2, abs=1e-4)
    assert row.to_json()["worker_cpu_s_per_gbit_size"] == pytest.approx(0.2, abs=1e-4)
    note = size_cpu_note([row])
    assert note is not None and "0.200 CPU-s per Gbit of the size" in note
    sent = {"ina": "0.200", "ring": "0.133", "gloo": "0.133"}
    sent = {a: f"per Gbit a rank sent: {x}" for a, x in sent.items()}
    assert sent[algo] in note if algo in sent else "a rank sent" not in note
    assert "# worker cpu, largest size:" in format_table(algo, [row])
    assert Row(algo, 1000, 250, "int32", 2, 10.0, 10.0, 10.0, 0).worker_cpu_s_per_gbit_size is None
    assert size_cpu_note([Row(algo, 1000, 250, "int32", 2, 10.0, 10.0, 10.0, 0)]) is None


def test_no_cpu_per_gbit_where_ranks_send_unequal_amounts_or_cpu_was_not_measured() -> None:
    cpu = RowCpu((0.3, 0.5), 0.0, 1.0)
    assert (
        Row("collnet", 1000, 250, "int32", 2, 10.0, 10.0, 10.0, 0, cpu=cpu)
        .to_json()
        .get("worker_cpu_s_per_gbit")
        is None
    )
    assert Row("ina", 1000, 250, "int32", 2, 10.0, 10.0, 10.0, 0).worker_cpu_s_per_gbit is None


def _dataplane_row(dataplane: float | None) -> Row:
    # 4 ranks at 0.4 of a core, 0.5 s calls of 125 MB: 0.2 CPU-s per Gbit (INA).
    programs = (("s1", dataplane),) if dataplane is not None else None
    system = SystemCpu(machine=0.9, switch=(("s1", 0.01),), dataplane=programs)
    cpu = RowCpu((0.4, 0.4, 0.4, 0.4), 0.0, 1.0, system, cores=2)
    return Row("ina", 125_000_000, 31_250_000, "int32", 4, 5e5, 5e5, 5e5, 0, cpu=cpu)


def test_switch_dataplane_cpu_per_gbit_is_on_the_ranks_scale() -> None:
    row = _dataplane_row(0.4)  # the switch's programs: a quarter of the ranks' CPU
    assert row.worker_cpu_s_per_gbit == pytest.approx(0.2)
    assert row.switch_dataplane_cpu_s_per_gbit == pytest.approx(0.05)
    assert row.to_json()["switch_dataplane_cpu_s_per_gbit"] == pytest.approx(0.05)
    assert "switch_dataplane_cpu_s_per_gbit" not in _dataplane_row(None).to_json()
    note = dataplane_note([row])
    assert note is not None and "0.050 CPU-s per Gbit" in note
    assert "about 0.150 was the rest" in note
    assert dataplane_note([_dataplane_row(None)]) is None


def test_switch_column_shows_process_and_data_plane_unflagged() -> None:
    table = format_table("ina", [_dataplane_row(0.95)])
    line = next(x for x in table.splitlines() if x.lstrip().startswith("125000000"))
    # switch 1% + 95%: shown 96, not "!" (the data plane ran on both cores); worker 40.
    assert line.split()[-3:] == ["96", "40", "90"]
    assert "# switch data plane:" in table
