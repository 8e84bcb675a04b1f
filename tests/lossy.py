"""Point-to-point sessions in real processes over UDP on 127.0.0.1, with losses chosen by
rule: the end-of-call tests of ``hostlib.p2p`` need ranks that really stop reading their
socket between calls (a fake network's driver keeps every rank polling).

Each rank is a spawned process with a :class:`LossyUdpTransport`: a real UDP socket whose
``send`` and ``recv_into`` drop, duplicate or hold back datagrams as a :class:`Faults`
says. Between calls the ranks meet at a :class:`multiprocessing.Barrier` (as the bench's
coordinator does) after sleeping a little, so a rank that finished a call is busy
elsewhere while a peer may still wait for it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import random
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hostlib import InaSession, JobSpec, RetryPolicy
from hostlib.p2pwire import P2P_ACK, P2P_DATA, P2P_HEADER, PeerSpec
from hostlib.peers import PeerCollective, RingAllreduce, TreeAllreduce
from hostlib.transport.base import Addr
from hostlib.transport.udp import UdpTransport

__all__ = ["Faults", "LossyUdpTransport", "RankReport", "run_ranks"]

_KINDS: dict[str, type[PeerCollective]] = {"ring": RingAllreduce, "tree": TreeAllreduce}
OPERATIONS = ("allreduce", "reduce_scatter", "all_gather", "tree", "ina")
"""What a rank calls: ring allreduce and its halves, the tree's allreduce, or INA's
through a switch (:func:`run_ranks`' ``switch``)."""


@dataclass(frozen=True)
class InaJob:
    """Where INA ranks send, and the job the switch holds for them."""

    job_id: int
    switch: Addr
    lanes: int
    slots: int


@dataclass(frozen=True)
class Faults:
    """What a rank's transport does to datagrams (each rank seeds its own random).

    Attributes:
        final_ack: drop the first copy of the acknowledgement that answers a rank's
            last DATA packet to each peer in every call from the second on (the first
            call, lossless, counts the packets a call sends on each channel).
        final_data: drop the first copy of every call's last DATA packet to each peer
            (from the second call on).
        loss: drop probability of any datagram, each way.
        ack_loss: drop probability of acknowledgements only (received ones).
        duplicate: probability of sending a datagram twice.
        reorder: probability of holding a datagram back behind the next one sent.
    """

    final_ack: bool = False
    final_data: bool = False
    loss: float = 0.0
    ack_loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0


@dataclass
class FaultCounts:
    dropped_out: int = 0
    dropped_in: int = 0
    final_acks_dropped: int = 0
    final_data_dropped: int = 0
    duplicated: int = 0
    reordered: int = 0


class LossyUdpTransport(UdpTransport):
    """A :class:`UdpTransport` that applies :class:`Faults` to p2p datagrams (so the
    sessions' native cores drive their calls through it, not on the socket)."""

    native_io = False

    def __init__(self, faults: Faults, seed: int) -> None:
        super().__init__(("127.0.0.1", 0))
        self.faults = faults
        self.counts = FaultCounts()
        self._random = random.Random(seed)
        self._held: tuple[bytes, Addr] | None = None
        # Per (call, peer): the first DATA seq sent; per peer: DATA per call (call 1).
        self._first_seq: dict[tuple[int, int], int] = {}
        self._per_call: dict[int, int] = {}
        self._acks_dropped: set[tuple[int, int]] = set()
        self._data_dropped: set[tuple[int, int]] = set()

    def _last_seq(self, call: int, peer: int) -> int | None:
        first, count = self._first_seq.get((call, peer)), self._per_call.get(peer)
        return None if first is None or count is None else first + count - 1

    def _learn(self, dst: int, seq: int, call: int) -> None:
        self._first_seq.setdefault((call, dst), seq)
        if call == 1:
            self._per_call[dst] = seq - self._first_seq[(1, dst)] + 1

    def send(self, data: bytes | memoryview, dest: Addr) -> None:
        packet = bytes(data)
        vt, _f, _src, dst, seq, _aux, call, _n = P2P_HEADER.unpack_from(packet)
        f, rnd = self.faults, self._random.random
        if vt == P2P_DATA:
            self._learn(dst, seq, call)
            last = f.final_data and call > 1 and seq == self._last_seq(call, dst)
            if last and (call, dst) not in self._data_dropped:
                self._data_dropped.add((call, dst))
                self.counts.final_data_dropped += 1
                return
        if f.loss and rnd() < f.loss:
            self.counts.dropped_out += 1
            return
        copies = 2 if f.duplicate and rnd() < f.duplicate else 1
        self.counts.duplicated += copies - 1
        for _ in range(copies):
            if f.reorder and self._held is None and rnd() < f.reorder:
                self._held = (packet, dest)
                self.counts.reordered += 1
                continue
            super().send(packet, dest)
            if self._held is not None:
                held, self._held = self._held, None
                super().send(*held)

    def recv_into(self, buf: bytearray | memoryview, timeout: float) -> tuple[int, Addr | None]:
        deadline = time.perf_counter() + timeout
        while True:
            n, src = super().recv_into(buf, max(deadline - time.perf_counter(), 0.0))
            if not n or not self._drop_in(bytes(buf[: min(n, P2P_HEADER.size)])):
                return n, src
            if time.perf_counter() >= deadline:
                return 0, None

    def _drop_in(self, header: bytes) -> bool:
        if len(header) < P2P_HEADER.size:
            return False
        vt, _f, src, _dst, seq, _aux, call, _n = P2P_HEADER.unpack(header)
        f, rnd = self.faults, self._random.random
        final = vt == P2P_ACK and f.final_ack and call > 1 and seq == self._last_seq(call, src)
        if final and (call, src) not in self._acks_dropped:
            self._acks_dropped.add((call, src))
            self.counts.final_acks_dropped += 1
            return True
        lost = (f.loss and rnd() < f.loss) or (vt == P2P_ACK and f.ack_loss and rnd() < f.ack_loss)
        self.counts.dropped_in += bool(lost)
        return bool(lost)


@dataclass
class RankReport:
    """What a rank sends back: its results, or the error that ended it."""

    rank: int
    results: list[np.ndarray] = field(default_factory=list)
    error: str | None = None
    counts: FaultCounts | None = None
    retransmitted: int = 0
    fast_retransmitted: int = 0
    late_answered: int = 0
    late_answers: int = 0
    seconds: float = 0.0


def _call(session: PeerCollective | InaSession, operation: str, x: np.ndarray) -> np.ndarray:
    if operation == "reduce_scatter":
        return np.asarray(session.reduce_scatter(x))  # type: ignore[attr-defined]
    if operation == "all_gather":
        return np.asarray(session.all_gather(x))  # type: ignore[attr-defined]
    return np.asarray(session.allreduce(x))


def _rank_main(
    rank: int,
    n: int,
    operation: str,
    inputs: list[np.ndarray],
    faults: Faults,
    policy: RetryPolicy,
    lanes: int,
    window: int,
    pause: float,
    conn: multiprocessing.connection.Connection,
    barrier: Any,
) -> None:
    report = RankReport(rank)
    transport = LossyUdpTransport(faults, seed=1000 + rank)
    conn.send(transport.local_addr)
    addrs, job = conn.recv()
    session: PeerCollective | InaSession
    if job is not None:
        spec = JobSpec(job.job_id, rank, n, job.switch, job.lanes, job.slots)
        session = InaSession(spec, transport, policy)
    else:
        kind = "tree" if operation == "tree" else "ring"
        session = _KINDS[kind](PeerSpec(rank, tuple(addrs), lanes, window), transport, policy)
    start = time.perf_counter()
    try:
        for x in inputs:
            report.results.append(_call(session, operation, x))
            # Busy elsewhere, then a barrier that needs every rank: a rank still
            # waiting for an ack of this call holds everyone here.
            time.sleep(pause * (rank % 2))
            barrier.wait(timeout=policy.deadline + 5.0)
    except Exception as exc:  # reported to the test, which fails with it
        report.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
    report.seconds = time.perf_counter() - start
    if isinstance(session, InaSession):
        report.retransmitted = session.retransmissions
        report.fast_retransmitted = session.fast_retransmissions
    else:
        stats = session.endpoint.stats
        report.retransmitted = stats.retransmitted
        report.fast_retransmitted = getattr(stats, "fast_retransmitted", 0)  # older hostlib
        report.late_answered = getattr(stats, "late_answered", 0)
    report.late_answers = session.late_answers
    report.counts = transport.counts
    if report.error is not None:
        barrier.abort()  # the others stop waiting at once
    if isinstance(session, InaSession):
        session.close()
    else:
        session.close(linger=0.2)
    conn.send(report)


def run_ranks(
    operation: str,
    inputs: Sequence[Sequence[np.ndarray]],
    faults: Faults,
    policy: RetryPolicy,
    *,
    lanes: int = 64,
    window: int = 8,
    pause: float = 0.05,
    timeout: float = 120.0,
    install: Callable[[list[Addr]], InaJob] | None = None,
) -> list[RankReport]:
    """Run ``inputs[call][rank]`` through ``operation`` on one process per rank;
    ``"ina"`` calls ``install(every rank's address)`` for the switch's job first.

    Returns:
        Every rank's report, in rank order.

    Raises:
        TimeoutError: a rank sent nothing back within ``timeout`` (it is killed).
    """
    ctx = multiprocessing.get_context("spawn")
    n = len(inputs[0])
    barrier = ctx.Barrier(n)
    pipes = [ctx.Pipe() for _ in range(n)]
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                r, n, operation, [call[r] for call in inputs], faults, policy, lanes,
                window, pause, pipes[r][1], barrier,
            ),
            daemon=True,
        )
        for r in range(n)
    ]
    for p in procs:
        p.start()
    try:
        addrs = [conn.recv() for conn, _ in pipes]
        job = install(addrs) if install is not None else None
        for conn, _ in pipes:
            conn.send((addrs, job))
        reports = []
        end = time.monotonic() + timeout
        for r, (conn, _) in enumerate(pipes):
            if not conn.poll(max(end - time.monotonic(), 0.0)):
                raise TimeoutError(f"rank {r} sent no report within {timeout} s")
            reports.append(conn.recv())
        return reports
    finally:
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join()
