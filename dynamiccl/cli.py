"""``inalab decide``: the predicted time of each algorithm for one collective, and the choice.

Reads a profile (``--profile``, a JSON file from :meth:`Profile.save` or ``inalab
calibrate``; without it :data:`~dynamiccl.model.DEFAULT_PROFILE`, whose ``source`` says
it is the built-in one and where it was measured) and optionally a topology
(``--topology``: link bandwidth, delay, loss, contention and whether a switch aggregates
for the job; its job's ranks are the workers), prints one line per algorithm (time,
share in latency steps, what bounds its bytes: :data:`BOUNDS_HELP`) and the choice with
its reason, or the same as JSON (``--json``). ``--export-tuner PATH`` also writes the
choices over ``--min..--max`` as an NCCL example-tuner rule file. Sizes use nccl-tests'
syntax (``4096``, ``4K``, ``1M``, ``1G``). Bad input exits 2 with one line.

Also runs standalone: ``python -m dynamiccl.cli --size 4M --workers 8``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from emulation.argtypes import int_in, size
from emulation.bench.config import format_size

if TYPE_CHECKING:
    from dynamiccl.model import Estimate, MeasuredLinks, Profile, TopologySummary
    from dynamiccl.policy import Decision
    from emulation.topology import Topology

__all__ = ["BOUNDS_HELP", "add_arguments", "main", "run"]

PROG = "inalab decide"

BOUNDS_HELP = """\
Each algorithm's line: its predicted time, the share of it spent in latency steps
(round trips between ranks or to the switch: what small messages pay), and "bound:",
what limits how fast its bytes move (what large messages pay):
  software  the profile's measured time per byte: the hosts' (and, for INA, the soft
            switch's) CPU as calibrated. The network, if any, is faster than that.
            A faster link will not help; a faster host or switch would.
  wire      the network: the slowest worker link in --topology, slowed further when
            several of the algorithm's streams share one switch-to-switch link.
  switch    INA only: one aggregating switch cannot sum the workers' contributions
            faster (the profile's switch rate shared by the ranks it sums).
  window    INA only: too few switch slots (--slots) to keep the link busy over a
            round trip.
Without --topology there is no wire: every time is the calibrated machine's.
The built-in profile was measured on one machine (its line says which);
"inalab calibrate --workers N -o profile.json" measures yours for --profile."""
"""``--help``'s epilog: what the per-algorithm bound means, in a user's words."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``inalab decide``, and :data:`BOUNDS_HELP` as ``--help``'s epilog."""
    from dynamiccl.model import COLLECTIVES

    parser.epilog = BOUNDS_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the epilog's lines

    parser.add_argument("--size", type=size, help="message size, e.g. 4096, 4K, 4M, 1G")
    parser.add_argument(
        "--workers",
        type=int_in(1),
        help="ranks taking part (with --topology: its job's ranks, and no other number)",
    )
    parser.add_argument("--topology", type=Path, help="a topologies/ file: the job's network")
    parser.add_argument("--job", type=int_in(0, 0xFFFF), help="the topology's job (default: first)")
    parser.add_argument(
        "--profile",
        type=Path,
        help="profile JSON from inalab calibrate (default: the built-in one, measured on "
        "another machine's loopback; its source line says which)",
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
    summary, workers, hosts = _topology(args)
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
            + f"\nprofile: {_profile_label(args, profile)}"
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
            "profile_links": None if profile.links is None else asdict(profile.links),
            **decision.to_dict(),
            "latency_share": {
                a: (e.latency / e.seconds if e.available and e.seconds > 0 else None)
                for a, e in decision.estimates.items()
            },
        }
        if args.export_tuner is not None:
            doc["tuner_file"] = str(args.export_tuner)
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"# {args.collective} of {format_size(args.size)} ({args.size} bytes), "
        f"{workers} workers" + (f", topology {args.topology}" if args.topology else "")
    )
    print(f"# profile: {_profile_label(args, profile)}")
    if profile.links is not None:
        print(f"# {_links_note(profile.links, args.topology is not None)}")
    for algo, est in decision.estimates.items():
        print(_estimate_line(algo, est, decision.predicted[algo], decision.sources[algo]))
    print(f"choice: {decision.algorithm}: {decision.reason}")
    if args.export_tuner is not None:
        print(f"# wrote tuner rules to {args.export_tuner}")
    return 0


def _profile_label(args: argparse.Namespace, profile: Profile) -> str:
    """The profile as every output names it: the built-in one says so in its source."""
    return profile.source if args.profile is None else f"{args.profile} ({profile.source})"


def _links_note(links: MeasuredLinks, with_topology: bool) -> str:
    note = (
        f"profile measured across the emulated links of {links.where} "
        f"({links.describe()}): their bandwidth, delay and loss are in its numbers"
    )
    if with_topology:
        note += "; --topology adds its links' delay and loss on top"
    return note


def _estimate_line(algo: str, est: Estimate, seconds: float, source: str) -> str:
    """``  ring     2121.000 ms  model, latency   0%, bound: software`` (see BOUNDS_HELP)."""
    if not math.isfinite(seconds):
        return f"{algo:>6} {'n/a':>15}  {est.bound}"
    share = f"{est.latency / est.seconds:4.0%}" if est.seconds > 0 else " n/a"
    return f"{algo:>6} {seconds * 1e3:12.3f} ms  {source}, latency {share}, bound: {est.bound}"


def _topology(args: argparse.Namespace) -> tuple[TopologySummary, int | None, int | None]:
    """(summary, workers, hosts) from --topology/--job/--slots/--no-ina and --workers:
    with a topology the workers are its job's ranks, and --workers must agree.

    Raises:
        _UsageError: an unreadable topology, an unknown job, --job without a topology,
            or --workers other than the job's ranks.
    """
    from dynamiccl.model import TopologySummary, summarize_topology

    if args.topology is None:
        if args.job is not None:
            raise _UsageError("--job needs --topology")
        return TopologySummary(slots=args.slots), args.workers, None
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
    if args.workers is not None and args.workers != ranks:
        raise _UsageError(_workers_mismatch(args, topo, ranks))
    return summary, ranks, len(names)


def _workers_mismatch(args: argparse.Namespace, topo: Topology, ranks: int) -> str:
    """One line: the model would describe a network the job does not have."""
    sizes = {j.job_id: sum(topo.host(n).ranks for n in j.workers) for j in topo.jobs}
    if not sizes:
        return (
            f"--workers {args.workers}, but {args.topology} has no jobs: its "
            f"{len(topo.hosts)} hosts make one job of {ranks} ranks (omit --workers)"
        )
    job = args.job if args.job is not None else topo.jobs[0].job_id
    listed = ", ".join(f"job {j}: {n}" for j, n in sizes.items())
    pick = ", or pick another job with --job" if len(sizes) > 1 else ""
    return (
        f"--workers {args.workers}, but job {job} of {args.topology} has {ranks} ranks "
        f"(ranks per job: {listed}); omit --workers{pick}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dynamiccl.cli``: the same command without the ``inalab`` entry point."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
