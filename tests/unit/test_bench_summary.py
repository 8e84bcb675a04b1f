"""The answer of ``inalab bench``: who won at each size, by how much, whether the row
measured the CPU, the overall sentence, the JSON's ``summary``, and the legend printed
once however many tables follow it. Pure: rows in, words out."""

from __future__ import annotations

import dataclasses
import json

import pytest

from emulation.bench.cpu import RowCpu
from emulation.bench.notes import WIDTH, bound_note, legend
from emulation.bench.report import Row, make_document
from emulation.bench.summary import format_summary, human_time, summarize

K, M = 1 << 10, 1 << 20


def _rows(algo: str, times_us: dict[int, float]) -> list[Row]:
    return [Row(algo, n, n // 4, "float32", 4, t, t, t, 0) for n, t in times_us.items()]


def _bound(row: Row) -> Row:
    """``row`` with a rank at 97% of a core during its timed calls: CPU-bound."""
    return dataclasses.replace(row, cpu=RowCpu((0.97, 0.2), 0.0, 1.0))


def _ina_against_gloo() -> list[Row]:
    # INA wins small, loses large: the new user's run.
    sizes = (4 * K, 64 * K, 1 * M, 4 * M, 16 * M)
    return [
        *_rows("ina", dict(zip(sizes, (100.0, 400.0, 1000.0, 5000.0, 40000.0), strict=True))),
        *_rows("gloo", dict(zip(sizes, (210.0, 600.0, 1390.0, 4000.0, 18000.0), strict=True))),
    ]


def test_each_size_says_who_won_and_by_how_much() -> None:
    text = format_summary(summarize(_ina_against_gloo(), ["ina", "gloo"]))
    lines = text.splitlines()
    assert lines[0].startswith("# summary: who won at each size")
    one_m = next(line for line in lines if line.split()[1] == "1M")
    assert "ina 1.00 ms" in one_m and "gloo 1.39 ms" in one_m
    assert one_m.endswith("-> ina 1.39x faster than gloo")
    four_m = next(line for line in lines if line.split()[1] == "4M")
    assert four_m.endswith("-> gloo 1.25x faster than ina")
    assert "fastest:" not in text  # two algorithms: the lines say it


def test_the_overall_line_comes_last_with_ranges_and_extremes() -> None:
    summary = summarize(_ina_against_gloo(), ["ina", "gloo"])
    assert (summary.subject, summary.baseline) == ("ina", "gloo")
    assert summary.overall() == (
        "ina faster than gloo at 4K..1M (up to 2.10x), slower at 4M..16M (down to 0.45x)"
    )
    assert format_summary(summary).splitlines()[-1] == f"# overall: {summary.overall()}"


def test_sizes_apart_are_separate_ranges_and_near_ties_are_even() -> None:
    rows = [
        *_rows("ina", {4 * K: 100.0, 16 * K: 300.0, 64 * K: 100.0, 256 * K: 101.0}),
        *_rows("gloo", {4 * K: 200.0, 16 * K: 150.0, 64 * K: 200.0, 256 * K: 100.0}),
    ]
    assert summarize(rows).overall() == (
        "ina faster than gloo at 4K, 64K (up to 2.00x), slower at 16K (down to 0.50x),"
        " even at 256K (within 2%)"
    )
    only_even = summarize([*_rows("ina", {4 * K: 100.0}), *_rows("gloo", {4 * K: 101.0})])
    assert only_even.overall() == "ina even with gloo at 4K (within 2%)"


def test_with_more_algorithms_the_fastest_and_each_others_ratio() -> None:
    rows = [
        *_rows("ina", {4 * K: 100.0, 1 * M: 3000.0}),
        *_rows("ring", {4 * K: 120.0, 1 * M: 1500.0}),
        *_rows("gloo", {4 * K: 250.0, 1 * M: 2000.0}),
    ]
    summary = summarize(rows, ["ina", "ring", "gloo"])
    lines = format_summary(summary).splitlines()
    assert lines[1].endswith("-> ina 1.20x faster than ring, 2.50x than gloo")
    assert lines[2].endswith("-> ring 2.00x faster than ina, 1.33x than gloo")
    assert lines[-2] == "# fastest: ina at 4K; ring at 1M"
    assert lines[-1] == (
        "# overall: ina faster than gloo at 4K (up to 2.50x), slower at 1M (down to 0.67x)"
    )
    # Without Gloo the subject is judged against the first other algorithm.
    assert summarize(rows[:4], ["ina", "ring"]).baseline == "ring"


def test_cpu_bound_sizes_are_marked_in_their_line_and_the_overall() -> None:
    rows = _ina_against_gloo()
    rows = [_bound(r) if r.algo == "gloo" and r.nbytes >= 4 * M else r for r in rows]
    summary = summarize(rows, ["ina", "gloo"])
    lines = format_summary(summary).splitlines()
    assert [line.endswith("CPU-bound (gloo)") for line in lines[1:6]] == [False] * 3 + [True] * 2
    assert summary.overall().endswith("; CPU-bound at 4M..16M")
    assert [v.bound for v in summary.sizes][-1] == ("gloo",)


def test_wrong_rows_are_marked() -> None:
    rows = _ina_against_gloo()
    rows[0] = dataclasses.replace(rows[0], wrong=3)
    assert "WRONG (ina)" in format_summary(summarize(rows)).splitlines()[1]


def test_nothing_to_compare_says_so() -> None:
    ring = summarize(_rows("ring", {4 * K: 10.0}))
    assert ring.subject is None and ring.overall() == "ring alone: nothing to compare"
    assert summarize([]).overall() == "no size finished: nothing to compare"
    assert format_summary(ring).splitlines()[-1] == "# overall: ring alone: nothing to compare"
    with pytest.raises(ValueError, match="two rows of ring"):
        summarize(_rows("ring", {4 * K: 10.0}) * 2)


def test_the_json_document_carries_the_summary() -> None:
    rows = _ina_against_gloo()
    summary = summarize(rows, ["ina", "gloo"])
    doc = json.loads(json.dumps(make_document({}, rows, {"summary": summary.to_json()})))
    got = doc["summary"]
    assert (got["subject"], got["baseline"]) == ("ina", "gloo")
    assert got["overall"] == summary.overall()
    assert got["speedups"][str(1 * M)] == pytest.approx(1.39)
    size = got["sizes"][3]
    assert size["size_bytes"] == 4 * M and size["fastest"] == "gloo"
    assert size["slower_than_fastest"] == {"ina": pytest.approx(1.25)}
    assert size["cpu_bound"] is False and size["wrong_algos"] == []
    assert len(doc["rows"]) == 10  # the rows as before


@pytest.mark.parametrize(
    ("us", "text"), [(85.23, "85.2 us"), (960.0, "960 us"), (1800.0, "1.80 ms"), (2.5e6, "2.50 s")]
)
def test_human_time(us: float, text: str) -> None:
    assert human_time(us) == text


# ----------------------------------------------------------------- the legend
def test_the_legend_says_only_what_applies_in_short_lines() -> None:
    gloo = _rows("gloo", {4 * K: 1.0})
    text = "\n".join(legend(gloo))
    assert "busbw = algbw * 2(n-1)/n" in text
    assert "INA's busbw" not in text and "retx" not in text and "cpu (%)" not in text
    both = legend([*_rows("ina", {4 * K: 1.0}), _bound(gloo[0])])
    joined = "\n".join(both)
    assert "INA's busbw" in joined and "retx =" in joined and "cpu (%)" in joined
    assert both[-1] == bound_note()
    assert all(len(line) <= WIDTH for line in both)
    long = legend([*_rows("ina", {4 * K: 1.0}), _bound(gloo[0])], explain=True)
    assert len(long) > len(both) and all(len(line) <= WIDTH for line in long)
    assert "host_drops" in "\n".join(long)  # the retx column's long form


def test_the_legend_comes_once_before_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    from emulation.bench.cli import _print_tables, config_from_args
    from emulation.bench.fabric import LoopbackFabric
    from emulation.bench.sweep import SweepResult
    from emulation.cli import build_parser

    args = build_parser().parse_args(["bench", "-b", "4K", "-e", "4K", "--algos", "ina,ring,gloo"])
    cfg = config_from_args(args)
    rows = [*_rows("ina", {4 * K: 1.0}), *_rows("ring", {4 * K: 2.0}), *_rows("gloo", {4 * K: 3.0})]
    _print_tables(SweepResult(rows=rows), cfg, LoopbackFabric(), True, explain=False)
    out = capsys.readouterr().out
    assert out.count("# legend") == 1 and out.count("busbw = algbw") == 1
    assert out.count("retx =") == 1 and out.count("# algorithm:") == 3
    assert out.index("# legend") < out.index("# algorithm:")


def test_the_loopback_note_names_what_sets_inas_pace() -> None:
    from emulation.bench.cli import loopback_note

    native = loopback_note("native")
    assert native.startswith("# on loopback there is no wire: INA's pace is the soft switch's")
    assert "runs in native C" in native and "Python process" in native
    assert "runs in Python too" in loopback_note("python")
    assert all(len(line) <= WIDTH for line in native.splitlines())


def test_a_bad_host_engine_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from emulation.bench.cli import UsageError, host_engine

    monkeypatch.setenv("INALAB_HOST_ENGINE", "rust")
    with pytest.raises(UsageError, match="INALAB_HOST_ENGINE"):
        host_engine()
    monkeypatch.setenv("INALAB_HOST_ENGINE", "python")
    assert host_engine() == "python"
