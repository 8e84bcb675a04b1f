"""The link-rate sweep of ``inalab emulate TOPOLOGY --bw 100,200,500,1000 bench``: one
bench per link rate in one network, put together against the rate.

Emulation layer (bench). ``emulation.mininet.emulate`` re-shapes the links between rates and
runs the bench at each; this module owns what is made of the per-rate bench JSON
documents (:mod:`emulation.bench.report`'s): one document with a row per (rate, size,
algorithm), each row with its ``bw_mbit``; a table per size of each algorithm's time
and its speedup over the baseline (Gloo's ring when it ran, else hostlib's ring) at
each rate, and where each algorithm stops beating the baseline (the crossover); a plot
of both against the rate, CPU-bound points hollow, crossovers marked. The crossover is
where the speedup falls through 1 between two measured rates, placed by interpolating
the speedup linearly in log(rate); an algorithm that beats the baseline at every rate
(or at none) has none within the sweep, and the table says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "RatePoint",
    "RateSweepError",
    "baseline_of",
    "crossover",
    "format_rate_sweep",
    "merge_documents",
    "rate_points",
    "write_rate_plot",
]

BASELINES = ("gloo", "ring")
"""What the speedup is over: Gloo's ring allreduce if it ran, else hostlib's ring."""


class RateSweepError(Exception):
    """The per-rate documents cannot be put together (no rows, or a row without time)."""


@dataclass(frozen=True)
class RatePoint:
    """One algorithm at one size and one link rate."""

    bw_mbit: float
    time_us: float
    """The slowest rank's mean time per call (the bench's headline time)."""
    speedup: float | None
    """Baseline time / this time at the same rate and size (None: no baseline there)."""
    bound: bool
    """The row was CPU-bound (``cpu.bound`` in the JSON)."""


PER_RATE = (
    "wall_s",
    "links",
    "switch_counters",
    "switch_log",
    "udp_kernel_counters_delta",
    "link_drops",
    "busy_cores_before",
    "stopped_by",
)
"""Metadata each rate's bench has of its own: kept per rate, not at the top."""


def merge_documents(docs: Sequence[tuple[float, Mapping[str, Any]]]) -> dict[str, Any]:
    """One bench document from ``(rate, document)`` pairs in sweep order: the first
    one's metadata with ``link_rates_mbit`` (the rates) and ``per_rate`` (each rate's
    :data:`PER_RATE` metadata and sections other than rows, e.g. auto's ``dynamiccl``),
    its notes, and every row with its ``bw_mbit``. ``metadata.emulation`` loses its
    ``links``: each rate's are ``per_rate``'s ``emulation_links`` (``inalab compare``
    refuses a sweep's document: a size has a row per rate).

    Raises:
        RateSweepError: ``docs`` is empty.
    """
    if not docs:
        raise RateSweepError("no rate finished: nothing to report")
    first = docs[0][1]
    rates = [rate for rate, _ in docs]
    meta = {k: v for k, v in first.get("metadata", {}).items() if k not in PER_RATE}
    meta["link_rates_mbit"] = rates
    if isinstance(meta.get("emulation"), Mapping):  # its links are each rate's
        meta["emulation"] = {k: v for k, v in meta["emulation"].items() if k != "links"}
    meta["per_rate"] = []
    for rate, doc in docs:
        at = doc.get("metadata", {})
        sections = {
            k: v for k, v in doc.items() if k not in ("schema", "metadata", "notes", "rows")
        }
        emulation = at.get("emulation")
        if isinstance(emulation, Mapping) and "links" in emulation:
            sections["emulation_links"] = emulation["links"]
        meta["per_rate"].append(
            {"bw_mbit": rate, **{k: at[k] for k in PER_RATE if k in at}, **sections}
        )
    rows = [{"bw_mbit": rate, **row} for rate, doc in docs for row in doc.get("rows", [])]
    out = {key: first[key] for key in ("schema", "notes") if key in first}
    return {**out, "metadata": meta, "rows": rows}


def baseline_of(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The algorithm speedups are over: the first of :data:`BASELINES` among the rows."""
    algos = {row.get("algo") for row in rows}
    return next((b for b in BASELINES if b in algos), None)


def _time(row: Mapping[str, Any]) -> float:
    try:
        return float(row["time_us"]["max"])
    except (KeyError, TypeError, ValueError):
        raise RateSweepError(f"row without time_us.max: {dict(row)!r}") from None


def rate_points(
    rows: Sequence[Mapping[str, Any]], baseline: str | None
) -> dict[tuple[str, int], list[RatePoint]]:
    """(algorithm, size) -> its points in ascending rate, from rows with ``bw_mbit``.

    Raises:
        RateSweepError: a row has no time.
    """
    base = {(r["bw_mbit"], r["size_bytes"]): _time(r) for r in rows if r["algo"] == baseline}
    out: dict[tuple[str, int], list[RatePoint]] = {}
    for row in rows:
        t = _time(row)
        b = base.get((row["bw_mbit"], row["size_bytes"]))
        cpu = row.get("cpu")
        point = RatePoint(
            bw_mbit=float(row["bw_mbit"]),
            time_us=t,
            speedup=None if b is None or t <= 0 else b / t,
            bound=isinstance(cpu, Mapping) and cpu.get("bound") is True,
        )
        out.setdefault((str(row["algo"]), int(row["size_bytes"])), []).append(point)
    for points in out.values():
        points.sort(key=lambda p: p.bw_mbit)
    return out


def crossover(points: Sequence[RatePoint]) -> float | None:
    """The rate at which the speedup first falls through 1 (the algorithm stops beating
    the baseline), interpolated in log(rate) between the two measured rates around it;
    None if it never does within ``points`` (ascending rates)."""
    known = [p for p in points if p.speedup is not None]
    for lo, hi in itertools.pairwise(known):
        assert lo.speedup is not None and hi.speedup is not None
        if lo.speedup > 1.0 >= hi.speedup:
            a, b = math.log(lo.speedup), math.log(hi.speedup)
            frac = a / (a - b) if a != b else 1.0
            x0, x1 = math.log(lo.bw_mbit), math.log(hi.bw_mbit)
            return math.exp(x0 + frac * (x1 - x0))
    return None


def _verdict(algo: str, baseline: str, points: Sequence[RatePoint]) -> str:
    """One line: where ``algo`` stops beating ``baseline``, or that it does not."""
    rate = crossover(points)
    known = [p for p in points if p.speedup is not None]
    if not known:
        return f"{algo}: no {baseline} time at these rates"
    if rate is not None:
        return f"{algo} stops beating {baseline} at about {rate:.0f} Mbit/s"
    lo, hi = known[0].bw_mbit, known[-1].bw_mbit
    assert known[0].speedup is not None
    if all(p.speedup is not None and p.speedup > 1.0 for p in known):
        return f"{algo} beats {baseline} at every rate ({lo:g} to {hi:g} Mbit/s): no crossover"
    if all(p.speedup is not None and p.speedup <= 1.0 for p in known):
        return f"{algo} is not faster than {baseline} at any rate ({lo:g} to {hi:g} Mbit/s)"
    return f"{algo} overtakes {baseline} only as the rate grows: no crossover downward"


def format_rate_sweep(rows: Sequence[Mapping[str, Any]], description: str = "") -> str:
    """The sweep's tables: per size, a line per rate with each algorithm's time (``!``
    after it: CPU-bound) and its speedup over the baseline, then the crossover lines.

    Raises:
        RateSweepError: a row has no time.
    """
    from emulation.bench.report import bound_note, format_time
    from hostlib.units import format_size as human_size

    baseline = baseline_of(rows)
    points = rate_points(rows, baseline)
    algos = list(dict.fromkeys(str(r["algo"]) for r in rows))
    lines = [f"# link-rate sweep{': ' + description if description else ''}"]
    if baseline is None:
        lines.append("# no gloo or ring rows: times only, no speedups or crossovers")
    else:
        lines.append(f"# x{baseline} = {baseline}'s time / the algorithm's at the same rate"
                     f" (>1: faster than {baseline})")  # fmt: skip
    header = "#  Mbit/s" + "".join(
        f" {algo:>10}" + ("" if algo == baseline or baseline is None else f" {'x' + baseline:>7}")
        for algo in algos
    )
    for size in sorted({int(r["size_bytes"]) for r in rows}):
        lines += ["#", f"# size {human_size(size)} ({size} bytes): time (us)", header]
        rates = sorted({p.bw_mbit for a in algos for p in points.get((a, size), [])})
        for rate in rates:
            cells = []
            for algo in algos:
                at = next((p for p in points.get((algo, size), []) if p.bw_mbit == rate), None)
                if at is None:
                    cells.append(f"{'-':>9} ")
                else:
                    cells.append(f"{format_time(at.time_us)}{'!' if at.bound else ' '}")
                if algo != baseline and baseline is not None:
                    s = None if at is None else at.speedup
                    cells.append(f"{'-' if s is None else f'{s:.2f}':>7}")
            lines.append(f"{rate:9g} {' '.join(cells)}".rstrip())
        if baseline is not None:
            for algo in algos:
                if algo != baseline and (algo, size) in points:
                    verdict = _verdict(algo, baseline, points[algo, size])
                    lines.append(f"# {human_size(size)}: {verdict}")
    if any(p.bound for ps in points.values() for p in ps):
        lines.append(bound_note())
    return "\n".join(lines)


def write_rate_plot(path: Path, rows: Sequence[Mapping[str, Any]], title: str = "") -> None:
    """Two panels against the link rate (log x): time per call, and speedup over the
    baseline with the line at 1; one line per (algorithm, size), hollow where CPU-bound,
    each crossover an ``x`` on the speedup line at 1.

    Raises:
        RateSweepError: a row has no time.
    """
    from matplotlib.figure import Figure

    from emulation.bench.report import plot_bound_legend, plot_line, save_figure
    from hostlib.units import format_size as human_size

    baseline = baseline_of(rows)
    points = rate_points(rows, baseline)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax_t, ax_s = fig.subplots(1, 2)
    crossed = False
    for (algo, size), ps in sorted(points.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        label = f"{algo} {human_size(size)}"
        plot_line(ax_t, label, [(p.bw_mbit, p.time_us, p.bound) for p in ps])
        if algo != baseline and baseline is not None:
            known = [(p.bw_mbit, p.speedup, p.bound) for p in ps if p.speedup is not None]
            plot_line(ax_s, label, known)
            rate = crossover(ps)
            if rate is not None:
                ax_s.plot([rate], [1.0], ls="none", marker="x", ms=10, color="black")
                crossed = True
    ax_s.axhline(1.0, color="gray", lw=1, ls="--")
    if crossed:
        ax_s.plot([], [], ls="none", marker="x", color="black",
                  label=f"crossover: stops beating {baseline}")  # fmt: skip
    bound = any(p.bound for ps in points.values() for p in ps)
    swept = sorted({float(r["bw_mbit"]) for r in rows})
    labels = (("time per call (us), slowest rank", ax_t),
              (f"speedup over {baseline} (x{baseline})", ax_s))  # fmt: skip
    for ylabel, ax in labels:
        if bound:
            plot_bound_legend(ax)
        ax.set_xscale("log")
        ax.set_xticks(swept, [f"{r:g}" for r in swept])
        ax.minorticks_off()
        ax.set_xlabel("link rate (Mbit/s)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    ax_t.set_yscale("log")
    if title:
        fig.suptitle(title)
    save_figure(fig, path)
