"""Results of ``inalab replay``: every call's time per strategy, the oracle, the summary
table, the JSON document and the plot. Pure data and arithmetic (matplotlib is imported
by :func:`write_plot` alone).

A replay runs the calls of one training iteration ``K`` times under each strategy. The
numbers it reports, over the measured iterations (iteration 0 is a warm-up for every
strategy and counted by none):

- a strategy's *total*: the sum over iterations of the sum over calls of the call's
  time, the slowest rank's (a collective ends for the job when its last rank has it);
- the *oracle*: per call of the iteration and per phase (before and after the
  scenario's change, or the whole run without one), the action whose static runs were
  fastest over that phase's measured iterations, and at each iteration that action's
  fastest measured time among the static runs that used it for the call. It is computed
  from the static runs and never run itself, and no static configuration is faster;
- *regret*: ``total / oracle total - 1``; *gain*: ``best static total / total``, the best
  static configuration being the static run with the smallest total;
- a time *per iteration*: the mean of the iterations' times over a stated range of
  iterations (:func:`mean_iteration_s`), the same for every strategy and the oracle: the
  table's over the measured iterations, the converged line's over its half;
- for the agent and the model, the *converged* half: the mean time per iteration over
  the last half of the measured iterations, and how far it is above the oracle's mean
  over the same iterations; called converged only when that half has at least
  :data:`MIN_CONVERGED_ITERATIONS` iterations.

A strategy that is run (the model, the agent) can come out below the oracle: the oracle
is computed from the static runs' times, and separate runs of the same action differ by
run-to-run noise. The table says so when it happens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emulation.bench.replay_setup import ReplaySetup

__all__ = [
    "JSON_SCHEMA",
    "MIN_CONVERGED_ITERATIONS",
    "ORACLE_NOTE",
    "WARMUP_ITERATIONS",
    "CallTime",
    "Converged",
    "Oracle",
    "StrategyRun",
    "Summary",
    "SummaryRow",
    "actions_json",
    "compute_oracle",
    "converged_from",
    "format_summary",
    "iterations_to_converge",
    "make_document",
    "mean_iteration_s",
    "phases",
    "plot_figure",
    "setup_lines",
    "summarize",
    "workload_json",
    "write_json",
    "write_plot",
]

JSON_SCHEMA = "inalab.replay/1"
"""Value of the JSON document's ``schema`` key; bumped on incompatible change."""

WARMUP_ITERATIONS = 1
"""Iterations at the start of every strategy's run that no total counts: the first
calls of a configuration pay for first use (page faults on new buffers, an RTT
estimate still at its default)."""

MIN_CONVERGED_ITERATIONS = 4
"""The fewest iterations in the last half of the measured ones for the report to call a
learning strategy converged there. Over fewer, a single iteration is a third or more of
the mean, and one iteration's noise (another process's burst, the agent's re-try of
another action every 16th call) decides the verdict. The default ten iterations give a
half of five; ``--iterations 8`` is the fewest that gives four."""

NOISE_NOTE = (
    "the oracle is not run but computed from the static runs' times, and every strategy"
    " runs separately (interleaved iteration by iteration), so the same action's time"
    " differs from run to run by noise: a strategy below the oracle by that much measured"
    " noise, not a choice better than the best static action per call"
)

ORACLE_NOTE = (
    "computed, not run: per call of the iteration and per phase (before/after the change),"
    " the action whose static runs were fastest in total over the phase's measured"
    " iterations; its time at each iteration is the fastest of the static runs that used"
    " it for that call, so no static configuration beats it"
)

TIMING_NOTE = (
    "a call's time is the slowest rank's wall time of that call (each rank times its own"
    " call; the ranks line up with an untimed one-element ring allreduce before each"
    " iteration); totals sum the measured iterations' calls, iteration 0 excluded"
)


@dataclass(frozen=True)
class CallTime:
    """One call of one iteration, merged over ranks.

    Attributes:
        action: the action's label (``ring/l2048/w32``).
        seconds: the slowest rank's time of the call.
        retransmits: packets the ranks sent again during the call, summed over ranks.
        wrong: elements outside the tolerance, summed over ranks.
        max_abs_err: the largest absolute error of any rank's result.
    """

    action: str
    seconds: float
    retransmits: int = 0
    wrong: int = 0
    max_abs_err: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "seconds": self.seconds,
            "retransmits": self.retransmits,
            "wrong": self.wrong,
            "max_abs_err": self.max_abs_err,
        }


@dataclass
class StrategyRun:
    """What one strategy's run measured, iteration by iteration.

    Attributes:
        name: the strategy as the table names it (``static ina/l2048/w8``, ``model``,
            ``agent``).
        kind: ``static``, ``model`` or ``agent``.
        iterations: per iteration, per call of the workload, its :class:`CallTime`.
        config: a static run's action per collective (labels); None otherwise.
        decisions: the model's and the agent's decisions per iteration and call
            (``AgentDecision.to_dict()``).
        complete: whether its iterations are comparable with the other runs' (False: a
            stop signal cut it short; after a stop every run is cut to the iterations all
            finished, and those count as complete).
    """

    name: str
    kind: str
    iterations: list[list[CallTime]] = field(default_factory=list)
    config: dict[str, str] | None = None
    decisions: list[list[dict[str, Any]]] = field(default_factory=list)
    complete: bool = False

    def iteration_seconds(self) -> list[float]:
        """Each iteration's time: the sum of its calls' times."""
        return [sum(c.seconds for c in calls) for calls in self.iterations]

    def total(self, first: int = WARMUP_ITERATIONS) -> float:
        """The sum of the iterations' times from iteration ``first`` on."""
        return sum(self.iteration_seconds()[first:])

    @property
    def wrong(self) -> int:
        return sum(c.wrong for calls in self.iterations for c in calls)

    @property
    def retransmits(self) -> int:
        return sum(c.retransmits for calls in self.iterations for c in calls)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "kind": self.kind,
            "complete": self.complete,
            "total_s": self.total(),
            "iteration_s": self.iteration_seconds(),
            "wrong": self.wrong,
            "retransmits": self.retransmits,
            "iterations": [[c.to_json() for c in calls] for calls in self.iterations],
        }
        if self.config is not None:
            doc["config"] = dict(self.config)
        if self.decisions:
            doc["decisions"] = self.decisions
        return doc


@dataclass(frozen=True)
class Oracle:
    """The fastest static action per call and phase, with its measured times.

    Attributes:
        iterations: per iteration, per call, the chosen action and its time.
        phases: the ``[start, end)`` iteration ranges the choice was made over.
    """

    iterations: list[list[CallTime]]
    phases: tuple[tuple[int, int], ...]

    def iteration_seconds(self) -> list[float]:
        return [sum(c.seconds for c in calls) for calls in self.iterations]

    def total(self, first: int = WARMUP_ITERATIONS) -> float:
        return sum(self.iteration_seconds()[first:])

    def choices(self) -> list[list[str]]:
        """Per phase, per call, the chosen action's label."""
        return [[c.action for c in self.iterations[lo]] for lo, _ in self.phases]

    def to_json(self) -> dict[str, Any]:
        return {
            "note": ORACLE_NOTE,
            "total_s": self.total(),
            "iteration_s": self.iteration_seconds(),
            "phases": [
                {"iterations": [lo, hi], "actions": labels}
                for (lo, hi), labels in zip(self.phases, self.choices(), strict=True)
            ],
            "iterations": [[c.to_json() for c in calls] for calls in self.iterations],
        }


def phases(iterations: int, change_at: int | None) -> tuple[tuple[int, int], ...]:
    """The iteration ranges the oracle chooses over: the whole run, or before and after
    the change.

    Raises:
        ValueError: ``change_at`` outside ``1..iterations-1``.
    """
    if change_at is None:
        return ((0, iterations),)
    if not 1 <= change_at < iterations:
        raise ValueError(f"change iteration {change_at} outside 1..{iterations - 1}")
    return ((0, change_at), (change_at, iterations))


def compute_oracle(
    static: Sequence[StrategyRun],
    spans: Sequence[tuple[int, int]],
    warmup: int = WARMUP_ITERATIONS,
) -> Oracle:
    """The oracle of the static runs ``static`` (each with every iteration of ``spans``).

    Raises:
        ValueError: no static run, or runs of different shapes.
    """
    if not static:
        raise ValueError("the oracle needs at least one static run")
    shape = [len(calls) for calls in static[0].iterations]
    if any([len(calls) for calls in run.iterations] != shape for run in static):
        raise ValueError("static runs of different shapes")
    if not spans or spans[-1][1] != len(shape):
        raise ValueError(f"phases {list(spans)} do not cover {len(shape)} iterations")
    out: list[list[CallTime]] = [[] for _ in shape]
    for lo, hi in spans:
        measured = range(max(lo, warmup), hi) or range(lo, hi)
        for j in range(shape[0] if shape else 0):
            times = _times_by_action(static, j, range(lo, hi))
            best = min(times, key=lambda a: (sum(times[a][i] for i in measured), a))
            for i in range(lo, hi):
                out[i].append(CallTime(best, times[best][i]))
    return Oracle(out, tuple(spans))


def _times_by_action(
    static: Sequence[StrategyRun], call: int, iterations: range
) -> dict[str, dict[int, float]]:
    """Per action used for ``call``, its fastest time among the runs that used it, by
    iteration."""
    samples: dict[str, dict[int, list[float]]] = {}
    for run in static:
        for i in iterations:
            c = run.iterations[i][call]
            samples.setdefault(c.action, {}).setdefault(i, []).append(c.seconds)
    return {action: {i: min(v) for i, v in by_iter.items()} for action, by_iter in samples.items()}


def converged_from(iterations: int, warmup: int = WARMUP_ITERATIONS) -> int:
    """The first iteration of the converged half: the last half of the measured
    iterations, rounded up (10 iterations: 5..9)."""
    return warmup + max(iterations - warmup, 0) // 2


def iterations_to_converge(warmup: int = WARMUP_ITERATIONS) -> int:
    """The fewest iterations per strategy whose converged half has
    :data:`MIN_CONVERGED_ITERATIONS` iterations."""
    return warmup + 2 * MIN_CONVERGED_ITERATIONS - 1


def mean_iteration_s(seconds: Sequence[float], first: int, end: int) -> float:
    """The mean time per iteration over iterations ``first..end-1`` of ``seconds`` (each
    iteration's time); NaN for an empty range. The table's per-iteration column and the
    converged line both use it, over the ranges they name."""
    window = seconds[first:end]
    return _mean(sum(window), len(window))


@dataclass(frozen=True)
class SummaryRow:
    """One strategy in the summary table.

    Attributes:
        strategy: its name; ``oracle`` for the oracle.
        kind: ``static``, ``model``, ``agent`` or ``oracle``.
        total_s: over the measured iterations.
        iteration_s: the mean time per measured iteration.
        regret: ``total / oracle total - 1`` (None: no oracle).
        gain: ``best static total / total`` (None: no static run).
        wrong: elements outside the tolerance, every call of every rank.
        retransmits: packets sent again, every call of every rank.
    """

    strategy: str
    kind: str
    total_s: float
    iteration_s: float
    regret: float | None
    gain: float | None
    wrong: int = 0
    retransmits: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "kind": self.kind,
            "total_s": self.total_s,
            "iteration_s": self.iteration_s,
            "regret": self.regret,
            "gain": self.gain,
            "wrong": self.wrong,
            "retransmits": self.retransmits,
        }


@dataclass(frozen=True)
class Converged:
    """A learning strategy over the last half of the measured iterations.

    Attributes:
        first: the first iteration of that half.
        last: its last iteration (the run's last).
        iteration_s: its mean time per iteration there.
        oracle_iteration_s: the oracle's, over the same iterations.
        within: ``iteration_s / oracle_iteration_s - 1``.
    """

    first: int
    last: int
    iteration_s: float
    oracle_iteration_s: float
    within: float

    @property
    def iterations(self) -> int:
        return self.last - self.first + 1

    @property
    def enough(self) -> bool:
        """Whether the half is long enough to be called converged
        (:data:`MIN_CONVERGED_ITERATIONS`)."""
        return self.iterations >= MIN_CONVERGED_ITERATIONS

    def to_json(self) -> dict[str, Any]:
        return {
            "first_iteration": self.first,
            "last_iteration": self.last,
            "enough_iterations": self.enough,
            "iteration_s": self.iteration_s,
            "oracle_iteration_s": self.oracle_iteration_s,
            "within": self.within,
        }


@dataclass(frozen=True)
class Summary:
    """The table's rows (oracle first, then the runs in order) and what it names."""

    rows: list[SummaryRow]
    best_static: str | None
    converged: dict[str, Converged]
    measured: int
    """Measured iterations per strategy (the warm-up excluded)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [r.to_json() for r in self.rows],
            "best_static": self.best_static,
            "converged": {name: c.to_json() for name, c in self.converged.items()},
            "measured_iterations": self.measured,
            "warmup_iterations": WARMUP_ITERATIONS,
            "min_converged_iterations": MIN_CONVERGED_ITERATIONS,
        }


def summarize(
    runs: Sequence[StrategyRun], oracle: Oracle | None, warmup: int = WARMUP_ITERATIONS
) -> Summary:
    """The summary of the complete runs of ``runs`` (a stopped run's partial iterations
    are in the JSON, not in the table)."""
    done = [r for r in runs if r.complete]
    static = [r for r in done if r.kind == "static"]
    best = min(static, key=lambda r: r.total(warmup)) if static else None
    best_total = best.total(warmup) if best is not None else None
    oracle_total = oracle.total(warmup) if oracle is not None else None
    measured = max((len(r.iterations) - warmup for r in done), default=0)
    rows = []
    end = warmup + measured
    if oracle is not None and oracle_total is not None:
        gain = _ratio(best_total, oracle_total)
        per = mean_iteration_s(oracle.iteration_seconds(), warmup, end)
        rows.append(SummaryRow("oracle", "oracle", oracle_total, per, 0.0, gain))
    for r in done:
        total = r.total(warmup)
        regret = None if oracle_total is None else _ratio(total, oracle_total, minus_one=True)
        per = mean_iteration_s(r.iteration_seconds(), warmup, end)
        rows.append(SummaryRow(r.name, r.kind, total, per, regret, _ratio(best_total, total),
                               r.wrong, r.retransmits))  # fmt: skip
    converged = {}
    if oracle is not None:
        converged = {r.name: _converged(r, oracle, warmup) for r in done if r.kind != "static"}
    return Summary(rows, best.name if best is not None else None, converged, measured)


def _converged(run: StrategyRun, oracle: Oracle, warmup: int) -> Converged:
    end = len(run.iterations)
    first = converged_from(end, warmup)
    mean = mean_iteration_s(run.iteration_seconds(), first, end)
    best = mean_iteration_s(oracle.iteration_seconds(), first, end)
    within = _ratio(mean, best, minus_one=True)
    return Converged(first, end - 1, mean, best, within if within is not None else float("nan"))


def _mean(total: float, count: int) -> float:
    return total / count if count else float("nan")


def _ratio(a: float | None, b: float | None, minus_one: bool = False) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b - (1.0 if minus_one else 0.0)


# ----------------------------------------------------------------- table
def format_summary(summary: Summary, header: str = "") -> str:
    """The summary table (strategy, total, per iteration, regret, gain, wrong, retx),
    then lines naming the range the per-iteration column is over, the best static
    configuration, each learning strategy on its converged half (or why it is not
    judged), and, when a strategy came out below the oracle, why that is noise."""
    lines = [header] if header else []
    width = max([len(r.strategy) for r in summary.rows] + [8])
    lines.append(f"# {'strategy':<{width}}  {'total(s)':>9}  {'iter(s)':>8}  {'regret':>8}"
                 f"  {'gain':>6}  {'wrong':>6}  {'retx':>6}")  # fmt: skip
    for r in summary.rows:
        mark = " *" if r.strategy == summary.best_static else ""
        lines.append(
            f"  {r.strategy:<{width}}  {r.total_s:9.3f}  {r.iteration_s:8.4f}"
            f"  {_pct(r.regret):>8}  {_times(r.gain):>6}  {_count(r, r.wrong):>6}"
            f"  {_count(r, r.retransmits):>6}{mark}"
        )
    last = summary.measured + WARMUP_ITERATIONS - 1
    if summary.rows:
        lines.append(f"# iter(s): the mean time per iteration over the measured iterations"
                     f" {WARMUP_ITERATIONS}..{last}")  # fmt: skip
    if summary.best_static is not None:
        lines.append(f"# * best static: {summary.best_static}")
    lines += [_converged_line(name, c) for name, c in summary.converged.items()]
    below = _below_the_oracle(summary)
    if below:
        lines.append(f"# below the oracle ({', '.join(below)}): {NOISE_NOTE}")
    return "\n".join(lines)


def _converged_line(name: str, c: Converged) -> str:
    window = f"iterations {c.first}..{c.last}"
    if not c.enough:
        return (
            f"# {name}: not judged converged: the last half of the measured iterations"
            f" ({window}) is {c.iterations} iteration{'s' if c.iterations != 1 else ''},"
            f" fewer than {MIN_CONVERGED_ITERATIONS}"
            f" (--iterations {iterations_to_converge()} or more gives {MIN_CONVERGED_ITERATIONS})"
        )
    return (
        f"# {name} once converged ({window}): {c.iteration_s:.4f} s per iteration,"
        f" {_within_words(c.within)} the oracle's {c.oracle_iteration_s:.4f} s over the same"
        " iterations"
    )


def _below_the_oracle(summary: Summary) -> list[str]:
    """``NAME -1.3%`` for each strategy whose regret, or converged half, is negative."""
    below = [
        f"{r.strategy} {_pct(r.regret)}"
        for r in summary.rows
        if r.kind != "oracle" and r.regret is not None and r.regret < 0
    ]
    below += [
        f"{name} {_pct(c.within)} once converged"
        for name, c in summary.converged.items()
        if c.enough and c.within < 0
    ]
    return below


def _within_words(within: float) -> str:
    if within != within:
        return "no comparison with"
    if within < 0:
        return f"{-100 * within:.1f}% faster than"
    return f"within {100 * within:.1f}% of"


def _pct(value: float | None) -> str:
    return "-" if value is None or value != value else f"{100 * value:+.1f}%"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _count(row: SummaryRow, value: int) -> str:
    return "-" if row.kind == "oracle" else str(value)


# ----------------------------------------------------------------- the set-up in words
def setup_lines(setup: ReplaySetup) -> list[str]:
    """The banner's lines on the workload, the iterations and the strategies."""
    from collections import Counter

    w = setup.workload
    kinds = ", ".join(f"{c} {n}" for c, n in Counter(c.collective for c in w.calls).items())
    lines = [
        f"# {w.name}: {len(w.calls)} calls per iteration ({kinds}),"
        f" {sum(setup.run_bytes) / (1 << 20):.1f} MiB at scale {setup.scale:.4g},"
        f" {setup.workers} workers",
        f"# {setup.iterations} iterations per strategy, iteration 0 a warm-up (not counted);"
        f" {_strategy_words(setup)}",
    ]
    rounded = sum(1 for c, b in zip(w.calls, setup.run_bytes, strict=True) if c.nbytes != b)
    if rounded:
        lines.append(f"# {rounded} reduce_scatter/all_gather sizes rounded up to a multiple of"
                     f" {4 * setup.workers} bytes (4 x workers: equal parts)")  # fmt: skip
    return lines


def _strategy_words(setup: ReplaySetup) -> str:
    parts = []
    if "static" in setup.strategies:
        how = ("every combination" if setup.static_mode == "product"
               else "one per action, the ring for collectives it cannot run")  # fmt: skip
        parts.append(f"{len(setup.statics)} static ({how})")
    parts += [s for s in ("model", "agent") if s in setup.strategies]
    if "oracle" in setup.strategies:
        parts.append("oracle computed from the static runs")
    return "strategies: " + ", ".join(parts)


def workload_json(setup: ReplaySetup) -> dict[str, Any]:
    """The JSON's ``workload``: its calls as traced and as run, and the scale."""
    w = setup.workload
    calls = [
        {"collective": c.collective, "nbytes": c.nbytes, "nbytes_run": b, "dtype": c.dtype,
         "label": c.label}
        for c, b in zip(w.calls, setup.run_bytes, strict=True)
    ]  # fmt: skip
    return {
        "name": w.name,
        "description": w.description,
        "source": w.source,
        "scale": setup.scale,
        "total_bytes": w.total_bytes,
        "total_bytes_run": sum(setup.run_bytes),
        "rounding": "reduce_scatter and all_gather sizes rounded up to a multiple of"
        f" {4 * setup.workers} bytes (4 x workers); an all_gather rank passes nbytes_run /"
        " workers",
        "calls": calls,
    }


def actions_json(setup: ReplaySetup) -> dict[str, Any]:
    """The JSON's ``actions``: the space per collective and the static configurations."""
    return {
        "space": {c: [a.label for a in s] for c, s in setup.spaces.items()},
        "lanes": setup.lanes,
        "slots": setup.slots,
        "static_mode": setup.static_mode,
        "static_configs": {
            name: {c: a.label for c, a in config.items()} for name, config in setup.statics.items()
        },
    }


# ----------------------------------------------------------------- JSON
def make_document(
    metadata: Mapping[str, Any],
    runs: Iterable[StrategyRun],
    oracle: Oracle | None,
    summary: Summary,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document: schema tag, metadata, notes, ``extra`` sections (workload,
    scenario, actions), every strategy's calls, the oracle and the summary."""
    return {
        "schema": JSON_SCHEMA,
        "metadata": dict(metadata),
        "notes": {"timing": TIMING_NOTE, "oracle": ORACLE_NOTE},
        **dict(extra or {}),
        "strategies": {r.name: r.to_json() for r in runs},
        "oracle": None if oracle is None else oracle.to_json(),
        "summary": summary.to_json(),
    }


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Write ``document`` as indented JSON (the directory must exist)."""
    path.write_text(json.dumps(document, indent=2) + "\n")


# ----------------------------------------------------------------- plot
def write_plot(
    path: Path,
    runs: Sequence[StrategyRun],
    oracle: Oracle | None,
    summary: Summary,
    change_at: int | None = None,
    title: str = "",
    references: Sequence[StrategyRun] = (),
) -> None:
    """Time per iteration against iteration for the agent, the model, the best static
    configuration, the oracle and ``references`` (runs outside the comparison, e.g.
    Gloo), with a vertical line at the change, as PNG (the Agg canvas: no display, no
    pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot_figure(runs, oracle, summary, change_at, title, references)
    FigureCanvasAgg(fig)
    fig.savefig(str(path), format="png", dpi=100)


def plot_figure(
    runs: Sequence[StrategyRun],
    oracle: Oracle | None,
    summary: Summary,
    change_at: int | None = None,
    title: str = "",
    references: Sequence[StrategyRun] = (),
) -> Any:
    """The figure of :func:`write_plot` (not drawn)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    by_name = {r.name: r for r in runs}
    lines: list[tuple[str, list[float], str]] = []
    for name in ("agent", "model"):
        if name in by_name:
            lines.append((name, by_name[name].iteration_seconds(), "-"))
    if summary.best_static in by_name:
        best = by_name[summary.best_static]
        lines.append((f"best static: {best.name}", best.iteration_seconds(), "--"))
    if oracle is not None:
        lines.append(("oracle (computed)", oracle.iteration_seconds(), ":"))
    lines += [(f"{r.name} (reference)", r.iteration_seconds(), "-.") for r in references]
    for label, ys, style in lines:
        ax.plot(range(len(ys)), ys, style, marker="o", label=label)
    ax.axvspan(-0.5, WARMUP_ITERATIONS - 0.5, color="gray", alpha=0.15, label="warm-up")
    if change_at is not None:
        ax.axvline(change_at - 0.5, color="red", lw=1, label=f"change at iteration {change_at}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("time per iteration (s), slowest rank per call")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    if title:
        fig.suptitle(title, fontsize="medium")
    return fig
