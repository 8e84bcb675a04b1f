"""``inalab decide``: the predicted time of each algorithm for one collective, and the choice.

Reads a profile (``--profile``, a JSON file from :meth:`Profile.save` or ``inalab
calibrate``; without it :data:`~dynamiccl.model.DEFAULT_PROFILE`, whose ``source`` says
it is the built-in one and where it was measured) and optionally the job's network: link
bandwidth, delay, loss, contention and whether a switch aggregates for the job, as a
:class:`~dynamiccl.model.TopologySummary` JSON file (``--summary``) or from a topology
file (``--topology``: its job's ranks are the workers). Prints one line per algorithm
(time, share in latency steps, what bounds its bytes: :data:`BOUNDS_HELP`) and the
choice with its reason, or the same as JSON (``--json``). ``--export-tuner PATH`` also
writes the choices over ``--min..--max`` as an NCCL example-tuner rule file. Sizes use
nccl-tests' syntax (``4096``, ``4K``, ``1M``, ``1G``). Bad input exits 2 with one line.

dynamiccl reads no topology file itself (it imports nothing of emulation): ``--topology``
works through the :data:`Summarize` function the caller injects into :func:`run`, which
the ``inalab`` command does. Also runs standalone, without ``--topology``: ``python -m
dynamiccl.cli --size 4M --workers 8 [--summary FILE]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dynamiccl.actions import (
    ALL_COLLECTIVES,
    DEFAULT_LANE_CHOICES,
    DEFAULT_WINDOW_CHOICES,
    action_space,
)
from dynamiccl.model import SummaryError, TopologySummary
from hostlib.protocol import MAX_LANES
from hostlib.units import format_size, parse_size

if TYPE_CHECKING:
    from dynamiccl.model import Estimate, MeasuredLinks, Profile
    from dynamiccl.policy import Decision

__all__ = ["BOUNDS_HELP", "JobRanks", "Summarize", "add_arguments", "int_list", "main", "run"]

PROG = "inalab decide"

DEFAULT_SWITCH_LANES = 2048
"""``--switch-lanes``: the bench's switch (one 8 KiB jumbo payload per packet)."""

BOUNDS_HELP = """\
Each algorithm's line: its predicted time, the share of it spent in latency steps
(round trips between ranks or to the switch: what small messages pay), and "bound:",
what limits how fast its bytes move (what large messages pay):
  software  the profile's measured time per byte: the hosts' (and, for INA, the soft
            switch's) CPU as calibrated. The network, if any, is faster than that.
            A faster link will not help; a faster host or switch would.
  wire      the network: the slowest worker link in --topology (or --summary), slowed
            further when several of the algorithm's streams share one switch-to-switch
            link.
  switch    INA only: one aggregating switch cannot sum the workers' contributions
            faster (the profile's switch rate shared by the ranks it sums).
  window    INA only: too few switch slots (--slots) to keep the link busy over a
            round trip.
Without --topology or --summary there is no wire: every time is the calibrated machine's.
The built-in profile was measured on one machine (its line says which);
`inalab calibrate --workers 4 -o profile.json` measures yours for --profile."""
"""``--help``'s epilog: what the per-algorithm bound means, in a user's words."""


@dataclass(frozen=True)
class JobRanks:
    """A topology's job as ``--topology`` checks ``--workers`` against it.

    Attributes:
        ranks: the job's ranks: the workers of the decision.
        hosts: the job's hosts.
        job: the job's id; None for a topology without jobs (all its hosts are one job).
        per_job: every job's ranks by id, in the topology's order (empty without jobs).
    """

    ranks: int
    hosts: int
    job: int | None = None
    per_job: Mapping[int, int] = field(default_factory=dict)


Summarize = Callable[[Path, int | None, int | None], tuple[TopologySummary, JobRanks]]
"""Reads ``--topology PATH`` for ``--job`` (None: the first) with ``--slots`` (None:
unknown): the job's :class:`TopologySummary` and its :class:`JobRanks`. It may raise
ValueError (an unreadable or invalid file) or KeyError (no such job), which decide
reports as one line. ``inalab`` passes ``emulation.topology.summary.decide_summary``."""


def _size(text: str) -> int:
    """An nccl-tests size for argparse (:func:`hostlib.units.parse_size`)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse parser of integers in ``lo..hi`` (no upper bound when ``hi`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bounds = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{value} outside {bounds}")
        return value

    return parse


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in 0..1, got {text!r}")
    return value


def int_list(lo: int, hi: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse parser of comma-separated integers in ``lo..hi``, sorted, without
    repeats (``--lanes-choices``, ``--window-choices`` here and in ``inalab replay``)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
        except ValueError:
            values = ()
        if not values or any(not lo <= v <= hi for v in values):
            raise argparse.ArgumentTypeError(
                f"invalid list {text!r}: comma-separated integers in {lo}..{hi}"
            )
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``inalab decide``, and :data:`BOUNDS_HELP` as ``--help``'s epilog."""
    parser.epilog = BOUNDS_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the epilog's lines

    parser.add_argument("--size", type=_size, help="message size, e.g. 4096, 4K, 4M, 1G")
    parser.add_argument(
        "--workers",
        type=_int_in(1),
        help="ranks taking part (with --topology: its job's ranks, and no other number)",
    )
    network = parser.add_mutually_exclusive_group()
    network.add_argument(
        "--topology", type=Path, help="a topologies/ file: the job's network and its ranks"
    )
    network.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="the job's network as TopologySummary JSON (written by "
        "emulation.topology.summary.summary_json)",
    )
    parser.add_argument(
        "--job", type=_int_in(0, 0xFFFF), help="the topology's job (default: first)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="profile JSON from inalab calibrate (default: the built-in one, measured on "
        "another machine's loopback; its source line says which)",
    )
    parser.add_argument(
        "--collective",
        default="allreduce",
        choices=ALL_COLLECTIVES,
        help="default: allreduce (reduce_scatter and all_gather: --explain's view only)",
    )
    parser.add_argument(
        "--slots", type=_int_in(0), help="the job's free switch slots (0: INA unavailable)"
    )
    parser.add_argument(
        "--no-ina", action="store_true", help="the switch is unreachable: never choose INA"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="decide the whole configuration: every action (algorithm, lanes per packet, "
        "window) with its model time, prior and measured mean, and the online agent's "
        "choice and phase",
    )
    parser.add_argument(
        "--agent-state",
        type=Path,
        metavar="FILE",
        help="an online agent's saved state (inalab replay --agent-state FILE): explain "
        "what it learnt (implies --explain; default: a model-only agent)",
    )
    parser.add_argument(
        "--switch-lanes",
        type=_int_in(1, MAX_LANES),
        default=DEFAULT_SWITCH_LANES,
        help=f"the switch's lanes per packet, INA's only width (default {DEFAULT_SWITCH_LANES}, "
        "the bench's)",
    )
    parser.add_argument(
        "--lanes-choices",
        type=int_list(1, MAX_LANES),
        default=DEFAULT_LANE_CHOICES,
        metavar="N,N",
        help="ring and tree packet widths --explain considers (default "
        + ",".join(map(str, DEFAULT_LANE_CHOICES))
        + ")",
    )
    parser.add_argument(
        "--window-choices",
        type=int_list(1, 1 << 20),
        default=DEFAULT_WINDOW_CHOICES,
        metavar="N,N",
        help="windows --explain considers (default "
        + ",".join(map(str, DEFAULT_WINDOW_CHOICES))
        + ")",
    )
    shared = parser.add_argument_group(
        "contention for switch memory (--explain; docs/dynamiccl.md 'Contention for switch memory')"
    )
    shared.add_argument(
        "--reserved",
        type=_int_in(0),
        metavar="N",
        help="the job's reserved slots: INA windows up to N are INA reserved, wider ones "
        "INA shared (implies --explain)",
    )
    shared.add_argument(
        "--shared", type=_int_in(0), default=0, metavar="N",
        help="the job's slots in the shared region past the reservation (default 0)",
    )  # fmt: skip
    shared.add_argument(
        "--blocked", type=_fraction, default=0.0, metavar="F",
        help="the share of those slots another job holds now, 0..1 (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--export-tuner", type=Path, metavar="PATH", help="write an NCCL tuner rule file"
    )
    parser.add_argument(
        "--min", type=_size, default=4096, help="--export-tuner's smallest size (default 4K)"
    )
    parser.add_argument(
        "--max", type=_size, default=1 << 30, help="--export-tuner's largest size (default 1G)"
    )


class _UsageError(ValueError):
    pass


def run(args: argparse.Namespace, summarize: Summarize | None = None) -> int:
    """Print the decision (and write the rule file); 0 on success, 2 on bad input.

    ``summarize`` reads ``--topology`` (see :data:`Summarize`); without one,
    ``--topology`` is a usage error (``--summary`` needs none).
    """
    remarks: list[str] = []
    try:
        status = _run(args, summarize, remarks)
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    for remark in remarks:  # after the decision: an error stays the only line
        print(f"{PROG}: {remark}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace, summarize: Summarize | None, remarks: list[str]) -> int:
    """The decision (see :func:`run`); notes and warnings for stderr go to ``remarks``."""
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
    summary, given, hosts = _network(args, summarize)
    workers = _workers(given, profile, remarks)
    ina = not args.no_ina
    if args.reserved is None and (args.shared or args.blocked):
        raise _UsageError("--shared and --blocked describe a job with --reserved N")
    if (args.explain or args.agent_state is not None or args.reserved is not None
            or args.collective != "allreduce"):  # fmt: skip
        if args.export_tuner is not None:
            raise _UsageError("--export-tuner writes algorithms only: leave out --explain")
        if args.size is None:
            raise _UsageError("--explain needs --size")
        return _explain(args, profile, summary, workers, hosts)

    def decide(size: int) -> Decision:
        return choose(args.collective, size, workers, summary, profile, ina_available=ina)

    if args.export_tuner is not None:
        if not args.export_tuner.parent.is_dir():
            raise _UsageError(f"directory of {args.export_tuner} does not exist")
        rules = tuner_rules(decide, args.collective, args.min, args.max, n_ranks=workers)
        comment = (
            f"inalab decide: {args.collective}, {workers} workers"
            + _network_label(args)
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
            "summary": None if args.summary is None else str(args.summary),
            "nodes": hosts,
            "profile": profile.source,
            "profile_is_default": args.profile is None,
            "profile_workers": None if profile.workers is None else list(profile.workers),
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
        f"{workers} workers" + _network_label(args)
    )
    print(f"# profile: {_profile_label(args, profile)}")
    if profile.links is not None:
        print(f"# {_links_note(profile.links, _network_flag(args))}")
    for algo, est in decision.estimates.items():
        print(_estimate_line(algo, est, decision.predicted[algo], decision.sources[algo]))
    print(f"choice: {decision.algorithm}: {decision.reason}")
    if args.export_tuner is not None:
        print(f"# wrote tuner rules to {args.export_tuner}")
    return 0


def _explain(
    args: argparse.Namespace,
    profile: Profile,
    summary: TopologySummary,
    workers: int,
    hosts: int | None,
) -> int:
    """``--explain``: the online agent's view of every action for ``--size``, under the
    contention ``--reserved/--shared/--blocked`` give."""
    from dynamiccl.agent import Agent, AgentError
    from dynamiccl.contention import Contention, ContentionError

    contention = None
    if args.reserved is not None:
        try:
            contention = Contention(args.reserved, args.shared, args.blocked)
        except ContentionError as exc:
            raise _UsageError(str(exc)) from None

    if args.agent_state is not None:
        try:
            agent = Agent.load(args.agent_state, profile, summary, workers=workers)
        except AgentError as exc:
            raise _UsageError(str(exc)) from None
        who = f"the agent saved in {args.agent_state} (job {agent.job})"
    else:
        offered = ["ina", "ring", "tree"]
        if hosts is not None and hosts < workers:
            offered.insert(1, "collnet")  # several ranks per host: CollNet can run
        slots = summary.slots if summary.slots else max(args.window_choices)
        windows = tuple(args.window_choices)
        if contention is not None:  # both kinds of INA arm, whatever the choices say
            slots = max(contention.slots, 1)
            windows = tuple(sorted({*windows, contention.reserved, contention.slots} - {0}))
        actions = {
            c: action_space(c, switch_lanes=args.switch_lanes, slots=slots, algorithms=offered,
                            lane_choices=args.lanes_choices, window_choices=windows)
            for c in ALL_COLLECTIVES
        }  # fmt: skip
        agent = Agent(profile, workers, summary, actions, learn=False)
        who = "a model-only agent (the profile's prior; nothing measured)"
    if args.collective not in agent.actions:
        raise _UsageError(f"{args.agent_state} has no actions for {args.collective}")
    decision = agent.decide(args.collective, args.size, free_slots=args.slots,
                            switch_reachable=not args.no_ina, contention=contention)  # fmt: skip
    if args.json:
        doc = {
            "collective": args.collective,
            "size_bytes": args.size,
            "workers": workers,
            "topology": None if args.topology is None else str(args.topology),
            "summary": None if args.summary is None else str(args.summary),
            "profile": profile.source,
            "agent": who,
            "contention": None if contention is None else contention.to_dict(),
            "explain": decision.to_dict(),
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"# {args.collective} of {format_size(args.size)} ({args.size} bytes), "
        f"{workers} workers" + _network_label(args)
    )
    print(f"# profile: {_profile_label(args, profile)}")
    print(f"# decided by {who}")
    if contention is not None:
        print(f"# contention: {contention.describe()}")
    print(f"{'action':>16} {'model':>12} {'prior':>12} {'measured':>12} {'calls':>6}")
    for arm in decision.arms:
        cells = (_ms(arm.model), _ms(arm.prior), _ms(arm.observed), str(arm.count))
        note = "" if arm.available else "  (switch unreachable or short of slots)"
        if arm.available and contention is not None and arm.action.needs_switch:
            note = f"  (INA {contention.arm(arm.action.window)}"
            note += f", {arm.fallback:.0%} to the fallback)" if arm.fallback else ")"
        print(f"{arm.action.label:>16} " + " ".join(f"{c:>12}" for c in cells[:3])
              + f" {cells[3]:>6}{note}")  # fmt: skip
    print(f"choice: {decision.action.label} ({decision.phase}): {decision.reason}")
    return 0


def _workers(given: int | None, profile: Profile, remarks: list[str]) -> int:
    """The workers to decide for: ``given`` (``--workers`` or the topology's job), with a
    warning in ``remarks`` when the profile was fitted at other counts; else the
    profile's one count, with a note saying so.

    Raises:
        _UsageError: none given and the profile records no single count.
    """
    fitted = profile.workers
    counts = "" if fitted is None else ", ".join(map(str, fitted))
    if given is None:
        if fitted is None or len(fitted) != 1:
            why = "it records none" if fitted is None else f"it was fitted at {counts}: pick one"
            raise _UsageError(f"give --workers (or a --topology with a job): the profile "
                              f"cannot say ({why})")  # fmt: skip
        remarks.append(f"note: no --workers given: deciding for {fitted[0]}, the worker count"
                       " the profile was fitted at")  # fmt: skip
        return fitted[0]
    if fitted is not None and given not in fitted:
        remarks.append(
            f"warning: {given} workers, but the profile was fitted at {counts}: a"
            " calibration's ranks share the machine's cores, so its times hold for those"
            f" counts; fit {given} (inalab calibrate --workers {given} -o PROFILE, or inalab"
            f" emulate TOPOLOGY calibrate with a job of {given} ranks) and pass --profile"
            " PROFILE"
        )
    return given


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "n/a" if not math.isfinite(seconds) else f"{seconds * 1e3:.3f} ms"


def _profile_label(args: argparse.Namespace, profile: Profile) -> str:
    """The profile as every output names it: the built-in one says so in its source."""
    return profile.source if args.profile is None else f"{args.profile} ({profile.source})"


def _network_flag(args: argparse.Namespace) -> str | None:
    """``--topology`` or ``--summary``, whichever gave the network (None: neither)."""
    if args.topology is not None:
        return "--topology"
    return None if args.summary is None else "--summary"


def _network_label(args: argparse.Namespace) -> str:
    """``, topology PATH`` or ``, summary PATH`` for the headers; empty without either."""
    if args.topology is not None:
        return f", topology {args.topology}"
    return "" if args.summary is None else f", summary {args.summary}"


def _links_note(links: MeasuredLinks, network_flag: str | None) -> str:
    note = (
        f"profile measured across the emulated links of {links.where} "
        f"({links.describe()}): their bandwidth, delay and loss are in its numbers"
    )
    if network_flag is not None:
        note += f"; {network_flag} adds its links' delay and loss on top"
    return note


def _estimate_line(algo: str, est: Estimate, seconds: float, source: str) -> str:
    """``  ring     2121.000 ms  model, latency   0%, bound: software`` (see BOUNDS_HELP)."""
    if not math.isfinite(seconds):
        return f"{algo:>6} {'n/a':>15}  {est.bound}"
    share = f"{est.latency / est.seconds:4.0%}" if est.seconds > 0 else " n/a"
    return f"{algo:>6} {seconds * 1e3:12.3f} ms  {source}, latency {share}, bound: {est.bound}"


def _network(
    args: argparse.Namespace, summarize: Summarize | None
) -> tuple[TopologySummary, int | None, int | None]:
    """(summary, workers, hosts) from --topology/--summary/--job/--slots and --workers:
    with a topology the workers are its job's ranks, and --workers must agree; --slots
    overrides a --summary's slots.

    Raises:
        _UsageError: --job without a topology, --topology with nothing to read it, an
            unreadable topology or summary, an unknown job, or --workers other than the
            job's ranks.
    """
    if args.topology is None and args.job is not None:
        raise _UsageError("--job needs --topology")
    if args.summary is not None:
        try:
            summary = TopologySummary.load(args.summary)
        except SummaryError as exc:
            raise _UsageError(str(exc)) from None
        if args.slots is not None:
            summary = replace(summary, slots=args.slots)
        return summary, args.workers, None
    if args.topology is None:
        return TopologySummary(slots=args.slots), args.workers, None
    if summarize is None:
        raise _UsageError(
            "--topology needs the inalab command to read topology files (dynamiccl reads "
            "none): run inalab decide, or give --summary FILE"
        )
    try:
        summary, job = summarize(args.topology, args.job, args.slots)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    except KeyError as exc:
        raise _UsageError(str(exc.args[0])) from None
    if args.workers is not None and args.workers != job.ranks:
        raise _UsageError(_workers_mismatch(args, job))
    return summary, job.ranks, job.hosts


def _workers_mismatch(args: argparse.Namespace, job: JobRanks) -> str:
    """One line: the model would describe a network the job does not have."""
    if not job.per_job:
        return (
            f"--workers {args.workers}, but {args.topology} has no jobs: its "
            f"{job.hosts} hosts make one job of {job.ranks} ranks (omit --workers)"
        )
    listed = ", ".join(f"job {j}: {n}" for j, n in job.per_job.items())
    pick = ", or pick another job with --job" if len(job.per_job) > 1 else ""
    return (
        f"--workers {args.workers}, but job {job.job} of {args.topology} has {job.ranks} "
        f"ranks (ranks per job: {listed}); omit --workers{pick}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dynamiccl.cli``: the same command without the ``inalab`` entry point."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
