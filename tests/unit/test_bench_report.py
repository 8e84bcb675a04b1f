"""Unit tests of ``inalab bench``'s pure parts: sizes, flags, bandwidth math, table, JSON,
plot, inputs and correctness checks. No processes, no sockets."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from emulation.bench.cli import config_from_args
from emulation.bench.config import (
    DEFAULT_BENCH_LANES,
    DEFAULT_BENCH_SLOTS,
    BenchConfig,
    align_down,
    format_size,
    parse_size,
    size_sweep,
)
from emulation.bench.notes import legend
from emulation.bench.report import (
    JSON_SCHEMA,
    Row,
    bound_note,
    bus_factor,
    format_oracle,
    format_table,
    make_document,
    merge_ranks,
    oracle_points,
    oracle_summary,
    write_json,
    write_plot,
)
from emulation.bench.workers import count_wrong, make_input, reference
from emulation.cli import build_parser
from hostlib.protocol import TNA_LANES_PER_PACKET


# ----------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4k", 4096),
        ("1M", 1 << 20),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        (" 16K ", 16384),
        ("3", 3),
    ],
)
def test_parse_size_accepts_nccl_tests_syntax(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "4X", "-4K", "1.5K", "4KB", "0", "0K", "4 K B"])
def test_parse_size_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_format_size_round_trips() -> None:
    for n in (1, 3, 4096, 4097, 1 << 20, 3 << 20, 1 << 30, 4 << 30):
        assert parse_size(format_size(n)) == n
    assert format_size(4096) == "4K"
    assert format_size(16 << 20) == "16M"
    assert format_size(4097) == "4097"


def test_size_sweep_follows_nccl_tests() -> None:
    assert size_sweep(4 << 10, 16 << 20, 4) == [4 << (10 + 2 * k) for k in range(7)]
    assert size_sweep(4 << 10, 64 << 10, 4) == [4096, 16384, 65536]
    assert size_sweep(4096, 4096, 2) == [4096]
    assert size_sweep(4096, 10000, 2) == [4096, 8192]  # the max need not be on the grid


@pytest.mark.parametrize(
    ("lo", "hi", "f", "message"),
    [(1 << 20, 4096, 4, "larger than"), (4096, 1 << 20, 1, "stepfactor"), (0, 4096, 2, "positive")],
)
def test_size_sweep_rejects_bad_ranges(lo: int, hi: int, f: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        size_sweep(lo, hi, f)


def test_align_down() -> None:
    assert align_down(4097, 4) == 4096
    assert align_down(4096, 4) == 4096
    assert align_down(3, 4) == 0


def test_bench_config_validates() -> None:
    cfg = BenchConfig(sizes=(4096,))
    assert cfg.lanes == DEFAULT_BENCH_LANES
    assert cfg.slots == DEFAULT_BENCH_SLOTS
    assert cfg.algos == ("ina", "gloo")
    with pytest.raises(ValueError, match="multiples"):
        BenchConfig(sizes=(4098,))
    with pytest.raises(ValueError, match="workers"):
        BenchConfig(sizes=(4096,), workers=33)
    with pytest.raises(ValueError, match="loss"):
        BenchConfig(sizes=(4096,), loss=1.0)
    with pytest.raises(ValueError, match="algos"):
        BenchConfig(sizes=(4096,), algos=("nccl",))


# ----------------------------------------------------------------- flags
def test_bench_flag_defaults() -> None:
    args = build_parser().parse_args(["bench"])
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (4 << 10, 16 << 20, 4)
    assert (args.iters, args.warmup_iters, args.workers) == (5, 2, 4)
    assert args.algos is None and args.collective == "allreduce"  # resolved per collective
    assert config_from_args(args).algos == ("ina", "gloo")
    assert args.datatype == "float32"
    assert args.loss == 0.0
    # The lanes' default depends on --program: resolved with the rest of the run's flags.
    assert args.lanes is None and args.program == "v1model"
    assert config_from_args(args).lanes == DEFAULT_BENCH_LANES
    tna = build_parser().parse_args(["bench", "--program", "tna"])
    tna_config = config_from_args(tna)
    assert (tna_config.lanes, tna_config.program) == (TNA_LANES_PER_PACKET, "tna")
    assert args.slots == DEFAULT_BENCH_SLOTS
    assert args.timeout == 10.0
    assert args.json is None and args.plot is None and not args.switch_only


def test_bench_short_flags() -> None:
    argv = "bench -b 1K -e 1M -f 2 -n 3 -w 0 -d int32 --algos gloo,ina --workers 2"
    args = build_parser().parse_args(argv.split())
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (1024, 1 << 20, 2)
    assert (args.iters, args.warmup_iters, args.datatype) == (3, 0, "int32")
    assert args.algos == ("ina", "gloo")  # canonical order, whatever the order given


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-b", "4X"], "invalid size"),
        (["-e", "lots"], "invalid size"),
        (["-f", "1"], "outside"),
        (["--algos", "nccl"], "invalid algorithms"),
        (["--algos", ""], "invalid algorithms"),
        (["--loss", "1"], "outside"),
        (["--loss", "x"], "invalid probability"),
        (["--workers", "0"], "outside"),
        (["--workers", "33"], "outside"),
        (["-d", "float16"], "invalid choice"),
        (["--timeout", "0"], "must be positive"),
        (["--lanes", "4096"], "outside"),
    ],
)
def test_bench_bad_flags_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["bench", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# ----------------------------------------------------------------- bandwidth math
def test_bus_factor_is_nccl_tests_allreduce() -> None:
    assert bus_factor(1) == 0.0
    assert bus_factor(2) == 1.0
    assert bus_factor(4) == 1.5
    assert bus_factor(8) == 1.75
    with pytest.raises(ValueError):
        bus_factor(0)


def _row(algo: str = "ina", nbytes: int = 1_000_000, t: float = 1000.0, n: int = 4) -> Row:
    return Row(algo, nbytes, nbytes // 4, "float32", n, t * 0.9, t * 0.8, t, 0)


def test_algbw_and_busbw_use_slowest_rank() -> None:
    r = _row(nbytes=1_000_000, t=1000.0, n=4)  # 1 MB in 1 ms = 1 GB/s (1e9)
    assert r.algbw == pytest.approx(1.0)
    assert r.busbw == pytest.approx(1.5)
    assert Row("gloo", 8, 2, "int32", 2, 0.0, 0.0, 0.0, 0).algbw == 0.0


@dataclass
class _Res:
    nbytes: int
    count: int
    mean_us: float
    wrong: int
    max_abs_err: float = 0.0


def test_merge_ranks_takes_mean_min_max_and_sums_wrong() -> None:
    per_rank = [
        [_Res(4096, 1024, 10.0, 0), _Res(16384, 4096, 40.0, 1, 0.5)],
        [_Res(4096, 1024, 30.0, 2), _Res(16384, 4096, 20.0, 0, 0.25)],
    ]
    rows = merge_ranks("gloo", "float32", per_rank)
    assert [r.nbytes for r in rows] == [4096, 16384]
    assert (rows[0].time_us_mean, rows[0].time_us_min, rows[0].time_us_max) == (20.0, 10.0, 30.0)
    assert rows[0].wrong == 2 and rows[1].wrong == 1
    assert rows[1].max_abs_err == 0.5
    assert rows[0].num_workers == 2
    with pytest.raises(ValueError, match="different sizes"):
        merge_ranks("gloo", "float32", [per_rank[0], per_rank[1][:1]])
    with pytest.raises(ValueError):
        merge_ranks("gloo", "float32", [])


# ----------------------------------------------------------------- table
def test_table_has_nccl_tests_columns_and_note() -> None:
    rows = [_row(nbytes=4096, t=12.345), _row(nbytes=16 << 20, t=123456.0)]
    text = format_table("ina", rows, "soft switch")
    lines = text.splitlines()
    header = next(line for line in lines if "size" in line and "#wrong" in line)
    for col in ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"):
        assert col in header
    assert any("(B)" in line and "(elements)" in line and "(GB/s)" in line for line in lines)
    assert "exceed the link rate" not in text and "busbw =" not in text  # the legend's
    data = [line for line in lines if not line.startswith("#")]
    assert len(data) == 2
    fields = data[0].split()
    assert fields[:4] == ["4096", "1024", "float32", "sum"]
    assert fields[4] == "12.35" and fields[-1] == "0"
    assert data[1].split()[4] == "123456"  # large times lose their decimals, not width
    assert len({len(line) for line in data}) == 1  # fixed-width columns
    assert "Out of bounds values : 0 OK" in text


def test_table_reports_failures() -> None:
    bad = Row("gloo", 4096, 1024, "float32", 2, 1.0, 1.0, 1.0, 7)
    assert "7 FAILED" in format_table("gloo", [bad])


# ----------------------------------------------------------------- JSON
def test_json_document_schema(tmp_path: Path) -> None:
    meta = {"workers": 4, "lanes": 256, "loss": 0.0, "dtype": "float32", "switch_counters": {}}
    rows = [_row("ina"), _row("gloo")]
    path = tmp_path / "bench.json"
    write_json(path, make_document(meta, rows))
    doc = json.loads(path.read_text())
    assert doc["schema"] == JSON_SCHEMA
    assert doc["metadata"] == meta
    assert "slowest rank" in doc["notes"]["timing"]
    assert "exceed the link rate" in doc["notes"]["busbw"]
    assert [r["algo"] for r in doc["rows"]] == ["ina", "gloo"]
    row = doc["rows"][0]
    assert set(row) == {
        "algo",
        "size_bytes",
        "count",
        "type",
        "collective",
        "redop",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
        "max_abs_err",
        "retransmits",
            "retransmits_fast",
            "retransmits_timed",
            "late_samples",
            "host_drops",
            "late_answers",
            "late_timers",
    }
    assert set(row["time_us"]) == {"mean", "min", "max"}
    assert row["time_us"]["max"] == 1000.0
    assert row["algbw_gbps"] == pytest.approx(1.0)
    assert row["busbw_gbps"] == pytest.approx(1.5)


# ----------------------------------------------------------------- plot
@pytest.mark.slow
def test_plot_writes_png(tmp_path: Path) -> None:
    rows = [
        _row(algo, nbytes=s, t=t)
        for algo, scale in (("ina", 1.0), ("gloo", 2.0))
        for s, t in ((4096, 10.0 * scale), (65536, 50.0 * scale), (1 << 20, 400.0 * scale))
    ]
    path = tmp_path / "bench.png"
    write_plot(path, rows, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.png"
    write_plot(empty, [])
    assert empty.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------- inputs and checks
def test_inputs_are_deterministic_and_small() -> None:
    a = make_input(3, 1, 10000, "int32")
    assert a.dtype == np.int32
    assert np.array_equal(a, make_input(3, 1, 10000, "int32"))
    assert not np.array_equal(a, make_input(3, 2, 10000, "int32"))
    assert not np.array_equal(a, make_input(4, 1, 10000, "int32"))
    assert np.abs(a).max() <= 1000
    f = make_input(0, 0, 100000, "float32")
    assert f.dtype == np.float32 and np.isfinite(f).all()
    assert len(np.unique(np.frexp(f[f != 0])[1])) > 5  # magnitudes vary across blocks
    with pytest.raises(ValueError):
        make_input(0, 0, 4, "float16")


def test_reference_is_the_float64_sum() -> None:
    n, count = 4, 5000
    xs = [make_input(7, r, count, "float32").astype(np.float64) for r in range(n)]
    ref, absmax = reference(7, n, count, "float32")
    assert np.array_equal(ref, sum(xs))
    assert np.array_equal(absmax, np.max(np.abs(xs), axis=0))


def test_count_wrong_int32_is_exact() -> None:
    ref, absmax = reference(0, 3, 1000, "int32")
    good = ref.astype(np.int32)
    assert count_wrong("ina", good, ref, absmax, 3, 256) == (0, 0.0)
    bad = good.copy()
    bad[[1, 5]] += 1
    assert count_wrong("gloo", bad, ref, absmax, 3, 256) == (2, 1.0)


def test_count_wrong_gloo_float_tolerance() -> None:
    ref, absmax = reference(0, 4, 4096, "float32")
    y = ref.astype(np.float32)
    assert count_wrong("gloo", y, ref, absmax, 4, 256)[0] == 0
    y[10] += np.float32(1e-2 * np.abs(ref).max())
    assert count_wrong("gloo", y, ref, absmax, 4, 256)[0] == 1
    with pytest.raises(ValueError, match="shape"):
        count_wrong("gloo", y[:-1], ref, absmax, 4, 256)


def test_count_wrong_ina_uses_quantisation_bound() -> None:
    quantize = pytest.importorskip("hostlib.quantize")
    ref, absmax = reference(0, 4, 4096, "float32")
    bound = quantize.error_bound(absmax, 4, 256, ref)
    inside = (ref + 0.5 * bound).astype(np.float32)
    # float32 rounding adds at most half an ulp; keep the test about the bound itself.
    inside = np.where(np.abs(inside - ref) <= bound, inside, ref.astype(np.float32))
    assert count_wrong("ina", inside, ref, absmax, 4, 256)[0] == 0
    outside = inside.copy()
    outside[3] = np.float32(ref[3] + 4 * bound[3] + 1e-3)
    assert count_wrong("ina", outside, ref, absmax, 4, 256)[0] == 1


def test_udp_counters_parse_proc_net_snmp(tmp_path: Path) -> None:
    from emulation.bench.sweep import udp_counters

    snmp = tmp_path / "snmp"
    snmp.write_text(
        "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
        "Udp: InDatagrams NoPorts InErrors RcvbufErrors\nUdp: 10 0 3 3\n"
        "UdpLite: InDatagrams\nUdpLite: 0\n"
    )
    assert udp_counters(snmp) == {"InDatagrams": 10, "NoPorts": 0, "InErrors": 3, "RcvbufErrors": 3}
    assert udp_counters(tmp_path / "missing") == {}


# ----------------------------------------------------------------- auto against the oracle
def _times(
    algo: str, times_us: dict[int, float], chosen: dict[int, str] | None = None
) -> list[Row]:
    return [
        Row(algo, n, n // 4, "float32", 4, t, t, t, 0, chosen=None if chosen is None else chosen[n])
        for n, t in times_us.items()
    ]


def test_oracle_regret_and_mixed_workload_gain() -> None:
    # Tree wins small, ring wins large; auto picks tree, tree, ring (one miss at 64K).
    rows = [
        *_times("ina", {4096: 300.0, 65536: 900.0, 1 << 20: 9000.0}),
        *_times("ring", {4096: 200.0, 65536: 500.0, 1 << 20: 4000.0}),
        *_times("tree", {4096: 100.0, 65536: 600.0, 1 << 20: 8000.0}),
        *_times(
            "auto",
            {4096: 110.0, 65536: 620.0, 1 << 20: 4100.0},
            {4096: "tree", 65536: "tree", 1 << 20: "ring"},
        ),
    ]
    points = oracle_points(rows, ["ina", "ring", "tree"])
    assert [(p.nbytes, p.oracle, p.chosen) for p in points] == [
        (4096, "tree", "tree"),
        (65536, "ring", "tree"),
        (1 << 20, "ring", "ring"),
    ]
    assert [p.regret for p in points] == pytest.approx([0.0, 0.2, 0.0])
    assert points[0].auto_regret == pytest.approx(0.1)
    summary = oracle_summary(points)
    assert summary["mean_regret"] == pytest.approx(0.2 / 3)
    assert summary["max_regret"] == pytest.approx(0.2)
    assert summary["agreement"] == pytest.approx(2 / 3)
    # Every size once: ring 4700 us is the best static; the choices cost 100+600+4000.
    assert summary["best_static"] == "ring"
    assert summary["workload_us"]["chosen"] == pytest.approx(4700.0)
    assert summary["gain_over_best_static"] == pytest.approx(1.0)
    assert summary["auto_gain_over_best_static"] == pytest.approx(4700.0 / 4830.0)
    text = format_oracle(points, summary)
    assert "Mean regret          : 6.7%" in text and "gain 1.00x" in text
    assert json.loads(json.dumps(summary))["points"][1]["oracle"] == "ring"


def test_oracle_skips_sizes_whose_choice_did_not_run_statically() -> None:
    rows = [
        *_times("ring", {4096: 200.0, 65536: 500.0}),
        *_times("auto", {4096: 210.0, 65536: 300.0}, {4096: "ring", 65536: "ina"}),
    ]
    points = oracle_points(rows, ["ina", "ring", "tree"])
    assert [p.nbytes for p in points] == [4096]
    with pytest.raises(ValueError, match="no sizes"):
        oracle_summary([])


def test_auto_rows_carry_the_choice_into_table_and_json() -> None:
    rows = _times("auto", {4096: 100.0}, {4096: "tree"})
    assert rows[0].to_json()["chosen"] == "tree"
    assert "chosen" not in _row().to_json()
    table = format_table("auto", rows).splitlines()
    head = next(i for i, line in enumerate(table) if "#wrong" in line)
    assert "chosen" in table[head] and table[head + 2].endswith("tree")
    assert "chosen" not in format_table("ina", [_row()])


def test_the_table_counts_retransmissions_except_for_gloo() -> None:
    row = replace(_row(), retransmits=17)
    ina = format_table("ina", [row]).splitlines()
    head = next(i for i, line in enumerate(ina) if "#wrong" in line)
    assert ina[head].split()[-1] == "retx" and ina[head + 2].split()[-1] == "17"
    assert "retx =" not in "\n".join(ina)  # explained once, in the legend
    assert "retx" not in format_table("gloo", [row])


def test_count_wrong_ring_and_tree_use_the_float32_summation_bound() -> None:
    n, count = 4, 3000
    ref, absmax = reference(1, n, count, "float32")
    exact = ref.astype(np.float32)
    assert count_wrong("ring", exact, ref, absmax, n, 64) == (0, pytest.approx(0.0, abs=1e-6))
    off = exact.copy()
    off[7] += np.float32(1e-2 + 10 * absmax[7])  # far beyond (n-1) * 2**-23 * n * max|x|
    wrong, _ = count_wrong("tree", off, ref, absmax, n, 64)
    assert wrong == 1


# ----------------------------------------------------------------- CPU use per row
def _cpu_row(
    nbytes: int, workers: tuple[float, ...], switch: float | None, machine: float | None
) -> Row:
    from emulation.bench.cpu import RowCpu, SystemCpu

    system = SystemCpu(
        machine=machine,
        softirq=0.0 if machine is not None else None,
        switch=None if switch is None else (("switch", switch),),
        samples=3,
        span_s=0.1,
    )
    return dataclasses.replace(_row(nbytes=nbytes), cpu=RowCpu(workers, 1.0, 1.08, system, cores=2))


def test_merge_ranks_records_each_ranks_cpu() -> None:
    from emulation.bench.workers import SizeResult

    per_rank = [
        [SizeResult(4096, 1024, 10.0, 0, 0.0, cpu_s=0.05, t_start=5.0, t_end=5.1)],
        [SizeResult(4096, 1024, 12.0, 0, 0.0, cpu_s=0.1, t_start=5.02, t_end=5.12)],
    ]
    (row,) = merge_ranks("ina", "float32", per_rank)
    assert row.cpu is not None
    assert row.cpu.workers == pytest.approx((0.5, 1.0))
    assert (row.cpu.start, row.cpu.end) == (5.0, 5.12)
    assert row.cpu.bound_by == ["rank 1"]
    assert row.to_json()["cpu"]["workers"] == [0.5, 1.0]


def test_table_shows_cpu_and_flags_bound_rows() -> None:
    rows = [
        _cpu_row(4096, (0.2, 0.3), 0.5, 0.6),
        _cpu_row(65536, (0.2, 0.3), 0.97, 0.8),
        _cpu_row(1 << 20, (0.2, 0.3), None, None),
    ]
    text = format_table("ina", rows)
    lines = text.splitlines()
    header = next(line for line in lines if "#wrong" in line)
    assert header.split()[-3:] == ["switch", "worker", "machine"]
    data = [line for line in lines if not line.startswith("#")]
    assert [line.split()[-3:] for line in data] == [
        ["50", "30", "60"],
        ["97!", "30", "80"],
        ["-", "30", "-"],
    ]
    assert len({len(line) for line in data}) == 1  # still fixed width
    # The numbers' last digits line up under the headers' last letters.
    assert header.rstrip().rindex("machine") + len("machine") == data[0].rstrip().rindex("60") + 2
    assert bound_note() not in text  # explained once, in the legend
    assert "not the network or the algorithm" in bound_note()
    assert legend(rows)[-1] == bound_note()
    assert not any("CPU-bound" in line for line in legend(rows[:1]))


def test_json_rows_carry_a_cpu_object(tmp_path: Path) -> None:
    rows = [_cpu_row(4096, (0.2, 0.95), 0.5, 0.6), _row("gloo")]
    path = tmp_path / "bench.json"
    write_json(path, make_document({}, rows))
    doc = json.loads(path.read_text())
    cpu = doc["rows"][0]["cpu"]
    assert cpu["workers"] == [0.2, 0.95] and cpu["workers_max"] == 0.95
    assert cpu["switch"] == {"switch": 0.5} and cpu["machine"] == 0.6 and cpu["softirq"] == 0.0
    assert cpu["bound"] is True and cpu["bound_by"] == ["rank 1"]
    assert cpu["interval_s"] == pytest.approx(0.08) and cpu["samples"] == 3
    assert "cpu" not in doc["rows"][1]  # not measured: no key, as before
    assert "not the network" in doc["notes"]["cpu"]


def test_plot_marks_cpu_bound_points_hollow(tmp_path: Path) -> None:
    from emulation.bench.report import plot_figure

    rows = [
        _cpu_row(4096, (0.2,), 0.5, 0.5),
        _cpu_row(65536, (0.9, 0.9), 0.5, 0.99),  # the bench's processes: 2.3 of 2 cores
        _cpu_row(262144, (0.2,), 0.1, 0.99),  # other load: flagged apart, not hollow
        _cpu_row(1 << 20, (0.2,), 0.95, 0.5),
    ]
    fig = plot_figure(rows, "t")
    for ax in fig.axes:
        hollow = [ln for ln in ax.lines if ln.get_markerfacecolor() == "none"]
        marked = [list(ln.get_xdata()) for ln in hollow if len(ln.get_xdata())]
        assert marked == [[65536, 1 << 20]]
        filled = [ln for ln in ax.lines if ln.get_marker() == "o" and ln not in hollow]
        assert [list(ln.get_xdata()) for ln in filled] == [[4096, 262144]]
        assert any("CPU-bound" in t.get_text() for t in ax.get_legend().get_texts())
    unbound = plot_figure([_cpu_row(4096, (0.2,), 0.5, 0.5)])
    assert not any("CPU-bound" in t.get_text() for t in unbound.axes[0].get_legend().get_texts())
    path = tmp_path / "bound.png"
    write_plot(path, rows)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_host_drops_get_a_footnote_and_a_json_field() -> None:
    quiet, dropped = _row(), dataclasses.replace(_row(nbytes=2_000_000), host_drops=7)
    assert "host drops" not in format_table("ina", [quiet])
    table = format_table("ina", [quiet, dropped])
    assert "dropped 7 datagrams for full socket receive buffers" in table
    assert dropped.to_json()["host_drops"] == 7
    assert "host drops" not in format_table("gloo", [dropped])  # TCP's are its own


@pytest.mark.parametrize(
    ("field", "count", "line"),
    [
        ("late_answers", 5, "late answers: 5 packets reached a rank twice"),
        ("late_timers", 3, "late timers: 3 timers expired while their rank"),
    ],
)
def test_late_counts_get_a_footnote_and_a_json_field(field: str, count: int, line: str) -> None:
    quiet, late = _row(), dataclasses.replace(_row(nbytes=2_000_000), **{field: count})
    assert line.split(":")[0] not in format_table("ina", [quiet])
    assert line in format_table("ina", [quiet, late])
    assert late.to_json()[field] == count
    assert getattr(Row.from_json(late.to_json(), late.num_workers), field) == count


def test_switch_counters_explain_ignored_duplicates_and_drops() -> None:
    from emulation.bench.report import switch_notes

    counters = {
        "s1": {"duplicates_ignored": 7, "drop_stale": 2, "drop_bad_rank": 0, "cpu_ms": 110},
        "s2": {"duplicates_ignored": 1, "drop_sim_ingress": 3},
    }
    dups, drops = switch_notes(counters)
    assert dups.startswith("# switch: 8 packets came for a slot that already held theirs")
    assert drops.startswith("# switch drops: drop_sim_ingress 3, drop_stale 2 (JSON")
    assert switch_notes({"s1": {"duplicates_ignored": 0, "received": 5}}) == []
    one = switch_notes({"duplicates_ignored": 2, "received": 9, "cpu_ms": 3})  # loopback's
    assert len(one) == 1 and one[0].startswith("# switch: 2 packets")
    assert switch_notes({}) == []


def test_link_drops_get_a_line_naming_the_interfaces() -> None:
    from emulation.bench.report import RETX_NOTE, link_drops_note

    line = link_drops_note({"s1-eth3": 40, "h1-eth0": 2})
    assert line is not None
    assert line.startswith("# link drops: the emulated links dropped 42 frames")
    assert "h1-eth0 2, s1-eth3 40; JSON metadata link_drops" in line
    assert link_drops_note({}) is None
    assert "link_drops" in RETX_NOTE


def test_stolen_time_gets_a_line_under_the_table() -> None:
    def with_steal(row: Row, steal: float) -> Row:
        assert row.cpu is not None
        system = dataclasses.replace(row.cpu.system, steal=steal)
        return dataclasses.replace(row, cpu=dataclasses.replace(row.cpu, system=system))

    calm = with_steal(_cpu_row(4096, (0.2,), 0.1, 0.3), 0.005)
    stolen = with_steal(_cpu_row(8192, (0.2,), 0.1, 0.3), 0.04)
    assert "steal" not in format_table("ina", [calm])
    table = format_table("ina", [calm, stolen])
    assert "# steal: the hypervisor took up to 4.0% of this VM's cores during 1 row(s)" in table
    assert stolen.to_json()["cpu"]["steal"] == 0.04


def test_other_load_is_flagged_apart_from_cpu_bound() -> None:
    busy = _cpu_row(4096, (0.2,), 0.1, 0.99)
    assert busy.cpu is not None and not busy.cpu.bound and busy.cpu.busy_other
    assert busy.cpu.other_cores == pytest.approx((0.99 - 0.15) * 2)
    table = format_table("ina", [busy, _cpu_row(8192, (0.2,), 0.1, 0.2)])
    assert "machine busy with other processes: up to 168% of a core during 1 row(s)" in table
    assert "CPU-bound" not in table
    assert "99~" in table  # the machine column marks other load, not a bound
