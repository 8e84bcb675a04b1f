"""Unit tests of ``inalab replay``'s report: the oracle, regret, gain and the converged
half on crafted numbers, the table, the JSON and the plot. No processes, no sockets."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from emulation.bench.replay_report import (
    JSON_SCHEMA,
    MIN_CONVERGED_ITERATIONS,
    NOISE_NOTE,
    CallTime,
    StrategyRun,
    compute_oracle,
    converged_from,
    format_summary,
    iterations_to_converge,
    make_document,
    mean_iteration_s,
    phases,
    summarize,
    write_json,
    write_plot,
)


def _run(name: str, kind: str, times: list[list[float]], actions: list[str]) -> StrategyRun:
    """A complete run whose call j always used ``actions[j]``."""
    iterations = [[CallTime(a, t) for a, t in zip(actions, row, strict=True)] for row in times]
    return StrategyRun(name, kind, iterations, complete=True)


# Two static configurations, two calls per iteration, three iterations (0 is warm-up):
# "ina" is fast for call 0, "ring" for call 1.
STATIC_INA = _run("static ina", "static", [[10, 10], [1, 4], [1, 4]], ["ina", "ina"])
STATIC_RING = _run("static ring", "static", [[10, 10], [3, 2], [3, 2]], ["ring", "ring"])
AGENT = _run("agent", "agent", [[10, 10], [4, 4], [1, 2]], ["ina", "ring"])


def test_the_oracle_takes_each_calls_fastest_action() -> None:
    oracle = compute_oracle([STATIC_INA, STATIC_RING], phases(3, None))
    assert oracle.choices() == [["ina", "ring"]]
    assert oracle.iteration_seconds() == [20, 3, 3]
    assert oracle.total() == 6  # iteration 0, the warm-up, is not counted


def test_regret_gain_and_the_converged_half() -> None:
    runs = [STATIC_INA, STATIC_RING, AGENT]
    oracle = compute_oracle(runs[:2], phases(3, None))
    summary = summarize(runs, oracle)
    rows = {r.strategy: r for r in summary.rows}
    assert [r.strategy for r in summary.rows] == ["oracle", "static ina", "static ring", "agent"]
    assert rows["static ina"].total_s == 10 and rows["static ring"].total_s == 10
    assert rows["static ina"].regret == pytest.approx(10 / 6 - 1)
    assert rows["agent"].total_s == 11
    assert rows["agent"].regret == pytest.approx(11 / 6 - 1)
    assert rows["agent"].gain == pytest.approx(10 / 11)
    assert rows["static ina"].gain == 1.0
    assert rows["oracle"].regret == 0.0 and rows["oracle"].gain == pytest.approx(10 / 6)
    assert rows["agent"].iteration_s == pytest.approx(5.5)  # 11 s over 2 measured iterations
    assert summary.best_static == "static ina"  # the first of equal totals
    converged = summary.converged["agent"]
    assert converged.first == 2  # the last half of iterations 1..2
    assert converged.iteration_s == 3 and converged.oracle_iteration_s == 3
    assert converged.within == 0.0


def test_the_oracle_chooses_again_after_the_change() -> None:
    # After the change (iteration 2), ring becomes the faster action for call 0 too.
    ring = _run("static ring", "static", [[10, 10], [3, 2], [0.5, 2]], ["ring", "ring"])
    oracle = compute_oracle([STATIC_INA, ring], phases(3, 2))
    assert oracle.phases == ((0, 2), (2, 3))
    assert oracle.choices() == [["ina", "ring"], ["ring", "ring"]]
    assert oracle.iteration_seconds() == [20, 3, 2.5]
    assert oracle.total() == 5.5


def test_an_action_measured_in_several_runs_counts_its_fastest_time() -> None:
    both = _run("static x", "static", [[5, 9], [5, 9], [5, 9]], ["x", "x"])
    mixed = _run("static x+y", "static", [[5, 1], [2, 1], [7, 1]], ["x", "y"])
    oracle = compute_oracle([both, mixed], phases(3, None))
    assert oracle.choices() == [["x", "y"]]
    assert [calls[0].seconds for calls in oracle.iterations] == [5, 2, 5]


def test_no_static_configuration_beats_the_oracle() -> None:
    rng = random.Random(7)
    actions = ["ina/l2048/w8", "ring/l2048/w8", "tree/l256/w8"]
    static = []
    for k in range(6):
        picks = [rng.choice(actions) for _ in range(4)]
        times = [[rng.uniform(0.1, 2.0) for _ in picks] for _ in range(6)]
        static.append(_run(f"static {k}", "static", times, picks))
    for spans in (phases(6, None), phases(6, 3)):
        oracle = compute_oracle(static, spans)
        assert oracle.total() <= min(r.total() for r in static) + 1e-12


def test_a_stopped_run_stays_out_of_the_table() -> None:
    partial = StrategyRun("agent", "agent", AGENT.iterations[:2], complete=False)
    summary = summarize([STATIC_INA, partial], compute_oracle([STATIC_INA], phases(3, None)))
    assert [r.strategy for r in summary.rows] == ["oracle", "static ina"]
    assert summary.converged == {}


@pytest.mark.parametrize(("iterations", "first"), [(2, 1), (3, 2), (4, 2), (10, 5), (11, 6)])
def test_the_converged_half_is_the_last_half_of_the_measured_iterations(
    iterations: int, first: int
) -> None:
    assert converged_from(iterations) == first


@pytest.mark.parametrize("change_at", [0, 3, 7])
def test_a_change_outside_the_run_is_refused(change_at: int) -> None:
    with pytest.raises(ValueError, match=r"outside 1\.\.2"):
        phases(3, change_at)


def test_runs_of_different_shapes_have_no_oracle() -> None:
    short = _run("static s", "static", [[1, 1], [1, 1]], ["ina", "ina"])
    with pytest.raises(ValueError, match="shapes"):
        compute_oracle([STATIC_INA, short], phases(3, None))


def test_table_json_and_plot(tmp_path: Path) -> None:
    runs = [STATIC_INA, STATIC_RING, AGENT]
    oracle = compute_oracle(runs[:2], phases(3, None))
    summary = summarize(runs, oracle)
    table = format_summary(summary, "# tiny")
    assert table.splitlines()[0] == "# tiny"
    assert "  static ina " in table and table.count(" *\n") == 1
    assert "# * best static: static ina" in table
    assert "+83.3%" in table  # the agent's regret, 11/6 - 1
    assert "# iter(s): the mean time per iteration over the measured iterations 1..2" in table
    assert (  # one iteration in the last half: not enough to call it converged
        "# agent: not judged converged: the last half of the measured iterations (iterations"
        f" 2..2) is 1 iteration, fewer than {MIN_CONVERGED_ITERATIONS} (--iterations"
        f" {iterations_to_converge()} or more gives {MIN_CONVERGED_ITERATIONS})"
    ) in table.splitlines()
    assert "once converged" not in table and "below the oracle" not in table
    doc = make_document({"workers": 2}, runs, oracle, summary, {"scenario": {"name": "none"}})
    path = tmp_path / "replay.json"
    write_json(path, doc)
    back = json.loads(path.read_text())
    assert back["schema"] == JSON_SCHEMA
    assert list(back["strategies"]) == ["static ina", "static ring", "agent"]
    assert back["strategies"]["agent"]["iterations"][1][0] == {
        "action": "ina", "seconds": 4, "retransmits": 0, "wrong": 0, "max_abs_err": 0.0,
    }  # fmt: skip
    assert back["oracle"]["phases"] == [{"iterations": [0, 3], "actions": ["ina", "ring"]}]
    assert back["summary"]["best_static"] == "static ina"
    assert back["scenario"] == {"name": "none"}
    png = tmp_path / "replay.png"
    write_plot(png, runs, oracle, summary, change_at=2, title="tiny")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _long(name: str, kind: str, per_call: list[float], actions: list[str]) -> StrategyRun:
    """``iterations_to_converge()`` iterations of the same two calls, the warm-up slower;
    iteration ``i`` adds ``i / 1000`` s to call 0, so windows have different means."""
    rows = [[t + i / 1000 if j == 0 else t for j, t in enumerate(per_call)]
            for i in range(iterations_to_converge())]  # fmt: skip
    rows[0] = [10.0 for _ in per_call]
    return _run(name, kind, rows, actions)


def test_converged_needs_the_stated_iterations_and_names_its_oracle_figure() -> None:
    static = [_long("static ina", "static", [1, 4], ["ina", "ina"]),
              _long("static ring", "static", [3, 2], ["ring", "ring"])]  # fmt: skip
    agent = _long("agent", "agent", [1.5, 2], ["ina", "ring"])
    end = iterations_to_converge()
    oracle = compute_oracle(static, phases(end, None))
    summary = summarize([*static, agent], oracle)
    c = summary.converged["agent"]
    assert (c.first, c.last, c.iterations, c.enough) == (4, 7, MIN_CONVERGED_ITERATIONS, True)
    # One definition of time per iteration, over the range each place names.
    seconds = oracle.iteration_seconds()
    assert c.oracle_iteration_s == mean_iteration_s(seconds, 4, end) == pytest.approx(3.0055)
    assert summary.rows[0].iteration_s == mean_iteration_s(seconds, 1, end) == pytest.approx(3.004)
    table = format_summary(summary)
    assert f"  {'oracle':<11}  {21.028:9.3f}  {3.004:8.4f}  {'+0.0%':>8}" in table
    assert "# iter(s): the mean time per iteration over the measured iterations 1..7" in table
    assert (
        "# agent once converged (iterations 4..7): 3.5055 s per iteration, within 16.6% of"
        " the oracle's 3.0055 s over the same iterations"
    ) in table.splitlines()
    assert "below the oracle" not in table


def test_a_strategy_below_the_oracle_is_explained_as_noise() -> None:
    static = [_long("static ina", "static", [1, 4], ["ina", "ina"]),
              _long("static ring", "static", [3, 2], ["ring", "ring"])]  # fmt: skip
    # The model ran the oracle's actions and its run happened to be 1% faster.
    model = _long("model", "model", [0.99, 1.98], ["ina", "ring"])
    oracle = compute_oracle(static, phases(iterations_to_converge(), None))
    summary = summarize([*static, model], oracle)
    rows = {r.strategy: r for r in summary.rows}
    assert rows["model"].regret is not None and rows["model"].regret < 0
    table = format_summary(summary)
    regret = f"{100 * rows['model'].regret:+.1f}%"
    within = f"{100 * summary.converged['model'].within:+.1f}%"
    assert (
        f"# below the oracle (model {regret}, model {within} once converged): {NOISE_NOTE}"
    ) in table.splitlines()
    assert "interleaved" in NOISE_NOTE and "noise" in NOISE_NOTE
    assert "faster than the oracle's" in table
