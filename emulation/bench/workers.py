"""The worker side of ``inalab bench``: one process per rank, INA, CollNet, ring, tree,
auto or Gloo.

A worker first enters its placement's network namespace, if any (an emulated host). It
talks to the coordinator (``sweep.py``) over one ``multiprocessing`` pipe, in strict
lock-step so the coordinator can read one message per rank per phase:

* INA and CollNet only: worker -> ``("addr", (ip, port))`` (a CollNet rank other than its
  host's head: ``("addr", None)``); coordinator -> ``("job", job_id, data_addr, rank)``:
  where to send and the rank the packets carry (``None``s for a CollNet non-head)
* ring and tree: worker -> ``("addr", (ip, port))``; coordinator -> ``("peers", addrs)``,
  every rank's address in rank order
* auto: INA's exchange, then ring's, then tree's (a session of each on its own socket)
* per size k: worker -> ``("barrier", k, result of size k-1 or None)``; coordinator ->
  ``("go",)``, or for auto ``("go", algorithm)``: what dynamiccl chose for this size (the
  same for every rank)
* at the end: worker -> ``("result", [SizeResult, ...])``
* on any exception: worker -> ``("error", traceback_text)`` and exit status 1.

Inputs are a vectorised formula of (seed, rank, index), so every rank rebuilds all ranks'
inputs and the float64 reference without any exchange. Torch is imported only by Gloo
workers; the others import only hostlib.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np

from hostlib.ina import RetryPolicy

__all__ = [
    "GLOO_ATOL_FRACTION",
    "GLOO_RTOL",
    "Placement",
    "SizeResult",
    "WorkerPlan",
    "count_wrong",
    "enter_netns",
    "expect",
    "make_input",
    "reference",
    "setup_logging",
    "worker_main",
]

log = logging.getLogger(__name__)

GLOO_RTOL = 1e-5
"""Relative tolerance for Gloo float32 sums: float32 adds in a rank-dependent order."""

GLOO_ATOL_FRACTION = 1e-6
"""Absolute tolerance for Gloo float32, as a fraction of max|reference| (cancellation)."""

_INT_RANGE = 1000
"""Inputs are integers in [-1000, 1000] (scaled for float32): a sum over MAX_WORKERS ranks
stays exact in int32 and float64, so int32 results must match exactly."""

_SCALE_BLOCK = 4096
"""float32 inputs change magnitude every 4096 elements (2**-4 .. 2**4), so INA's per-packet
block exponents differ across packets as they would for real gradients."""


@dataclass(frozen=True)
class Placement:
    """Where a rank runs: its network namespace, address and host.

    Attributes:
        netns: a network namespace to enter first (``/proc/PID/ns/net`` of an emulated
            host); ``None``: the coordinator's own.
        bind_ip: the address INA workers bind (and Gloo's peers reach).
        ifname: the interface Gloo uses (``GLOO_SOCKET_IFNAME``).
        host: index of the rank's host (CollNet groups the ranks of one host).
        local_rank: the rank's index on its host; 0 is the host's head rank.
    """

    netns: str | None = None
    bind_ip: str = "127.0.0.1"
    ifname: str = "lo"
    host: int = 0
    local_rank: int = 0


@dataclass(frozen=True)
class WorkerPlan:
    """Everything one worker needs; picklable for the ``spawn`` start method."""

    algo: str
    rank: int
    num_workers: int
    sizes: tuple[int, ...]
    dtype: str
    iters: int
    warmup: int
    seed: int
    lanes: int
    slots: int
    timeout: float
    gloo_init: str | None = None
    log_path: str | None = None
    log_level: int = logging.WARNING
    placement: Placement = field(default_factory=Placement)
    hosts: int = 1
    """collnet: hosts in the job (the INA job's workers are their head ranks)."""
    max_local: int = 1
    """collnet: the most ranks any one host has (for the float32 error bound)."""
    window: int | None = None
    """ring and tree: packets in flight per peer (``None``: ``slots``)."""
    collective: str = "allreduce"
    """What each call runs: ``allreduce``, ``reduce_scatter`` or ``all_gather`` (a size is
    the whole vector; each rank's part is ``1/num_workers`` of it)."""
    transport: str = "udp"
    """INA's: ``udp``, or ``rdma`` (an emulated RNIC, messages of ``msg_packets``)."""
    msg_packets: int = 1
    rdma_device: str | None = None
    """``rdma``: the verbs device to run on instead of an emulated RNIC."""
    cc_target: float = RetryPolicy.cc_target
    """INA's congestion target (:attr:`hostlib.ina.RetryPolicy.cc_target`)."""

    @property
    def p2p_window(self) -> int:
        return self.window if self.window is not None else self.slots

    def retry_policy(self) -> RetryPolicy:
        """The hosts' retry and congestion policy of this plan."""
        return RetryPolicy(deadline=self.timeout, cc_target=self.cc_target)


@dataclass(frozen=True)
class SizeResult:
    """One rank's measurement of one size."""

    nbytes: int
    count: int
    mean_us: float
    """Mean wall time per call over the timed calls."""
    wrong: int
    """Elements of the last result outside the tolerance."""
    max_abs_err: float
    retransmits: int = 0
    """Packets this rank sent again during this size's calls (0 for Gloo: TCP's own)."""
    ran: str = ""
    """The algorithm that ran (auto's choice; otherwise the plan's algorithm)."""
    cpu_s: float = 0.0
    """CPU seconds this rank's process used (all its threads) during the timed calls."""
    t_start: float = 0.0
    """``time.monotonic()`` when the timed calls began (0: not measured). The coordinator
    attributes the switches' and the machine's CPU samples to this interval: monotonic
    time is one clock across the machine's processes and network namespaces."""
    t_end: float = 0.0
    """``time.monotonic()`` when the timed calls ended."""
    fast_retransmits: int = 0
    """Of ``retransmits``, those sent because later packets were answered first."""
    host_drops: int = 0
    """Datagrams this rank's kernel dropped for its sockets (receive buffer full)."""
    late_answers: int = 0
    """Packets that reached this rank a second time: summed over ranks, retransmissions
    whose first copy was late rather than lost (``Communicator.late_answers``)."""
    late_timers: int = 0
    """Timers this rank served late and re-armed instead of retransmitting: it had
    not been running, nor (on one machine) had its peers (``Communicator.late_timers``)."""
    retransmits_timed: int = 0
    """Of ``retransmits``, those sent during the timed calls (after the warm-up)."""
    late_samples: int = 0
    """Round trips the INA estimator took from late answers (timeouts proved spurious)."""
    sent_bytes: int | None = None
    """Bytes per timed call out of this rank's host link (its interface's transmit
    counter), measured by a host's head rank in an emulated network; else ``None``."""


# ----------------------------------------------------------------- inputs and checks
def make_input(seed: int, rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input of ``count`` elements: deterministic, cheap, varied.

    Raises:
        ValueError: unknown dtype.
    """
    i = np.arange(count, dtype=np.int64)
    k = (i * 7919 + (rank + 1) * 104729 + (seed % 2003) * 15485863) % (2 * _INT_RANGE + 1)
    k -= _INT_RANGE
    if dtype == "int32":
        return k.astype(np.int32)
    if dtype == "float32":
        scale = np.exp2(((i // _SCALE_BLOCK) % 9) - 4.0) / _INT_RANGE
        return (k * scale).astype(np.float32)
    raise ValueError(f"unknown dtype {dtype!r}")


def reference(seed: int, num_workers: int, count: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The float64 sum over all ranks' inputs and the elementwise max over ranks of |x_r|."""
    total = np.zeros(count, dtype=np.float64)
    absmax = np.zeros(count, dtype=np.float64)
    for r in range(num_workers):
        x = make_input(seed, r, count, dtype).astype(np.float64)
        total += x
        np.maximum(absmax, np.abs(x), out=absmax)
    return total, absmax


def count_wrong(
    algo: str,
    result: np.ndarray,
    ref: np.ndarray,
    absmax: np.ndarray,
    num_workers: int,
    lanes: int,
    hosts: int = 1,
    max_local: int = 1,
) -> tuple[int, float]:
    """Elements of ``result`` outside the tolerance, and the largest absolute error.

    int32 must match exactly. float32 from INA must lie within
    ``hostlib.quantize.error_bound`` (the quantisation's own bound); from hostlib's ring
    or tree within float32 summation's ``(n-1) * 2**-24 * sum|x|`` (with ``n * max|x|``
    for ``sum|x|`` and a factor 2 for second-order terms); from Gloo within
    ``GLOO_RTOL * |ref| + GLOO_ATOL_FRACTION * max|ref|``.

    Raises:
        ValueError: ``result`` has the wrong shape.
    """
    if result.shape != ref.shape:
        raise ValueError(f"result shape {result.shape} != reference shape {ref.shape}")
    err = np.abs(result.astype(np.float64) - ref)
    max_err = float(err.max()) if err.size else 0.0
    if result.dtype.kind in "iu":
        return int(np.count_nonzero(err)), max_err
    if algo == "ina":
        from hostlib.quantize import error_bound

        bound = error_bound(absmax, num_workers, lanes, ref)
    elif algo == "collnet":
        from hostlib.quantize import error_bound

        # Each host's float32 sum of up to k inputs (|sum| <= k * absmax, rounding error
        # below k * 2**-24 * k * absmax) is what its head quantizes for INA over hosts.
        k = max_local
        bound = error_bound(k * absmax, hosts, lanes, ref) + k * k * 2.0**-23 * absmax
    elif algo in ("ring", "tree"):
        bound = (num_workers - 1) * 2.0**-23 * num_workers * absmax
    else:
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        bound = GLOO_RTOL * np.abs(ref) + GLOO_ATOL_FRACTION * scale
    return int(np.count_nonzero(~(err <= bound))), max_err


def check_result(plan: WorkerPlan, ran: str, y: np.ndarray, count: int) -> tuple[int, float]:
    """:func:`count_wrong` of rank ``plan.rank``'s result of ``plan.collective`` over a
    ``count``-element vector: the sum (allreduce), this rank's part of it (reduce-scatter),
    or every rank's input in rank order, which must arrive exactly (all-gather)."""
    n, rank = plan.num_workers, plan.rank
    if plan.collective == "all_gather":
        part = count // n
        ref = np.concatenate([make_input(plan.seed, r, part, plan.dtype) for r in range(n)])
        if y.shape != ref.shape:
            raise ValueError(f"result shape {y.shape} != reference shape {ref.shape}")
        err = np.abs(y.astype(np.float64) - ref.astype(np.float64))
        return int(np.count_nonzero(err)), float(err.max()) if err.size else 0.0
    total, absmax = reference(plan.seed, n, count, plan.dtype)
    if plan.collective == "reduce_scatter":
        # Judged inside the whole vector, the other parts being the reference itself:
        # INA's float32 bound depends on where a packet's block starts.
        lo, hi = rank * count // n, (rank + 1) * count // n
        if y.shape != (hi - lo,):
            raise ValueError(f"result shape {y.shape} != this rank's part ({hi - lo},)")
        whole = total.astype(y.dtype)
        whole[lo:hi] = y
        y = whole
    return count_wrong(ran, y, total, absmax, n, plan.lanes, plan.hosts, plan.max_local)


# ----------------------------------------------------------------- allreduce backends
class _Allreduce(Protocol):
    def prepare(self, x: np.ndarray) -> Callable[[], np.ndarray]:
        """A zero-argument out-of-place allreduce of ``x`` (one timed call)."""
        ...

    def close(self) -> None: ...

    @property
    def retransmits(self) -> int:
        """Retransmitted packets so far (0 where the transport retransmits itself)."""
        ...

    @property
    def fast_retransmits(self) -> int:
        """Of :attr:`retransmits`, those sent because later packets were answered first
        (the rest waited for a timer)."""
        ...

    @property
    def host_drops(self) -> int:
        """Datagrams the kernel dropped for this rank's sockets so far (receive buffer
        full; 0 where unknown or TCP)."""
        ...

    @property
    def late_answers(self) -> int:
        """Packets that reached this rank a second time so far (0 for TCP)."""
        ...

    @property
    def late_timers(self) -> int:
        """Timers served late and re-armed so far (0 for TCP)."""
        ...

    @property
    def late_samples(self) -> int:
        """Round trips taken from late answers so far (INA; 0 for the others)."""
        ...


def rdma_address(placement: Placement, rank: int) -> str:
    """The IPv4 of rank ``rank``'s emulated RNIC: its placement's address, or on loopback
    an address of its own (one RNIC is one address at UDP 4791): 127.0.x.y from 127.0.1.1."""
    if placement.bind_ip != "127.0.0.1":
        return placement.bind_ip
    return f"127.0.{1 + rank // 250}.{1 + rank % 250}"


def _join_ina_rdma(plan: WorkerPlan, conn: Connection, num_workers: int) -> Any:
    """As :func:`_join_ina`, over RDMA: the RNIC's address and reply endpoints to the
    coordinator, which installs the job's queue pairs and sends back the switch's, and
    whether its replies carry an ICRC to check (a P4 switch's do not)."""
    from emulation.bench.rdma_device import open_rdma_device
    from hostlib import InaSession, JobSpec
    from hostlib.protocol import LANE_BYTES, ROCE_UDP_PORT
    from hostlib.transport.rdma import RdmaTransport

    m, pmtu = plan.msg_packets, plan.lanes * LANE_BYTES
    nic = open_rdma_device(plan.rdma_device, plan.rank, rdma_address(plan.placement, plan.rank),
                           pmtu, m * pmtu)  # fmt: skip
    try:
        transport = RdmaTransport(nic, plan.slots // m, m, plan.lanes)
    except BaseException:
        nic.close()
        raise
    try:
        endpoints = [tuple(e) for e in transport.endpoints()]
        conn.send(("addr", (nic.address, ROCE_UDP_PORT), endpoints))
        msg = expect(conn, "job")
        switch = (str(msg[2][0]), ROCE_UDP_PORT)
        transport.connect_switch(switch[0], msg[4])
        if not msg[5] and hasattr(nic, "check_icrc"):
            # A P4 switch's replies carry ICRC 0 (docs/rdma.md); a verbs device's check is
            # the RNIC's own setting.
            nic.check_icrc = False
        spec = JobSpec(job_id=msg[1], rank=msg[3], num_workers=num_workers, switch=switch,
                       lanes=m * plan.lanes, slots=plan.slots // m)  # fmt: skip
        return InaSession(spec, transport, plan.retry_policy())
    except BaseException:
        transport.close()
        raise


def _join_ina(plan: WorkerPlan, conn: Connection, num_workers: int) -> Any:
    """This rank's INA session: its address to the coordinator, the job back (the
    switch, and the rank its packets carry there); one of ``num_workers`` contributions
    (the quantization's headroom)."""
    from hostlib import InaSession, JobSpec
    from hostlib.transport.udp import UdpTransport

    if plan.transport == "rdma":
        return _join_ina_rdma(plan, conn, num_workers)

    transport = UdpTransport(local=(plan.placement.bind_ip, 0))
    try:
        conn.send(("addr", tuple(transport.local_addr)))
        msg = expect(conn, "job")
        spec = JobSpec(job_id=msg[1], rank=msg[3], num_workers=num_workers,
                       switch=tuple(msg[2]), lanes=plan.lanes, slots=plan.slots)  # fmt: skip
        return InaSession(spec, transport, plan.retry_policy())
    except BaseException:
        transport.close()
        raise


def _join_peers(plan: WorkerPlan, conn: Connection, kind: str) -> Any:
    """This rank's ring or tree session, on a socket of its own, with INA's packet size
    (``lanes``) and the plan's ring window."""
    from hostlib import PeerSpec, RingAllreduce, TreeAllreduce
    from hostlib.transport.udp import UdpTransport

    make = {"ring": RingAllreduce, "tree": TreeAllreduce}[kind]
    transport = UdpTransport(local=(plan.placement.bind_ip, 0))
    try:
        conn.send(("addr", tuple(transport.local_addr)))
        addrs = tuple((str(a[0]), int(a[1])) for a in expect(conn, "peers")[1])
        spec = PeerSpec(plan.rank, addrs, lanes=plan.lanes, window=plan.p2p_window)
        return make(spec, transport, plan.retry_policy())
    except BaseException:
        transport.close()
        raise


_SESSIONS = {
    "ina": ("ina",),
    "collnet": ("collnet",),
    "ring": ("ring",),
    "tree": ("tree",),
    "auto": ("ina", "ring", "tree"),  # dynamiccl's choice per size, told by ("go", algo)
}
"""The sessions each of hostlib's bench algorithms joins, in the coordinator's order."""


class _HostAllreduce:
    """hostlib's algorithms through the rank's :class:`~hostlib.communicator.Communicator`:
    the sessions the plan's algorithm needs (INA through the switch; CollNet's host group
    with INA between the head ranks; ring and tree on sockets of their own), each call an
    :class:`~hostlib.actions.Action` of the chosen algorithm with the plan's lanes and
    window (INA's ``slots``, the ring's and tree's ``p2p_window``)."""

    def __init__(self, plan: WorkerPlan, conn: Connection, group: Any = None) -> None:
        from hostlib.collnet import CollNetAllreduce, ina_inter
        from hostlib.communicator import Communicator

        self._plan = plan
        self._collnet: Any = None
        sessions: dict[str, Any] = {}
        try:
            for kind in _SESSIONS[plan.algo]:
                if kind == "ina":
                    sessions["ina"] = _join_ina(plan, conn, plan.num_workers)
                elif kind == "collnet":
                    inter = None
                    if plan.placement.local_rank == 0:  # the host's head: INA between hosts
                        sessions["ina"] = _join_ina(plan, conn, plan.hosts)
                        inter = ina_inter(sessions["ina"])
                    else:
                        conn.send(("addr", None))
                        expect(conn, "job")
                    self._collnet = CollNetAllreduce(group, plan.placement.local_rank, inter)
                else:
                    sessions[kind] = _join_peers(plan, conn, kind)
        except BaseException:
            for session in sessions.values():
                session.close()
            raise
        self.comm = Communicator(plan.rank, plan.num_workers, collnet=self._collnet, **sessions)
        self.chosen = _SESSIONS[plan.algo][0]

    def select(self, algo: str) -> None:
        if algo not in _SESSIONS[self._plan.algo]:
            have = ", ".join(_SESSIONS[self._plan.algo])
            raise ValueError(f"{self._plan.algo} cannot run {algo!r} (it has {have})")
        self.chosen = algo

    def prepare(self, x: np.ndarray) -> Callable[[], np.ndarray]:
        from hostlib.actions import Action

        plan = self._plan
        window = plan.slots if self.chosen in ("ina", "collnet") else plan.p2p_window
        lanes = plan.lanes
        if self.chosen == "ina" and plan.transport == "rdma":  # the engine's unit: a message
            window, lanes = plan.slots // plan.msg_packets, lanes * plan.msg_packets
        action = Action(self.chosen, lanes, window)
        if plan.collective == "reduce_scatter":
            reduce_scatter = self.comm.reduce_scatter
            return lambda: np.asarray(reduce_scatter(x, action))
        if plan.collective == "all_gather":
            all_gather = self.comm.all_gather
            return lambda: np.asarray(all_gather(x, action))
        allreduce = self.comm.allreduce
        # One result buffer for all calls, as nccl-tests' recvbuff and Gloo's tensor:
        # a new array per call would time the kernel zeroing its pages.
        out = np.empty_like(x)
        return lambda: np.asarray(allreduce(x, action, out=out))

    @property
    def retransmits(self) -> int:
        return self.comm.retransmissions

    @property
    def fast_retransmits(self) -> int:
        return self.comm.fast_retransmissions

    @property
    def host_drops(self) -> int:
        return self.comm.host_drops

    @property
    def late_answers(self) -> int:
        return self.comm.late_answers

    @property
    def late_timers(self) -> int:
        return self.comm.late_timers

    @property
    def late_samples(self) -> int:
        return self.comm.late_samples

    def close(self) -> None:
        try:
            if self._collnet is not None:
                self._collnet.close()
        finally:
            self.comm.close()  # the p2p sessions answer late peers a moment first


class _GlooAllreduce:
    """torch.distributed's Gloo backend over loopback TCP."""

    def __init__(self, plan: WorkerPlan) -> None:
        # c10d warns on every connection it cannot reverse-resolve ("The hostname of the
        # client socket cannot be retrieved"), which is every one in an emulated host
        # without DNS; errors still print. A user's own setting wins.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        import torch
        import torch.distributed as dist

        # Gloo finds its address from the hostname, which resolves to loopback or, in an
        # emulated host, to the machine's own: name the placement's interface instead.
        os.environ["GLOO_SOCKET_IFNAME"] = plan.placement.ifname
        torch.set_num_threads(1)
        self._torch = torch
        self._dist = dist
        self._collective = plan.collective
        # Rendezvous waits for the slowest spawn (each imports torch), so it gets at least
        # a minute whatever the per-operation --timeout.
        dist.init_process_group(
            "gloo",
            init_method=plan.gloo_init,
            rank=plan.rank,
            world_size=plan.num_workers,
            timeout=timedelta(seconds=max(plan.timeout, 60.0)),
        )

    def prepare(self, x: np.ndarray) -> Callable[[], np.ndarray]:
        src = self._torch.from_numpy(x)
        n = self._dist.get_world_size()
        if self._collective == "reduce_scatter":
            part = self._torch.empty(src.numel() // n, dtype=src.dtype)
            reduce_scatter = self._dist.reduce_scatter_single
            return lambda: (reduce_scatter(part, src), part.numpy())[1]
        if self._collective == "all_gather":
            whole = self._torch.empty(src.numel() * n, dtype=src.dtype)
            all_gather = self._dist.all_gather_single
            return lambda: (all_gather(whole, src), whole.numpy())[1]
        buf = self._torch.empty_like(src)
        all_reduce = self._dist.all_reduce

        def call() -> np.ndarray:
            # all_reduce is in place; the copy makes it out of place like INA's.
            buf.copy_(src)
            all_reduce(buf)
            return buf.numpy()

        return call

    @property
    def retransmits(self) -> int:
        return 0  # TCP's own, invisible from here

    @property
    def fast_retransmits(self) -> int:
        return 0

    @property
    def host_drops(self) -> int:
        return 0  # TCP retransmits what the host drops

    @property
    def late_answers(self) -> int:
        return 0

    @property
    def late_timers(self) -> int:
        return 0

    @property
    def late_samples(self) -> int:
        return 0

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


# ----------------------------------------------------------------- the worker process
def worker_main(plan: WorkerPlan, conn: Connection, group: Any = None) -> None:
    """Process entry point: run the sweep, report results or the traceback, exit."""
    setup_logging(plan.log_path, plan.log_level)
    try:
        if plan.placement.netns is not None:
            enter_netns(plan.placement.netns)
        results = _run(plan, conn, group)
        conn.send(("result", results))
    except BaseException:
        text = traceback.format_exc()
        log.error("rank %d failed:\n%s", plan.rank, text)
        # If the coordinator is gone, the exit status still says we failed.
        with contextlib.suppress(OSError):
            conn.send(("error", text))
        raise SystemExit(1) from None
    finally:
        conn.close()


def _run(plan: WorkerPlan, conn: Connection, group: Any) -> list[SizeResult]:
    coll: _Allreduce
    if plan.algo in _SESSIONS:
        coll = _HostAllreduce(plan, conn, group)
    elif plan.algo == "gloo":
        coll = _GlooAllreduce(plan)
    else:
        raise ValueError(f"unknown algorithm {plan.algo!r}")
    try:
        done: list[SizeResult] = []
        for k, nbytes in enumerate(plan.sizes):
            done.append(_run_size(plan, conn, coll, k, nbytes, done[-1] if done else None))
        return done
    finally:
        coll.close()


def _run_size(
    plan: WorkerPlan,
    conn: Connection,
    coll: _Allreduce,
    k: int,
    nbytes: int,
    last: SizeResult | None = None,
) -> SizeResult:
    count = nbytes // np.dtype(plan.dtype).itemsize
    part = count // plan.num_workers  # a reduce-scatter's result, an all-gather's input
    if plan.collective == "all_gather":
        x = make_input(plan.seed, plan.rank, part, plan.dtype)
    else:
        x = make_input(plan.seed, plan.rank, count, plan.dtype)
    # The previous size's result rides on the barrier: a run stopped midway keeps it.
    conn.send(("barrier", k, last))
    go = expect(conn, "go")
    ran = plan.algo
    if plan.algo == "auto" and isinstance(coll, _HostAllreduce):
        coll.select(str(go[1]))
        ran = coll.chosen
    call = coll.prepare(x)
    resent, fast, drops = coll.retransmits, coll.fast_retransmits, coll.host_drops
    late, late_timers, late_samples = coll.late_answers, coll.late_timers, coll.late_samples
    for _ in range(plan.warmup):
        call()
    resent_warm = coll.retransmits
    link = _own_link(plan.placement)
    tx0 = None if link is None else link_tx_bytes(link)
    y, (elapsed, cpu_s, t_start, t_end) = _timed(call, plan.iters, x)
    sent = None if link is None or tx0 is None else (link_tx_bytes(link) - tx0) // plan.iters
    wrong, max_err = check_result(plan, ran, y, count)
    mean_us = elapsed / plan.iters * 1e6
    log.info("rank %d size %d (%s): %.1f us/call, %d wrong", plan.rank, nbytes, ran, mean_us, wrong)
    return SizeResult(
        nbytes, count, mean_us, wrong, max_err, coll.retransmits - resent, ran,
        cpu_s, t_start, t_end, coll.fast_retransmits - fast, coll.host_drops - drops,
        coll.late_answers - late, coll.late_timers - late_timers,
        coll.retransmits - resent_warm, coll.late_samples - late_samples, sent,
    )  # fmt: skip


def _own_link(placement: Placement) -> str | None:
    """The interface whose counters are this host's traffic: a host's head rank in its
    own namespace measures it; on loopback (no namespace) the link carries everyone's."""
    if placement.netns is None or placement.local_rank != 0:
        return None
    return placement.ifname


def link_tx_bytes(ifname: str) -> int:
    """The bytes ``ifname`` of this process's network namespace has sent
    (``/proc/net/dev``, which shows the reading process's namespace).

    Raises:
        KeyError: no such interface here.
    """
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == ifname:
                return int(counters.split()[8])  # rx: 8 fields, then tx bytes
    raise KeyError(f"no interface {ifname!r} in /proc/net/dev")


def _timed(
    call: Callable[[], np.ndarray], iters: int, x: np.ndarray
) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """Run ``call`` ``iters`` times back to back; the last result and (wall seconds, this
    process's CPU seconds, monotonic start, monotonic end). One clock for the time and the
    interval: on Linux ``monotonic`` reads the CLOCK_MONOTONIC that ``perf_counter`` does.

    The CPU clocks are read inside the wall interval and per thread (:func:`threads_cpu`):
    another thread of the rank (the p2p engine's, torch's) may take the GIL between two
    reads, and the process clock lags by up to a scheduler tick for a thread running on
    another core, so time spent before the interval surfaced inside it and made a rank's
    share over a few milliseconds exceed every core."""
    y = x
    start = time.monotonic()
    cpu0 = threads_cpu()
    for _ in range(iters):
        y = call()
    cpu1 = threads_cpu()
    end = time.monotonic()
    return y, (end - start, cpu_between(cpu0, cpu1), start, end)


def _thread_clock(tid: int) -> int:
    # MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) of linux/posix-timers.h: the clock that
    # pthread_getcpuclockid(3) returns, for any thread of this process.
    return ((~tid) << 3) | 6


@dataclass(frozen=True)
class ThreadsCpu:
    """CPU seconds of this process: the process clock and each live thread's own."""

    process: float
    """``time.process_time()``: every thread, the ended ones too; for a thread running
    on another core it lags by up to a scheduler tick."""
    threads: dict[int, float]
    """Thread id to its CPU seconds, exact at the read (the kernel adds the running
    thread's time since its last tick); empty where the per-thread clocks are not
    readable (not Linux)."""


def threads_cpu() -> ThreadsCpu:
    """This process's CPU clocks now (:class:`ThreadsCpu`)."""
    process = time.process_time()
    threads: dict[int, float] = {}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return ThreadsCpu(process, threads)
    for tid in tids:
        try:
            threads[tid] = time.clock_gettime(_thread_clock(tid))
        except OSError:
            continue  # ended since the listing: its time is in the process clock only
    return ThreadsCpu(process, threads)


def cpu_between(a: ThreadsCpu, b: ThreadsCpu) -> float:
    """CPU seconds this process used between two reads: the sum of each thread's own
    clock, exact, while every thread read at ``a`` was still there at ``b`` (a thread
    started between them counts whole); the lagging process clock otherwise, since an
    ended thread's time is only there."""
    if not a.threads or not b.threads or not a.threads.keys() <= b.threads.keys():
        return b.process - a.process
    return sum(b.threads.values()) - sum(a.threads.values())


_CLONE_NEWNET = 0x40000000


def enter_netns(path: str) -> None:
    """Move the calling thread into the network namespace at ``path`` (``setns(2)``).

    Called first in a worker process, before any thread or socket exists, so everything
    the process creates afterwards lives in that namespace (threads inherit it).

    Raises:
        OSError: the namespace cannot be opened or entered (not root, host gone).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def expect(conn: Connection, kind: str) -> tuple[Any, ...]:
    """The coordinator's next message, which must be a tuple starting with ``kind``.

    Raises:
        RuntimeError: the message is anything else.
    """
    msg = conn.recv()
    if not isinstance(msg, tuple) or not msg or msg[0] != kind:
        raise RuntimeError(f"coordinator sent {msg!r}, expected {kind!r}")
    return msg


def setup_logging(log_path: str | None, level: int) -> None:
    """Send this worker process's log records at ``level`` and above to ``log_path``
    (``None``: leave logging as it is)."""
    if log_path is None:
        return
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
