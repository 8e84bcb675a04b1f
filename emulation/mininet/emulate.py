"""``inalab emulate TOPOLOGY [ACTION]``: a topology in Mininet, then a bench, a CLI, or a wait.

Builds the network of a topology file (``topologies/``) with inalab's switches, starts
and configures them through the controller, and writes ``RUN_DIR/manifest.json``
(P4Runtime endpoints, INA addresses, hosts and their namespaces). Then:

- ``bench``: ``inalab bench``'s sweep with the ranks inside the Mininet hosts, across the
  emulated links: INA (flat or hierarchical, as the topology's aggregating switches
  say), CollNet (hosts with several ``ranks``), hostlib's ring and tree, auto
  (dynamiccl, deciding with the topology's links) and Gloo's ring, the same tables,
  JSON and plot;
- ``calibrate``: ``inalab calibrate`` across the emulated links (the job's ranks):
  dynamiccl's profile for this network;
- ``wire-floor``: what moving INA-sized datagrams between the job's hosts costs a host
  in CPU with no work at all (:mod:`emulation.bench.wirefloor`): the floor under the
  bench's worker CPU for INA on this network;
- ``up`` (default): keep the network up until Ctrl-C (or ``--seconds``), for your own
  controller (``inalab ctl --manifest RUN_DIR/manifest.json --name s1``) and workers;
- ``--cli``: Mininet's CLI once the network is up (after the bench, if one runs);
- ``check``: none of the above: validate the topology and print what would be built
  (:mod:`emulation.mininet.check`; no root, no Mininet).

Needs root (network namespaces) and Mininet's ``mnexec`` (``apt-get install mininet``).
Everything this run created is removed on exit, whatever the exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulation.argtypes import delay, int_in, positive_float, probability, rates
from emulation.mininet.fabric import EmulatedFabric
from emulation.mininet.overrides import apply_overrides, default_lanes, describe_links
from emulation.mininet.sharing import DEFAULT_ROUNDS, SharingPlan, plan_sharing
from emulation.mininet.sharing import POLICIES as SHARING_POLICIES

if TYPE_CHECKING:
    from emulation.bench.config import BenchConfig
    from emulation.bmv2 import Bmv2Tools
    from emulation.mininet.datapaths import LinkPlan
    from emulation.mininet.network import Emulation
    from emulation.topology import Topology, TopologyJob

__all__ = [
    "EmulatedFabric",
    "add_arguments",
    "apply_overrides",
    "convergence_footnote",
    "default_lanes",
    "describe_links",
    "describe_plan",
    "emulation_metadata",
    "run",
]

PROG = "inalab emulate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``inalab emulate``'s options and its ``bench`` and ``up`` actions."""
    from emulation.bench.cli import add_arguments as bench_arguments

    add = parser.add_argument
    add("topology", type=Path, help="topology file (topologies/*.yaml or a topology.json)")
    add("--run-dir", type=Path, help="logs, pcaps, manifest.json (default: a new temp dir)")
    add("--bw", type=rates, action=_Rates, metavar="MBIT[,MBIT...]",
        help="set every link's bandwidth; several rates (bench only) run the bench at each in "
        "one network, re-shaping the links between them: the link-rate sweep")  # fmt: skip
    add("--delay", type=delay, metavar="DELAY", help="set every link's one-way delay")
    add("--jitter", type=delay, metavar="DELAY",
        help="set every link's delay jitter (needs a kernel with netem)")  # fmt: skip
    add("--link-loss", type=probability(allow_one=False), metavar="P",
        help="set every link's loss probability (each way)")  # fmt: skip
    add("--link-dup", type=probability(allow_one=False), metavar="P",
        help="set every link's probability of sending a packet twice (each way; by the "
        "eBPF switch's ports)")  # fmt: skip
    add("--link-reorder", type=probability(allow_one=False), metavar="P",
        help="set every link's probability of holding a packet back behind the packets "
        "queued after it (by the eBPF switch's ports, on their way out: toward the host "
        "on a host's link; the link needs a rate)")  # fmt: skip
    add("--in-order-links", action="store_true",
        help="every link keeps each flow's order, as a cable does (eBPF switches only; "
        "veths without TCP segmentation offload and with GRO, which costs TCP CPU: "
        "emulation.mininet.network.IN_ORDER_FEATURES); by default a veth may pass a flow's frame "
        "ahead of an earlier one that the other core received")  # fmt: skip
    add("--switch-slots", type=int_in(1, 1 << 15), default=1024,
        help="each switch's slot pool per set (default 1024)")  # fmt: skip
    add("--pcap", action="store_true",
        help="switches record their ports: RUN_DIR/NAME.pcap (the Python data plane), "
        "RUN_DIR/NAME-ethN.pcap (eBPF, by tcpdump), RUN_DIR/pcaps/ (bmv2)")  # fmt: skip
    add("--datapath", choices=("auto", "python", "ebpf"),
        help="every soft switch's data plane: ebpf (a TC program on its ports, in the "
        "kernel), python (the pipeline in the switch process; its links may delay), or "
        "auto: ebpf where it runs (root, clang, libbpf) and no link needs the Python delay "
        "line (default: each switch's datapath in the topology, auto unless set)")  # fmt: skip
    add("--p4-tools", metavar="DIRS",
        help="where bmv2 switches' simple_switch_grpc and p4c-bm2-ss are: directories "
        "separated by ':', searched instead of PATH, which sudo resets (pass yours with "
        '--p4-tools "$PATH")')  # fmt: skip
    add("--job", type=int, help="the topology job the bench uses (default: its first)")
    add("--jobs", type=_job_ids, metavar="ID,ID[,...]",
        help="bench: these topology jobs (on hosts of their own) each alone, then all at "
        "once on the one fabric, a table of each job's time per call together against "
        "alone; run: every job's ranks run COMMAND at once (docs/emulation.md 'Several "
        "jobs at once')")  # fmt: skip
    add(
        "--stagger",
        type=float,
        default=0.0,
        metavar="S",
        help="--jobs: job k starts k*S seconds after the first when together (default 0)",
    )
    add("--rounds", type=int_in(1, 1000), default=DEFAULT_ROUNDS, metavar="R",
        help="--sharing dynamic: rounds per job and phase, each one dynamiccl decision "
        f"and one sweep of it (default {DEFAULT_ROUNDS})")  # fmt: skip
    add("--sharing", choices=SHARING_POLICIES, default="reserve",
        help="bench: how jobs take their switch's memory (--switch-slots): reserve (each "
        "reserves its window, --slots; the default), partition (the pool split evenly "
        "among the --jobs: each reserves --switch-slots // N, its window), shared (no "
        "reservation: each shares its window in a region of the whole pool, a power of "
        "two; what collides goes to the switch's fallback node, role fallback in the "
        "topology), dynamic (each reserves --switch-slots // 2N and shares the pool's top "
        "half, with the fallback; dynamiccl picks INA reserved, INA shared, ring or tree "
        "round by round: bench --algos auto) (docs/emulation.md 'Several jobs and switch "
        "memory: --sharing')")  # fmt: skip
    add("--cli", action="store_true", help="open Mininet's CLI once the network is up")
    # Sub-usages read "inalab emulate TOPOLOGY bench", as the command is typed.
    sub = parser.add_subparsers(dest="action", metavar="ACTION", prog=f"{parser.prog} TOPOLOGY")
    bench = sub.add_parser("bench", help="allreduce sweep in the hosts (inalab bench's flags)")
    bench_arguments(bench, emulated=True)
    parser.set_defaults(bw_sweep=())
    bench.add_argument("--bw", type=rates, action=_Rates, default=argparse.SUPPRESS,
                       metavar="MBIT[,MBIT...]",
                       help="emulate's --bw, here too: several rates run the link-rate sweep "
                       "(the bench at each rate, one network; time and speedup over Gloo "
                       "against the rate, with the crossover)")  # fmt: skip
    from emulation.bench.calibrate import add_arguments as calibrate_arguments

    cal = sub.add_parser(
        "calibrate", help="fit a dynamiccl profile across the links (inalab calibrate's flags)"
    )
    calibrate_arguments(cal, emulated=True)
    only = sub.add_parser(
        "switch-only", help="load the job's switch from senders in its hosts (no host library)"
    )
    only.add_argument("--seconds", type=positive_float, default=5.0,
                      help="measured interval (default 5)")  # fmt: skip
    only.add_argument(
        "--window",
        type=int_in(1, 4096),
        default=64,
        help="slots outstanding per sender: the job's slots (default 64)",
    )
    only.add_argument("--lanes", type=int_in(1, 2048), default=64,
                      help="int32 lanes per packet (default 64: p4/'s width)")  # fmt: skip
    only.add_argument("--json", type=Path, metavar="PATH", help="write the numbers as JSON")
    from emulation.bench.config import DEFAULT_EMULATED_SLOTS
    from hostlib.protocol import MAX_LANES

    floor = sub.add_parser(
        "wire-floor",
        help="CPU per Gbit of moving INA-sized datagrams between the job's hosts, no work",
        description="Each rank of the job sends UDP datagrams of an INA packet's size to the"
        " next rank and receives the previous rank's, from native code with no other work:"
        " the CPU per Gbit that this network's kernel path costs a host by itself, the floor"
        " under the bench's worker CPU for INA (emulation.bench.wirefloor).",
    )
    floor.add_argument("--seconds", type=positive_float, default=5.0,
                       help="sending interval (default 5)")  # fmt: skip
    floor.add_argument("--rate", type=positive_float, metavar="MBIT",
                       help="each rank's sending rate in Mbit/s (default: 95%% of the hosts'"
                       " link rate)")  # fmt: skip
    floor.add_argument("--batch", type=int_in(1, 1024), default=DEFAULT_EMULATED_SLOTS,
                       help="datagrams sent at once, per period (default"
                       f" {DEFAULT_EMULATED_SLOTS}: the bench's INA window)")  # fmt: skip
    floor.add_argument("--lanes", type=int_in(1, MAX_LANES), default=None,
                       help="the datagram is an INA packet of this many lanes (default: the"
                       " bench's)")  # fmt: skip
    floor.add_argument("--json", type=Path, metavar="PATH", help="write the numbers as JSON")
    from emulation.mininet.run import add_arguments as run_arguments

    program = sub.add_parser("run", help="run COMMAND once per rank of the job, in its host")
    run_arguments(program)
    from emulation.bench.replay import add_arguments as replay_arguments

    replay = sub.add_parser(
        "replay", help="replay a workload's collectives in the hosts (inalab replay's flags)"
    )
    replay_arguments(replay, emulated=True)
    up = sub.add_parser("up", help="keep the network up until Ctrl-C (the default)")
    up.add_argument("--seconds", type=float, help="stop after this long instead")
    sub.add_parser(
        "check",
        help="validate the topology and print what would be built (no root, no Mininet)",
        description=CHECK_DESCRIPTION,
    )


class _Rates(argparse.Action):
    """``--bw``: the first rate is the one the network is built at (``bw``, a number as
    every other caller of :func:`apply_overrides` expects); all of them, if several, the
    bench's link-rate sweep (``bw_sweep``; empty: no sweep)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.bw = values[0]
        namespace.bw_sweep = values if len(values) > 1 else ()


CHECK_DESCRIPTION = """\
Validate the topology with the options given before `check` and print what a run would
build, building nothing (no root, no Mininet): hosts and their ranks, switches and their
data planes (an `auto` switch as this machine would resolve it and why; without root,
whether the eBPF data plane loads is decided at run time), links as they would be applied
(after --bw, --delay, --jitter, --link-loss) and who applies their delay and loss, jobs
with their aggregation trees and what dynamiccl is told of each. Exit status 0 if the
topology can be emulated with these options, 1 with a one-line error if not. E.g.
`inalab emulate topologies/leaf_spine_hier.yaml --bw 100 --delay 1ms check`."""


def run(args: argparse.Namespace) -> int:
    """Bring the network up, run the action, tear it down; 0 on success, 1 if a run
    failed or gave wrong results, 2 on bad arguments or a machine that cannot emulate
    (``check``: 0 or 1, :func:`emulation.mininet.check.run_check`)."""
    try:
        _check_rates(args)
    except _Refused as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.action == "check":  # no root, no Mininet: nothing below is needed
        from emulation.mininet.check import run_check

        return run_check(args)
    from emulation.mininet.network import EmulationError
    from emulation.softswitch.process import SwitchStartError
    from emulation.topology import TopologyError, load_topology

    try:
        topo = load_topology(args.topology)
        if getattr(args, "lanes", False) is None:  # bench or calibrate without --lanes
            args.lanes = _bench_lanes(args, topo)
        lanes = getattr(args, "lanes", None)
        topo = apply_overrides(topo, args.bw, args.delay, args.link_loss, lanes, args.jitter,
                               args.link_dup, args.link_reorder)  # fmt: skip
        job = _job(topo, args.job) if args.action in _JOB_ACTIONS else None
        if args.jobs is not None:
            args.jobs = _jobs(args, topo)
        if args.action == "bench":  # a bad flag is refused before any network exists
            assert job is not None
            _check_bench_flags(args, topo, job)
            for each in args.jobs or ():
                _check_bench_flags(args, topo, each)
        elif args.action == "replay":
            assert job is not None
            _check_replay_flags(args, topo, job)
        elif args.action == "wire-floor" and args.rate is None:
            _host_link_rate(topo, "wire-floor", "--rate MBIT (or --bw MBIT)")
        args.sharing_plan = _sharing(args, topo, job)
        tools = _bmv2_tools(topo, args.p4_tools)
        _check_machine()
    except (TopologyError, _Refused) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    from emulation.mininet.registry import EmulationBusy, register

    made = args.run_dir is None
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="inalab-emulate-"))
    names = [h.name for h in topo.hosts] + [s.name for s in topo.switches]
    with ExitStack() as held:
        try:  # before anything is built: a second run with these names stops here
            held.enter_context(register(names, run_dir, str(args.topology)))
        except EmulationBusy as exc:
            if made:
                run_dir.rmdir()  # the empty directory mkdtemp made just now
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"{PROG}: error: run directory {run_dir}: {exc.strerror}", file=sys.stderr)
            return 2
        try:
            return _run(args, topo, job, run_dir, tools)
        except (EmulationError, SwitchStartError) as exc:
            print(f"{PROG}: failed: {exc}", file=sys.stderr)
            return 1
        finally:
            print(f"# run dir: {run_dir}")


class _Refused(Exception):
    """This machine or these flags cannot run the emulation."""


def _sharing(
    args: argparse.Namespace, topo: Topology, job: TopologyJob | None
) -> SharingPlan | None:
    """The bench's :class:`~emulation.mininet.sharing.SharingPlan` for ``--sharing``
    (None: not the bench, whose jobs reserve their window as ever); ``partition`` sets
    ``args.slots`` to each job's share of the pool, its window.

    Raises:
        _Refused: ``--sharing`` other than ``reserve`` for another action, or a policy
            the jobs cannot have (:func:`~emulation.mininet.sharing.plan_sharing`).
    """
    if args.action != "bench":
        if args.sharing != "reserve":
            raise _Refused(f"--sharing {args.sharing} is the bench's: inalab emulate T "
                           f"[--jobs A,B] --sharing {args.sharing} bench ...")  # fmt: skip
        return None
    if args.sharing == "dynamic" and not args.jobs:
        raise _Refused("--sharing dynamic is dynamiccl's choice among several jobs: give"
                       " --jobs A,B[,...] (one job's bench chooses with --algos auto)")  # fmt: skip
    jobs = args.jobs or ([job] if job is not None else [])
    try:
        plan = plan_sharing(topo, jobs, args.sharing, args.slots, args.switch_slots,
                            getattr(args, "transport", "udp"))  # fmt: skip
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if plan.policy in ("partition", "dynamic") and args.slots != plan.window:
        what = ("its share of the pool" if plan.policy == "partition"
                else "its reservation and its slots in the region")  # fmt: skip
        print(f"{PROG}: note: --sharing {plan.policy}: each job's window is {what},"
              f" {plan.window} slots (not --slots {args.slots})", file=sys.stderr)  # fmt: skip
        args.slots = plan.window
    return plan


def _check_rates(args: argparse.Namespace) -> None:
    """Refuse a link-rate sweep (several ``--bw`` rates) for any action but ``bench``.

    Raises:
        _Refused: several rates for an action other than ``bench``.
    """
    if args.bw_sweep and args.action != "bench":
        given = ",".join(f"{r:g}" for r in args.bw_sweep)
        raise _Refused(f"--bw {given}: several rates are the bench's link-rate sweep; give"
                       " one rate to the other actions")  # fmt: skip


def _check_bench_flags(args: argparse.Namespace, topo: Topology, job: TopologyJob) -> None:
    """What ``inalab bench`` checks before it starts anything (outputs' directories, a
    readable ``--profile``, torch for gloo), and over RDMA what the job must be
    (:func:`emulation.mininet.roce.roce_problems`).

    Raises:
        _Refused: one of them fails.
    """
    from emulation.bench.cli import UsageError, check_inputs, check_outputs
    from emulation.mininet.roce import roce_problems

    try:
        check_outputs(args)
        check_inputs(args)
    except UsageError as exc:
        raise _Refused(str(exc)) from None
    if args.transport == "rdma" and (problems := roce_problems(topo, job)):
        raise _Refused("; ".join(problems))


def _bench_lanes(args: argparse.Namespace, topo: Topology) -> int:
    """``--lanes``' default: the topology's, or over RDMA a path MTU's."""
    from emulation.mininet.roce import rdma_lanes

    return rdma_lanes(topo) if getattr(args, "transport", "udp") == "rdma" else default_lanes(topo)


def _check_replay_flags(args: argparse.Namespace, topo: Topology, job: TopologyJob) -> None:
    """What ``inalab replay`` checks before it starts anything (the workload, the
    flags, a profile or agent state), and, for ``bandwidth-drop``, shaped host links;
    sets ``args.slots``: the job's slots on every switch, its widest INA window.

    Raises:
        _Refused: one of them fails.
    """
    from emulation.bench.replay_setup import UsageError, prepare

    try:
        setup = prepare(args, sum(topo.host(h).ranks for h in job.workers), emulated=True)
    except UsageError as exc:
        raise _Refused(str(exc)) from None
    if setup.scenario == "bandwidth-drop":
        _host_link_rate(topo)
    args.slots = setup.slots


def _host_link_rate(
    topo: Topology, who: str = "--scenario bandwidth-drop", give: str = "--bw MBIT"
) -> float:
    """The one HTB rate of every link with a host at one end (bandwidth-drop's "before",
    the wire floor's default rate); ``who`` needs it and may be given ``give`` instead.

    Raises:
        _Refused: a host link is unshaped, or they differ.
    """
    rates = {link.bw for link in topo.host_links()}
    if len(rates) != 1 or None in rates:
        shown = ", ".join("unshaped" if r is None else f"{r:g}" for r in sorted(rates, key=str))
        raise _Refused(f"{who} needs every host link shaped at one rate (here: {shown}):"
                       f" give {give}")  # fmt: skip
    (rate,) = rates
    assert rate is not None
    return rate


def _bmv2_tools(topo: Topology, p4_tools: str | None) -> Bmv2Tools | None:
    """The tools ``kind: bmv2`` switches run (None: there are none), found in
    ``--p4-tools`` or else on PATH before a run directory exists.

    Raises:
        _Refused: one is missing (the message says where it looked and what to do).
    """
    from emulation.bmv2 import Bmv2Unavailable, find_bmv2

    names = [s.name for s in topo.switches if s.kind == "bmv2"]
    if not names:
        return None
    try:
        return find_bmv2(path=p4_tools, origin="--p4-tools")
    except Bmv2Unavailable as exc:
        which = "switch" if len(names) == 1 else "switches"
        raise _Refused(f"{which} {', '.join(names)}: {exc}") from None


def _check_machine() -> None:
    if os.geteuid() != 0:
        raise _Refused("needs root: Mininet creates network namespaces and veth pairs")
    if shutil.which("mnexec") is None:
        raise _Refused("mnexec not found: apt-get install -y mininet")


def _job(topo: Topology, job_id: int | None) -> TopologyJob:
    if not topo.jobs:
        raise _Refused(f"topology {topo.name} has no jobs section: nothing to benchmark")
    if job_id is None:
        return topo.jobs[0]
    for job in topo.jobs:
        if job.job_id == job_id:
            return job
    raise _Refused(f"topology {topo.name} has no job {job_id}")


def _job_ids(text: str) -> list[int]:
    """``--jobs``: job ids, comma separated."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid job ids {text!r}: e.g. 4,5") from None


def _jobs(args: argparse.Namespace, topo: Topology) -> list[TopologyJob]:
    """The ``--jobs`` of ``topo``, checked (:func:`emulation.mininet.multijob.check_jobs`).

    Raises:
        _Refused: not with bench, with --job or a --bw sweep, or jobs that cannot share.
    """
    from emulation.mininet.multijob import check_jobs

    if args.action not in ("bench", "run"):
        raise _Refused("--jobs runs the bench or a command: inalab emulate T --jobs 4,5 "
                       "bench|run ...")  # fmt: skip
    if args.job is not None or args.bw_sweep or args.stagger < 0:
        raise _Refused("--jobs goes without --job and one --bw rate; --stagger >= 0")
    jobs = [_job(topo, j) for j in args.jobs]
    if (why := check_jobs(jobs)) is not None:
        raise _Refused(why)
    return jobs


_JOB_ACTIONS = ("bench", "calibrate", "switch-only", "run", "replay", "wire-floor")
"""Actions that install a job of their own (the topology's jobs are not installed)."""


def _run(
    args: argparse.Namespace,
    topo: Topology,
    job: TopologyJob | None,
    run_dir: Path,
    tools: Bmv2Tools | None = None,
) -> int:
    from emulation.mininet.network import emulate

    bench = args.action in _JOB_ACTIONS
    slots = getattr(args, "slots", None) or getattr(args, "window", None) or 256
    print(f"# {PROG}: {topo.name}: {len(topo.hosts)} hosts, {len(topo.switches)} switches,"
          f" {len(topo.links)} links; starting", flush=True)  # fmt: skip
    pool = max(args.switch_slots, slots)
    seed = getattr(args, "seed", 0)
    sharing = getattr(args, "sharing_plan", None)
    with emulate(
        topo, run_dir, pool, not bench, args.pcap, seed, slots, args.datapath,
        bmv2_tools=tools, in_order_links=args.in_order_links,
        roce=getattr(args, "transport", "udp") == "rdma", sharing=sharing,
    ) as em:  # fmt: skip
        for line in describe_plan(em.topology, em.plan, tools):
            print(line, flush=True)
        if sharing is not None:
            print(f"# {sharing.describe()}", flush=True)
        if args.in_order_links:
            print("# links: every veth keeps each flow's order (TSO off, GRO on)", flush=True)
        print(f"# manifest: {run_dir / 'manifest.json'}", flush=True)
        status = 0
        if args.action == "calibrate":
            assert job is not None
            status = _calibrate(args, em, job, run_dir)
        elif args.action == "switch-only":
            assert job is not None
            status = _switch_only(args, em, job, run_dir)
        elif args.action == "wire-floor":
            assert job is not None
            status = _wire_floor(args, em, job, run_dir)
        elif args.action == "run" and args.jobs:
            from emulation.mininet.multijob import run_commands

            status = run_commands(args, em, args.jobs, run_dir)
        elif args.action == "run":
            from emulation.mininet.run import run_command

            assert job is not None
            status = run_command(args, em, job, run_dir)
        elif args.action == "replay":
            assert job is not None
            status = _replay(args, em, job, run_dir)
        elif bench and args.jobs:
            from emulation.mininet.multijob import run_jobs

            status = run_jobs(args, em, args.jobs, run_dir)
        elif bench:
            assert job is not None
            status = _bench(args, em, job, run_dir)
        elif not args.cli:
            _wait(getattr(args, "seconds", None))
        if args.cli:
            from mininet.cli import CLI

            CLI(em.net)
        _report_links(em, run_dir)
        return status


def _bench(args: argparse.Namespace, em: Emulation, job: TopologyJob, run_dir: Path) -> int:
    from emulation.bench.cli import UsageError, config_from_args, run_bench
    from emulation.bench.sweep import BenchError

    fabric = EmulatedFabric(em, job, args.loss)
    try:
        cfg = config_from_args(args, workers=fabric.workers, ranks_per_host=1)
        fabric.check(cfg)
    except (UsageError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    meta = {
        "emulation": {
            **emulation_metadata(em.topology, job, run_dir),
            "hierarchical": fabric.hierarchical,
            "sharing": None if em.sharing is None else em.sharing.to_json(),
        },
        "loss_applies_to": "switch drop simulator (INA only); link loss in emulation.links",
    }
    from emulation.topology.summary import summarize_topology

    summary = summarize_topology(em.topology, job.job_id, slots=cfg.slots)
    try:
        if args.bw_sweep:
            return _bench_rates(args, cfg, em, fabric, meta, run_dir)
        notes = convergence_footnote(cfg, em.topology, args.topology, job)
        return run_bench(args, cfg, run_dir, fabric, meta, summary, notes)
    except BenchError as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        for job_id, counters in em.sharing_counters.items():  # the bench's own job id
            counts = ", ".join(f"{k} {v}" for k, v in counters.items())
            print(f"# sharing: job {job_id} on {job.switch}, its runs summed: {counts}",
                  flush=True)  # fmt: skip


def convergence_footnote(
    cfg: BenchConfig, topo: Topology, path: str | Path, job: TopologyJob
) -> list[str]:
    """The lines the bench prints after its summary where an algorithm that may use the
    switch runs: the links where the job's INA traffic converges on ``topo`` (the file
    at ``path``) before a switch sums it (:mod:`emulation.topology.convergence`; the JSON has them
    as ``metadata.emulation.topology.convergence``)."""
    from emulation.bench.config import INA_ALGORITHMS
    from emulation.topology.convergence import convergence_notes

    if not set(cfg.algos) & {*INA_ALGORITHMS, "auto"}:
        return []  # ring, tree and Gloo send host to host: no switch sums them
    return [f"# {line}" for line in convergence_notes(topo, path, (job,))]


def _bench_rates(
    args: argparse.Namespace,
    cfg: BenchConfig,
    em: Emulation,
    fabric: EmulatedFabric,
    meta: dict[str, Any],
    run_dir: Path,
) -> int:
    """The bench at each rate of ``args.bw_sweep`` in this one network (every link's HTB
    class changed in place between rates), each rate's JSON in ``RUN_DIR/bench-RATEmbit.json``;
    then the sweep's tables, and ``--json``/``--plot`` of all of it
    (:mod:`emulation.bench.ratesweep`). A stop signal ends the sweep after reporting the
    rates that finished.

    Raises:
        BenchError: a rate's bench failed (the earlier rates' JSON files stay).
        EmulationError: tc could not change a link's rate.
    """
    import json

    from emulation.bench.cli import run_bench
    from emulation.bench.ratesweep import merge_documents
    from emulation.topology.summary import summarize_topology

    job = fabric.job
    netem = None if em.plan is None else em.plan.netem
    docs: list[tuple[float, dict[str, Any]]] = []
    status, stopped = 0, None
    for rate in args.bw_sweep:
        em.set_link_rate(rate)
        topo = apply_overrides(em.topology, bw=rate)
        fabric.links = describe_links(topo, netem)
        print(f"# link rate {rate:g} Mbit/s: every link's HTB class changed in place", flush=True)
        out = run_dir / f"bench-{rate:g}mbit.json"
        one = argparse.Namespace(**{**vars(args), "json": out, "plot": None})
        at = {**meta, "emulation": {**meta["emulation"], **emulation_metadata(topo, job, run_dir)}}
        summary = summarize_topology(topo, job.job_id, slots=cfg.slots)
        notes = convergence_footnote(cfg, topo, args.topology, job)
        try:
            status = max(status, run_bench(one, cfg, run_dir, fabric, at, summary, notes))
        except KeyboardInterrupt as exc:  # run_bench wrote what finished; report it too
            stopped = exc
        if out.exists():
            docs.append((rate, json.loads(out.read_text())))
        if stopped is not None or status == 2:
            break
    if docs:
        _report_rates(args, cfg, fabric, merge_documents(docs))
    if stopped is not None:
        raise stopped
    return status


def _report_rates(
    args: argparse.Namespace, cfg: BenchConfig, fabric: EmulatedFabric, doc: dict[str, Any]
) -> None:
    """Print the link-rate sweep's tables; write its JSON and plot where asked."""
    from emulation.bench.ratesweep import format_rate_sweep, write_rate_plot
    from emulation.bench.report import write_json

    where = f"{fabric.description}, job {fabric.job.job_id}, {cfg.workers} ranks, {cfg.dtype}"
    print(format_rate_sweep(doc["rows"], where), flush=True)
    if args.json is not None:
        write_json(args.json, doc)
        print(f"# json: {args.json} (one row per rate, size and algorithm; bw_mbit in each)")
    if args.plot is not None:
        rates = ", ".join(f"{r:g}" for r in doc["metadata"]["link_rates_mbit"])
        write_rate_plot(args.plot, doc["rows"], f"allreduce {cfg.dtype} against the link rate"
                        f" ({rates} Mbit/s)\n{where}")  # fmt: skip
        print(f"# plot: {args.plot}")


def emulation_metadata(topo: Topology, job: TopologyJob, run_dir: Path) -> dict[str, Any]:
    """The ``emulation`` section of a bench's or replay's JSON metadata: the network the
    ranks ran across, links as applied (``inalab compare`` tells configurations apart by
    it), and the links where its INA traffic converges before a switch sums it."""
    from emulation.topology.convergence import converging_links

    return {
        "topology": topo.name,
        "job": job.job_id,
        "hosts": list(job.workers),
        "links": [dataclasses.asdict(link) for link in topo.links],
        "manifest": str(run_dir / "manifest.json"),
        "convergence": [c.to_dict() for c in converging_links(topo, job)],
    }


def _calibrate(args: argparse.Namespace, em: Emulation, job: TopologyJob, run_dir: Path) -> int:
    from emulation.bench.calibrate import calibrate

    fabric = EmulatedFabric(em, job)
    where = f"{em.topology.name} (Mininet hosts, job {job.job_id})"
    return calibrate(args, (fabric.workers,), run_dir / "calibrate", fabric, where, em.topology)


def _replay(args: argparse.Namespace, em: Emulation, job: TopologyJob, run_dir: Path) -> int:
    from emulation.bench.replay import run_replay
    from emulation.bench.replay_setup import prepare
    from emulation.bench.sweep import BenchError
    from emulation.topology.summary import summarize_topology

    fabric = EmulatedFabric(em, job)
    setup = prepare(args, fabric.workers, emulated=True)  # refused before the network if bad
    widths = {em.topology.switch(s).lanes for s in em.installed_switches(job)}
    if widths != {setup.lanes}:
        print(f"{PROG}: error: --lanes {setup.lanes} but the job's switches have"
              f" {sorted(widths)}", file=sys.stderr)  # fmt: skip
        return 2
    bw = None
    if setup.scenario == "bandwidth-drop":
        rate = _host_link_rate(em.topology)
        bw = (rate, args.bw_after if args.bw_after is not None else rate / 10)
    meta = {"emulation": emulation_metadata(em.topology, job, run_dir)}
    summary = summarize_topology(em.topology, job.job_id, slots=setup.slots)
    try:
        return run_replay(args, setup, run_dir, fabric, summary, meta, bw)
    except BenchError as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1


def _switch_only(args: argparse.Namespace, em: Emulation, job: TopologyJob, run_dir: Path) -> int:
    from emulation.bench.cli import write_switch_only
    from emulation.bench.switch_only import SwitchOnlyError, run_switch_only

    fabric = EmulatedFabric(em, job)
    kinds = sorted({em.topology.switch(s).kind for s in em.installed_switches(job)})
    try:
        numbers = run_switch_only(
            run_dir / "switch-only", fabric, fabric.workers, args.lanes, args.window,
            args.seconds, in_process=False,
        )  # fmt: skip
    except (ValueError, SwitchOnlyError) as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    print(f"# {PROG} switch-only: {fabric.description}, job {job.job_id}, switches "
          f"{', '.join(em.installed_switches(job))} ({'/'.join(kinds)})")  # fmt: skip
    where = {"switch": "/".join(kinds), "fabric": fabric.description, "seconds": args.seconds,
             "topology": em.topology.name, "job": job.job_id}  # fmt: skip
    write_switch_only(numbers, where, args.json, run_dir)
    return 0


def _wire_floor(args: argparse.Namespace, em: Emulation, job: TopologyJob, run_dir: Path) -> int:
    from emulation.bench.wirefloor import (
        RATE_SHARE,
        WireFloorError,
        measure_wire_floor,
        report_lines,
    )
    from hostlib.protocol import packet_size

    rate = args.rate if args.rate is not None else RATE_SHARE * _host_link_rate(em.topology)
    fabric = EmulatedFabric(em, job)
    try:
        floor = measure_wire_floor(
            fabric, fabric.workers, packet_size(args.lanes), args.batch, rate, args.seconds
        )
    except (ValueError, WireFloorError) as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    where = f"{fabric.description}, job {job.job_id}, {fabric.workers} ranks"
    for line in report_lines(floor, where):
        print(line, flush=True)
    if args.json is not None:
        doc = {"schema": "inalab.wire-floor/1", "topology": em.topology.name,
               "job": job.job_id, "fabric": fabric.description, "seconds": args.seconds,
               "run_dir": str(run_dir), **floor.to_json()}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"# json: {args.json}")
    return 0


def _wait(seconds: float | None) -> None:
    """Sleep until SIGINT/SIGTERM or ``seconds`` (the network stays up meanwhile)."""
    stop = False

    def _on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    old = signal.signal(signal.SIGTERM, _on_signal)
    deadline = None if seconds is None else time.monotonic() + seconds
    print("# up: Ctrl-C stops and removes the network", flush=True)
    try:
        while not stop and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)


def describe_plan(topo: Topology, plan: LinkPlan | None, tools: Bmv2Tools | None) -> list[str]:
    """Lines on who emulates the links, then one per switch on its kind and data plane
    (a soft switch's eBPF or Python with the reason; bmv2's program and tools)."""
    if plan is None:
        return []
    links = describe_links(topo, plan.netem)
    if not plan.netem and any(link.delay or link.loss or link.jitter for link in topo.links):
        links += " (this kernel has no netem)"
    lines = [f"# {topo.name}'s links: {links}"]
    for s in topo.switches:
        choice = plan.datapaths.get(s.name)
        if s.kind == "bmv2":
            line = f"# {s.name}: bmv2 switch, p4/ina.p4 data plane ({s.lanes} lanes)"
            if tools is not None:
                line += f": {tools.switch}"
                line += f", compiled by {tools.compiler}" if tools.compiler else ""
            lines.append(line)
        elif choice is not None:
            where = "eBPF (TC on its ports)" if choice.datapath == "ebpf" else "Python"
            lines.append(f"# {s.name}: soft switch, {where} data plane: {choice.reason}")
    return lines


def _report_links(em: Emulation, run_dir: Path) -> None:
    files = sorted(run_dir.glob("*.links.json"))
    if files:
        print(f"# link emulation statistics: {', '.join(str(f) for f in files)}")
