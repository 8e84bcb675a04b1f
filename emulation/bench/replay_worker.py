"""The worker side of ``inalab replay``: one process per rank, holding an INA, a ring and
a tree session, running each iteration's calls with the actions the coordinator sends.

A worker first enters its placement's network namespace, if any (an emulated host), as
a bench worker does, then talks to the coordinator (``replay.py``) over one
``multiprocessing`` pipe, in lock-step (one message per rank per phase):

* INA: worker -> ``("addr", (ip, port))``; coordinator -> ``("job", job_id, data_addr,
  wire_rank)``; then the ring's and the tree's exchange: worker -> ``("addr", ...)``;
  coordinator -> ``("peers", addrs)`` (a session of each on its own socket);
* per iteration: coordinator -> ``("iter", i, [(algorithm, lanes, window), ...])``, one
  action per call of the workload; worker -> ``("done", i, [(seconds, retransmits,
  wrong, max_abs_err), ...])``. One message each way per iteration, not per call, so
  the coordinator's pipes never pace the calls;
* coordinator -> ``("exit",)``; worker -> ``("result", retransmits)``, and it exits;
* on any exception: worker -> ``("error", traceback_text)`` and exit status 1.

Before an iteration's calls the ranks line up with an untimed one-element ring
allreduce, so a call's time is not the other ranks' lateness in reading the pipe. Then
the calls run back to back, each timed on its own; the results are checked after the
last one (outside the timed calls, as a training step would not stop between them).

A *competitor* (the ``competing-job`` scenario) holds an INA session of a second job on
the same switch: on ``("go",)`` it runs int32 allreduces of one size back to back until
``("pause",)``, then answers ``("paused", calls, seconds, wrong)``. Every allreduce
carries a stop flag in its last element: a rank that has the pause message adds 1, so
all ranks see the same sum and stop after the same call (a collective's ranks must make
the same calls), whichever rank read the message first.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from emulation.bench.workers import (
    Placement,
    count_wrong,
    enter_netns,
    expect,
    make_input,
    reference,
    setup_logging,
)
from hostlib.actions import Action
from hostlib.communicator import Communicator

__all__ = [
    "CallOutcome",
    "ReplayCall",
    "ReplayPlan",
    "check_result",
    "replay_worker_main",
]

log = logging.getLogger(__name__)

CallOutcome = tuple[float, int, int, float]
"""One rank's call: (seconds, retransmits, wrong elements, largest absolute error)."""

_ACTION = tuple[str, int, int]


@dataclass(frozen=True)
class ReplayCall:
    """One call as a rank runs it.

    Attributes:
        collective: ``allreduce``, ``reduce_scatter`` or ``all_gather``.
        count: the elements the rank passes (``all_gather``: its own part).
        dtype: ``float32`` or ``int32``.
    """

    collective: str
    count: int
    dtype: str


@dataclass(frozen=True)
class ReplayPlan:
    """Everything one replay worker needs; picklable for the ``spawn`` start method.

    Attributes:
        role: ``replay`` (INA, ring and tree sessions) or ``competitor`` (INA only).
        rank: this rank.
        num_workers: ranks of the job.
        calls: one iteration's calls (a competitor: its one allreduce).
        seed: seeds the inputs.
        lanes: the switch's lanes per INA packet (INA's quantization block).
        slots: the INA job's slots (INA actions' windows are at most this).
        peer_lanes: the ring's and tree's default packet width (the line-up call's).
        peer_window: their default window.
        timeout: seconds without progress before a call fails.
        log_path: this rank's log file.
        log_level: its level.
        placement: where the rank runs.
    """

    role: str
    rank: int
    num_workers: int
    calls: tuple[ReplayCall, ...]
    seed: int
    lanes: int
    slots: int
    peer_lanes: int
    peer_window: int
    timeout: float
    log_path: str | None = None
    log_level: int = logging.WARNING
    placement: Placement = field(default_factory=Placement)


# ----------------------------------------------------------------- checks
def check_result(
    call: ReplayCall,
    algorithm: str,
    result: np.ndarray,
    expected: tuple[np.ndarray, np.ndarray],
    rank: int,
    num_workers: int,
    lanes: int,
) -> tuple[int, float]:
    """Elements of ``result`` outside the tolerance, and the largest absolute error.

    ``expected`` is (the float64 sum, max over ranks of |x|) for a reduction, and (the
    concatenation of every rank's part, unused) for ``all_gather``, which must match
    exactly. A ``reduce_scatter`` result is rank ``rank``'s part of the sum, checked
    against the bound of the whole: INA's quantization blocks are the packets of the
    whole vector (:func:`~emulation.bench.workers.count_wrong`'s bounds otherwise).

    Raises:
        ValueError: a result of the wrong shape.
    """
    ref, absmax = expected
    if call.collective == "all_gather":
        if result.shape != ref.shape:
            raise ValueError(f"all_gather result shape {result.shape} != {ref.shape}")
        err = np.abs(result.astype(np.float64) - ref.astype(np.float64))
        return int(np.count_nonzero(err)), float(err.max()) if err.size else 0.0
    if call.collective == "allreduce":
        return count_wrong(algorithm, result, ref, absmax, num_workers, lanes)
    lo, hi = rank * ref.size // num_workers, (rank + 1) * ref.size // num_workers
    if result.shape != (hi - lo,):
        raise ValueError(f"reduce_scatter part shape {result.shape} != ({hi - lo},)")
    err = np.abs(result.astype(np.float64) - ref[lo:hi])
    max_err = float(err.max()) if err.size else 0.0
    if result.dtype.kind in "iu":
        return int(np.count_nonzero(err)), max_err
    if algorithm == "ina":
        from hostlib.quantize import error_bound

        bound = error_bound(absmax, num_workers, lanes, ref)[lo:hi]
    else:  # the ring's float32 summation bound, as count_wrong's
        bound = (num_workers - 1) * 2.0**-23 * num_workers * absmax[lo:hi]
    return int(np.count_nonzero(~(err <= bound))), max_err


class _Data:
    """Each call's input and expected result, built once per (collective, count, dtype):
    the inputs are a formula of (seed, rank, count), so equal calls share them."""

    def __init__(self, plan: ReplayPlan) -> None:
        self.plan = plan
        self._inputs: dict[tuple[int, str], np.ndarray] = {}
        self._expected: dict[tuple[str, int, str], tuple[np.ndarray, np.ndarray]] = {}

    def input(self, call: ReplayCall) -> np.ndarray:
        key = (call.count, call.dtype)
        if key not in self._inputs:
            self._inputs[key] = make_input(self.plan.seed, self.plan.rank, call.count, call.dtype)
        return self._inputs[key]

    def expected(self, call: ReplayCall) -> tuple[np.ndarray, np.ndarray]:
        gather = call.collective == "all_gather"
        key = ("gather" if gather else "sum", call.count, call.dtype)
        if key not in self._expected:
            n, seed = self.plan.num_workers, self.plan.seed
            if gather:
                parts = [make_input(seed, r, call.count, call.dtype) for r in range(n)]
                self._expected[key] = (np.concatenate(parts), np.zeros(0))
            else:
                self._expected[key] = reference(seed, n, call.count, call.dtype)
        return self._expected[key]


# ----------------------------------------------------------------- sessions
class _Sessions:
    """A rank's INA session (job installed by the coordinator) and its ring and tree
    sessions, each on its own UDP socket."""

    def __init__(self, plan: ReplayPlan, conn: Connection, peers: bool = True) -> None:
        self.plan = plan
        self.wire_rank = plan.rank
        self.ina: Any = None
        self.peers: dict[str, Any] = {}
        try:
            self.ina = self._join_ina(conn)
            for kind in ("ring", "tree") if peers else ():
                self.peers[kind] = self._join_peers(conn, kind)
        except BaseException:
            self.close()
            raise
        self.comm = Communicator(
            plan.rank, plan.num_workers, ina=self.ina, ring=self.peers.get("ring"),
            tree=self.peers.get("tree"),
        )  # fmt: skip

    def _join_ina(self, conn: Connection) -> Any:
        from hostlib import InaSession, JobSpec, RetryPolicy
        from hostlib.transport.udp import UdpTransport

        transport = UdpTransport(local=(self.plan.placement.bind_ip, 0))
        try:
            conn.send(("addr", tuple(transport.local_addr)))
            msg = expect(conn, "job")
            self.wire_rank = int(msg[3])
            plan = self.plan
            spec = JobSpec(job_id=msg[1], rank=self.wire_rank, num_workers=plan.num_workers,
                           switch=tuple(msg[2]), lanes=plan.lanes, slots=plan.slots)  # fmt: skip
            return InaSession(spec, transport, RetryPolicy(deadline=plan.timeout))
        except BaseException:
            transport.close()
            raise

    def _join_peers(self, conn: Connection, kind: str) -> Any:
        from hostlib import PeerSpec, RetryPolicy, RingAllreduce, TreeAllreduce
        from hostlib.transport.udp import UdpTransport

        make = {"ring": RingAllreduce, "tree": TreeAllreduce}[kind]
        transport = UdpTransport(local=(self.plan.placement.bind_ip, 0))
        try:
            conn.send(("addr", tuple(transport.local_addr)))
            addrs = tuple((str(a[0]), int(a[1])) for a in expect(conn, "peers")[1])
            spec = PeerSpec(self.plan.rank, addrs, lanes=self.plan.peer_lanes,
                            window=self.plan.peer_window)  # fmt: skip
            return make(spec, transport, RetryPolicy(deadline=self.plan.timeout))
        except BaseException:
            transport.close()
            raise

    @property
    def retransmits(self) -> int:
        return self.comm.retransmissions

    def run(self, call: ReplayCall, x: np.ndarray, action: _ACTION) -> np.ndarray:
        """One call with ``action``.

        Raises:
            ActionError: an algorithm that does not run the call's collective.
        """
        return np.asarray(self.comm.run(call.collective, x, Action(*action)))

    def line_up(self) -> None:
        """An untimed one-element ring allreduce: every rank has reached it."""
        self.peers["ring"].allreduce(np.zeros(1, dtype=np.int32))

    def close(self) -> None:
        errors = []
        for session in [*self.peers.values(), self.ina]:
            try:
                if session is not None:
                    session.close()
            except Exception as exc:  # close the others too, then report the first
                errors.append(exc)
        if errors:
            raise errors[0]


# ----------------------------------------------------------------- the process
def replay_worker_main(plan: ReplayPlan, conn: Connection) -> None:
    """Process entry point: join the sessions, run iterations until told to exit, report
    the traceback on failure."""
    setup_logging(plan.log_path, plan.log_level)
    try:
        if plan.placement.netns is not None:
            enter_netns(plan.placement.netns)
        if plan.role == "competitor":
            _compete(plan, conn)
        else:
            _replay(plan, conn)
    except BaseException:
        text = traceback.format_exc()
        log.error("rank %d failed:\n%s", plan.rank, text)
        with contextlib.suppress(OSError):  # the coordinator may be gone
            conn.send(("error", text))
        raise SystemExit(1) from None
    finally:
        conn.close()


def _serve(conn: Connection, sessions: _Sessions, answer: Callable[[Any], tuple[Any, ...]]) -> None:
    """Send ``answer(message)`` for each of the coordinator's messages until ``exit``, then
    this rank's retransmissions; close ``sessions`` however it ends."""
    try:
        while (msg := conn.recv()) != ("exit",):
            conn.send(answer(msg))
        conn.send(("result", sessions.retransmits))
    finally:
        sessions.close()


def _replay(plan: ReplayPlan, conn: Connection) -> None:
    sessions = _Sessions(plan, conn)
    data = _Data(plan)

    def answer(msg: Any) -> tuple[Any, ...]:
        if not isinstance(msg, tuple) or len(msg) != 3 or msg[0] != "iter":
            raise RuntimeError(f"coordinator sent {msg!r}, expected 'iter' or 'exit'")
        return ("done", msg[1], _iteration(plan, sessions, data, list(msg[2])))

    _serve(conn, sessions, answer)


def _iteration(
    plan: ReplayPlan, sessions: _Sessions, data: _Data, actions: list[_ACTION]
) -> list[CallOutcome]:
    """One iteration: line up, run every call timed, then check every result."""
    if len(actions) != len(plan.calls):
        raise ValueError(f"{len(actions)} actions for {len(plan.calls)} calls")
    sessions.line_up()
    results, timed = [], []
    for call, action in zip(plan.calls, actions, strict=True):
        x = data.input(call)
        resent = sessions.retransmits
        start = time.perf_counter()
        y = sessions.run(call, x, action)
        seconds = time.perf_counter() - start
        results.append(y)
        timed.append((seconds, sessions.retransmits - resent))
    out: list[CallOutcome] = []
    for call, action, y, (seconds, resent) in zip(plan.calls, actions, results, timed, strict=True):
        wrong, err = check_result(call, action[0], y, data.expected(call), plan.rank,
                                  plan.num_workers, plan.lanes)  # fmt: skip
        out.append((seconds, resent, wrong, err))
    return out


def _compete(plan: ReplayPlan, conn: Connection) -> None:
    """The competing job: allreduces back to back between ``go`` and ``pause``."""
    sessions = _Sessions(plan, conn, peers=False)
    call = plan.calls[0]
    x = make_input(plan.seed, plan.rank, call.count, "int32")
    ref, _ = reference(plan.seed, plan.num_workers, call.count, "int32")

    def answer(msg: Any) -> tuple[Any, ...]:
        if msg != ("go",):
            raise RuntimeError(f"coordinator sent {msg!r}, expected 'go' or 'exit'")
        return ("paused", *_compete_until_paused(sessions, conn, x, ref))

    _serve(conn, sessions, answer)


def _compete_until_paused(
    sessions: _Sessions, conn: Connection, x: np.ndarray, ref: np.ndarray
) -> tuple[int, float, int]:
    """Allreduces until some rank reads ``pause`` (the flag in the last element); then
    this rank's pause is consumed too. Returns (calls, seconds, wrong elements)."""
    calls, wrong, seen = 0, 0, False
    start = time.perf_counter()
    while True:
        if not seen and conn.poll():
            expect(conn, "pause")
            seen = True
        x[-1] = int(seen)
        y = np.asarray(sessions.ina.allreduce(x))
        calls += 1
        wrong += int(np.count_nonzero(y[:-1] != ref[:-1]))
        if y[-1] > 0:
            break
    if not seen:
        expect(conn, "pause")
    return calls, time.perf_counter() - start, wrong
