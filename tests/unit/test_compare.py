"""``inalab compare``: bench JSON files side by side, speedups over a baseline, refusals.

The files are written by the bench's own code (its metadata, ``make_document``,
``write_json``, the emulator's ``emulation_metadata``, ``write_switch_only``), so a change
of the bench's JSON that compare does not follow fails here; real runs' files are
compared in tests/integration/test_compare_cli.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from dynamiccl.model import DEFAULT_PROFILE
from emulation.bench.cli import _metadata, config_from_args, write_switch_only
from emulation.bench.compare import (
    CompareError,
    comparison_figure,
    format_comparison,
    read_bench_run,
    resolve_baseline,
    series_of,
)
from emulation.bench.cpu import RowCpu
from emulation.bench.ratesweep import merge_documents
from emulation.bench.report import Row, make_document, write_json
from emulation.cli import build_parser, main
from emulation.mininet.emulate import apply_overrides, emulation_metadata
from emulation.topology import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"

BOUND = RowCpu(workers=(0.97, 0.4), start=1.0, end=2.0)  # rank 0 above 90%: CPU-bound
IDLE = RowCpu(workers=(0.3, 0.4), start=1.0, end=2.0)


def _bench_file(
    path: Path,
    times: dict[tuple[str, int], float],
    *flags: str,
    bound: frozenset[tuple[str, int]] = frozenset(),
    topology: str | None = None,
    bw: float | None = None,
) -> Path:
    """A bench JSON as ``inalab bench`` writes it: its metadata from the flags, one row
    per (algorithm, size) with that time (us)."""
    args = build_parser().parse_args(["bench", *flags])
    cfg = config_from_args(args)
    meta = _metadata(args, cfg, path.parent)
    if topology is not None:
        topo = apply_overrides(load_topology(TOPOLOGIES / topology), bw=bw)
        meta["emulation"] = emulation_metadata(topo, topo.jobs[0], path.parent)
    rows = [
        Row(
            algo,
            n,
            n // 4,
            cfg.dtype,
            cfg.workers,
            t * 0.9,
            t * 0.8,
            t,
            0,
            cpu=BOUND if (algo, n) in bound else IDLE,
        )
        for (algo, n), t in times.items()
    ]
    write_json(path, make_document(meta, rows))
    return path


A_TIMES = {
    ("ina", 4096): 100.0,
    ("ina", 16384): 400.0,
    ("gloo", 4096): 150.0,
    ("gloo", 16384): 900.0,
}
B_TIMES = {
    ("ina", 4096): 50.0,
    ("ina", 16384): 400.0,
    ("gloo", 4096): 300.0,
    ("gloo", 16384): 450.0,
}


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    a = _bench_file(tmp_path / "a.json", A_TIMES, "--workers", "2")
    b = _bench_file(
        tmp_path / "b.json",
        B_TIMES,
        "--workers",
        "2",
        "--lanes",
        "64",
        bound=frozenset({("gloo", 16384)}),
    )
    return a, b


def _compare(*argv: str | Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def _data(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if not line.startswith("#")]


# ----------------------------------------------------------------- reading
def test_rows_come_back_as_the_bench_wrote_them(two: tuple[Path, Path]) -> None:
    run = read_bench_run(two[1])
    assert run.label == "b" and run.algos == ["ina", "gloo"]
    assert run.rows[0] == Row("ina", 4096, 1024, "float32", 2, 45.0, 40.0, 50.0, 0)
    assert run.bound == {("gloo", 16384)}
    assert run.metadata["lanes"] == 64


def test_row_from_json_inverts_to_json_but_cpu() -> None:
    row = Row("auto", 65536, 16384, "int32", 4, 9.5, 8.0, 11.0, 3, 0.25, 7, 5, 2, "ring", BOUND)
    assert Row.from_json(row.to_json(), 4) == dataclasses.replace(row, cpu=None)
    with pytest.raises(ValueError, match="no 'time_us'"):
        Row.from_json({k: v for k, v in row.to_json().items() if k != "time_us"}, 4)
    with pytest.raises(ValueError, match="expected an integer, got '4K'"):
        Row.from_json({**row.to_json(), "size_bytes": "4K"}, 4)
    with pytest.raises(ValueError, match="expected a row object"):
        Row.from_json([1, 2], 4)


# ----------------------------------------------------------------- the table
def test_two_files_side_by_side_against_the_first(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _compare(*two, capsys=capsys)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert (
        lines[0] == "# inalab compare: allreduce float32, 2 workers, loopback, switch drop"
        " simulator 0"
    )
    assert any(
        re.fullmatch(rf"# 1: a = {re.escape(str(two[0]))} \(.*, ina, gloo\)", x) for x in lines
    )
    assert "# differs: lanes: a 2048, b 64" in lines  # allowed, and said
    assert "# baseline: file 1 (a), the same algorithm" in lines
    header = next(x for x in lines if "a:ina" in x).split()
    assert header == ["#", "size", "a:ina", "a:gloo", "b:ina", "speedup", "b:gloo", "speedup"]
    assert _data(out) == [
        ["4096", "100.0", "150.0", "50.00", "2.00x", "300.0", "0.50x"],
        ["16384", "400.0", "900.0", "400.0", "1.00x", "450.0!", "2.00x"],
    ]
    assert (
        f"# mean speedup (geometric, sizes both have): b:ina {math.sqrt(2):.2f}x,"
        " b:gloo 1.00x" in lines
    )
    assert any(x.startswith("# ! CPU-bound") for x in lines)


def test_baseline_an_algorithm_of_each_file(
    two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _compare(*two, "--baseline", "gloo", capsys=capsys)
    assert status == 0
    assert "# baseline: gloo of the same file" in out
    header = next(x for x in out.splitlines() if "a:ina" in x).split()
    assert header == ["#", "size", "a:ina", "speedup", "a:gloo", "b:ina", "speedup", "b:gloo"]
    assert _data(out)[0] == ["4096", "100.0", "1.50x", "150.0", "50.00", "6.00x", "300.0"]


@pytest.mark.parametrize("baseline", ["2", "b"])
def test_baseline_a_file_by_number_or_label(two: tuple[Path, Path], baseline: str) -> None:
    runs = [read_bench_run(p) for p in two]
    resolved = resolve_baseline(runs, baseline)
    assert resolved is runs[1]
    series = series_of(runs, resolved)
    a_ina = series[0]
    assert (a_ina.name, a_ina.speedup(4096), a_ina.speedup(16384)) == ("a:ina", 0.5, 1.0)
    assert series[2].baseline is None  # b:ina is the baseline itself
    assert "# baseline: file 2 (b), the same algorithm" in format_comparison(series, runs, resolved)


def test_sizes_one_file_lacks_are_dashes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _bench_file(
        tmp_path / "a.json", {("ina", 4096): 10.0, ("ina", 16384): 20.0}, "-b", "4K", "-e", "16K"
    )
    b = _bench_file(
        tmp_path / "b.json", {("ina", 16384): 10.0, ("ina", 65536): 30.0}, "-b", "16K", "-e", "64K"
    )
    status, out, _ = _compare(a, b, capsys=capsys)
    assert status == 0
    assert _data(out) == [
        ["4096", "10.00", "-", "-"],
        ["16384", "20.00", "10.00", "2.00x"],
        ["65536", "-", "30.00", "-"],
    ]


def test_files_of_one_name_are_labelled_by_path(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    paths = [_bench_file(tmp_path / d / "run.json", A_TIMES, "--workers", "2") for d in "xy"]
    args = build_parser().parse_args(["compare", *map(str, paths)])
    from emulation.bench.compare import _bench_runs, _read_documents

    runs = _bench_runs(args.files, _read_documents(args.files))
    assert [r.label for r in runs] == [str(p) for p in paths]


# ----------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("flags", "topology", "message"),
    [
        (("-d", "int32"), None, "data type int32 vs float32"),
        (("--workers", "4"), None, "workers 4 vs 2"),
        (("--loss", "0.01"), None, "switch drop simulator 0.01 vs 0.0"),
        ((), "star4.yaml", "network star4 vs loopback"),
    ],
)
def test_different_configurations_are_refused_in_one_line(
    two: tuple[Path, Path],
    tmp_path: Path,
    flags: tuple[str, ...],
    topology: str | None,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    other = _bench_file(tmp_path / "c.json", A_TIMES, "--workers", "2", *flags, topology=topology)
    status, out, err = _compare(two[0], other, capsys=capsys)
    assert status == 2 and out == ""
    assert err == (
        f"inalab compare: error: {other} and {two[0]} are different configurations:"
        f" {message} (--force compares them anyway)\n"
    )
    status, out, err = _compare(two[0], other, "--force", capsys=capsys)
    assert status == 0 and err == ""
    assert f"# differs: {message.split(' ')[0]}" in out


def test_links_of_one_topology_at_two_rates_are_different_configurations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fast, slow = (
        _bench_file(tmp_path / f"{name}.json", A_TIMES, topology="star4.yaml", bw=bw)
        for name, bw in (("fast", 1000.0), ("slow", 100.0))
    )
    status, _, err = _compare(fast, slow, capsys=capsys)
    assert status == 2
    assert (
        "different configurations: links 4 links: 100 Mbit/s, 0 ms, loss 0 vs 4 links:"
        " 1000 Mbit/s, 0 ms, loss 0 (--force" in err
    )
    same = _bench_file(tmp_path / "again.json", B_TIMES, topology="star4.yaml", bw=1000.0)
    status, out, _ = _compare(fast, same, capsys=capsys)
    assert status == 0
    assert out.startswith(
        "# inalab compare: allreduce float32, 4 workers, star4 job 1 (4 links: 1000 Mbit/s,"
        " 0 ms, loss 0), switch drop simulator 0\n"
    )


def test_bad_inputs_are_one_line_and_exit_2(
    two: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = two[0]
    not_json = tmp_path / "notes.json"
    not_json.write_text("size,time\n")
    profile = tmp_path / "profile.json"
    DEFAULT_PROFILE.save(profile)
    switch_only = tmp_path / "only.json"
    numbers = {"workers": 2, "lanes": 64, "window": 8, "packets_per_s": 1.0}
    write_switch_only(numbers, {"switch": "soft"}, switch_only, tmp_path)
    capsys.readouterr()
    broken = tmp_path / "broken.json"
    doc = json.loads(a.read_text())
    del doc["rows"][1]["time_us"]
    broken.write_text(json.dumps(doc))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**doc, "rows": []}))
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps(merge_documents([(100.0, json.loads(a.read_text()))])))
    cases = [
        (
            (a, tmp_path / "missing.json"),
            f"cannot read bench JSON {tmp_path / 'missing.json'}: No such file or directory",
        ),
        ((a, not_json), f"{not_json}: not JSON: "),
        ((a, profile), f"{profile}: not an inalab bench JSON (schema"),
        ((a, switch_only), f"{switch_only}: a switch-only run (packets/s, no sizes)"),
        ((a, broken), f"{broken}: rows[1]: no 'time_us'"),
        ((a, empty), f"{empty}: no rows"),
        ((a, sweep), f"{sweep}: a link-rate sweep (one row per rate): compare its per-rate"),
        ((a, a), f"{a} is given twice"),
        ((*two, "--baseline", "3"), "--baseline 3: there are files 1..2"),
        ((*two, "--baseline", "ring"), "--baseline ring: a, b ran no ring"),
        ((*two, "--baseline", "c"), "--baseline c: not a file (1..2, or a, b) nor an algorithm"),
        ((*two, "--plot", tmp_path / "no" / "x.png"), f"--plot: directory {tmp_path / 'no'}"),
    ]
    for argv, message in cases:
        status, out, err = _compare(*argv, capsys=capsys)
        assert status == 2, (argv, out, err)
        assert out == ""
        assert err.startswith(f"inalab compare: error: {message}"), err
        assert err.count("\n") == 1


def test_a_label_that_is_also_an_algorithm_needs_its_number(tmp_path: Path) -> None:
    runs = [read_bench_run(_bench_file(tmp_path / f"{n}.json", A_TIMES)) for n in ("gloo", "x")]
    with pytest.raises(CompareError, match="both a file's label and an algorithm: give the"):
        resolve_baseline(runs, "gloo")
    assert resolve_baseline(runs, "1") is runs[0]


# ----------------------------------------------------------------- the plot
@pytest.mark.slow
def test_the_plot_has_every_series_and_every_speedup(
    two: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [read_bench_run(p) for p in two]
    fig = comparison_figure(series_of(runs, runs[0]), "title")
    time_ax, speedup_ax = fig.axes
    labels = time_ax.get_legend_handles_labels()[1]
    assert labels == ["a:ina", "a:gloo", "b:ina", "b:gloo", "hollow: CPU-bound (>90% busy)"]
    assert speedup_ax.get_legend_handles_labels()[1][:2] == ["b:ina vs a:ina", "b:gloo vs a:gloo"]
    b_ina = next(line for line in speedup_ax.get_lines() if line.get_label() == "b:ina vs a:ina")
    assert list(b_ina.get_ydata()) == [2.0, 1.0]
    png = tmp_path / "compare.png"
    status, out, _ = _compare(*two, "--plot", png, capsys=capsys)
    assert status == 0 and f"# plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_links_recorded_before_dup_and_reorder_compare_as_none_of_either(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = _bench_file(tmp_path / "new.json", A_TIMES, topology="star4.yaml", bw=1000.0)
    old = tmp_path / "old.json"
    doc = json.loads(new.read_text())
    for link in doc["metadata"]["emulation"]["links"]:
        link.pop("dup", None), link.pop("reorder", None)  # as an older inalab wrote them
    old.write_text(json.dumps(doc))
    status, _, _ = _compare(new, old, capsys=capsys)
    assert status == 0
    for link in doc["metadata"]["emulation"]["links"]:
        link["dup"] = 0.05
    faulty = tmp_path / "faulty.json"
    faulty.write_text(json.dumps(doc))
    status, _, err = _compare(new, faulty, capsys=capsys)
    assert status == 2 and "loss 0, dup 0.05 vs" in err


def test_ina_over_udp_and_over_rdma_side_by_side_say_the_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    udp = _bench_file(tmp_path / "udp.json", A_TIMES, "--workers", "2")
    rdma = _bench_file(tmp_path / "rdma.json", {("ina", 4096): 80.0, ("ina", 16384): 500.0},
                       "--workers", "2", "--transport", "rdma")  # fmt: skip
    status, out, _ = _compare(udp, rdma, capsys=capsys)
    lines = out.splitlines()
    assert status == 0
    assert "# differs: INA transport: udp udp, rdma rdma" in lines
    assert "# differs: packets per RDMA message: udp 1, rdma 2" in lines
    header = next(x for x in lines if "udp:ina" in x).split()
    assert header[2:] == ["udp:ina", "udp:gloo", "rdma:ina", "speedup"]
