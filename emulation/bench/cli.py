"""``inalab bench``: allreduce over a size sweep, INA (soft switch) vs CollNet, ring, tree,
dynamiccl's auto and Gloo, nccl-tests style.

Runs on loopback without root: one soft switch process and one process per rank on
127.0.0.1. Flags follow nccl-tests (``-b/-e/-f`` sweep, ``-n/-w`` iterations, ``-d``
type). The tables go to stdout, a progress bar to stderr; ``--json`` and ``--plot``
write the results for later comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import socket
import sys
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulation.argtypes import cc_target, int_in, positive_float, probability, size
from emulation.bench.config import (
    ALGORITHMS,
    AUTO_CHOICES,
    COLLECTIVES,
    DEFAULT_ALGORITHMS,
    DEFAULT_BENCH_LANES,
    DEFAULT_BENCH_SLOTS,
    DEFAULT_CC_TARGET,
    DEFAULT_EMULATED_SLOTS,
    DEFAULT_EMULATED_WINDOW,
    DEFAULT_MSG_PACKETS,
    DEFAULT_RDMA_LANES,
    ELEMENT_BYTES,
    RDMA_ALGORITHMS,
    TRANSPORTS,
    BenchConfig,
    align_down,
    default_algorithms,
    format_size,
    size_sweep,
)
from hostlib.protocol import MAX_LANES, MAX_SLOT, MAX_WORKERS, TNA_LANES_PER_PACKET

if TYPE_CHECKING:
    from collections.abc import Sequence

    from dynamiccl.model import TopologySummary
    from dynamiccl.policy import Decision, Policy
    from emulation.bench.fabric import Fabric
    from emulation.bench.sweep import SweepResult

__all__ = [
    "UsageError",
    "add_arguments",
    "config_from_args",
    "host_engine",
    "loopback_note",
    "make_run_dir",
    "run",
    "run_bench",
]

PROG = "inalab bench"


# ----------------------------------------------------------------- argument types
def _algos(text: str) -> tuple[str, ...]:
    names = [a.strip().lower() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in ALGORITHMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"invalid algorithms {text!r}: a comma-separated subset of {','.join(ALGORITHMS)}"
        )
    return tuple(a for a in ALGORITHMS if a in names)


def add_arguments(parser: argparse.ArgumentParser, emulated: bool = False) -> None:
    """Declare ``inalab bench``'s flags (nccl-tests names where nccl-tests has one).

    ``emulated``: for ``inalab emulate TOPOLOGY bench``, where the topology gives the
    workers, their hosts and the links' loss, and there is no switch-only mode.
    """
    if emulated:
        hints = getattr(parser, "hints", {})  # emulation.cli.CommandParser's
        hints["--workers"] = (
            "under inalab emulate the topology gives the ranks: one per host, or the host's ranks"
        )
        hints["--run-dir"] = "give --run-dir to inalab emulate, before the action"
    add = parser.add_argument
    add("-b", "--minbytes", type=size, default=4 << 10, help="smallest size (default 4K)")
    add("-e", "--maxbytes", type=size, default=16 << 20, help="largest size (default 16M)")
    add("-f", "--stepfactor", type=int_in(2), default=4, help="size multiplier (default 4)")
    add("-n", "--iters", type=int_in(1), default=5, help="timed calls per size (default 5)")
    add("-w", "--warmup_iters", type=int_in(0), default=2, help="untimed calls (default 2)")
    add("-d", "--datatype", choices=sorted(ELEMENT_BYTES), default="float32", help="data type")
    if not emulated:
        add("--workers", type=int_in(1, MAX_WORKERS), default=4, help="ranks (default 4)")
    add(
        "--algos",
        type=_algos,
        default=None,
        help=f"comma list of {','.join(ALGORITHMS)} (default {','.join(DEFAULT_ALGORITHMS)};"
        " ring,gloo for all_gather)",
    )
    add("--collective", choices=COLLECTIVES, default="allreduce",
        help="what is timed, as nccl-tests' all_reduce_perf, reduce_scatter_perf and "
        "all_gather_perf: a size is the whole vector, each rank's part 1/n of it; "
        "reduce_scatter runs on ina, ring, gloo; all_gather on ring, gloo "
        "(default allreduce)")  # fmt: skip
    if not emulated:
        add(
            "--ranks-per-host",
            type=int_in(1, MAX_WORKERS),
            default=2,
            help="collnet: consecutive ranks sharing one emulated host (default 2)",
        )
    add(
        "--loss",
        type=probability(allow_one=False),  # at 1 nothing would ever complete
        default=0.0,
        help="switch drop probability, in and out (the drop simulator)",
    )
    lanes_help = f"int32 lanes per INA packet (default {DEFAULT_BENCH_LANES}"
    if emulated:
        lanes_help += ", or 64 when the topology has a bmv2 switch: p4/'s fixed width"
    lanes_help += ")"
    if not emulated:
        lanes_help = lanes_help[:-1] + f"; with --program tna {TNA_LANES_PER_PACKET})"
    add(
        "--lanes",
        type=int_in(1, MAX_LANES),
        default=None,
        help=lanes_help,
    )
    where = ("its host's address" if emulated
             else "its own 127.0.x.y, or --rdma-device's")  # fmt: skip
    add(
        "--transport",
        choices=TRANSPORTS,
        default="udp",
        help="how INA ranks reach the switch: udp (datagrams), or rdma: RoCEv2 WRITEs "
        f"from an emulated RNIC per rank (on {where}, UDP 4791; "
        "docs/protocol.md 'INA over RoCEv2'), lanes a path MTU (default "
        f"{DEFAULT_RDMA_LANES}, or the topology's if narrower), the switch serving "
        "RoCEv2 (default udp)",
    )
    add(
        "--msg-packets",
        type=int_in(1, 32),
        default=None,
        help="--transport rdma: packets per RDMA message, a power of two; a "
        f"retransmission resends a whole message (default {DEFAULT_MSG_PACKETS})",
    )
    if not emulated:
        add(
            "--rdma-device",
            metavar="DEV",
            default=None,
            help="--transport rdma: run the ranks on this verbs device (e.g. mlx5_0, rxe0; "
            "through pyverbs), one rank per IPv4 address of its RoCEv2 GIDs, instead of "
            "emulated RNICs (default)",
        )
        add(
            "--program",
            choices=("v1model", "tna"),
            default="v1model",
            help="the P4 program whose P4Info the soft switch serves and whose names the "
            "controller configures the job through: v1model (p4/ina.p4) or tna (p4/tna/, "
            "Tofino's) (default v1model)",
        )
    slots = DEFAULT_EMULATED_SLOTS if emulated else DEFAULT_BENCH_SLOTS
    add(
        "--slots",
        type=int_in(1, MAX_SLOT + 1),
        default=slots,
        help=f"INA job slots, the outstanding window (default {slots})",
    )
    window_default = "64" if emulated else "--slots"
    add(
        "--window",
        type=int_in(1, 1 << 20),
        default=DEFAULT_EMULATED_WINDOW if emulated else None,
        help="ring and tree: packets in flight per peer (default "
        f"{window_default}: a peer's acks queue behind its own data)",
    )
    add(
        "--profile",
        type=Path,
        metavar="PATH",
        help="auto: dynamiccl profile JSON (inalab calibrate; default: built-in loopback numbers)",
    )
    add("--seed", type=int, default=0, help="seed of inputs and the drop simulator")
    add("--timeout", type=positive_float, default=10.0, help="host no-progress deadline (s)")
    add(
        "--cc-target",
        type=cc_target,
        default=DEFAULT_CC_TARGET,
        metavar="MS|off",
        help="INA hosts' congestion control: the queueing (ms) their packets may meet above "
        "the least round trip before the window shrinks, e.g. 5 (default off: a fixed window;"
        " measured, it does not pay yet; docs/protocol.md 'Congestion control')",
    )
    if not emulated:  # inalab emulate has its own, before the action
        add("--run-dir", type=Path, help="directory for logs (default: a new temp dir)")
    add(
        "--pcap-count",
        type=int_in(0),
        default=0,
        metavar="N",
        help="record the switch's first N packets in RUN_DIR/switch.pcap (default 0: none)",
    )
    add("--json", type=Path, metavar="PATH", help="write results as JSON")
    add("--explain", action="store_true",
        help="explain the tables' columns and marks in full (default: a short legend)")  # fmt: skip
    add("--plot", type=Path, metavar="PATH", help="write a PNG plot of time and algbw")
    if not emulated:
        add("--switch-only", action="store_true", help="only load the switch (loadgen)")
        add("--seconds", type=positive_float, default=5.0, help="--switch-only duration (s)")


# ----------------------------------------------------------------- run
class UsageError(Exception):
    """Flags that parse one by one but not together: exit status 2, like argparse."""


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; 0 on success, 1 if a run failed or gave wrong results, 2 on
    bad arguments."""
    from emulation.bench.sweep import BenchError

    if args.lanes is None:
        args.lanes = _default_lanes(args)
    try:
        check_outputs(args)
        if args.switch_only:
            return _run_switch_only(args)
        check_inputs(args)
        cfg = config_from_args(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    run_dir = make_run_dir(args.run_dir)
    try:
        return run_bench(args, cfg, run_dir)
    except BenchError as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        print(f"# logs: {run_dir}")


def check_outputs(args: argparse.Namespace) -> None:
    """The JSON and plot files can be written where asked (checked before anything runs
    or any directory is made).

    Raises:
        UsageError: a file's directory does not exist.
    """
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and not Path(path).parent.is_dir():
            raise UsageError(f"{flag}: directory {Path(path).parent} does not exist")


def check_inputs(args: argparse.Namespace) -> None:
    """What the run will need, before it starts anything: a readable ``--profile``
    (whatever the algorithms: a bad file is never ignored) and PyTorch for ``gloo``.

    Raises:
        UsageError: the profile cannot be read, or gloo is asked for without torch.
    """
    import importlib.util

    from dynamiccl.model import Profile, ProfileError

    if args.profile is not None:
        try:
            Profile.load(args.profile)
        except (OSError, ProfileError) as exc:
            raise UsageError(f"--profile: {exc}") from None
    resolve_algos(args)
    host_engine()
    _check_rdma_device(args)
    if "gloo" in args.algos and importlib.util.find_spec("torch") is None:
        raise UsageError(
            "gloo needs PyTorch, which is not installed: pip install 'inalab[torch]' "
            "(torch==2.13.0), or leave gloo out of --algos"
        )


def _check_rdma_device(args: argparse.Namespace) -> None:
    """``--rdma-device``: only over RDMA, and a device that runs here with an address
    for every rank.

    Raises:
        UsageError: without ``--transport rdma``, or the device cannot carry the ranks
            (:func:`~emulation.bench.rdma_device.check_rdma_device`'s one-line reason).
    """
    from emulation.bench.rdma_device import RdmaDeviceError, check_rdma_device

    device = getattr(args, "rdma_device", None)
    if device is None:
        return
    if getattr(args, "transport", "udp") != "rdma":
        raise UsageError(f"--rdma-device {device}: with --transport rdma only")
    try:
        check_rdma_device(device, args.workers)
    except RdmaDeviceError as exc:
        raise UsageError(str(exc)) from None


def resolve_algos(args: argparse.Namespace) -> None:
    """``--algos`` as given, else the collective's default (``default_algorithms``); over
    RDMA, of those, what runs over RDMA."""
    if args.algos is None:
        args.algos = default_algorithms(args.collective)
        if getattr(args, "transport", "udp") == "rdma":
            args.algos = [a for a in args.algos if a in RDMA_ALGORITHMS]


def config_from_args(
    args: argparse.Namespace, workers: int | None = None, ranks_per_host: int | None = None
) -> BenchConfig:
    """The run's configuration from the parsed flags (``workers`` and ``ranks_per_host``
    from the caller when the flags have none: the emulator's topology).

    Raises:
        UsageError: flags that parse one by one but not together.
    """
    resolve_algos(args)
    elem = ELEMENT_BYTES[args.datatype]
    minbytes = align_down(args.minbytes, elem)
    maxbytes = align_down(args.maxbytes, elem)
    if minbytes == 0:
        raise UsageError(f"minbytes {args.minbytes} is smaller than one {args.datatype}")
    for flag, given, used in (
        ("minbytes", args.minbytes, minbytes),
        ("maxbytes", args.maxbytes, maxbytes),
    ):
        if given != used:
            print(
                f"{PROG}: note: --{flag} {given} rounded down to {used},"
                f" a multiple of the {elem}-byte {args.datatype}",
                file=sys.stderr,
            )
    try:
        sizes = size_sweep(minbytes, maxbytes, args.stepfactor)
        return BenchConfig(
            sizes=tuple(sizes),
            algos=tuple(args.algos),
            workers=workers if workers is not None else args.workers,
            dtype=args.datatype,
            iters=args.iters,
            warmup=args.warmup_iters,
            lanes=args.lanes if args.lanes is not None else _default_lanes(args),
            slots=args.slots,
            window=args.window,
            loss=args.loss,
            seed=args.seed,
            timeout=args.timeout,
            cc_target=args.cc_target,
            pcap_count=args.pcap_count,
            ranks_per_host=ranks_per_host
            if ranks_per_host is not None
            else (args.ranks_per_host if "collnet" in args.algos else 1),
            collective=args.collective,
            program=getattr(args, "program", "v1model"),
            transport=getattr(args, "transport", "udp"),
            msg_packets=_msg_packets(args),
            rdma_device=getattr(args, "rdma_device", None),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _msg_packets(args: argparse.Namespace) -> int:
    """``--msg-packets``, else 1 over UDP and :data:`DEFAULT_MSG_PACKETS` over RDMA."""
    given = getattr(args, "msg_packets", None)
    if given is not None:
        return int(given)
    return DEFAULT_MSG_PACKETS if getattr(args, "transport", "udp") == "rdma" else 1


def _default_lanes(args: argparse.Namespace) -> int:
    """``--lanes``' default on loopback: the Tofino program's width with ``--program tna``,
    a 4 KiB path MTU with ``--transport rdma``."""
    if getattr(args, "transport", "udp") == "rdma":
        return DEFAULT_RDMA_LANES
    return TNA_LANES_PER_PACKET if getattr(args, "program", "") == "tna" else DEFAULT_BENCH_LANES


def make_run_dir(given: Path | None, prefix: str = "inalab-bench-") -> Path:
    """``given`` (created with its parents if missing), or a new temporary directory named
    ``prefix...``: where a run keeps its logs.

    Raises:
        OSError: the directory cannot be created.
    """
    if given is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    given.mkdir(parents=True, exist_ok=True)
    return given


def run_bench(
    args: argparse.Namespace,
    cfg: BenchConfig,
    run_dir: Path,
    fabric: Fabric | None = None,
    extra_meta: dict[str, Any] | None = None,
    topology: TopologySummary | None = None,
    notes: Sequence[str] = (),
) -> int:
    """Run the sweep on ``fabric`` (default: loopback), print the legend, the tables and
    the summary of who won, write JSON and plot; 0 if every element was right, 1
    otherwise (2: ``--profile`` unreadable or ``INALAB_HOST_ENGINE`` invalid).

    ``topology`` is what dynamiccl knows of the network for ``auto`` (None: the
    profile's own set-up, loopback). ``notes``: the caller's lines (each a ``# ``
    comment) printed after the summary, e.g. what the emulation saw of its network.

    Raises:
        BenchError: a run failed (see :func:`emulation.bench.sweep.run_sweep`).
    """
    from dynamiccl.model import ProfileError
    from emulation.bench.fabric import LoopbackFabric
    from emulation.bench.progress import TerminalProgress
    from emulation.bench.report import make_document, write_json, write_plot
    from emulation.bench.summary import format_summary, summarize
    from emulation.bench.sweep import SweepInterrupted, run_sweep

    fabric = fabric or LoopbackFabric(cfg.ranks_per_host)
    try:
        policy = _policy(args, cfg, topology) if "auto" in cfg.algos else None
    except (OSError, ProfileError) as exc:
        print(f"{PROG}: error: --profile: {exc}", file=sys.stderr)
        return 2
    try:
        engine = host_engine()
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    # auto's decision per size, made once: the sweep runs them, the report explains them.
    decisions = {n: policy.decide(n) for n in cfg.sizes} if policy is not None else {}
    loopback = isinstance(fabric, LoopbackFabric)
    busy_before = _warn_if_busy()
    links = getattr(fabric, "links", "")
    print(_banner(cfg, fabric.description, engine if loopback else None, links), flush=True)
    progress = TerminalProgress(len(cfg.sizes) * len(cfg.algos)).sweep(cfg.sizes)
    level = logging.getLogger().getEffectiveLevel()
    decide = (lambda n: decisions[n].algorithm) if decisions else None
    stopped: KeyboardInterrupt | None = None
    try:
        result = run_sweep(cfg, run_dir, progress, level, fabric, decide)
    except SweepInterrupted as exc:  # report what finished, then stop as asked
        result, stopped = exc.result, exc.cause
        print(f"# stopped by {_signal_name(stopped)}: the tables hold the sizes every rank "
              "finished", flush=True)  # fmt: skip
    _print_tables(result, cfg, fabric, stopped is None, getattr(args, "explain", False))
    extra: dict[str, Any] = {}
    if policy is not None and stopped is None:
        extra["dynamiccl"] = _report_auto(policy, decisions, cfg, result.rows)
    summary = summarize(result.rows, cfg.algos)
    print(format_summary(summary))
    for line in notes:
        print(line)
    print("#")
    extra["summary"] = summary.to_json()
    wrong = sum(r.wrong for r in result.rows)
    meta = _metadata(args, cfg, run_dir)
    meta.update(extra_meta or {})
    meta["profile_path"] = None if args.profile is None else str(args.profile)
    meta["switch_counters"] = result.switch_counters
    meta["switch_log"] = result.switch_log
    meta["wall_s"] = result.wall_s
    meta["udp_kernel_counters_delta"] = result.udp_kernel_delta
    meta["link_drops"] = result.link_drops
    meta["busy_cores_before"] = busy_before
    meta["links"] = getattr(fabric, "links", None)
    meta["host_engine"] = engine
    if stopped is not None:
        meta["stopped_by"] = _signal_name(stopped)
    pcap = run_dir / "switch.pcap"
    if cfg.pcap_count and pcap.exists():
        meta["pcap"] = str(pcap)
        # The switch ran on a free port: scapy needs it (hostlib.scapy_layer.bind_port).
        print(f"# pcap: {pcap} (switch port in {run_dir / 'switch.ready.json'})")
    if args.json is not None:
        write_json(args.json, make_document(meta, result.rows, extra))
        print(f"# json: {args.json}")
    if args.plot is not None:
        title = (f"{cfg.collective} {cfg.dtype}, {cfg.workers} workers on {fabric.description}\n"
                 f"{getattr(fabric, 'links', '')}; switch drop simulator {cfg.loss:g}")  # fmt: skip
        write_plot(args.plot, result.rows, title)
        print(f"# plot: {args.plot}")
    if stopped is not None:
        raise stopped  # emulation.cli prints one line and exits 128 + the signal
    if wrong:
        print(f"{PROG}: {wrong} wrong elements in total", file=sys.stderr)
        return 1
    return 0


def _print_tables(
    result: SweepResult, cfg: BenchConfig, fabric: Fabric, complete: bool, explain: bool
) -> None:
    """The legend once, then one table per algorithm with its footnotes (after a stop,
    only the algorithms that finished a size)."""
    from emulation.bench.notes import legend, link_drops_note, switch_notes
    from emulation.bench.report import format_table

    for line in legend(result.rows, explain):
        print(line)
    print("#")
    hosts = len({p.host for p in fabric.placements(cfg.workers)})
    for algo in cfg.algos:
        rows = [r for r in result.rows if r.algo == algo]
        if rows or complete:
            print(format_table(algo, rows, _describe(algo, cfg, fabric.description, hosts)))
            for line in switch_notes(result.switch_counters.get(algo, {})):
                print(line)
            link_line = link_drops_note(result.link_drops.get(algo, {}))
            if link_line:
                print(link_line)
            print("#")


def _policy(args: argparse.Namespace, cfg: BenchConfig, topology: TopologySummary | None) -> Policy:
    """auto's decision maker: dynamiccl's policy from ``--profile`` without exploration,
    so its choice at a size is a pure function of the profile and the network.

    Raises:
        OSError, ProfileError: the profile file cannot be read.
    """
    from dynamiccl.model import DEFAULT_PROFILE, Profile
    from dynamiccl.policy import Policy

    profile = DEFAULT_PROFILE if args.profile is None else Profile.load(args.profile)
    return Policy(profile, cfg.workers, topology, epsilon=0.0)


def _report_auto(
    policy: Policy, decisions: dict[int, Decision], cfg: BenchConfig, rows: list[Any]
) -> dict[str, Any]:
    """Print auto's choices against the oracle (when its candidates ran too); the JSON
    section with the profile, each decision and the summary."""
    from emulation.bench.report import format_oracle, oracle_points, oracle_summary

    section: dict[str, Any] = {
        "profile": policy.profile.source,
        "topology": None
        if policy.topology_summary is None
        else dataclasses.asdict(policy.topology_summary),
        "decisions": {str(n): d.to_dict() for n, d in decisions.items()},
    }
    print(f"# auto's profile: {policy.profile.source}")
    static = [a for a in AUTO_CHOICES if a in cfg.algos]
    points = oracle_points(rows, static)
    if len(static) >= 2 and points:
        summary = oracle_summary(points)
        print(format_oracle(points, summary))
        print("#")
        section["oracle"] = summary
    else:
        print(f"# auto: run it with {','.join(AUTO_CHOICES)} to compare with the oracle\n#")
    return section


def host_engine() -> str:
    """The host engine the ranks will run (``native`` or ``python``): the ranks inherit
    this process's environment and ask :func:`hostlib.native.engine_name` as it does.

    Raises:
        UsageError: ``INALAB_HOST_ENGINE`` names no engine, or one not built here.
    """
    from hostlib.native import engine_name

    try:
        return engine_name()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def loopback_note(engine: str) -> str:
    """What sets the times on loopback, where there is no wire (``engine``: the hosts',
    :func:`host_engine`): lines printed before a loopback run's tables."""
    from emulation.bench.notes import wrap

    hosts = (
        "the hosts' per-packet work (INA, ring, tree) runs in native C"
        if engine == "native"
        else "the hosts' per-packet work (INA, ring, tree) runs in Python too"
    )
    text = (
        "on loopback there is no wire: INA's pace is the soft switch's, one Python process"
        f" that handles every packet of every rank; {hosts} (host engine: {engine});"
        " Gloo moves large TCP segments"
    )
    return "\n".join(wrap(text))


def _banner(cfg: BenchConfig, where: str, loopback: str | None = None, links: str = "") -> str:
    """The lines before the tables; ``loopback``: the host engine of a loopback run."""
    sizes = f"{format_size(cfg.sizes[0])}..{format_size(cfg.sizes[-1])}"
    return (
        f"# inalab bench: {_what(cfg.collective)}, {cfg.workers} workers on {where}, {cfg.dtype},"
        f" sizes {sizes} ({len(cfg.sizes)}), iters {cfg.iters}, warmup {cfg.warmup},"
        f" seed {cfg.seed}\n"
        + (f"# links: {links}\n" if links else "")
        + (f"{loopback_note(loopback)}\n" if loopback is not None else "")
        + "#"
    )


def _signal_name(stop: KeyboardInterrupt) -> str:
    """SIGTERM, SIGHUP (emulation.cli.Interrupted) or SIGINT (Ctrl-C)."""
    import signal

    return signal.Signals(getattr(stop, "signum", signal.SIGINT)).name


def _describe(algo: str, cfg: BenchConfig, where: str, hosts: int) -> str:
    ina = f"lanes={cfg.lanes}, slots={cfg.slots}, switch drop simulator {cfg.loss:g} in+out"
    if algo == "ina" and cfg.transport == "rdma":
        return (
            f"INA over RoCEv2 (UC RDMA WRITE from an emulated RNIC per rank, messages of "
            f"{cfg.msg_packets} packets) through the switch, {ina}, n={cfg.workers}"
        )
    if algo == "ina":
        return f"INA through the switch, {ina}, n={cfg.workers}"
    if algo == "collnet":
        return (
            f"CollNet: shared-memory reduce on each of {hosts} hosts, the heads' INA"
            f" through the switch, {ina}, n={cfg.workers}"
        )
    if algo in ("ring", "tree"):
        shape = ("binary tree reduce + bcast" if algo == "tree"
                 else "reduce-scatter + all-gather" if cfg.collective == "allreduce"
                 else cfg.collective.replace("_", "-"))  # fmt: skip
        return (
            f"hostlib {algo} ({shape}) over UDP on {where}, lanes={cfg.lanes},"
            f" window={cfg.p2p_window}, n={cfg.workers}"
        )
    if algo == "auto":
        return f"dynamiccl picks ina, ring or tree per size (the 'chosen' column), n={cfg.workers}"
    # torch's ProcessGroupGloo runs gloo::allreduce: segmented ring reduce-scatter + all-gather.
    torch_version = _version("torch")
    return (
        f"torch.distributed gloo {torch_version}: ring {cfg.collective.replace('_', '-')},"
        f" TCP on {where}, n={cfg.workers}"
    )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _warn_if_busy() -> float | None:
    """Cores other processes kept busy for half a second before the run; a warning on
    standard error when more than ``BUSY_OTHER_CORES`` (the rows will say so again)."""
    from emulation.bench.cpu import BUSY_OTHER_CORES, busy_cores

    busy = busy_cores(0.5)
    if busy is not None and busy > BUSY_OTHER_CORES:
        print(
            f"{PROG}: warning: the machine is busy with other processes ({busy:.0%} of a"
            " core before the run): times will include that load; rows that ran beside it"
            " are marked ~",
            file=sys.stderr,
            flush=True,
        )
    return None if busy is None else round(busy, 3)


def _what(collective: str) -> str:
    return collective if collective == "all_gather" else f"{collective} sum"


def _metadata(args: argparse.Namespace, cfg: BenchConfig, run_dir: Path) -> dict[str, Any]:
    import numpy

    from emulation.bench.report import redop

    return {
        "collective": cfg.collective,
        "redop": redop(cfg.collective),
        "algos": list(cfg.algos),
        "workers": cfg.workers,
        "lanes": cfg.lanes,
        "slots": cfg.slots,
        "transport": cfg.transport,
        "msg_packets": cfg.msg_packets,
        "program": cfg.program,
        "window": cfg.p2p_window,
        "ranks_per_host": cfg.ranks_per_host,
        "loss": cfg.loss,
        "loss_applies_to": "switch ingress and each egress replica (INA only)",
        "dtype": cfg.dtype,
        "seed": cfg.seed,
        "timeout_s": cfg.timeout,
        "cc_target_s": cfg.cc_target if math.isfinite(cfg.cc_target) else None,
        "sweep": {
            "minbytes": cfg.sizes[0],
            "maxbytes": align_down(args.maxbytes, ELEMENT_BYTES[cfg.dtype]),
            "stepfactor": args.stepfactor,
            "iters": cfg.iters,
            "warmup_iters": cfg.warmup,
            "sizes": list(cfg.sizes),
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "torch": _version("torch"),
            "inalab": _version("inalab"),
        },
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_dir": str(run_dir),
    }


def _run_switch_only(args: argparse.Namespace) -> int:
    from emulation.bench.switch_only import SwitchOnlyError, run_switch_only

    run_dir = make_run_dir(args.run_dir)
    try:
        numbers = run_switch_only(
            run_dir, workers=args.workers, lanes=args.lanes, seconds=args.seconds
        )
    except (ValueError, SwitchOnlyError) as exc:
        print(f"{PROG}: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        print(f"# logs: {run_dir}")
    print(f"# inalab bench --switch-only: {args.workers} workers, lanes {args.lanes}")
    where = {"switch": "soft", "fabric": "127.0.0.1", "seconds": args.seconds}
    write_switch_only(numbers, where, args.json, run_dir)
    return 0


def write_switch_only(
    numbers: dict[str, Any], where: dict[str, Any], json_path: Path | None, run_dir: Path
) -> None:
    """Print a switch-only run's numbers, one per line, and write them as JSON if asked
    (``where``: the switch kind and fabric, into the metadata)."""
    width = max((len(str(k)) for k in numbers), default=0)
    for key, value in numbers.items():
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    if json_path is None:
        return
    doc = {
        "schema": "inalab.bench/1",
        "metadata": {
            "mode": "switch-only",
            **where,
            "workers": numbers["workers"],
            "lanes": numbers["lanes"],
            "window": numbers["window"],
            "versions": {"python": platform.python_version(), "inalab": _version("inalab")},
            "hostname": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "run_dir": str(run_dir),
        },
        "switch_only": numbers,
    }
    json_path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"# json: {json_path}")
