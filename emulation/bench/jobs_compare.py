"""``inalab compare A.json B.json ...`` of ``inalab emulate T --jobs ... bench --json``
documents: each job's time per call together, under each memory policy, in one table
and one plot (issue #41: a static partition, shared best effort with fallback, all-ring,
and dynamiccl's choice, side by side).

Emulation layer (bench), a reader of what :mod:`emulation.mininet.multijob` writes
(schema ``inalab-multijob/1``). A series is one (file, algorithm): ``partition ina``,
``partition ring``, ``shared ina``, ``dynamic auto``, labelled by the file's policy
(its name when two files have the same). The files must hold the same jobs (ids and
worker counts); the table is at each size they all measured, a row per job, a column
per series: the time per call together (the slowest rank's mean) and, in brackets, its
factor against the same job alone. ``*`` marks a together row that was CPU-bound. The
plot has a group of bars per job, one bar per series (hatched: CPU-bound), and a tick
at the job's time alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MULTIJOB_SCHEMA",
    "JobSeries",
    "JobsError",
    "format_jobs",
    "is_multijob",
    "jobs_figure",
    "read_jobs",
    "write_jobs_plot",
]

MULTIJOB_SCHEMA = "inalab-multijob/1"
""":data:`emulation.mininet.multijob.SCHEMA`, spelled here: the bench layer reads what the
Mininet layer above it writes, without importing it."""


class JobsError(ValueError):
    """A multi-job document that cannot be read or compared."""


@dataclass(frozen=True)
class Point:
    """One job's time per call at one size: together, alone, whether together was
    CPU-bound."""

    together_us: float | None
    alone_us: float | None
    bound: bool


@dataclass(frozen=True)
class JobSeries:
    """One (file, algorithm): per (job, size), its :class:`Point`."""

    label: str
    points: Mapping[tuple[int, int], Point]


def is_multijob(doc: Any) -> bool:
    """Whether ``doc`` is a multi-job document."""
    return isinstance(doc, Mapping) and doc.get("schema") == MULTIJOB_SCHEMA


def read_jobs(paths: Sequence[Path], docs: Sequence[Mapping[str, Any]]) -> list[JobSeries]:
    """The series of the documents (read from ``paths``), in file order.

    Raises:
        JobsError: a document with no jobs, jobs that differ from the first file's, or a
            malformed row.
    """
    policies = [_policy(d) for d in docs]
    pairs = zip(policies, paths, strict=True)
    names = [p if policies.count(p) == 1 else path.stem for p, path in pairs]
    first = _jobs_of(paths[0], docs[0])
    out = []
    for path, doc, name in zip(paths, docs, names, strict=True):
        jobs = _jobs_of(path, doc)
        if jobs != first:
            raise JobsError(f"{path}: jobs {_show(jobs)}, not {paths[0]}'s {_show(first)}")
        try:
            by_algo = _points(doc["jobs"])
        except (KeyError, TypeError, AttributeError):
            raise JobsError(f"{path}: a row without its algo or size_bytes") from None
        out += [JobSeries(f"{name} {algo}", points) for algo, points in by_algo.items()]
    return out


def _points(jobs: Sequence[Mapping[str, Any]]) -> dict[str, dict[tuple[int, int], Point]]:
    """Per algorithm, (job, size) -> its :class:`Point`, from the documents' jobs.

    Raises:
        KeyError, TypeError, AttributeError: a malformed row.
    """
    by_algo: dict[str, dict[tuple[int, int], Point]] = {}
    for job in jobs:
        alone = {(r["algo"], r["size_bytes"]): r for r in job.get("alone") or ()}
        for row in job.get("together") or ():
            key = (row["algo"], row["size_bytes"])
            solo = alone.get(key)
            cpu = row.get("cpu") or {}
            point = Point(row.get("time_us"), None if solo is None else solo.get("time_us"),
                          cpu.get("bound") is True)  # fmt: skip
            by_algo.setdefault(row["algo"], {})[(int(job["job"]), row["size_bytes"])] = point
    return by_algo


def _policy(doc: Mapping[str, Any]) -> str:
    sharing = doc.get("sharing")
    return str(sharing.get("policy")) if isinstance(sharing, Mapping) else "reserve"


def _jobs_of(path: Path, doc: Mapping[str, Any]) -> tuple[tuple[int, int], ...]:
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise JobsError(f"{path}: no jobs")
    try:
        return tuple((int(j["job"]), int(j["workers"])) for j in jobs)
    except (KeyError, TypeError, ValueError):
        raise JobsError(f"{path}: a job without its id or workers") from None


def _show(jobs: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{j} ({n} workers)" for j, n in jobs)


def _sizes(series: Sequence[JobSeries]) -> list[int]:
    """Sizes every series measured, ascending."""
    each = [{size for _, size in s.points} for s in series]
    return sorted(set.intersection(*each)) if each else []


def format_jobs(series: Sequence[JobSeries]) -> str:
    """The table: per size every series measured, a row per job, a column per series.

    Raises:
        JobsError: no size that every series measured.
    """
    sizes = _sizes(series)
    if not sizes:
        raise JobsError("no size that every file and algorithm measured")
    jobs = sorted({job for s in series for job, _ in s.points})
    width = max(18, *(len(s.label) + 2 for s in series))
    lines = ["# time per call together (ms), the slowest rank's mean; (x alone); * CPU-bound"]
    for size in sizes:
        lines.append(f"# size {size} B")
        lines.append(f"{'job':>6}" + "".join(f"{s.label:>{width}}" for s in series))
        for job in jobs:
            cells = [_cell(s.points.get((job, size))) for s in series]
            lines.append(f"{job:>6}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)


def _cell(point: Point | None) -> str:
    if point is None or point.together_us is None:
        return "-"
    text = f"{point.together_us / 1e3:.1f}"
    if point.alone_us:
        text += f" ({point.together_us / point.alone_us:.2f}x)"
    return text + ("*" if point.bound else "")


def write_jobs_plot(path: Path, series: Sequence[JobSeries], title: str = "") -> None:
    """:func:`jobs_figure` as PNG (the bench's Agg canvas)."""
    from emulation.bench.report import save_figure

    save_figure(jobs_figure(series, title), path)


def jobs_figure(series: Sequence[JobSeries], title: str = "") -> Any:
    """Grouped bars at the largest common size: a group per job, a bar per series
    (hatched: CPU-bound), a black tick at the job's time alone."""
    from matplotlib.figure import Figure

    size = _sizes(series)[-1]
    jobs = sorted({job for s in series for job, _ in s.points})
    fig = Figure(figsize=(max(6.0, 1.6 * len(jobs) * max(1, len(series)) / 2), 4.5),
                 layout="constrained")  # fmt: skip
    ax = fig.subplots()
    width = 0.8 / max(1, len(series))
    for k, s in enumerate(series):
        xs, heights, alone, hatches = [], [], [], []
        for j, job in enumerate(jobs):
            point = s.points.get((job, size))
            if point is None or point.together_us is None:
                continue
            x = j - 0.4 + width * (k + 0.5)
            xs.append(x)
            heights.append(point.together_us / 1e3)
            alone.append((x, None if point.alone_us is None else point.alone_us / 1e3))
            hatches.append("//" if point.bound else "")
        bars = ax.bar(xs, heights, width, label=s.label)
        for bar, hatch in zip(bars, hatches, strict=True):
            bar.set_hatch(hatch)
        for x, t in alone:
            if t is not None:
                ax.plot([x - width / 2, x + width / 2], [t, t], color="black", linewidth=2)
    ax.set_xticks(range(len(jobs)), [f"job {j}" for j in jobs])
    ax.set_ylabel("time per call together (ms); black tick: alone")
    ax.set_title(title or f"{size} B per call; hatched: CPU-bound")
    ax.legend(fontsize="small")
    return fig
