"""The link-rate sweep of ``inalab emulate ... --bw 100,200,... bench``: the rates flag,
and what is made of the per-rate bench documents (merged JSON, tables, crossover, plot).
The sweep itself runs in tests/integration/test_emulate_rate_sweep.py (root, Mininet)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from emulation.argtypes import rates
from emulation.bench.ratesweep import (
    RateSweepError,
    baseline_of,
    crossover,
    format_rate_sweep,
    merge_documents,
    rate_points,
    write_rate_plot,
)
from emulation.cli import build_parser

REPO = Path(__file__).resolve().parents[2]

# INA at 4K: 2, 3, 6 ms; Gloo: 4, 4, 4 ms -> speedup 2, 4/3, 2/3: crosses between 200 and 500.
TIMES = {100.0: (2000.0, 4000.0), 200.0: (3000.0, 4000.0), 500.0: (6000.0, 4000.0)}


def _row(algo: str, size: int, t: float, bound: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {"algo": algo, "size_bytes": size, "time_us": {"mean": t, "min": t,
                           "max": t}, "wrong": 0}  # fmt: skip
    if bound:
        row["cpu"] = {"bound": True}
    return row


def _docs(bound_at: float | None = None) -> list[tuple[float, dict[str, Any]]]:
    docs = []
    for rate, (ina, gloo) in TIMES.items():
        rows = [_row("ina", 4096, ina, bound=rate == bound_at), _row("gloo", 4096, gloo),
                _row("ina", 1 << 20, ina / 4), _row("gloo", 1 << 20, gloo)]  # fmt: skip
        meta = {"workers": 4, "wall_s": rate / 100, "links": f"every link {rate:g} Mbit/s",
                "emulation": {"links": [{"a": "h1", "b": "s1", "bw": rate}]}}  # fmt: skip
        doc = {"schema": "inalab-bench/1", "metadata": meta, "rows": rows, "dynamiccl": rate}
        docs.append((rate, doc))
    return docs


def test_rates_parse_one_or_a_comma_list_in_order() -> None:
    assert rates("100") == (100.0,)
    assert rates("1000,100,250.5") == (1000.0, 100.0, 250.5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100,abc", r"invalid rate 'abc' in '100,abc'"),
        ("0", r"rate 0 Mbit/s must be positive"),
        ("100,-5", r"must be positive"),
        ("100,", r"invalid rate ''"),
        ("nan", r"must be positive"),
        ("inf", r"must be positive"),
        ("100,100", r"given twice"),
        ("100;200", r"invalid rate '100;200'"),
    ],
)
def test_bad_rates_are_refused(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        rates(text)


def test_the_rates_go_before_or_after_bench() -> None:
    parse = build_parser().parse_args
    before = parse(["emulate", "t.yaml", "--bw", "100,200", "bench"])
    after = parse(["emulate", "t.yaml", "--bw", "50", "bench", "--bw", "100,200"])
    alone = parse(["emulate", "t.yaml", "--bw", "100,200", "bench", "-b", "4K"])
    for args in (before, after, alone):  # built at the first rate, swept over all
        assert (args.bw, args.bw_sweep) == (100.0, (100.0, 200.0))
    last = parse(["emulate", "t.yaml", "--bw", "100,200", "bench", "--bw", "300"])
    assert (last.bw, last.bw_sweep) == (300.0, ())  # the last --bw wins, whole
    none = parse(["emulate", "t.yaml", "bench"])
    assert (none.bw, none.bw_sweep) == (None, ())


def _inalab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "emulation.cli", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO, check=False)  # fmt: skip


@pytest.mark.parametrize("bw", ["100,abc", "0"])
def test_the_command_refuses_a_bad_rate_in_one_line(bw: str) -> None:
    proc = _inalab("emulate", "topologies/star4.yaml", "--bw", bw, "bench", "-b", "4K")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith("inalab emulate: error: argument --bw")


@pytest.mark.parametrize("action", ["up", "check", "run"])
def test_several_rates_are_for_the_bench_only(action: str) -> None:
    extra = ["--", "true"] if action == "run" else []
    proc = _inalab("emulate", "topologies/star4.yaml", "--bw", "100,200", action, *extra)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "inalab emulate: error: --bw 100,200: several rates are the bench's link-rate sweep;"
        " give one rate to the other actions\n"
    )


def test_the_merged_document_has_a_row_per_rate_size_and_algorithm() -> None:
    doc = merge_documents(_docs())
    assert doc["schema"] == "inalab-bench/1"
    assert doc["metadata"]["link_rates_mbit"] == [100.0, 200.0, 500.0]
    assert [p["wall_s"] for p in doc["metadata"]["per_rate"]] == [1.0, 2.0, 5.0]
    assert "wall_s" not in doc["metadata"] and doc["metadata"]["workers"] == 4
    assert doc["metadata"]["per_rate"][2]["links"] == "every link 500 Mbit/s"
    assert "links" not in doc["metadata"]  # each rate's, in per_rate
    assert doc["metadata"]["emulation"] == {}  # links: each rate's, in per_rate
    assert doc["metadata"]["per_rate"][1]["emulation_links"] == [
        {"a": "h1", "b": "s1", "bw": 200.0}
    ]
    assert [p["dynamiccl"] for p in doc["metadata"]["per_rate"]] == [100.0, 200.0, 500.0]
    assert "dynamiccl" not in doc
    keys = [(r["bw_mbit"], r["size_bytes"], r["algo"]) for r in doc["rows"]]
    assert len(keys) == len(set(keys)) == 3 * 2 * 2
    assert doc["rows"][0]["time_us"]["max"] == 2000.0
    with pytest.raises(RateSweepError, match="no rate finished"):
        merge_documents([])


def test_speedups_and_the_crossover_interpolated_in_log_rate() -> None:
    rows = merge_documents(_docs())["rows"]
    assert baseline_of(rows) == "gloo"
    points = rate_points(rows, "gloo")
    small = points["ina", 4096]
    assert [p.speedup for p in small] == pytest.approx([2.0, 4 / 3, 2 / 3])
    # log speedup 0.2877 at 200 and -0.4055 at 500: 1 is crossed 41.5% of the way in log.
    assert crossover(small) == pytest.approx(200 * 2.5**0.41503, rel=1e-3)
    assert crossover(points["ina", 1 << 20]) is None  # 8x, 5.3x, 2.7x: never crosses
    assert crossover(points["gloo", 4096]) is None  # 1 throughout: never "falls through"


def test_the_table_marks_the_crossover_and_cpu_bound_points() -> None:
    text = format_rate_sweep(merge_documents(_docs(bound_at=500.0))["rows"], "star4")
    lines = text.splitlines()
    assert lines[0] == "# link-rate sweep: star4"
    assert "#  Mbit/s        ina   xgloo       gloo" in lines
    at_500 = [ln for ln in lines if ln.startswith("      500")]
    assert at_500[0].split() == ["500", "6000.0!", "0.67", "4000.0"]
    assert "# 4K: ina stops beating gloo at about 293 Mbit/s" in lines
    assert "# 1M: ina beats gloo at every rate (100 to 500 Mbit/s): no crossover" in lines
    assert lines[-1].startswith("# ! CPU-bound")


def test_without_a_ring_the_table_has_times_only() -> None:
    rows = [r for r in merge_documents(_docs())["rows"] if r["algo"] == "ina"]
    text = format_rate_sweep(rows)
    assert "no gloo or ring rows" in text and "stops beating" not in text
    with_ring = [{**r, "algo": "ring"} if r["algo"] == "gloo" else r
                 for r in merge_documents(_docs())["rows"]]  # fmt: skip
    assert "# 4K: ina stops beating ring at about 293 Mbit/s" in format_rate_sweep(with_ring)


def test_a_row_without_time_is_an_error() -> None:
    with pytest.raises(RateSweepError, match=r"time_us\.max"):
        format_rate_sweep([{"bw_mbit": 100.0, "algo": "ina", "size_bytes": 4, "time_us": {}}])


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    png = tmp_path / "sweep.png"
    write_rate_plot(png, merge_documents(_docs(bound_at=200.0))["rows"], "title")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
