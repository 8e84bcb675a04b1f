"""``inalab decide``: the predicted time of each algorithm for one collective, and the choice.

Reads a profile (``--profile``, a JSON file from :meth:`Profile.save` or ``inalab
calibrate``; without it :data:`~dynamiccl.model.DEFAULT_PROFILE`, labelled as defaults)
and optionally a topology (``--topology``: link bandwidth, delay, loss, contention and
whether a switch aggregates for the job), prints one line per algorithm and the choice
with its reason, or the same as JSON (``--json``). ``--export-tuner PATH`` also writes
the choices over ``--min..--max`` as an NCCL example-tuner rule file. Sizes use
nccl-tests' syntax (``4096``, ``4K``, ``1M``, ``1G``). Bad input exits 2 with one line.

Also runs standalone: ``python -m dynamiccl.cli --size 4M --workers 8``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from emulation.argtypes import int_in, size
from emulation.bench.config import format_size

if TYPE_CHECKING:
    from dynamiccl.model import TopologySummary
    from dynamiccl.policy import Decision

__all__ = ["add_arguments", "main", "run"]

PROG = "inalab decide"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``inalab decide``."""
    from dynamiccl.model import COLLECTIVES

    parser.add_argument("--size", type=size, help="message size, e.g. 4096, 4K, 4M, 1G")
    parser.add_argument(
        "--workers",
        type=int_in(1),
        help="ranks taking part (default: the topology job's ranks)",
    )
    parser.add_argument("--topology", type=Path, help="a topologies/ file: the job's network")
    parser.add_argument("--job", type=int_in(0, 0xFFFF), help="the topology's job (default: first)")
    parser.add_argument(
        "--profile", type=Path, help="profile JSON (default: built-in loopback numbers)"
    )
    parser.add_argument(
        "--collective", default="allreduce", choices=COLLECTIVES, help="default: allreduce"
    )
    parser.add_argument(
        "--slots", type=int_in(0), help="the job's free switch slots (0: INA unavailable)"
    )
    parser.add_argument(
        "--no-ina", action="store_true", help="the switch is unreachable: never choose INA"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--export-tuner", type=Path, metavar="PATH", help="write an NCCL tuner rule file"
    )
    parser.add_argument(
        "--min", type=size, default=4096, help="--export-tuner's smallest size (default 4K)"
    )
    parser.add_argument(
        "--max", type=size, default=1 << 30, help="--export-tuner's largest size (default 1G)"
    )


class _UsageError(ValueError):
    pass


def run(args: argparse.Namespace) -> int:
    """Print the decision (and write the rule file); 0 on success, 2 on bad input."""
    try:
        return _run(args)
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from dynamiccl.model import DEFAULT_PROFILE, Profile, ProfileError
    from dynamiccl.policy import choose
    from dynamiccl.tuner import tuner_rules, write_rules

    if args.size is None and args.export_tuner is None:
        raise _UsageError("give --size, --export-tuner PATH, or both")
    if args.min > args.max:
        raise _UsageError(f"--min {format_size(args.min)} is above --max {format_size(args.max)}")
    try:
        profile = DEFAULT_PROFILE if args.profile is None else Profile.load(args.profile)
    except ProfileError as exc:
        raise _UsageError(str(exc)) from None
    summary, job_ranks, hosts = _topology(args)
    workers = args.workers if args.workers is not None else job_ranks
    if workers is None:
        raise _UsageError("give --workers (or a --topology with a job)")
    ina = not args.no_ina

    def decide(size: int) -> Decision:
        return choose(args.collective, size, workers, summary, profile, ina_available=ina)

    if args.export_tuner is not None:
        if not args.export_tuner.parent.is_dir():
            raise _UsageError(f"directory of {args.export_tuner} does not exist")
        rules = tuner_rules(decide, args.collective, args.min, args.max, n_ranks=workers)
        comment = (
            f"inalab decide: {args.collective}, {workers} workers"
            + (f", topology {args.topology}" if args.topology else "")
            + f"\nprofile: {profile.source}"
            + "\ncollnet_direct = INA: needs NCCL_COLLNET_ENABLE=1 and a CollNet plugin"
        )
        write_rules(args.export_tuner, rules, comment)
        if args.size is None:
            print(f"# wrote {len(rules)} rule(s) to {args.export_tuner}")
            return 0
    assert args.size is not None  # checked above: --size or --export-tuner
    decision = decide(args.size)
    if args.json:
        doc = {
            "collective": args.collective,
            "size_bytes": args.size,
            "workers": workers,
            "topology": None if args.topology is None else str(args.topology),
            "nodes": hosts,
            "profile": profile.source,
            "profile_is_default": args.profile is None,
            **decision.to_dict(),
        }
        if args.export_tuner is not None:
            doc["tuner_file"] = str(args.export_tuner)
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"# {args.collective} of {format_size(args.size)} ({args.size} bytes), "
        f"{workers} workers" + (f", topology {args.topology}" if args.topology else "")
    )
    label = profile.source if args.profile is None else f"{args.profile} ({profile.source})"
    print(f"# profile: {label}")
    for algo, est in decision.estimates.items():
        seconds = decision.predicted[algo]
        shown = f"{seconds * 1e3:12.3f} ms" if math.isfinite(seconds) else f"{'n/a':>15}"
        note = decision.sources[algo] if math.isfinite(seconds) else est.bound
        print(f"{algo:>6} {shown}  {note}")
    print(f"choice: {decision.algorithm}: {decision.reason}")
    if args.export_tuner is not None:
        print(f"# wrote tuner rules to {args.export_tuner}")
    return 0


def _topology(args: argparse.Namespace) -> tuple[TopologySummary, int | None, int | None]:
    """(summary, the job's ranks, hosts) from --topology/--job/--slots/--no-ina."""
    from dynamiccl.model import TopologySummary, summarize_topology

    if args.topology is None:
        if args.job is not None:
            raise _UsageError("--job needs --topology")
        return TopologySummary(slots=args.slots), None, None
    from emulation.topology import TopologyError, load_topology

    try:
        topo = load_topology(args.topology)
        summary = summarize_topology(topo, args.job, slots=args.slots)
    except TopologyError as exc:
        raise _UsageError(str(exc)) from None
    except KeyError as exc:
        raise _UsageError(str(exc.args[0])) from None
    job = next((j for j in topo.jobs if args.job in (None, j.job_id)), None)
    names = job.workers if job is not None else tuple(h.name for h in topo.hosts)
    ranks = sum(topo.host(n).ranks for n in names)
    return summary, ranks, len(names)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dynamiccl.cli``: the same command without the ``inalab`` entry point."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
