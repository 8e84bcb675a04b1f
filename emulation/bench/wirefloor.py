"""The wire floor: what moving a Gbit through the network costs a host, with no work.

``inalab emulate TOPOLOGY wire-floor`` puts one process per rank of the job where the
bench puts its ranks (:meth:`~emulation.bench.fabric.Fabric.placements`). Each sends
UDP datagrams of an INA packet's size to the next rank at a steady rate just under its
link's, and receives the previous rank's, in batches of the INA window, from native code
with nothing else to do (:mod:`emulation.bench._wirecore`): no headers, no lanes to
convert, no timers, no switch aggregation (the switches forward these datagrams like any
other). So every rank sends a Gbit and receives a Gbit for each Gbit of its traffic, as
an INA rank does for each Gbit of an allreduce's size, and its CPU per Gbit is the floor
under the bench's ``worker_cpu_s_per_gbit`` for INA on the same network: what the host's
kernel and the emulated links (shapers, veths, the switch's forwarding program, which
the kernel runs in the ranks' context) cost by themselves. The bench's figure minus this
floor is what the host library and the switch's aggregation add.

Each rank's CPU is its thread's clock over the run, which includes the kernel's
softirq work done while it ran (here: often another rank's frames), so single ranks
vary; their mean is the figure. Periods that began late (``late_periods``) mean the
host, not the link, set the pace: a floor measured on a saturated machine says so.
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any

from emulation.bench.fabric import Fabric
from emulation.bench.spawned import HANDSHAKE_SECONDS, next_report, reap
from emulation.bench.workers import Placement, enter_netns

__all__ = [
    "LATE_SHARE_BOUND",
    "RATE_SHARE",
    "RankFloor",
    "WireFloor",
    "WireFloorError",
    "measure_wire_floor",
    "report_lines",
]

RATE_SHARE = 0.95
"""The default sending rate as a share of the hosts' link rate: the datagrams' headers
(42 bytes of 8,250 at 2,048 lanes) and a margin, so that the shaper's queue stays short
and the rate, not the queue, is measured."""

LATE_SHARE_BOUND = 0.1
"""A rank whose sending periods began late more often than this was paced by its host,
not by the rate: the run is flagged host-bound and its floor is not a floor."""

_RANK_FIELDS = ("rank", "sent", "received", "cpu_s", "seconds", "periods", "late_periods")
_QUIET_SECONDS = 0.2  # after sending: receive until nothing came for this long
_SNDBUF_BATCHES = 4  # the send buffer holds this many batches: a slow link blocks sends
_RCVBUF_BYTES = 4 << 20


class WireFloorError(RuntimeError):
    """A rank's process failed or went silent, or the native sender is not built."""


@dataclass(frozen=True)
class RankFloor:
    """One rank's run: datagrams it sent and received, its thread's CPU seconds, the
    sending interval, and how many of its sending periods began late."""

    rank: int
    sent: int
    received: int
    cpu_s: float
    seconds: float
    periods: int
    late_periods: int


@dataclass(frozen=True)
class WireFloor:
    """A wire-floor run: its parameters, every rank's counts, and the links' drops over
    the run (interface to frames; empty where the fabric has no emulated links)."""

    datagram: int
    batch: int
    rate_mbit: float
    ranks: tuple[RankFloor, ...]
    link_drops: Mapping[str, int]

    def cpu_s_per_gbit(self, r: RankFloor) -> float:
        """Rank ``r``'s CPU seconds per Gbit it sent (it received as much)."""
        gbit = r.sent * self.datagram * 8e-9
        return r.cpu_s / gbit if gbit > 0 else float("nan")

    @property
    def mean_cpu_s_per_gbit(self) -> float:
        """The ranks' mean CPU seconds per Gbit sent: the floor."""
        return sum(self.cpu_s_per_gbit(r) for r in self.ranks) / len(self.ranks)

    def gbit_per_s(self, r: RankFloor) -> float:
        """Rank ``r``'s sending rate over its sending interval, Gbit/s."""
        return r.sent * self.datagram * 8e-9 / r.seconds if r.seconds > 0 else 0.0

    @property
    def lost(self) -> int:
        """Datagrams sent and not received (each rank's from its predecessor)."""
        n = len(self.ranks)
        return sum(max(self.ranks[i - 1].sent - self.ranks[i].received, 0) for i in range(n))

    @property
    def host_bound(self) -> bool:
        """Some rank began more than :data:`LATE_SHARE_BOUND` of its periods late."""
        return any(r.late_periods > LATE_SHARE_BOUND * max(r.periods, 1) for r in self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "datagram_bytes": self.datagram,
            "batch": self.batch,
            "rate_mbit": self.rate_mbit,
            "cpu_s_per_gbit": round(self.mean_cpu_s_per_gbit, 4),
            "host_bound": self.host_bound,
            "lost": self.lost,
            "link_drops": dict(self.link_drops),
            "ranks": [
                {
                    "rank": r.rank,
                    "sent": r.sent,
                    "received": r.received,
                    "cpu_s": round(r.cpu_s, 6),
                    "seconds": round(r.seconds, 6),
                    "gbit_per_s": round(self.gbit_per_s(r), 4),
                    "cpu_s_per_gbit": round(self.cpu_s_per_gbit(r), 4),
                    "periods": r.periods,
                    "late_periods": r.late_periods,
                }
                for r in self.ranks
            ],
        }


def measure_wire_floor(
    fabric: Fabric,
    workers: int,
    datagram: int,
    batch: int,
    rate_mbit: float,
    seconds: float,
) -> WireFloor:
    """Run the wire floor on ``fabric``: rank i sends to rank i+1 (mod ``workers``).

    Args:
        fabric: where the ranks run (their hosts and addresses).
        workers: ranks, at least 2.
        datagram: UDP payload bytes per datagram (an INA packet's: ``packet_size(lanes)``).
        batch: datagrams per sending period (the INA window).
        rate_mbit: each rank's sending rate, Mbit/s of UDP payload.
        seconds: the sending interval.

    Raises:
        ValueError: a parameter out of range.
        WireFloorError: the native sender is not built, or a rank failed or went silent.
    """
    if workers < 2:
        raise ValueError(f"the wire floor needs at least 2 ranks (got {workers})")
    if not 8 <= datagram <= 65507 or not 1 <= batch <= 1024:
        raise ValueError(f"datagram {datagram} (8..65507 bytes) or batch {batch} (1..1024)")
    if not rate_mbit > 0 or not seconds > 0:
        raise ValueError(f"rate {rate_mbit} Mbit/s and {seconds} s must be positive")
    try:
        import emulation.bench._wirecore  # noqa: F401  (the ranks import it too)
    except ImportError as exc:
        raise WireFloorError(
            f"the native wire sender is not built ({exc}): reinstall with a C compiler"
            " (pip install -e .)"
        ) from None
    try:
        placements = fabric.placements(workers)
    except ValueError as exc:
        raise WireFloorError(str(exc)) from None
    ctx = multiprocessing.get_context("spawn")
    ports: Queue[tuple[int, int]] = ctx.Queue()
    plans: Queue[dict[str, Any]] = ctx.Queue()
    reports: Queue[dict[str, Any]] = ctx.Queue()
    ranks = [
        ctx.Process(target=_rank_main, args=(rank, placements[rank], ports, plans, reports))
        for rank in range(workers)
    ]
    for p in ranks:
        p.start()
    try:
        bound = dict(next_report(ports, ranks, WireFloorError, "rank") for _ in ranks)
        peers = [(placements[r].bind_ip, bound[r]) for r in range(workers)]
        drops_before = fabric.link_drops()
        go = time.monotonic() + 0.2
        for _ in ranks:  # each rank takes any copy, and its peer from it by its rank
            plans.put({"peers": peers, "go": go, "datagram": datagram, "batch": batch,
                       "rate_bps": rate_mbit * 1e6, "seconds": seconds})  # fmt: skip
        wait = HANDSHAKE_SECONDS + seconds
        done = sorted(
            (next_report(reports, ranks, WireFloorError, "rank", wait) for _ in ranks),
            key=lambda d: d["rank"],
        )
        drops_after = fabric.link_drops()
    finally:
        reap(ranks)
    drops = {k: v - drops_before.get(k, 0) for k, v in drops_after.items()}
    return WireFloor(
        datagram=datagram,
        batch=batch,
        rate_mbit=rate_mbit,
        ranks=tuple(RankFloor(**{k: d[k] for k in _RANK_FIELDS}) for d in done),
        link_drops={k: v for k, v in drops.items() if v > 0},
    )


def report_lines(floor: WireFloor, where: str) -> list[str]:
    """The run as the bench prints: a heading, a row per rank, the floor and its flags."""
    lines = [
        f"# wire floor: {where}; each rank sends {floor.datagram}-byte UDP datagrams to the"
        f" next at {floor.rate_mbit:g} Mbit/s in batches of {floor.batch} and receives the"
        " previous rank's, with no other work",
        "#",
        f"# {'rank':>4} {'sent':>9} {'received':>9} {'Gbit/s':>7} {'cpu(s)':>8}"
        f" {'cpu-s/Gbit':>10} {'late':>6}",
    ]
    for r in floor.ranks:
        late = f"{100 * r.late_periods / max(r.periods, 1):.0f}%"
        lines.append(
            f"  {r.rank:>4} {r.sent:>9} {r.received:>9} {floor.gbit_per_s(r):>7.3f}"
            f" {r.cpu_s:>8.3f} {floor.cpu_s_per_gbit(r):>10.4f} {late:>6}"
        )
    lines += [
        "#",
        f"# floor: {floor.mean_cpu_s_per_gbit:.3f} CPU-s per Gbit a rank sent and received"
        " (mean of the ranks): what this network's kernel path costs a host by itself, under"
        " the bench's worker_cpu_s_per_gbit for INA (which adds the host library and the"
        " switch's aggregation)",
        "# late: sending periods that began late; above"
        f" {100 * LATE_SHARE_BOUND:.0f}% the host, not the rate, set the pace",
    ]
    if floor.host_bound:
        lines.append(
            "# host-bound: a rank could not keep the rate (late periods above the bound):"
            " the machine was short of CPU, and this is no floor; lower --rate"
        )
    if floor.lost:
        where_dropped = ", ".join(f"{k} {v}" for k, v in sorted(floor.link_drops.items()))
        lines.append(
            f"# lost: {floor.lost} datagrams sent were not received"
            + (f" (link drops: {where_dropped})" if where_dropped else "")
        )
    return lines


# --------------------------------------------------------------------- rank process
def _rank_main(
    rank: int,
    placement: Placement,
    ports: Queue[tuple[int, int]],
    plans: Queue[dict[str, Any]],
    reports: Queue[dict[str, Any]],
) -> None:
    """One rank: enter its host, bind its receiving socket, report the port, take the
    plan, connect to the next rank, send and receive until the plan's end, report."""
    import emulation.bench._wirecore as _wirecore

    if placement.netns is not None:
        enter_netns(placement.netns)
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF_BYTES)
        rx.bind((placement.bind_ip, 0))
        ports.put((rank, rx.getsockname()[1]))
        plan = plans.get(timeout=HANDSHAKE_SECONDS)
        peers = plan["peers"]
        sndbuf = _SNDBUF_BATCHES * plan["batch"] * plan["datagram"]
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        tx.bind((placement.bind_ip, 0))
        tx.connect(tuple(peers[(rank + 1) % len(peers)]))
        delay = plan["go"] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        counts = _wirecore.run(
            tx.fileno(), rx.fileno(), plan["batch"], plan["datagram"], plan["rate_bps"],
            plan["seconds"], _QUIET_SECONDS,
        )  # fmt: skip
    reports.put({"rank": rank, **counts})
