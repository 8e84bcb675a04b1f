"""Switch-only benchmark: how fast the soft switch aggregates, with no host library.

Two measurements of one job of N workers:

(a) :func:`measure_pipeline`: ``Pipeline.process`` in-process, no sockets: the ceiling
    set by the per-packet Python logic. Optionally under cProfile.
(b) :func:`measure_switch`: a real :class:`SoftSwitchProcess` and N sender processes on
    127.0.0.1. Each sender keeps ``window`` slots outstanding, reuses a slot (flipping its
    set) when the slot's RESULT arrives, and retransmits a slot not answered within
    ``rto`` so a lost datagram cannot stall it. Switch-side rates come from the switch's
    counters over the measured interval, worker-side goodput from the senders.

Both drive slots exactly as workers do: round r of a slot uses set r % 2 and a packet
number (seq) larger than the slot's previous use, and every worker contributes once per
round.
"""

from __future__ import annotations

import cProfile
import io
import multiprocessing
import os
import pstats
import queue
import socket
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import numpy as np

from controller.switch import WorkerAddress
from emulation.softswitch.pipeline import Addr, JobConfig, Pipeline
from emulation.softswitch.process import SoftSwitchProcess
from hostlib.protocol import (
    FLAG_RESEND,
    HEADER,
    HEADER_SIZE,
    LANES_PER_PACKET,
    MAX_LANES,
    MAX_WORKERS,
    PROTOCOL_VERSION,
    SLOT_MASK,
    Header,
    PacketType,
    make_pool_index,
    pack_header,
)

__all__ = ["measure_pipeline", "measure_switch", "run_switch_only"]

Result = dict[str, Any]

BENCH_JOB_ID = 1
_HOST = "127.0.0.1"  # the benchmark never leaves the machine
_RESULT_VT = (PROTOCOL_VERSION << 4) | PacketType.RESULT
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_POOL_OFFSET, _SEQ_OFFSET, _FLAGS_OFFSET = 8, 12, 1  # header byte offsets (protocol.py)
_SOCKET_BUFFER_BYTES = 4 << 20
_HANDSHAKE_SECONDS = 60.0  # spawning N interpreters that import numpy, on a loaded host


def run_switch_only(
    workers: int = 4,
    lanes: int = LANES_PER_PACKET,
    packets: int = 2_000_000,
    window: int = 64,
    seconds: float = 5.0,
    *,
    profile: bool = False,
    with_switch: bool = True,
    rto: float = 0.05,
    run_dir: Path | None = None,
) -> Result:
    """Run (a) and, unless ``with_switch`` is false, (b); return one dict of numbers.

    Args:
        workers: workers in the job.
        lanes: int32 lanes per packet.
        packets: most packets (a) processes (it also stops after ``seconds``).
        window: outstanding slots per worker (the job's slot count).
        seconds: length of each measured interval.
        profile: also run (a) under cProfile; the top functions go to ``"profile"``.
        with_switch: run (b), the real switch process.
        rto: (b) retransmission timeout of a sender, seconds.
        run_dir: where (b) keeps the switch log; a temporary directory if None.

    Raises:
        ValueError: a parameter out of range.
        SwitchStartError: the switch process did not start.
        RuntimeError: a sender failed or the pipeline's counters contradict the run.
    """
    _check_params(workers, lanes, window, seconds)
    result: Result = {"workers": workers, "lanes": lanes, "window": window}
    result.update(measure_pipeline(workers, lanes, window, packets, seconds))
    if profile:
        result["profile"] = profile_pipeline(workers, lanes, window, packets, seconds)
    if with_switch:
        result.update(measure_switch(workers, lanes, window, seconds, rto=rto, run_dir=run_dir))
    return result


def _check_params(workers: int, lanes: int, window: int, seconds: float) -> None:
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers {workers} outside 1..{MAX_WORKERS}")
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes {lanes} outside 1..{MAX_LANES}")
    if not 1 <= window <= SLOT_MASK + 1:
        raise ValueError(f"window {window} outside 1..{SLOT_MASK + 1}")
    if not seconds > 0:
        raise ValueError(f"seconds {seconds} must be positive")


# --------------------------------------------------------------------- (a) in-process
def _data_packet(rank: int, slot: int, pool_set: int, lanes: int, seq: int = 0) -> bytearray:
    """A valid DATA packet whose lanes all hold ``rank + 1`` (result lane: N(N+1)/2)."""
    header = Header(PacketType.DATA, BENCH_JOB_ID, rank, slot, pool_set, seq, lanes, rank)
    payload = np.full(lanes, rank + 1, dtype=">i4").tobytes()
    return bytearray(pack_header(header) + payload)


def _worker_addrs(workers: int) -> tuple[Addr, ...]:
    # In-process only: never bound, only matched against the job table.
    return tuple((_HOST, 40000 + rank) for rank in range(workers))


def _use_seq(rnd: int, slot: int, window: int) -> int:
    """Packet number of a slot's use in round ``rnd``: from 1, growing with each use."""
    return (rnd * window + slot + 1) & 0xFFFFFFFF


def _round_packets(
    workers: int, lanes: int, window: int, pool_set: int
) -> list[list[tuple[bytearray, memoryview, Addr]]]:
    """One round's packets per slot, one per rank: (buffer, view of it, source)."""
    addrs = _worker_addrs(workers)
    rounds = []
    for slot in range(window):
        bufs = [_data_packet(rank, slot, pool_set, lanes) for rank in range(workers)]
        rounds.append([(b, memoryview(b), addrs[rank]) for rank, b in enumerate(bufs)])
    return rounds


def measure_pipeline(workers: int, lanes: int, window: int, packets: int, seconds: float) -> Result:
    """(a): packets/s and aggregated elements/s of ``Pipeline.process`` alone.

    Raises:
        RuntimeError: the pipeline did not aggregate every packet (a pipeline bug).
    """
    pipe = Pipeline(lanes, slots=window)
    pipe.add_job(JobConfig(BENCH_JOB_ID, _worker_addrs(workers), window))
    rounds = [_round_packets(workers, lanes, window, s) for s in (0, 1)]
    process = pipe.process
    done = r = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for slot, group in enumerate(rounds[r & 1]):
            seq = _use_seq(r, slot, window)  # a new use must carry a newer packet number
            for buf, view, src in group:
                _U32.pack_into(buf, _SEQ_OFFSET, seq)
                process(view, src)
        done += workers * window
        r += 1
        if done >= packets or time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    c = pipe.counters()
    if c["aggregated"] != done or c["completed"] != r * window:
        raise RuntimeError(f"pipeline lost work: {done} packets, {r} rounds, counters {c}")
    return {
        "inproc_packets": done,
        "inproc_seconds": elapsed,
        "inproc_pps": done / elapsed,
        "inproc_elements_per_s": done * lanes / elapsed,
    }


def profile_pipeline(workers: int, lanes: int, window: int, packets: int, seconds: float) -> str:
    """(a) under cProfile; return the top 20 functions by own time as text."""
    prof = cProfile.Profile()
    prof.enable()
    try:
        measure_pipeline(workers, lanes, window, packets, seconds)
    finally:
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
    return out.getvalue()


# --------------------------------------------------------------------- (b) real switch
def measure_switch(
    workers: int,
    lanes: int,
    window: int,
    seconds: float,
    *,
    rto: float = 0.05,
    run_dir: Path | None = None,
) -> Result:
    """(b): a real switch process and ``workers`` sender processes on 127.0.0.1.

    Raises:
        SwitchStartError: the switch did not start.
        RuntimeError: a sender did not report in time.
    """
    ctx = multiprocessing.get_context("spawn")
    ports: Queue[tuple[int, int]] = ctx.Queue()
    plans: Queue[dict[str, Any]] = ctx.Queue()
    reports: Queue[Result] = ctx.Queue()
    args = (workers, lanes, window, rto, ports, plans, reports)
    senders = [ctx.Process(target=_sender_main, args=(rank, *args)) for rank in range(workers)]
    with _run_dir(run_dir) as d, SoftSwitchProcess(d, lanes=lanes, slots=window) as sw:
        for p in senders:
            p.start()
        try:
            return _drive(sw, senders, seconds, ports, plans, reports)
        finally:
            _reap(senders)


@contextmanager
def _run_dir(run_dir: Path | None) -> Iterator[Path]:
    if run_dir is not None:
        yield Path(run_dir)
        return
    with tempfile.TemporaryDirectory(prefix="inalab-loadgen-") as d:
        yield Path(d)


def _reap(senders: Sequence[BaseProcess]) -> None:
    """Join the sender processes; terminate (by their own handles) any still running."""
    for p in senders:
        p.join(timeout=5.0)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)


def _drive(
    sw: SoftSwitchProcess,
    senders: Sequence[BaseProcess],
    seconds: float,
    ports: Queue[tuple[int, int]],
    plans: Queue[dict[str, Any]],
    reports: Queue[Result],
) -> Result:
    """Register the senders as the job, start them, read counters over the interval."""
    workers = len(senders)
    bound = dict(_get(ports, senders) for _ in range(workers))
    addrs = [WorkerAddress(_HOST, bound[rank]) for rank in range(workers)]
    warmup = min(0.5, seconds / 4)  # let windows fill before counting
    go = time.monotonic() + 0.1
    start, end = go + warmup, go + warmup + seconds
    plan = {"switch": list(sw.data_addr), "go": go, "start": start, "end": end}
    with sw.controller() as ctl:
        ctl.add_job(BENCH_JOB_ID, addrs, sw.ready_info["slots"])
        for _ in range(workers):
            plans.put(plan)
        _sleep_until(start)
        c0, t0, cpu0 = ctl.counters(), time.monotonic(), _cpu_seconds(sw.pid)
        _sleep_until(end)
        c1, t1, cpu1 = ctl.counters(), time.monotonic(), _cpu_seconds(sw.pid)
    stats = [_get(reports, senders) for _ in range(workers)]
    result = _summarise(c0, c1, t1 - t0, stats, sw.ready_info["lanes"], seconds)
    # How busy the switch was: well under 1.0 means it was starved of CPU (or of load).
    result["switch_cpu_fraction"] = (cpu1 - cpu0) / (t1 - t0)
    return result


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` from /proc (Linux; 0.0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields 14 and 15 of proc(5) (utime, stime), counted after the ")" of comm.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(q: Queue[Any], senders: Sequence[BaseProcess]) -> Any:
    """Next item from a sender queue, or RuntimeError if a sender died or went silent."""
    deadline = time.monotonic() + _HANDSHAKE_SECONDS
    while time.monotonic() < deadline:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            pass  # look whether a sender died instead of waiting the whole deadline
        dead = [p.exitcode for p in senders if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"sender process failed with exit codes {dead}")
    raise RuntimeError(f"no sender report within {_HANDSHAKE_SECONDS}s")


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _summarise(
    c0: dict[str, int], c1: dict[str, int], dt: float, stats: list[Result], lanes: int, secs: float
) -> Result:
    def delta(name: str) -> int:
        return c1[name] - c0[name]

    drops = sum(delta(k) for k in c1 if k.startswith("drop_"))
    goodput = [s["completed"] * lanes / secs for s in stats]
    return {
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


# --------------------------------------------------------------------- sender process
def _sender_main(
    rank: int,
    workers: int,
    lanes: int,
    window: int,
    rto: float,
    ports: Queue[tuple[int, int]],
    plans: Queue[dict[str, Any]],
    reports: Queue[Result],
) -> None:
    """Entry point of one spawned sender: bind, report the port, blast, report stats."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER_BYTES)
        sock.bind((_HOST, 0))
        ports.put((rank, sock.getsockname()[1]))
        plan = plans.get(timeout=_HANDSHAKE_SECONDS)
        sender = _Sender(sock, tuple(plan["switch"]), rank, workers, lanes, window, rto)
        reports.put(sender.run(plan["go"], plan["start"], plan["end"]))


class _Sender:
    """One worker's window of slots: send, match results by (slot, seq), retransmit."""

    def __init__(
        self,
        sock: socket.socket,
        switch: Addr,
        rank: int,
        workers: int,
        lanes: int,
        window: int,
        rto: float,
    ) -> None:
        self.sock, self.switch, self.rto = sock, switch, rto
        self.packets = [_data_packet(rank, slot, 0, lanes) for slot in range(window)]
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
        _U32.pack_into(pkt, _SEQ_OFFSET, _use_seq(r, slot, len(self.rounds)))
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
        if vt != _RESULT_VT or slot >= window or seq != _use_seq(self.rounds[slot], slot, window):
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
