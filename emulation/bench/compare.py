"""``inalab compare A.json B.json ...``: several ``inalab bench`` runs in one table and plot.

Emulation layer (bench), a reader of what :mod:`emulation.bench.report` writes
(``inalab bench --json``, ``inalab emulate ... bench --json``): each file's rows come back
through :meth:`~emulation.bench.report.Row.from_json`, each (file, algorithm) is a series,
and the table puts the series side by side at each size with each one's speedup over a
baseline; the plot draws time and speedup against size with the bench's own markers
(hollow: CPU-bound).

Runs are compared only when they measured the same thing: the same collective, data type,
worker count, switch drop simulator and network (loopback, or the same topology, job and
links as applied). Knobs a comparison is usually about (lanes, window, data plane,
version, machine) may differ; the header lists what does. ``--force`` compares runs of
different configurations anyway.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulation.bench.config import ALGORITHMS
from emulation.bench.report import JSON_SCHEMA, Row

__all__ = [
    "CONFIGURATION",
    "BenchRun",
    "CompareError",
    "Series",
    "add_arguments",
    "bench_run_of",
    "check_same_configuration",
    "comparison_figure",
    "format_comparison",
    "read_bench_run",
    "resolve_baseline",
    "run",
    "series_of",
    "write_comparison_plot",
]

PROG = "inalab compare"

CONFIGURATION: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("collective", ("collective",)),
    ("data type", ("dtype",)),
    ("workers", ("workers",)),
    ("switch drop simulator", ("loss",)),
    ("network", ("emulation", "topology")),
    ("job", ("emulation", "job")),
    ("links", ("emulation", "links")),
)
"""What makes two bench runs measure the same thing: (name, key path in ``metadata``).
Loopback runs have no ``emulation`` section: their network is ``loopback``."""

SHOWN_DIFFERENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lanes", ("lanes",)),
    ("INA transport", ("transport",)),
    ("packets per RDMA message", ("msg_packets",)),
    ("slots", ("slots",)),
    ("ring/tree window", ("window",)),
    ("iters", ("sweep", "iters")),
    ("warmup", ("sweep", "warmup_iters")),
    ("host", ("hostname",)),
    ("cores", ("cpu_count",)),
    ("inalab", ("versions", "inalab")),
    ("torch", ("versions", "torch")),
)
"""What may differ between compared runs and is worth a line when it does."""

EPILOG = """\
A series is one algorithm of one file (LABEL:ALGO; a file's label is its name without
.json). The table has one line per size, each series' time (the slowest rank's mean per
call, as the bench's table) and, beside every series compared with the baseline, its
speedup: the baseline's time over the series' time at that size (above 1: faster than the
baseline). `--baseline` is a file (its number from 1, or its label: each algorithm
against the same algorithm of that file; the default is the first file) or an algorithm
(e.g. gloo: each series against the same file's gloo). Under the table: the geometric
mean speedup of each series over the sizes both have; `!` marks a CPU-bound row. Files
from different configurations (collective, data type, workers, the switch drop
simulator, the network: loopback or topology, job and links as applied) are refused
unless --force; lanes, window, machine and versions may differ and are listed. E.g.
`inalab compare before.json after.json --plot compare.png`, `inalab compare star4.json
--baseline gloo`."""


class CompareError(ValueError):
    """A file that cannot be compared, or runs that should not be; one line."""


@dataclass(frozen=True)
class BenchRun:
    """One bench JSON file: its label, metadata and rows, with each row's CPU-bound flag."""

    path: Path
    label: str
    metadata: Mapping[str, Any]
    rows: tuple[Row, ...]
    bound: frozenset[tuple[str, int]]
    """(algorithm, size) of the rows whose time measured the machine's CPU."""

    @property
    def algos(self) -> list[str]:
        return list(dict.fromkeys(r.algo for r in self.rows))


@dataclass(frozen=True)
class Series:
    """One algorithm of one run, its rows by size, and what it is compared with."""

    run: BenchRun
    algo: str
    rows: Mapping[int, Row]
    baseline: Series | None = None

    @property
    def name(self) -> str:
        return f"{self.run.label}:{self.algo}"

    def bound(self, nbytes: int) -> bool:
        return (self.algo, nbytes) in self.run.bound

    def speedup(self, nbytes: int) -> float | None:
        """The baseline's time over this series' at ``nbytes`` (None: either lacks it)."""
        if self.baseline is None or nbytes not in self.rows or nbytes not in self.baseline.rows:
            return None
        mine = self.rows[nbytes].time_us_max
        return self.baseline.rows[nbytes].time_us_max / mine if mine > 0 else None

    def mean_speedup(self) -> float | None:
        """The geometric mean of :meth:`speedup` over the sizes both have."""
        ratios = [x for n in self.rows if (x := self.speedup(n)) is not None and x > 0]
        if not ratios:
            return None
        return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


# ----------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``inalab compare``'s arguments."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add = parser.add_argument
    add(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE.json",
        help="inalab bench --json files (inalab emulate ... bench's too)",
    )
    add(
        "--baseline",
        default="1",
        metavar="FILE|ALGO",
        help="what speedups are relative to: a file's number (from 1) or label, each "
        "algorithm against that file's same algorithm; or an algorithm "
        f"({', '.join(ALGORITHMS)}), each series against its own file's (default: 1, the "
        "first file)",
    )
    add(
        "--plot",
        type=Path,
        metavar="PATH",
        help="write a PNG: time and speedup against size, one line per series",
    )
    add(
        "--force",
        action="store_true",
        help="compare runs of different configurations (data type, workers, network...)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the comparison and write the plot; 0, or 2 with one line on stderr for a
    file that cannot be read or compared (as the other commands' bad arguments).
    Multi-job documents (``inalab emulate T --jobs ... bench --json``) are compared by
    :mod:`emulation.bench.jobs_compare`."""
    try:
        if args.plot is not None and not args.plot.parent.is_dir():
            raise CompareError(f"--plot: directory {args.plot.parent} does not exist")
        docs = _read_documents(args.files)
        if _jobs_documents(args.files, docs):
            return _compare_jobs(args, docs)
        runs = _bench_runs(args.files, docs)
        differences = check_same_configuration(runs, force=args.force)
        baseline = resolve_baseline(runs, args.baseline)
    except CompareError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    series = series_of(runs, baseline)
    print(format_comparison(series, runs, baseline, differences))
    if args.plot is not None:
        write_comparison_plot(args.plot, series, _title(runs, baseline))
        print(f"# plot: {args.plot}")
    return 0


def _read_documents(paths: Sequence[Path]) -> list[Any]:
    """Every file's JSON, each read once.

    Raises:
        CompareError: a file given twice, or one that cannot be read or is not JSON.
    """
    from dynamiccl.model import read_json

    resolved = [p.resolve() for p in paths]
    twice = [str(p) for i, p in enumerate(paths) if resolved[i] in resolved[:i]]
    if twice:
        raise CompareError(f"{twice[0]} is given twice")
    return [read_json(p, "bench JSON", CompareError) for p in paths]


def _jobs_documents(paths: Sequence[Path], docs: Sequence[Any]) -> bool:
    """Whether the documents are multi-job ones (all of them; False: bench runs).

    Raises:
        CompareError: multi-job documents mixed with others.
    """
    from emulation.bench.jobs_compare import is_multijob

    kinds = [is_multijob(doc) for doc in docs]
    if any(kinds) and not all(kinds):
        first = paths[kinds.index(True)]
        raise CompareError(f"{first} is a multi-job run (emulate --jobs): compare it with"
                           " other multi-job runs, not bench runs")  # fmt: skip
    return all(kinds)


def _compare_jobs(args: argparse.Namespace, docs: Sequence[Any]) -> int:
    """The multi-job comparison of ``docs`` (the files'): its table, and its plot with
    ``--plot``."""
    from emulation.bench.jobs_compare import JobsError, format_jobs, read_jobs, write_jobs_plot

    try:
        series = read_jobs(args.files, docs)
        table = format_jobs(series)
    except JobsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(table)
    if args.plot is not None:
        write_jobs_plot(args.plot, series)
        print(f"# plot: {args.plot}")
    return 0


# ----------------------------------------------------------------- reading
def read_bench_run(path: Path, label: str | None = None) -> BenchRun:
    """One ``inalab bench --json`` file.

    Raises:
        CompareError: it cannot be read, is not JSON, not a bench sweep's document (a
            replay's, a switch-only run's, another schema), or has a malformed row.
    """
    from dynamiccl.model import read_json

    return bench_run_of(path, read_json(path, "bench JSON", CompareError), label)


def bench_run_of(path: Path, doc: Any, label: str | None = None) -> BenchRun:
    """The bench run of ``doc``, read from ``path`` (see :func:`read_bench_run`).

    Raises:
        CompareError: not a bench sweep's document, or a malformed row.
    """
    schema = doc.get("schema") if isinstance(doc, Mapping) else None
    if schema != JSON_SCHEMA:
        raise CompareError(
            f"{path}: not an inalab bench JSON (schema {schema!r}, expected {JSON_SCHEMA!r})"
        )
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        raise CompareError(f"{path}: no metadata object")
    if meta.get("mode") == "switch-only":
        raise CompareError(f"{path}: a switch-only run (packets/s, no sizes): nothing to compare")
    if "link_rates_mbit" in meta:  # emulate's --bw A,B,... bench: a size has a row per rate
        raise CompareError(
            f"{path}: a link-rate sweep (one row per rate): compare its per-rate files,"
            " RUN_DIR/bench-RATEmbit.json"
        )
    workers = meta.get("workers")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CompareError(f"{path}: metadata.workers: expected a positive integer")
    entries = doc.get("rows")
    if not isinstance(entries, list) or not entries:
        raise CompareError(f"{path}: no rows (a run stopped before its first size?)")
    rows, bound = [], set()
    for i, entry in enumerate(entries):
        try:
            row = Row.from_json(entry, workers)
        except ValueError as exc:
            raise CompareError(f"{path}: rows[{i}]: {exc}") from None
        rows.append(row)
        cpu = entry.get("cpu")
        if isinstance(cpu, Mapping) and cpu.get("bound") is True:
            bound.add((row.algo, row.nbytes))
    return BenchRun(path, label or path.stem, meta, tuple(rows), frozenset(bound))


def _bench_runs(paths: Sequence[Path], docs: Sequence[Any]) -> list[BenchRun]:
    """Every file's run (``docs``: their JSON), labelled by its name without ``.json``
    (by the path as given where two names are alike).

    Raises:
        CompareError: a document :func:`bench_run_of` refuses.
    """
    stems = [p.stem for p in paths]
    labels = [s if stems.count(s) == 1 else str(p) for s, p in zip(stems, paths, strict=True)]
    return [bench_run_of(p, d, lab) for p, d, lab in zip(paths, docs, labels, strict=True)]


def _value(meta: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The metadata's value at ``keys`` (None where it has none; a run without an
    ``emulation`` section ran on ``loopback``)."""
    value: Any = meta
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    if keys == ("emulation", "topology") and value is None:
        return "loopback"
    if keys == ("emulation", "links") and isinstance(value, list):
        # Runs from before links could duplicate and reorder did neither.
        value = [{**LINK_DEFAULTS, **link} if isinstance(link, Mapping) else link
                 for link in value]  # fmt: skip
    return value


LINK_DEFAULTS = {"dup": 0.0, "reorder": 0.0}
"""Link fields a bench run of an older inalab did not record, at the value they had."""


def _shown(value: Any) -> str:
    if isinstance(value, list):  # links: as many as they are, not every field
        return f"{len(value)} links: {_links_summary(value)}"
    return str(value)


def _links_summary(links: list[Any]) -> str:
    kinds = {
        (link.get("bw"), link.get("delay"), link.get("loss"), link.get("dup", 0.0),
         link.get("reorder", 0.0))
        for link in links
        if isinstance(link, Mapping)
    }  # fmt: skip
    return "; ".join(
        f"{'unshaped' if bw is None else f'{bw:g} Mbit/s'}, {delay:g} ms, loss {loss:g}"
        + (f", dup {dup:g}" if dup else "")
        + (f", reorder {reorder:g}" if reorder else "")
        for bw, delay, loss, dup, reorder in sorted(kinds, key=str)
        if isinstance(delay, int | float) and isinstance(loss, int | float)
    )


def check_same_configuration(runs: Sequence[BenchRun], force: bool = False) -> list[str]:
    """Refuse runs that measured different things (:data:`CONFIGURATION`) unless
    ``force``; return one line per other setting that differs (:data:`SHOWN_DIFFERENCES`,
    and with ``force`` the configuration's too).

    Raises:
        CompareError: a run's configuration differs from the first's, without ``force``.
    """
    first = runs[0]
    lines = []
    for table, refuse in ((CONFIGURATION, not force), (SHOWN_DIFFERENCES, False)):
        for name, keys in table:
            values = [_value(r.metadata, keys) for r in runs]
            if all(v == values[0] for v in values):
                continue
            if refuse:
                other = next(r for r, v in zip(runs, values, strict=True) if v != values[0])
                raise CompareError(
                    f"{other.path} and {first.path} are different configurations: {name}"
                    f" {_shown(_value(other.metadata, keys))} vs {_shown(values[0])}"
                    " (--force compares them anyway)"
                )
            shown = ", ".join(f"{r.label} {_shown(v)}" for r, v in zip(runs, values, strict=True))
            lines.append(f"{name}: {shown}")
    return lines


# ----------------------------------------------------------------- baseline and series
def resolve_baseline(runs: Sequence[BenchRun], baseline: str) -> BenchRun | str:
    """``--baseline``: a run (by number from 1, or label) or an algorithm every run has.

    Raises:
        CompareError: it names neither, both, or an algorithm some run lacks.
    """
    labels = [r.label for r in runs]
    if baseline.isdigit():
        number = int(baseline)
        if not 1 <= number <= len(runs):
            raise CompareError(f"--baseline {baseline}: there are files 1..{len(runs)}")
        return runs[number - 1]
    if baseline in labels and baseline in ALGORITHMS:
        raise CompareError(
            f"--baseline {baseline}: both a file's label and an algorithm: give the file's "
            f"number ({labels.index(baseline) + 1}) for the file"
        )
    if baseline in labels:
        return runs[labels.index(baseline)]
    if baseline not in ALGORITHMS:
        raise CompareError(
            f"--baseline {baseline}: not a file (1..{len(runs)}, or {', '.join(labels)}) nor"
            f" an algorithm ({', '.join(ALGORITHMS)})"
        )
    lacking = [r.label for r in runs if baseline not in r.algos]
    if lacking:
        raise CompareError(f"--baseline {baseline}: {', '.join(lacking)} ran no {baseline}")
    return baseline


def series_of(runs: Sequence[BenchRun], baseline: BenchRun | str) -> list[Series]:
    """Every (run, algorithm) in the files' order, each with its baseline series (None:
    it is the baseline, or the baseline run lacks its algorithm)."""

    def rows_of(r: BenchRun, algo: str) -> dict[int, Row]:
        return {row.nbytes: row for row in r.rows if row.algo == algo}

    out = []
    for r in runs:
        for algo in r.algos:
            base: Series | None = None
            if isinstance(baseline, str) and algo != baseline:
                base = Series(r, baseline, rows_of(r, baseline))
            elif isinstance(baseline, BenchRun) and r is not baseline and algo in baseline.algos:
                base = Series(baseline, algo, rows_of(baseline, algo))
            out.append(Series(r, algo, rows_of(r, algo), base))
    return out


# ----------------------------------------------------------------- table and plot
def _describe_baseline(runs: Sequence[BenchRun], baseline: BenchRun | str) -> str:
    if isinstance(baseline, str):
        return f"{baseline} of the same file"
    return f"file {runs.index(baseline) + 1} ({baseline.label}), the same algorithm"


def _configuration(run: BenchRun) -> str:
    meta = run.metadata
    network = _value(meta, ("emulation", "topology"))
    job = _value(meta, ("emulation", "job"))
    where = network if job is None else f"{network} job {job}"
    links = meta.get("links")  # as the bench described them, else from the links themselves
    if not links and isinstance(_value(meta, ("emulation", "links")), list):
        links = _shown(_value(meta, ("emulation", "links")))
    return (
        f"{meta.get('collective', 'allreduce')} {meta.get('dtype')}, {meta.get('workers')}"
        f" workers, {where}"
        + (f" ({links})" if links else "")
        + f", switch drop simulator {meta.get('loss', 0):g}"
    )


def _about(run: BenchRun) -> str:
    """When a run was made, its algorithms, and whether a signal cut it short."""
    stopped = run.metadata.get("stopped_by")
    return f"{run.metadata.get('date', 'undated')}, {', '.join(run.algos)}" + (
        f"; stopped by {stopped}: the sizes it finished" if stopped else ""
    )


def format_comparison(
    series: Sequence[Series],
    runs: Sequence[BenchRun],
    baseline: BenchRun | str,
    differences: Sequence[str] = (),
) -> str:
    """The table: a header naming the files, the configuration and the baseline, one line
    per size with every series' time and speedup, the mean speedups and the notes."""
    from emulation.bench.report import bound_note, format_time

    sizes = sorted({n for s in series for n in s.rows})
    widths = [max(len(s.name), 10) for s in series]
    head = ["#", f"{'size':>11}"]
    units = ["#", f"{'(B)':>11}"]
    for s, w in zip(series, widths, strict=True):
        head.append(f"  {s.name:>{w}}" + ("  speedup" if s.baseline is not None else ""))
        units.append(f"  {'(us)':>{w}}" + ("         " if s.baseline is not None else ""))
    lines = [
        f"# {PROG}: {_configuration(runs[0])}",
        *(f"# {i}: {r.label} = {r.path} ({_about(r)})" for i, r in enumerate(runs, 1)),
        *(f"# differs: {d}" for d in differences),
        "# time = the slowest rank's mean per call; speedup = the baseline's time / this"
        " time at the same size (above 1: faster)",
        f"# baseline: {_describe_baseline(runs, baseline)}",
        "#",
        "".join(head),
        "".join(units).rstrip(),
    ]
    for n in sizes:
        cells = [f"{n:12d}"]
        for s, w in zip(series, widths, strict=True):
            time = "-" if n not in s.rows else format_time(s.rows[n].time_us_max).strip()
            mark = "!" if s.bound(n) else " "
            cells.append(f"  {time:>{w - 1}}{mark}")
            if s.baseline is not None:
                x = s.speedup(n)
                cells.append(f"  {'-' if x is None else f'{x:.2f}x':>7}")
        lines.append("".join(cells).rstrip())
    means = [
        f"{s.name} {m:.2f}x"
        for s in series
        if s.baseline is not None
        if (m := s.mean_speedup()) is not None
    ]
    if means:
        lines.append(f"# mean speedup (geometric, sizes both have): {', '.join(means)}")
    wrong = [f"{s.name} at {n} B" for s in series for n, r in s.rows.items() if r.wrong]
    if wrong:
        lines.append(f"# wrong elements (#wrong > 0 in the file): {', '.join(wrong)}")
    if any(s.bound(n) for s in series for n in s.rows):
        lines.append(bound_note())
    return "\n".join(lines)


def _title(runs: Sequence[BenchRun], baseline: BenchRun | str) -> str:
    return f"{PROG}: {_configuration(runs[0])}\nbaseline: {_describe_baseline(runs, baseline)}"


def write_comparison_plot(path: Path, series: Sequence[Series], title: str = "") -> None:
    """:func:`comparison_figure` as a PNG (the Agg canvas: no display needed)."""
    from emulation.bench.report import save_figure

    save_figure(comparison_figure(series, title), path)


def comparison_figure(series: Sequence[Series], title: str = "") -> Any:
    """Two panels against size (log 2): every series' time, and every compared series'
    speedup over its baseline (1: as fast); hollow markers where a row was CPU-bound. A
    matplotlib ``Figure``, not drawn."""
    from matplotlib.figure import Figure

    from emulation.bench.report import plot_bound_legend, plot_line

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax_t, ax_x = fig.subplots(1, 2)
    for s in series:
        plot_line(ax_t, s.name, [(n, r.time_us_max, s.bound(n)) for n, r in sorted(s.rows.items())])
        if s.baseline is not None:
            points = [(n, x, s.bound(n)) for n in sorted(s.rows) if (x := s.speedup(n)) is not None]
            plot_line(ax_x, f"{s.name} vs {s.baseline.name}", points)
    ax_x.axhline(1.0, color="gray", ls="--", lw=1)
    bound = any(s.bound(n) for s in series for n in s.rows)
    for ax, ylabel in (
        (ax_t, "time per call (us), slowest rank"),
        (ax_x, "speedup: baseline time / time"),
    ):
        if bound:
            plot_bound_legend(ax)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    ax_t.set_yscale("log")
    if title:
        fig.suptitle(title)
    return fig
