"""How fast the soft switch's pipeline aggregates in-process, with no sockets.

:func:`measure_pipeline` runs ``Pipeline.process`` over one job of N workers: the ceiling
set by the per-packet Python logic (optionally under cProfile). It drives slots exactly
as workers do: round r of a slot uses set r % 2 and a packet number (seq) larger than the
slot's previous use, and every worker contributes once per round. The same packets
(:func:`data_packet`, :func:`use_seq`) load a real switch process in
:mod:`emulation.bench.switch_only`.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import struct
import time
from typing import Any

import numpy as np

from emulation.softswitch.pipeline import Addr, JobConfig, Pipeline
from hostlib.protocol import (
    MAX_LANES,
    MAX_WORKERS,
    SLOT_MASK,
    Header,
    PacketType,
    pack_header,
)

__all__ = [
    "BENCH_JOB_ID",
    "check_params",
    "data_packet",
    "measure_pipeline",
    "profile_pipeline",
    "use_seq",
]

Result = dict[str, Any]

BENCH_JOB_ID = 1
"""The job id of every switch-only benchmark."""
_HOST = "127.0.0.1"  # in-process addresses, never bound
_U32 = struct.Struct("!I")
_SEQ_OFFSET = 12  # the header's seq (protocol.py)


def check_params(workers: int, lanes: int, window: int, seconds: float) -> None:
    """Raises ValueError for a switch-only run's parameters out of range."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers {workers} outside 1..{MAX_WORKERS}")
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes {lanes} outside 1..{MAX_LANES}")
    if not 1 <= window <= SLOT_MASK + 1:
        raise ValueError(f"window {window} outside 1..{SLOT_MASK + 1}")
    if not seconds > 0:
        raise ValueError(f"seconds {seconds} must be positive")


# --------------------------------------------------------------------- (a) in-process
def data_packet(
    rank: int, slot: int, pool_set: int, lanes: int, seq: int = 0, *, value: int | None = None
) -> bytearray:
    """A valid DATA packet of rank ``rank`` whose lanes all hold ``value`` (default
    ``rank + 1``: the result's lanes are then N(N+1)/2)."""
    header = Header(PacketType.DATA, BENCH_JOB_ID, rank, slot, pool_set, seq, lanes, rank)
    payload = np.full(lanes, rank + 1 if value is None else value, dtype=">i4").tobytes()
    return bytearray(pack_header(header) + payload)


def _worker_addrs(workers: int) -> tuple[Addr, ...]:
    # In-process only: never bound, only matched against the job table.
    return tuple((_HOST, 40000 + rank) for rank in range(workers))


def use_seq(rnd: int, slot: int, window: int) -> int:
    """Packet number of a slot's use in round ``rnd``: from 1, growing with each use."""
    return (rnd * window + slot + 1) & 0xFFFFFFFF


def _round_packets(
    workers: int, lanes: int, window: int, pool_set: int
) -> list[list[tuple[bytearray, memoryview, Addr]]]:
    """One round's packets per slot, one per rank: (buffer, view of it, source)."""
    addrs = _worker_addrs(workers)
    rounds = []
    for slot in range(window):
        bufs = [data_packet(rank, slot, pool_set, lanes) for rank in range(workers)]
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
            seq = use_seq(r, slot, window)  # a new use must carry a newer packet number
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
