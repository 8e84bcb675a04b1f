"""Results of ``inalab bench``: rows, nccl-tests bandwidth math, the table, JSON and plot.

Bandwidths follow nccl-tests (doc/PERFORMANCE.md, ``shared/ANCHORS.md`` 3.7):
``algbw = S / t`` and, for allreduce, ``busbw = algbw * 2(n-1)/n``, in GB/s of 1e9 bytes.
That factor assumes an algorithm built from point-to-point sends; with in-network
aggregation each host sends and receives S once, so INA's busbw can exceed the link rate.
``t`` is the largest over ranks of each rank's mean time per call, as nccl-tests reports.
Each row also carries the CPU use during its timed calls (:mod:`emulation.bench.cpu`),
and rows where a process or the machine was nearly saturated are flagged CPU-bound in
the table, the JSON and the plot.

Emulation layer (bench). :class:`Row` and the bandwidth math live in ``rows.py``, below
this module and ``notes.py`` (the footnotes), and are re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulation.bench.cpu import BOUND_FRACTION, CPU_NOTE, RowCpu, worker_cpu
from emulation.bench.notes import (  # re-exported: the tables' footnotes
    RETX_FOOTNOTES,
    RETX_NOTE,
    bound_note,
    busy_note,
    dataplane_note,
    link_drops_note,
    size_cpu_note,
    steal_note,
    switch_notes,
)
from emulation.bench.rows import (  # noqa: F401 (re-exported: the row and its bandwidth math)
    BUS_FORMULA,
    REDOP,
    Row,
    bus_factor,
    redop,
)

__all__ = [
    "JSON_SCHEMA",
    "RETX_NOTE",
    "OraclePoint",
    "Row",
    "bound_note",
    "bus_factor",
    "busy_note",
    "dataplane_note",
    "format_oracle",
    "format_table",
    "format_time",
    "link_drops_note",
    "make_document",
    "merge_ranks",
    "oracle_points",
    "oracle_summary",
    "plot_bound_legend",
    "plot_figure",
    "plot_line",
    "save_figure",
    "size_cpu_note",
    "steal_note",
    "switch_notes",
    "write_json",
    "write_plot",
]

JSON_SCHEMA = "inalab.bench/1"
"""Value of the JSON document's ``schema`` key; bumped on incompatible change."""

TIMING_NOTE = (
    "per rank: mean wall time per call over `iters` back-to-back calls after `warmup_iters`"
    " untimed ones, following a barrier; time_us.mean/min/max are over ranks of those"
    " per-rank means; algbw and busbw use time_us.max (the slowest rank, as the table)"
)

BUSBW_NOTE = (
    "busbw = algbw * 2(n-1)/n (nccl-tests allreduce). The factor assumes point-to-point"
    " algorithms; with INA each host sends and receives S once, so INA's busbw can exceed"
    " the link rate: compare algbw across algorithms"
)


def merge_ranks(
    algo: str,
    dtype: str,
    per_rank: Sequence[Sequence[Any]],
    num_workers: int | None = None,
    collective: str = "allreduce",
    transport: str | None = None,
) -> list[Row]:
    """Merge each rank's per-size results (objects with ``nbytes``, ``count``, ``mean_us``,
    ``wrong``, ``max_abs_err`` and optionally ``retransmits``, ``ran`` and the CPU fields
    ``cpu_s``, ``t_start``, ``t_end``) into one :class:`Row` per size. The rows' ``cpu``
    has the ranks' own use; the sweep adds the switches' and the machine's.

    Raises:
        ValueError: no ranks, or ranks that measured different sizes.
    """
    if not per_rank:
        raise ValueError("no rank results")
    n = len(per_rank) if num_workers is None else num_workers
    sizes = [[r.nbytes for r in results] for results in per_rank]
    if any(s != sizes[0] for s in sizes):
        raise ValueError("ranks measured different sizes")
    rows = []
    for k, nbytes in enumerate(sizes[0]):
        at = [results[k] for results in per_rank]
        times = [r.mean_us for r in at]
        rows.append(
            Row(
                algo=algo,
                nbytes=nbytes,
                count=at[0].count,
                dtype=dtype,
                num_workers=n,
                time_us_mean=sum(times) / len(times),
                time_us_min=min(times),
                time_us_max=max(times),
                wrong=sum(r.wrong for r in at),
                max_abs_err=max(r.max_abs_err for r in at),
                retransmits=sum(getattr(r, "retransmits", 0) for r in at),
                fast_retransmits=sum(getattr(r, "fast_retransmits", 0) for r in at),
                retransmits_timed=sum(getattr(r, "retransmits_timed", 0) for r in at),
                host_drops=sum(getattr(r, "host_drops", 0) for r in at),
                late_answers=sum(getattr(r, "late_answers", 0) for r in at),
                late_timers=sum(getattr(r, "late_timers", 0) for r in at),
                late_samples=sum(getattr(r, "late_samples", 0) for r in at),
                chosen=(getattr(at[0], "ran", "") or None) if algo == "auto" else None,
                cpu=worker_cpu(at),
                collective=collective,
                transport=transport,
                sent_bytes=_sent_bytes(at),
            )
        )
    return rows


def _sent_bytes(at: Sequence[Any]) -> int | None:
    """The hosts' bytes per call: each host's head rank measured its link (the others
    report ``None``); ``None`` when no rank had a link of its own."""
    sent = [s for r in at if (s := getattr(r, "sent_bytes", None)) is not None]
    return sum(sent) if sent else None


# ----------------------------------------------------------------- table
_COLS = "#{:>11}  {:>12}  {:>8}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}"
_CPU_COLS = "  {:>8}  {:>8}  {:>8}"
"""switch, worker, machine; each value is followed by ``!`` (bound) or a space."""


def format_time(us: float) -> str:
    """A time in us for a table column, 9 wide (``inalab compare``'s too)."""
    # nccl-tests drops decimals as times grow, keeping the column width.
    if us >= 10000:
        return f"{us:9.0f}"
    if us >= 100:
        return f"{us:9.1f}"
    return f"{us:9.2f}"


def _fmt_share(share: float | None, bound: bool | None = None) -> str:
    """A share as a whole percentage, ``!`` after it when ``bound`` (default: above the
    bound), ``-`` if unknown."""
    if share is None:
        return "-" + " "
    bound = share > BOUND_FRACTION if bound is None else bound
    return f"{share * 100:.0f}" + ("!" if bound else " ")


def _cpu_cells(cpu: RowCpu | None) -> str:
    if cpu is None:
        return _CPU_COLS.format("- ", "- ", "- ")
    machine = cpu.system.machine
    if machine is None:
        cell = "- "
    else:
        own = cpu.own or 0.0
        mark = "!" if own > BOUND_FRACTION else "~" if cpu.busy_other else " "
        cell = f"{machine * 100:.0f}{mark}"
    # Marked by its process alone: a data plane that runs on every core bounds no process.
    switch_bound = any(who.startswith("switch") for who in cpu.bound_by)
    switch = _fmt_share(cpu.switch_shown, switch_bound)
    return _CPU_COLS.format(switch, _fmt_share(cpu.workers_max), cell)


def format_table(algo: str, rows: Iterable[Row], description: str = "") -> str:
    """An nccl-tests style table of one algorithm's rows, with a summary footer and the
    footnotes that count what happened in them; with CPU columns when any row measured
    its CPU. The columns and marks are explained once for all tables
    (:func:`emulation.bench.notes.legend`)."""
    rows = list(rows)
    collective = rows[0].collective if rows else "allreduce"
    what = (
        []
        if collective == "allreduce"
        else [f"# collective: {collective} (size: the whole vector; each rank's part is 1/n of it)"]
    )
    chosen = any(r.chosen for r in rows)
    cpu = any(r.cpu is not None for r in rows)
    retx = algo != "gloo"  # hostlib's algorithms retransmit; Gloo's TCP does it unseen
    head = (_COLS + ("  {:>7}" if retx else "") + ("  {:>7}" if chosen else "")
            + (_CPU_COLS if cpu else ""))  # fmt: skip
    names = ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    units = ["(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""]
    if retx:
        names, units = [*names, "retx"], [*units, "(pkts)"]
    if chosen:
        names, units = [*names, "chosen"], [*units, ""]
    if cpu:
        names += ["switch ", "worker ", "machine "]
        units += ["(%) ", "(%) ", "(%) "]
    lines = [
        f"# algorithm: {algo}" + (f" ({description})" if description else ""),
        *what,
        head.format(*names).rstrip(),
        head.format(*units).rstrip(),
    ]
    lines += [_table_line(r, chosen, cpu, retx) for r in rows]
    wrong = sum(r.wrong for r in rows)
    avg = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
    if retx:
        for attr, note in RETX_FOOTNOTES:
            count = sum(getattr(r, attr) for r in rows)
            if count:
                lines.append(note.format(count))
    lines += [
        f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
        f"# Avg bus bandwidth    : {avg:.4f}",
    ]
    notes = (busy_note(rows), steal_note(rows), size_cpu_note(rows), dataplane_note(rows))
    lines += [note for note in notes if note]
    return "\n".join(lines)


def _table_line(r: Row, chosen: bool, cpu: bool, retx: bool = True) -> str:
    return (
        f"{r.nbytes:12d}  {r.count:12d}  {r.dtype:>8}  {redop(r.collective):>6}"
        f"  {format_time(r.time_us_max)}"
        f"  {r.algbw:7.4f}  {r.busbw:7.4f}  {r.wrong:6d}"
        + (f"  {r.retransmits:7d}" if retx else "")
        + (f"  {r.chosen or '':>7}" if chosen else "")
        + (_cpu_cells(r.cpu) if cpu else "")
    )


# ----------------------------------------------------------------- dynamiccl vs oracle
@dataclass(frozen=True)
class OraclePoint:
    """One size: the static algorithms' times, the best of them and auto's choice."""

    nbytes: int
    times_us: dict[str, float]
    """Each static candidate's time (slowest rank's mean), by algorithm."""
    oracle: str
    """The fastest static candidate at this size."""
    chosen: str
    """What auto (dynamiccl) chose."""
    auto_us: float
    """auto's own measured time at this size."""

    @property
    def regret(self) -> float:
        """How much slower the chosen algorithm's static run is than the oracle's (0: the
        oracle's choice). The static runs' times, so run-to-run noise does not count."""
        return self.times_us[self.chosen] / self.times_us[self.oracle] - 1.0

    @property
    def auto_regret(self) -> float:
        """auto's own measured time against the oracle's (includes run-to-run noise)."""
        return self.auto_us / self.times_us[self.oracle] - 1.0


def oracle_points(rows: Iterable[Row], candidates: Sequence[str]) -> list[OraclePoint]:
    """auto's rows against the static ``candidates`` measured at the same sizes; sizes
    where auto chose an algorithm that was not measured statically are left out."""
    by: dict[tuple[str, int], Row] = {(r.algo, r.nbytes): r for r in rows}
    points = []
    for (algo, nbytes), auto in sorted(by.items(), key=lambda kv: kv[0][1]):
        if algo != "auto" or auto.chosen is None:
            continue
        times = {a: by[(a, nbytes)].time_us_max for a in candidates if (a, nbytes) in by}
        if auto.chosen not in times:
            continue
        oracle = min(times, key=lambda a: times[a])
        points.append(OraclePoint(nbytes, times, oracle, auto.chosen, auto.time_us_max))
    return points


def oracle_summary(points: Sequence[OraclePoint]) -> dict[str, Any]:
    """Average regret and the mixed workload: every size of the sweep once, as a job
    whose calls span the sweep (DDP's buckets range from its small first bucket to the
    25 MiB cap). The gain is the best single static algorithm's total over auto's.

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("no sizes where auto and its static candidates were all measured")
    common = set.intersection(*(set(p.times_us) for p in points))
    static_total = {a: sum(p.times_us[a] for p in points) for a in sorted(common)}
    best_static = min(static_total, key=lambda a: static_total[a])
    chosen_total = sum(p.times_us[p.chosen] for p in points)
    auto_total = sum(p.auto_us for p in points)
    oracle_total = sum(p.times_us[p.oracle] for p in points)
    return {
        "sizes": len(points),
        "mean_regret": sum(p.regret for p in points) / len(points),
        "max_regret": max(p.regret for p in points),
        "mean_auto_regret": sum(p.auto_regret for p in points) / len(points),
        "agreement": sum(p.chosen == p.oracle for p in points) / len(points),
        "workload_us": {
            **static_total,
            "oracle": oracle_total,
            "chosen": chosen_total,
            "auto": auto_total,
        },
        "best_static": best_static,
        "gain_over_best_static": static_total[best_static] / chosen_total,
        "auto_gain_over_best_static": static_total[best_static] / auto_total,
        "points": [
            {
                "size_bytes": p.nbytes,
                "times_us": p.times_us,
                "oracle": p.oracle,
                "chosen": p.chosen,
                "auto_us": p.auto_us,
                "regret": p.regret,
            }
            for p in points
        ],
    }


def format_oracle(points: Sequence[OraclePoint], summary: Mapping[str, Any]) -> str:
    """The table of auto's choices against the oracle, and the summary lines."""
    algos = list(points[0].times_us) if points else []
    cols = "#{:>11}" + "  {:>10}" * len(algos) + "  {:>7}  {:>7}  {:>10}  {:>7}"
    lines = [
        "# dynamiccl (auto) against the oracle: the fastest static algorithm at each size",
        cols.format("size", *algos, "oracle", "chosen", "auto", "regret"),
        cols.format("(B)", *(["(us)"] * len(algos)), "", "", "(us)", ""),
    ]
    for p in points:
        times = "".join(f"  {format_time(p.times_us[a]):>10}" for a in algos)
        lines.append(
            f"{p.nbytes:12d}{times}  {p.oracle:>7}  {p.chosen:>7}  {format_time(p.auto_us):>10}"
            f"  {p.regret:7.1%}"
        )
    w = summary["workload_us"]
    lines += [
        f"# Mean regret          : {summary['mean_regret']:.1%} (max {summary['max_regret']:.1%};"
        f" auto's own runs {summary['mean_auto_regret']:.1%}),"
        f" oracle agreement {summary['agreement']:.0%}",
        f"# Mixed workload       : every size once: best static {summary['best_static']}"
        f" {w[summary['best_static']] / 1e6:.3f} s, dynamiccl {w['chosen'] / 1e6:.3f} s"
        f" (auto's runs {w['auto'] / 1e6:.3f} s), oracle {w['oracle'] / 1e6:.3f} s:"
        f" gain {summary['gain_over_best_static']:.2f}x",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------- JSON
def make_document(
    metadata: Mapping[str, Any], rows: Iterable[Row], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON document: schema tag, metadata, notes on timing, one entry per row, and
    ``extra`` sections (e.g. ``dynamiccl``: auto against the oracle)."""
    return {
        "schema": JSON_SCHEMA,
        "metadata": dict(metadata),
        "notes": {"timing": TIMING_NOTE, "busbw": BUSBW_NOTE, "cpu": CPU_NOTE},
        "rows": [r.to_json() for r in rows],
        **dict(extra or {}),
    }


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Write ``document`` as indented JSON (parent directories must exist)."""
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")


# ----------------------------------------------------------------- plot
def write_plot(path: Path, rows: Iterable[Row], title: str = "") -> None:
    """Two panels, time and algbw against size (log x), one line per algorithm, as PNG;
    CPU-bound rows are hollow markers.

    Uses the Agg canvas directly, so no display and no pyplot global state.
    """
    save_figure(plot_figure(rows, title), path)


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib ``Figure`` as PNG through the Agg canvas (no display, no pyplot
    state): the bench's plot and ``inalab compare``'s."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(str(path), format="png", dpi=100)


def plot_figure(rows: Iterable[Row], title: str = "") -> Any:
    """The plot of :func:`write_plot` as a matplotlib ``Figure`` (not drawn)."""
    from matplotlib.figure import Figure

    by_algo: dict[str, list[Row]] = {}
    for r in rows:
        by_algo.setdefault(r.algo, []).append(r)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax_t, ax_bw = fig.subplots(1, 2)
    for algo, algo_rows in by_algo.items():
        algo_rows.sort(key=lambda r: r.nbytes)
        _plot_algo(ax_t, algo, algo_rows, lambda r: r.time_us_max)
        _plot_algo(ax_bw, algo, algo_rows, lambda r: r.algbw)
    bound = any(r.cpu is not None and r.cpu.bound for algo_rows in by_algo.values()
                for r in algo_rows)  # fmt: skip
    for ax, ylabel in ((ax_t, "time per call (us), slowest rank"), (ax_bw, "algbw (GB/s)")):
        if bound:
            plot_bound_legend(ax)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if by_algo:
            ax.legend()
    ax_t.set_yscale("log")
    if title:
        fig.suptitle(title)
    return fig


def plot_bound_legend(ax: Any) -> None:
    """The legend entry that says what a hollow marker is (:func:`plot_line`)."""
    ax.plot([], [], ls="none", marker="o", mfc="none", mec="gray",
            label=f"hollow: CPU-bound (>{BOUND_FRACTION:.0%} busy)")  # fmt: skip


def _plot_algo(ax: Any, algo: str, rows: Sequence[Row], y: Any) -> None:
    """One algorithm's line; filled markers, hollow where the row was CPU-bound."""
    plot_line(ax, algo, [(r.nbytes, y(r), r.cpu is not None and r.cpu.bound) for r in rows])


def plot_line(ax: Any, label: str, points: Sequence[tuple[float, float, bool]]) -> None:
    """One line on matplotlib axes ``ax`` through ``points`` (x, y, CPU-bound), with
    filled markers, hollow where the point was CPU-bound (the bench's and ``inalab
    compare``'s plots)."""
    (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
    color = line.get_color()
    for bound in (False, True):
        at = [p for p in points if p[2] == bound]
        face = "none" if bound else color
        # An explicit color keeps the axes' color cycle for the next algorithm's line.
        ax.plot([p[0] for p in at], [p[1] for p in at], ls="none", marker="o",
                color=color, mfc=face, mec=color)  # fmt: skip
