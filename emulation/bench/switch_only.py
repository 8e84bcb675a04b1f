"""Switch-only benchmark: how fast a switch aggregates, with no host library in the way.

``inalab bench --switch-only`` (the soft switch on loopback) and ``inalab emulate
TOPOLOGY switch-only`` (the topology's switches, soft or bmv2, on Mininet's veth ports)
run the same measurement on a :class:`~emulation.bench.fabric.Fabric`: one sender
process per rank, placed where the fabric says (a host's network namespace and
address), keeps ``window`` slots outstanding with pre-built DATA packets, reuses a slot
(flipping its set) when the slot's RESULT arrives, and retransmits a slot not answered
within ``rto``, so a lost packet cannot stall it. Every rank contributes ``rank + 1`` in
every lane, so each RESULT's lane must be ``N(N+1)/2``.

Switch-side rates come from the switch's counters over the measured interval (summed
over the job's switches), worker-side goodput from the senders. ``switch_cpu_fraction``
is the CPU time the switch processes used over the interval's wall time: near 1.0 (per
process) the switch was the bottleneck; well under, it was starved of load or of CPU.
The in-process ceiling of the Python pipeline (no sockets) is
:func:`emulation.softswitch.loadgen.measure_pipeline`.
"""

from __future__ import annotations

import multiprocessing
import socket
import struct
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from emulation.bench.config import BenchConfig
from emulation.bench.fabric import Fabric, FabricError, LoopbackFabric
from emulation.bench.spawned import HANDSHAKE_SECONDS, next_report, reap
from emulation.bench.workers import Placement, enter_netns
from emulation.softswitch.loadgen import (
    BENCH_JOB_ID,
    check_params,
    data_packet,
    measure_pipeline,
    profile_pipeline,
    use_seq,
)
from hostlib.protocol import (
    FLAG_RESEND,
    HEADER,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    SLOT_MASK,
    PacketType,
    make_pool_index,
)

__all__ = ["SwitchOnlyError", "measure_switch", "run_switch_only"]

Result = dict[str, Any]

_RESULT_VT = (PROTOCOL_VERSION << 4) | PacketType.RESULT
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_POOL_OFFSET, _SEQ_OFFSET, _FLAGS_OFFSET = 8, 12, 1  # header byte offsets (protocol.py)
_SOCKET_BUFFER_BYTES = 4 << 20


class SwitchOnlyError(RuntimeError):
    """A sender failed or went silent, or the switch could not be set up."""


def run_switch_only(
    run_dir: Path,
    fabric: Fabric | None = None,
    workers: int = 4,
    lanes: int = 64,
    window: int = 64,
    seconds: float = 5.0,
    *,
    packets: int = 2_000_000,
    in_process: bool = True,
    profile: bool = False,
    rto: float = 0.05,
) -> Result:
    """The pipeline in-process (unless ``in_process`` is false), then the real switch of
    ``fabric`` (default: a soft switch on loopback) under load; one dict of numbers.

    Args:
        run_dir: the switch's logs.
        fabric: where senders and switch are; None: :class:`LoopbackFabric`.
        workers, lanes, window, seconds, rto: as :func:`measure_switch`.
        packets: most packets the in-process run handles (it also stops after
            ``seconds``).
        in_process: also measure ``Pipeline.process`` alone (``inproc_*`` keys): the
            Python pipeline's ceiling, meaningless for another kind of switch.
        profile: the in-process run again under cProfile (``profile``: its top functions).

    Raises:
        ValueError: a parameter out of range.
        SwitchOnlyError: as :func:`measure_switch`.
    """
    check_params(workers, lanes, window, seconds)
    result: Result = {"workers": workers, "lanes": lanes, "window": window}
    if in_process:
        result.update(measure_pipeline(workers, lanes, window, packets, seconds))
        result.update(_program(workers, lanes, window, packets, seconds))
    if profile:
        result["profile"] = profile_pipeline(workers, lanes, window, packets, seconds)
    fabric = fabric if fabric is not None else LoopbackFabric()
    result.update(measure_switch(fabric, workers, lanes, window, seconds, run_dir, rto=rto))
    return result


def _program(workers: int, lanes: int, window: int, packets: int, seconds: float) -> Result:
    """The eBPF program's own time per packet, next to the Python pipeline's, where it can
    run (root, clang, libbpf); else why not (``ebpf_program``)."""
    from emulation.softswitch.ebpf import ebpf_unavailable

    why = ebpf_unavailable()
    if why is not None:
        return {"ebpf_program": f"not measured: {why}"}
    from emulation.softswitch.ebpf.microbench import MAX_RUN_LANES, measure_program

    return measure_program(workers, min(lanes, MAX_RUN_LANES), window, packets, seconds)


def measure_switch(
    fabric: Fabric,
    workers: int,
    lanes: int,
    window: int,
    seconds: float,
    run_dir: Path,
    *,
    rto: float = 0.05,
) -> Result:
    """Load the fabric's switch with ``workers`` senders for ``seconds``; return rates.

    Args:
        fabric: where the senders run and which switch their job uses.
        workers: senders, one per rank of the job.
        lanes: int32 lanes per packet (the switch's width).
        window: outstanding slots per sender (the job's slot count).
        seconds: length of the measured interval (after a short warm-up).
        run_dir: the fabric's switch logs.
        rto: a sender's retransmission timeout, seconds.

    Raises:
        SwitchOnlyError: a sender failed or did not report, or the switch failed.
    """
    cfg = BenchConfig(sizes=(4 * lanes,), algos=("ina",), workers=workers, lanes=lanes,
                      slots=window)  # fmt: skip
    try:
        placements = fabric.placements(workers)
    except ValueError as exc:
        raise SwitchOnlyError(str(exc)) from None
    ctx = multiprocessing.get_context("spawn")
    ports: Queue[tuple[int, int]] = ctx.Queue()
    plans: Queue[dict[str, Any]] = ctx.Queue()
    reports: Queue[Result] = ctx.Queue()
    queues = (ports, plans, reports)
    senders = [
        ctx.Process(
            target=_sender_main, args=(rank, placements[rank], workers, lanes, window, rto, *queues)
        )
        for rank in range(workers)
    ]
    for p in senders:
        p.start()
    try:
        bound = dict(_get(ports, senders) for _ in range(workers))
        with fabric.ina_switch(cfg, run_dir) as switch:
            addrs = [(placements[r].bind_ip, bound[r]) for r in range(workers)]
            targets = switch.install(BENCH_JOB_ID, addrs, placements)
            return _drive(switch, targets, senders, seconds, plans, reports, lanes)
    except FabricError as exc:
        raise SwitchOnlyError(str(exc)) from exc
    finally:
        reap(senders)


def _drive(
    switch: Any,
    targets: Sequence[tuple[tuple[str, int], int]],
    senders: Sequence[BaseProcess],
    seconds: float,
    plans: Queue[dict[str, Any]],
    reports: Queue[Result],
    lanes: int,
) -> Result:
    """Start the senders together, read the counters over the interval, collect stats."""
    warmup = min(0.5, seconds / 4)  # let windows fill before counting
    go = time.monotonic() + 0.2
    start, end = go + warmup, go + warmup + seconds
    # Each sender takes one copy (any), and its own target from it by its rank.
    plan = {"targets": [[list(a), r] for a, r in targets], "go": go, "start": start, "end": end}
    for _ in senders:
        plans.put(plan)
    _sleep_until(start)
    c0, t0 = _totals(switch.counters()), time.monotonic()
    _sleep_until(end)
    c1, t1 = _totals(switch.counters()), time.monotonic()
    stats = [_get(reports, senders) for _ in senders]
    return _summarise(c0, c1, t1 - t0, stats, lanes, seconds)


def _totals(counters: dict[str, Any]) -> dict[str, int]:
    """One switch's counters, or (a fabric of several switches) their sums."""
    if all(isinstance(v, dict) for v in counters.values()):
        out: dict[str, int] = {}
        for per_switch in counters.values():
            for key, value in per_switch.items():
                out[key] = out.get(key, 0) + int(value)
        return out
    return {k: int(v) for k, v in counters.items()}


def _get(q: Queue[Any], senders: Sequence[BaseProcess]) -> Any:
    """Next item from a sender queue; SwitchOnlyError if a sender died or went silent."""
    return next_report(q, senders, SwitchOnlyError, "sender")


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _summarise(
    c0: dict[str, int], c1: dict[str, int], dt: float, stats: list[Result], lanes: int, secs: float
) -> Result:
    def delta(name: str) -> int:
        return c1.get(name, 0) - c0.get(name, 0)

    drops = sum(delta(k) for k in c1 if k.startswith("drop_"))
    goodput = [s["completed"] * lanes / secs for s in stats]
    out: Result = {
        "switch_seconds": dt,
        "switch_pps": delta("received") / dt,
        "switch_elements_per_s": delta("aggregated") * lanes / dt,
        "switch_results_per_s": delta("results_sent") / dt,
        "switch_drops": drops,
        "worker_goodput_elements_per_s": sum(goodput) / len(goodput),
        "worker_goodput_gbit_per_s": sum(goodput) / len(goodput) * 32 / 1e9,
        "worker_retransmits": sum(s["retransmits"] for s in stats),
        "worker_bad_results": sum(s["bad_results"] for s in stats),
    }
    if "cpu_ms" in c1:
        out["switch_cpu_fraction"] = delta("cpu_ms") / 1000 / dt
    return out


# --------------------------------------------------------------------- sender process
def _sender_main(
    rank: int,
    placement: Placement,
    workers: int,
    lanes: int,
    window: int,
    rto: float,
    ports: Queue[tuple[int, int]],
    plans: Queue[dict[str, Any]],
    reports: Queue[Result],
) -> None:
    """Entry point of one spawned sender: enter its host, bind, report the port, wait
    for the plan (where to send, as which rank), blast, report its statistics."""
    if placement.netns is not None:
        enter_netns(placement.netns)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER_BYTES)
        sock.bind((placement.bind_ip, 0))
        ports.put((rank, sock.getsockname()[1]))
        plan = plans.get(timeout=HANDSHAKE_SECONDS)
        (ip, port), rank_at_switch = plan["targets"][rank]
        sender = _Sender(sock, (ip, port), rank_at_switch, rank + 1, workers, lanes, window, rto)
        reports.put(sender.run(plan["go"], plan["start"], plan["end"]))


class _Sender:
    """One worker's window of slots: send, match results by (slot, seq), retransmit."""

    def __init__(
        self,
        sock: socket.socket,
        switch: tuple[str, int],
        rank: int,
        value: int,
        workers: int,
        lanes: int,
        window: int,
        rto: float,
    ) -> None:
        self.sock, self.switch, self.rto = sock, switch, rto
        self.packets = [data_packet(rank, slot, 0, lanes, value=value) for slot in range(window)]
        self.rounds = [0] * window  # finished rounds per slot
        self.sent_at = [0.0] * window
        self.expect = workers * (workers + 1) // 2
        self.stats = {"completed": 0, "sent": 0, "retransmits": 0, "bad_results": 0}
        self.stats["send_errors"] = 0
        self.sock.settimeout(rto / 4)

    def run(self, go: float, start: float, end: float) -> Result:
        """Blast until ``end``; count completions in ``[start, end)``."""
        _sleep_until(go)
        for slot in range(len(self.packets)):
            self._send(slot, 0)
        buf = bytearray(65536)  # any datagram fits; only RESULTs of our size count
        n_iter = 0
        while (now := time.monotonic()) < end:
            try:
                n = self.sock.recv_into(buf)
            except TimeoutError:
                n = 0
            if n >= HEADER_SIZE + 4 and self._on_result(buf) and now >= start:
                self.stats["completed"] += 1
            n_iter += 1
            if n == 0 or n_iter % 64 == 0:
                self._retransmit_overdue(now)
        return dict(self.stats)

    def _send(self, slot: int, flags: int) -> None:
        pkt, r = self.packets[slot], self.rounds[slot]
        pkt[_FLAGS_OFFSET] = flags
        _U16.pack_into(pkt, _POOL_OFFSET, make_pool_index(slot, r & 1))
        _U32.pack_into(pkt, _SEQ_OFFSET, use_seq(r, slot, len(self.rounds)))
        self.sent_at[slot] = time.monotonic()
        try:
            self.sock.sendto(pkt, self.switch)
            self.stats["sent"] += 1
        except OSError:
            # Like a loss on the wire: the retransmission timer recovers the slot.
            self.stats["send_errors"] += 1

    def _on_result(self, buf: bytearray) -> bool:
        """Advance the slot of a fresh RESULT; False for stale or duplicate ones."""
        vt, _f, _job, _rank, _exp, _lanes, pidx, _, seq = HEADER.unpack_from(buf)
        slot = pidx & SLOT_MASK
        window = len(self.rounds)
        if vt != _RESULT_VT or slot >= window or seq != use_seq(self.rounds[slot], slot, window):
            return False
        if int.from_bytes(buf[HEADER_SIZE : HEADER_SIZE + 4], "big", signed=True) != self.expect:
            self.stats["bad_results"] += 1
        self.rounds[slot] += 1
        self._send(slot, 0)
        return True

    def _retransmit_overdue(self, now: float) -> None:
        for slot, t in enumerate(self.sent_at):
            if now - t > self.rto:
                self.stats["retransmits"] += 1
                self._send(slot, FLAG_RESEND)
