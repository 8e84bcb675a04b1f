"""``inalab calibrate``: measure INA, ring and tree briefly and fit a dynamiccl profile.

Runs ``inalab bench``'s sweep (the same workers, switch and checks) for each algorithm
at a few sizes and worker counts, turns each size's time (the slowest rank's mean per
call) into a :class:`~dynamiccl.fit.Measurement`, fits alpha and beta per algorithm
(:func:`~dynamiccl.fit.fit_profile`) and saves the profile as JSON for ``inalab decide
--profile`` and ``inalab bench --algos ...,auto --profile``. It prints the fit against
every measured point, so a poor fit is seen rather than trusted, and warns when the
fit's mean error is above :data:`POOR_FIT_MEAN_ERROR`. The profile records the worker
counts it was measured with (``inalab decide`` warns for others).

On loopback (``inalab calibrate``) the profile holds the software's costs on this
machine, and dynamiccl's model adds what a topology file says about links (bandwidth,
delay, loss, contention) on top. ``inalab emulate TOPOLOGY calibrate`` measures across
an emulated network's links instead, for decisions on that network: the model takes
the slowest of software and wire per byte, so the links' bandwidth is not counted
twice, but their delay is part of the fitted latency. Such a profile records the links
as applied (``links``: the slowest bandwidth, the worst delay and loss of the job's
paths, after ``--bw``, ``--delay``, ``--link-loss``), and ``inalab decide`` says so when
it uses it. Every result is checked like a bench run: a wrong sum fails the calibration.

This is the bench's side of calibration: it runs the sweeps and hands dynamiccl plain
measurements (``dynamiccl.fit``) and the links they crossed
(``emulation.topology.summary.measured_links``); dynamiccl imports nothing of it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynamiccl.model import ALGORITHMS
from emulation.argtypes import cc_target, int_in, positive_float, size
from emulation.bench.config import (
    DEFAULT_BENCH_LANES,
    DEFAULT_BENCH_SLOTS,
    DEFAULT_CC_TARGET,
    DEFAULT_EMULATED_SLOTS,
    BenchConfig,
    align_down,
    format_size,
    size_sweep,
)
from hostlib.protocol import MAX_LANES, MAX_SLOT, MAX_WORKERS

if TYPE_CHECKING:
    from dynamiccl.fit import Measurement
    from dynamiccl.model import MeasuredLinks, Profile
    from emulation.topology import Topology

__all__ = [
    "POOR_FIT_MEAN_ERROR",
    "CalibrationError",
    "add_arguments",
    "calibrate",
    "fit_report",
    "measure",
    "poor_fit_warning",
    "run",
    "worker_counts",
]

PROG = "inalab calibrate"

CANDIDATES = ALGORITHMS
"""What calibration measures by default: every algorithm dynamiccl chooses from."""


POOR_FIT_MEAN_ERROR = 0.20
"""Mean |relative error| of the fit above which calibrate warns. The model chooses the
algorithm with the lowest predicted time, and on one machine the algorithms are often
within 20% of each other (on loopback the tree wins small messages and the ring large
ones, by little): a fit further off than that on average ranks them by its error."""


class CalibrationError(RuntimeError):
    """A calibration run failed or measured wrong sums."""


def worker_counts(text: str) -> tuple[int, ...]:
    """``"2,4,8"`` -> ``(2, 4, 8)``: sorted, unique, each in 2..MAX_WORKERS.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid worker counts {text!r}: e.g. 2,4,8") from None
    if not counts or any(not 2 <= n <= MAX_WORKERS for n in counts):
        raise argparse.ArgumentTypeError(
            f"invalid worker counts {text!r}: comma-separated numbers in 2..{MAX_WORKERS}"
        )
    return tuple(counts)


def _algos(text: str) -> tuple[str, ...]:
    names = {a.strip().lower() for a in text.split(",") if a.strip()}
    if not names or names - set(CANDIDATES):
        raise argparse.ArgumentTypeError(
            f"invalid algorithms {text!r}: a comma-separated subset of {','.join(CANDIDATES)}"
        )
    return tuple(a for a in CANDIDATES if a in names)


def add_arguments(parser: argparse.ArgumentParser, emulated: bool = False) -> None:
    """The flags of ``inalab calibrate`` (the sweep's follow ``inalab bench``);
    ``emulated``: for ``inalab emulate TOPOLOGY calibrate``, whose job gives the workers
    and whose run directory is the emulation's."""
    slots = DEFAULT_EMULATED_SLOTS if emulated else DEFAULT_BENCH_SLOTS
    add = parser.add_argument
    add("-o", "--output", type=Path, required=True, metavar="PATH", help="profile JSON to write")
    add("-b", "--minbytes", type=size, default=4 << 10, help="smallest size (default 4K)")
    add("-e", "--maxbytes", type=size, default=4 << 20, help="largest size (default 4M)")
    add("-f", "--stepfactor", type=int_in(2), default=4, help="size multiplier (default 4)")
    add("-n", "--iters", type=int_in(1), default=3, help="timed calls per size (default 3)")
    add("--cc-target", type=cc_target, default=DEFAULT_CC_TARGET, metavar="MS|off",
        help="INA hosts' congestion target, as inalab bench's (default off)")  # fmt: skip
    add("-w", "--warmup_iters", type=int_in(0), default=1, help="untimed calls (default 1)")
    if not emulated:
        add("--workers", type=worker_counts, default=(4,),
            help="worker counts (default 4; the ranks share this machine's cores, so fit "
            "the count you will run)")  # fmt: skip
    add("--algos", type=_algos, default=CANDIDATES, help="default ina,ring,tree")
    lanes_default = "64 when the topology has a bmv2 switch, else " if emulated else ""
    add("--lanes", type=int_in(1, MAX_LANES), default=None if emulated else DEFAULT_BENCH_LANES,
        help=f"int32 lanes per packet (default {lanes_default}{DEFAULT_BENCH_LANES})")  # fmt: skip
    add("--slots", type=int_in(1, MAX_SLOT + 1), default=slots,
        help=f"INA slots and ring/tree window (default {slots})")  # fmt: skip
    add("--timeout", type=positive_float, default=10.0, help="host no-progress deadline (s)")
    add("--seed", type=int, default=0, help="seed of the inputs")
    if not emulated:
        add("--run-dir", type=Path, help="directory for logs (default: a new temp dir)")
    add("--json", type=Path, metavar="PATH", help="also write the measurements and the fit")


def run(args: argparse.Namespace) -> int:
    """Measure on loopback, fit, save; 0 on success, 1 if a run failed, 2 on bad
    arguments."""
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="inalab-calibrate-"))
    try:
        return calibrate(args, args.workers, run_dir, None, "127.0.0.1 (inalab bench's loopback)")
    finally:
        print(f"# logs: {run_dir}")


def calibrate(
    args: argparse.Namespace,
    workers: Sequence[int],
    run_dir: Path,
    fabric: Any,
    where: str,
    topology: Topology | None = None,
) -> int:
    """Measure with ``workers`` ranks on ``fabric`` (None: loopback), fit, save the
    profile (and ``--json``); 0 on success, 1 if a run failed, 2 on bad arguments.

    ``topology`` is the emulated network as ``fabric`` realises it (overrides applied;
    None on loopback): the profile records its links for the job ``args.job`` (None:
    the first, as ``inalab emulate`` picks it)."""
    from dynamiccl.fit import FitError
    from emulation.topology.summary import measured_links

    for path in (args.output, args.json):
        if path is not None and not path.parent.is_dir():
            print(f"{PROG}: error: directory of {path} does not exist", file=sys.stderr)
            return 2
    try:
        configs = _configs(args, workers)
        check = getattr(fabric, "check", None)
        if check is not None:
            check(configs[0])
        links = None if topology is None else measured_links(topology, getattr(args, "job", None))
    except (ValueError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else exc
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        points = measure(configs, run_dir, fabric)
        profile = _fit(points, args, workers, where, links)
    except (CalibrationError, FitError) as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    report = fit_report(profile, points)
    print(_format(profile, report))
    warning = poor_fit_warning(report)
    if warning is not None:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    profile.save(args.output)
    print(f"# profile: {args.output}")
    if args.json is not None:
        doc = {"profile": profile.to_dict(), "points": report}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"# json: {args.json}")
    return 0


def _configs(args: argparse.Namespace, workers: Sequence[int]) -> list[BenchConfig]:
    """One bench configuration per worker count.

    Raises:
        ValueError: flags that do not make a sweep.
    """
    sizes = size_sweep(align_down(args.minbytes, 4), align_down(args.maxbytes, 4), args.stepfactor)
    if len(sizes) < 2:
        raise ValueError("need two sizes at least to separate latency from bandwidth")
    return [
        BenchConfig(
            sizes=tuple(sizes),
            algos=tuple(args.algos),
            workers=n,
            dtype="float32",
            iters=args.iters,
            warmup=args.warmup_iters,
            lanes=args.lanes,
            slots=args.slots,
            seed=args.seed,
            timeout=args.timeout,
            cc_target=args.cc_target,
        )
        for n in workers
    ]


def measure(configs: Sequence[BenchConfig], run_dir: Path, fabric: Any = None) -> list[Measurement]:
    """Run each configuration's sweep (on ``fabric``, default loopback); one measurement
    per algorithm, size and worker count.

    Raises:
        CalibrationError: a run failed or a result was wrong.
    """
    from dynamiccl.fit import Measurement
    from emulation.bench.progress import TerminalProgress
    from emulation.bench.sweep import BenchError, run_sweep

    total = sum(len(c.algos) * len(c.sizes) for c in configs)
    points: list[Measurement] = []
    level = logging.getLogger().getEffectiveLevel()
    bar = TerminalProgress(total)
    for cfg in configs:
        progress = bar.sweep(cfg.sizes, prefix=f"{cfg.workers} workers, ")
        where = run_dir / f"workers{cfg.workers}"
        where.mkdir(parents=True, exist_ok=True)
        try:
            result = run_sweep(cfg, where, progress, level, fabric)
        except BenchError as exc:
            raise CalibrationError(f"{cfg.workers} workers: {exc}") from exc
        wrong = [r for r in result.rows if r.wrong]
        if wrong:
            r = wrong[0]
            raise CalibrationError(
                f"{r.algo} with {cfg.workers} workers got {r.wrong} wrong elements at "
                f"{format_size(r.nbytes)} (logs: {where})"
            )
        points += [
            Measurement(r.algo, r.nbytes, cfg.workers, r.time_us_max / 1e6) for r in result.rows
        ]
    return points


def _fit(
    points: Sequence[Measurement],
    args: argparse.Namespace,
    workers: Sequence[int],
    where: str,
    links: MeasuredLinks | None = None,
) -> Profile:
    """The profile of ``points``; ``links``: the emulated links they were measured across.

    Raises:
        FitError: the points cannot determine a fit.
    """
    from dynamiccl.fit import fit_profile
    from dynamiccl.model import DEFAULT_PROFILE

    # The packet size and window are the run's: the model counts packets and losses by them.
    base = replace(DEFAULT_PROFILE, packet_bytes=4 * args.lanes, window=args.slots, links=links,
                   workers=tuple(sorted(set(workers))))  # fmt: skip
    date = datetime.now(UTC).date().isoformat()
    counts = ",".join(str(n) for n in workers)
    source = f"inalab calibrate on {where}, {date}, workers {counts}, lanes {args.lanes}"
    if links is not None:
        source += f", links {links.describe()}"
    return fit_profile(points, base, source=source)


def fit_report(profile: Profile, points: Sequence[Measurement]) -> list[dict[str, Any]]:
    """Each point's measured and fitted time and the relative error of the fit."""
    from dynamiccl.model import estimate

    out = []
    for p in points:
        fitted = estimate(p.algorithm, p.size_bytes, p.workers, profile).seconds
        out.append(
            {
                "algorithm": p.algorithm,
                "size_bytes": p.size_bytes,
                "workers": p.workers,
                "seconds": p.seconds,
                "fitted_seconds": fitted,
                "relative_error": fitted / p.seconds - 1.0,
            }
        )
    return out


def poor_fit_warning(report: Sequence[dict[str, Any]]) -> str | None:
    """What to say when the fit's mean |error| is above :data:`POOR_FIT_MEAN_ERROR`
    (None: it is not): how far off, the worst point, and what to do.

    Args:
        report: :func:`fit_report`'s points (at least one).
    """
    errors = [abs(r["relative_error"]) for r in report]
    mean = sum(errors) / len(errors)
    if mean <= POOR_FIT_MEAN_ERROR:
        return None
    worst = max(report, key=lambda r: abs(r["relative_error"]))
    return (
        f"a poor fit: mean |error| {mean:.1%}, above {POOR_FIT_MEAN_ERROR:.0%} (worst:"
        f" {worst['algorithm']} at {format_size(worst['size_bytes'])} with"
        f" {worst['workers']} workers, {worst['relative_error']:+.1%}), so decisions between"
        " algorithms closer than that are guesses. Measure again on an otherwise idle"
        " machine (the ranks share its cores) with more timed calls (-n 10 -w 2); if the"
        " error stays, fit only the sizes you will run (-b/-e): the model (a cost per step"
        " plus one per byte) misses this machine somewhere in between"
    )


def _format(profile: Profile, report: Sequence[dict[str, Any]]) -> str:
    lines = [f"# {PROG}: {profile.source}", "#", "# algorithm   alpha (us/step)   beta (ns/B)"]
    if profile.links is not None:
        links = profile.links
        lines[1:1] = [f"# measured across the emulated links of {links.where}: {links.describe()}"]
    for algo in sorted({r["algorithm"] for r in report}, key=CANDIDATES.index):
        params = profile.params(algo)
        lines.append(f"# {algo:<9}  {params.alpha * 1e6:16.1f}  {params.beta * 1e9:12.3f}")
    lines.append(f"# switch rate {profile.switch_rate / 1e6:.1f} MB/s of contributions")
    lines += ["#", "# algo  workers      size   measured (us)   fitted (us)   error"]
    for r in report:
        lines.append(
            f"  {r['algorithm']:<5} {r['workers']:7d}  {format_size(r['size_bytes']):>8}"
            f"  {r['seconds'] * 1e6:14.1f}  {r['fitted_seconds'] * 1e6:12.1f}"
            f"  {r['relative_error']:+6.1%}"
        )
    errors = [abs(r["relative_error"]) for r in report]
    lines.append(f"# mean |error| {sum(errors) / len(errors):.1%}, max {max(errors):.1%}")
    return "\n".join(lines)
