"""The binding of the native INA core (``hostlib/_inacore.c``), and the choice of engine.

Layer: hostlib, beside ``hostlib.ina``. :class:`NativeInaAllreduce` is one worker's call
with the interface of :class:`~hostlib.ina.InaAllreduce` (``start``, ``on_datagram``,
``on_timer``, ``next_wakeup``, ``done``, ``result``, ``commit``), so the fake network
drives either engine and a differential test holds the native one to the Python one: the
same packets for the same events, bit-identical results. :meth:`NativeInaAllreduce.run`
is the production path: the whole call on the session's connected UDP socket in C, the
GIL released, batched ``recvmmsg``/``sendmmsg``, results written into the output as they
arrive. :class:`NativeP2pEndpoint` and :class:`NativeCollectiveCall` bind the p2p core
(``hostlib/_p2pcore.c``) the same way, against the wire of ``hostlib.p2pwire`` and not
``hostlib.p2p`` (the Python engine), so ``hostlib.peers`` picks either p2p engine.
:func:`emulated_rnic` picks the emulated RNIC the same way: the native one
(:mod:`hostlib.transport.rnic_native`, ``hostlib/_rnicore.c``) or the Python one.

Which engine a session uses: ``INALAB_HOST_ENGINE=native|python``; unset, the native one
when it was built (``pip install`` compiles it with the system's C compiler; a failed
build is not an error) and Python otherwise, with one warning per process. The Python
engine stays the specification.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from hostlib import protocol
from hostlib.errors import P2pError, P2pTimeoutError
from hostlib.ina import (
    SEQ_MODULUS,
    InaError,
    InaTimeoutError,
    JobSpec,
    RetryPolicy,
    _Rtt,
    _Stats,
    check_call_data,
    check_window,
    commit_uses,
    out_buffer,
    timeout_message,
)
from hostlib.p2pwire import (
    FLAG_DUPLICATE,
    FLAG_EARLY,
    P2P_ACK,
    P2P_DATA,
    P2P_HEADER,
    call_knobs,
    stall_message,
)
from hostlib.transport.rnic import EmulatedRnic
from hostlib.transport.rnic_native import NativeRnic, rnic_core_unavailable

__all__ = [
    "ENGINES",
    "ENGINE_ENV",
    "NativeInaAllreduce",
    "emulated_rnic",
    "engine_name",
    "native_rnic_unavailable",
    "native_unavailable",
]

log = logging.getLogger(__name__)

ENGINE_ENV = "INALAB_HOST_ENGINE"
"""Environment variable choosing the host engine: ``native`` or ``python``."""
ENGINES = ("native", "python")


class _CoreTimeout(Exception):
    """What the C core raises on its deadline: ``(seconds without progress, indices)``."""


def _load() -> tuple[Any, str | None]:
    try:
        from hostlib import _inacore
    except ImportError as exc:
        return None, f"the native core was not built ({exc})"
    wire = {
        "PROTOCOL_VERSION": protocol.PROTOCOL_VERSION,
        "DATA": int(protocol.PacketType.DATA),
        "RESULT": int(protocol.PacketType.RESULT),
        "HEADER_SIZE": protocol.HEADER_SIZE,
        "FLAG_RESEND": protocol.FLAG_RESEND,
        "POOL_SET_BIT": protocol.POOL_SET_BIT,
        "EXPONENT_MIN": protocol.EXPONENT_MIN,
        "EXPONENT_MAX": protocol.EXPONENT_MAX,
        "MAX_LANES": protocol.MAX_LANES,
        "SEQ_MODULUS": SEQ_MODULUS,
    }
    if wire != _inacore.PROTOCOL:
        return None, f"the native core's protocol {_inacore.PROTOCOL} is not {wire}"
    _inacore.set_timeout_error(_CoreTimeout)
    return _inacore, None


_core, _why_not = _load()
_warned = False


def native_unavailable() -> str | None:
    """Why the native engine cannot run here, or ``None`` when it can."""
    return _why_not


GSO_ENV = "INALAB_UDP_GSO"


def udp_gso(environ: dict[str, str] | None = None) -> bool:
    """Whether the native p2p core sends runs of datagrams to one peer as one UDP GSO
    send (``INALAB_UDP_GSO``: 1, the default, or 0).

    The datagrams on the wire are the same: the kernel, or a NIC with UDP segmentation
    offload, cuts the send into them before they leave the host. Only a software switch
    reading frames off a virtual link whose sender still offloads segmentation would see
    one large frame; the emulation turns that offload off on its hosts for such switches.

    Raises:
        ValueError: a value other than 0 or 1.
    """
    env = os.environ if environ is None else environ
    value = env.get(GSO_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{GSO_ENV}={value!r}: 1 (on) or 0 (off)")
    return value == "1"


def engine_name(environ: dict[str, str] | None = None) -> str:
    """The engine a new session uses: ``INALAB_HOST_ENGINE``, else the native one when
    it was built (else Python, with one warning per process).

    Raises:
        ValueError: an unknown engine name, or ``native`` asked for where it was not built.
    """
    global _warned
    env = os.environ if environ is None else environ
    name = env.get(ENGINE_ENV, "").strip().lower()
    if name and name not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={name!r}: choose one of {', '.join(ENGINES)}")
    if name == "native" and _why_not is not None:
        raise ValueError(f"{ENGINE_ENV}=native: {_why_not}")
    if name:
        return name
    if _why_not is None:
        return "native"
    if not _warned:
        _warned = True
        log.warning("host engine: Python (%s); INA calls cost more CPU per packet", _why_not)
    return "python"


def native_rnic_unavailable() -> str | None:
    """Why the native emulated RNIC (``hostlib/_rnicore.c``) cannot run here, or ``None``."""
    return rnic_core_unavailable()


_rnic_warned = False


def emulated_rnic(
    address: str, pmtu: int = 256, seed: int | None = None, *, engine: str | None = None
) -> EmulatedRnic | NativeRnic:
    """An emulated RNIC on ``address`` for the host engine: :class:`NativeRnic` (per-packet
    work in C) unless the engine is Python (``engine``, else ``INALAB_HOST_ENGINE``) or
    its core was not built (then :class:`EmulatedRnic`, with one warning per process).

    Raises:
        ValueError: an unknown engine, ``native`` asked for where it was not built, or a
            path MTU that is not an RDMA MTU.
        TransportError: the address's UDP port 4791 cannot be bound.
    """
    global _rnic_warned
    name = engine_name({ENGINE_ENV: engine} if engine else None)
    why = rnic_core_unavailable()
    if name == "native" and why is not None:
        if engine == "native":
            raise ValueError(f"native RNIC: {why}")
        if not _rnic_warned:
            _rnic_warned = True
            log.warning("emulated RNIC: Python (%s); each packet costs more CPU", why)
        name = "python"
    if name == "native":
        return NativeRnic(address, pmtu, seed)
    return EmulatedRnic(address, pmtu, seed)


class NativeInaAllreduce:
    """One worker's INA allreduce call on the native core: the arguments, errors and
    interface of :class:`~hostlib.ina.InaAllreduce`. ``stream_min_bytes``: results go to
    ``out`` with non-temporal stores (past the caches) when it is at least this
    large, not the input's memory, and the CPU has AVX2 (default: the core's 16 MiB, where
    that measured faster; negative: never); the tests lower it to run that path on small
    calls. ``batch_results``: while a whole window is in flight, :meth:`run` sleeps for
    about this many results before it receives them in one batch, so that one wake-up
    serves several (default: the core's 4, cut to half the window; 0: never). It changes
    when results are taken, never which packets are sent for them.

    Raises:
        TypeError: data is not float32/int32.
        ValueError: data is not 1-D or contiguous, holds NaN/infinity (float32), or the
            window is outside ``1..spec.slots``; or the native core is not built.
    """

    def __init__(
        self,
        spec: JobSpec,
        data: np.ndarray,
        uses: np.ndarray,
        policy: RetryPolicy,
        rtt: _Rtt | None = None,
        first_seq: int = 1,
        *,
        window: int | None = None,
        out: np.ndarray | None = None,
        stream_min_bytes: int | None = None,
        batch_results: int | None = None,
        flagged: bool = True,
    ) -> None:
        if _core is None:
            raise ValueError(f"native INA engine: {_why_not}")
        check_call_data(data, first_seq)
        if uses.dtype != np.int64 or not uses.flags.c_contiguous:
            raise ValueError("uses must be a contiguous int64 array")
        slots = check_window(window, spec.slots)
        self.spec, self.policy, self.uses = spec, policy, uses
        self.first_seq = first_seq
        self.rtt = rtt or _Rtt(policy.timeout)
        self.count = data.size
        self.stats = _Stats()
        self._data = np.ascontiguousarray(data)  # the core reads it in place
        # Results are written where they arrive: into ``out`` when given (the caller's
        # memory, which may be ``data`` itself: a block's data is read only until its
        # result arrives, and a retransmission sends the slot's built packet).
        if out is None:
            self._out = np.empty(data.size, dtype=self._data.dtype)
        else:
            self._out = out_buffer(out, self._data)
        cc = self.rtt.cc
        self._core = _core.InaCore(
            spec.job_id, spec.rank, spec.num_workers, spec.lanes, slots, self._data,
            self._out, uses, first_seq, self.rtt.rto, self.rtt.srtt, self.rtt.rttvar,
            self.rtt.samples, policy.min_timeout, policy.max_timeout, policy.backoff,
            policy.deadline, policy.late_timer, stall_check=policy.stall_check,
            first_timeout=policy.timeout, cwnd=cc.cwnd, base_rtt=cc.base_rtt,
            round_start=cc.round_start, round_min=cc.round_min,
            round_samples=cc.round_samples, cuts=cc.cuts,
            cc_target=policy.cc_target, cc_beta=policy.cc_beta, cc_max_cut=policy.cc_max_cut,
            flagged=flagged,
            **({} if stream_min_bytes is None else {"stream_min_bytes": stream_min_bytes}),
            **({} if batch_results is None else {"batch_results": batch_results}),
        )  # fmt: skip
        state = self._core.state
        self.window: int = state["window"]
        self.npackets: int = state["npackets"]
        self.nblocks: int = state["nblocks"]
        self.streams: bool = state["stream"]
        """Whether the results go to ``out`` past the caches (``stream_min_bytes``)."""
        self.naps = 0
        """:meth:`run`'s sleeps before a receive (``batch_results``)."""
        self.receives = 0
        """:meth:`run`'s receive calls that returned datagrams."""
        self.received = 0
        """The datagrams they returned: ``received / receives`` per wake-up."""

    # ------------------------------------------------------------------ events
    @property
    def done(self) -> bool:
        return bool(self._core.done)

    def start(self, now: float) -> list[bytes]:
        """The first window of packets to send."""
        return self._sync(self._core.start(now))

    def on_datagram(self, data: memoryview | bytes, now: float) -> bytes | None:
        """Take one received datagram; return the next packet to send, if any."""
        return self._sync(self._core.on_datagram(data, now))

    def on_timer(self, now: float) -> list[bytes]:
        """Packets to send again at ``now`` (fast retransmissions, then expired timers).

        Raises:
            InaTimeoutError: no new result for longer than the policy's deadline.
        """
        try:
            return self._sync(self._core.on_timer(now))
        except _CoreTimeout as exc:
            raise InaTimeoutError(self._timeout_message(*exc.args)) from None

    def next_wakeup(self) -> float:
        return float(self._core.next_wakeup())

    def run(self, fd: int) -> None:
        """The whole call on a UDP socket connected to the switch (``fd``), in C with the
        GIL released; a signal's exception (KeyboardInterrupt) ends it within 0.1 s.

        Raises:
            InaTimeoutError: no new result for longer than the policy's deadline.
            OSError: the socket failed.
        """
        try:
            self._core.run(fd)
        except _CoreTimeout as exc:
            raise InaTimeoutError(self._timeout_message(*exc.args)) from None
        finally:
            self._sync(None)

    def _sync(self, value: Any) -> Any:
        """Copy the core's counters, RTT estimate and congestion window out (the
        session's are shared across its calls, as the Python engine's are)."""
        s = self._core.state
        self.rtt.rto, self.rtt.srtt, self.rtt.rttvar = s["rto"], s["srtt"], s["rttvar"]
        self.rtt.samples = s["samples"]
        cc = self.rtt.cc
        cc.cwnd, cc.base_rtt, cc.cuts = s["cwnd"], s["base_rtt"], s["cuts"]
        cc.round_start, cc.round_min = s["round_start"], s["round_min"]
        cc.round_samples = s["round_samples"]
        st = self.stats
        st.sent, st.retransmitted = s["sent"], s["retransmitted"]
        st.fast_retransmitted, st.stale, st.foreign = (
            s["fast_retransmitted"], s["stale"], s["foreign"],
        )  # fmt: skip
        st.late_timers, st.late_samples = s["late_timers"], s["late_samples"]
        self.naps, self.receives, self.received = s["naps"], s["receives"], s["received"]
        return value

    def _timeout_message(self, seconds: float, waiting: list[int]) -> str:
        state = self._core.state  # not yet synced into self.stats when run() times out
        return timeout_message(
            self.spec, self.policy, seconds, state["done"], self.npackets, waiting,
            state["retransmitted"],
        )  # fmt: skip

    # ------------------------------------------------------------------ result
    def result(self) -> np.ndarray:
        """The reduced array (the input's dtype and size).

        Raises:
            InaError: the call has not completed.
        """
        if not self.done:
            raise InaError("allreduce has not completed")
        return self._out

    @property
    def next_seq(self) -> int:
        """Packet number of the first packet of the session's next call."""
        return (self.first_seq - 1 + self.npackets) % SEQ_MODULUS + 1

    def commit(self) -> None:
        """Advance the session's per-slot use counts past this completed call."""
        if not self.done:
            raise InaError("allreduce has not completed")
        commit_uses(self.uses, self.window, self.npackets)


# ----------------------------------------------------------------- the p2p core
def _load_p2p() -> tuple[Any, str | None]:
    try:
        from hostlib import _p2pcore
    except ImportError as exc:
        return None, f"the native p2p core was not built ({exc})"
    wire = {
        "P2P_DATA": P2P_DATA,
        "P2P_ACK": P2P_ACK,
        "HEADER": P2P_HEADER.size,
        "FLAG_RESEND": protocol.FLAG_RESEND,
        "FLAG_DUPLICATE": FLAG_DUPLICATE,
        "FLAG_EARLY": FLAG_EARLY,
        "MAX_LANES": protocol.MAX_LANES,
    }
    if wire != _p2pcore.PROTOCOL:
        return None, f"the native p2p core's protocol {_p2pcore.PROTOCOL} is not {wire}"
    _p2pcore.set_errors(P2pError, _CoreTimeout)
    return _p2pcore, None


_p2p_loaded: tuple[Any, str | None] | None = None


def _p2p_core() -> tuple[Any, str | None]:
    """The p2p core and why not, loaded at first use (a worker that runs no p2p session
    never loads it)."""
    global _p2p_loaded
    if _p2p_loaded is None:
        _p2p_loaded = _load_p2p()
    return _p2p_loaded


def native_p2p_unavailable() -> str | None:
    """Why the native point-to-point core cannot run here, or ``None`` when it can."""
    return _p2p_core()[1]


@dataclass
class _NativeP2pStats:
    sent: int = 0
    retransmitted: int = 0
    fast_retransmitted: int = 0
    duplicates: int = 0
    foreign: int = 0
    late_answered: int = 0
    spurious: int = 0
    late_timers: int = 0


class NativeP2pEndpoint:
    """One worker's reliable channels on the native core: the interface of
    :class:`~hostlib.p2p.P2pEndpoint` that calls, sessions and their responder use.

    Raises:
        ValueError: the native p2p core is not built, or a spec it cannot take.
    """

    def __init__(self, spec: Any, policy: RetryPolicy | None = None) -> None:
        core, why_not = _p2p_core()
        if core is None:
            raise ValueError(f"native p2p engine: {why_not}")
        self.spec = spec
        self.policy = policy or RetryPolicy()
        p = self.policy
        self.core = core.Endpoint(
            spec.rank, list(spec.addrs), spec.lanes, spec.window, p.timeout, p.min_timeout,
            p.max_timeout, p.backoff, p.deadline, gso=udp_gso(), late_timer=p.late_timer,
            stall_check=p.stall_check,
        )  # fmt: skip
        self.stats = _NativeP2pStats()
        self.rtt = _Rtt(p.timeout)
        self._driver_counts = {"foreign": 0, "late_answered": 0}
        self._sync()

    def count(self, counter: str) -> None:
        """Count one event the session's driver saw (``foreign``, ``late_answered``)."""
        self._driver_counts[counter] += 1
        self._sync()

    def _sync(self) -> None:
        s = self.core.state
        st = self.stats
        st.sent, st.retransmitted, st.fast_retransmitted = (
            s["sent"], s["retransmitted"], s["fast_retransmitted"],
        )  # fmt: skip
        extra = self._driver_counts
        st.duplicates = s["duplicates"]
        st.foreign = s["foreign"] + extra["foreign"]
        st.late_answered = s["late_answered"] + extra["late_answered"]
        st.spurious = s["spurious"]
        st.late_timers = s["late_timers"]
        self.rtt.rto, self.rtt.srtt, self.rtt.rttvar = s["rto"], s["srtt"], s["rttvar"]
        self.rtt.samples = s["samples"]
        self.call: int = s["call"]
        self.last_progress: float = s["last_progress"]
        self.last_rx: float = s["last_rx"]
        self.lanes: int = s["lanes"]
        self.window: int = s["window"]
        self.naps: int = s["naps"]
        """Sleeps before a receive in the calls' run() (:attr:`batch_datagrams`)."""
        self.receives: int = s["receives"]
        self.received: int = s["received"]
        """Datagrams the calls' run() took in its :attr:`receives` receive calls."""

    @property
    def batch_datagrams(self) -> int:
        """While a call still expects two batches of messages, its run() sleeps for
        about this many datagrams' spacing before it receives them together (default:
        the core's 8; 0: never). It changes when datagrams are taken, never which are
        sent for them."""
        return int(self.core.batch_datagrams)

    @batch_datagrams.setter
    def batch_datagrams(self, value: int) -> None:
        self.core.batch_datagrams = value

    @property
    def unacked(self) -> bool:
        return bool(self.core.state["unacked"])

    @property
    def has_output(self) -> bool:
        return bool(self.core.state["has_output"])

    def waiting_for(self) -> dict[int, int]:
        return dict(self.core.waiting_for())

    def on_datagram(self, data: Any, now: float) -> None:
        self.core.on_datagram(data, now)
        self._sync()

    def on_timer(self, now: float) -> None:
        self.core.on_timer(now)
        self._sync()

    def take_outbox(self) -> list[bytes]:
        out: list[bytes] = self.core.take_outbox()
        return out

    def next_timer(self) -> float:
        return float(self.core.next_timer())

    def serve_idle(self, fd: int, now: float) -> None:
        """Answer every datagram waiting on ``fd`` as between calls (the responder)."""
        self.core.serve_idle(fd, now)
        self._sync()


_RING_KINDS = {"allreduce": 0, "reduce_scatter": 1, "all_gather": 2}
_TREE_KIND = 3


class NativeCollectiveCall:
    """One ring (``phase``) or tree (``tree=True``) call of one rank on the native core:
    the arguments, errors and driving interface of :class:`~hostlib.p2p.CollectiveCall`
    (``start``, ``on_datagram``, ``on_timer``, ``next_wakeup``, ``done``, ``result``).

    Raises:
        TypeError: data is not int32/float32.
        ValueError: data is not 1-D, too large, an unknown phase, or lanes or window out
            of range.
    """

    def __init__(
        self,
        endpoint: NativeP2pEndpoint,
        data: np.ndarray,
        linger: float = 0.0,
        *,
        lanes: int | None = None,
        window: int | None = None,
        phase: str = "allreduce",
        tree: bool = False,
        out: np.ndarray | None = None,
    ) -> None:
        check_call_data(data)
        if phase not in _RING_KINDS:
            raise ValueError(f"unknown ring phase {phase!r} (known: {', '.join(_RING_KINDS)})")
        self.endpoint, self.spec, self.phase = endpoint, endpoint.spec, phase
        self.lanes, self.window = call_knobs(self.spec, lanes, window)
        n, r = self.spec.world_size, self.spec.rank
        # A ring allreduce of several ranks writes every element of its result from
        # received data, so the core reads the input where it is (``src``) rather than
        # from a copy of it in the result.
        ring_allreduce = phase == "allreduce" and not tree and n > 1 and data.flags.c_contiguous
        src: np.ndarray | None = None
        if phase == "all_gather" and not tree:
            self.out = np.zeros(n * data.size, dtype=data.dtype)
            self.out[r * data.size : (r + 1) * data.size] = data
        elif out is not None and phase == "allreduce":
            # The caller's memory (``data`` itself when in place): reduced there.
            self.out = out_buffer(out, data)
            if self.out.ctypes.data != data.ctypes.data:
                if ring_allreduce and not np.may_share_memory(self.out, data):
                    src = data
                else:
                    self.out[...] = data
        elif ring_allreduce:
            self.out, src = np.empty_like(data, order="C"), data
        else:
            self.out = np.array(data, copy=True, order="C")
        size = self.out.size
        self.bounds = (np.arange(n + 1, dtype=np.int64) * size) // n
        kind = _TREE_KIND if tree else _RING_KINDS[phase]
        self._core = _p2p_core()[0].Call(
            endpoint.core, kind, self.out, data.dtype == np.float32, self.lanes, self.window,
            linger, src,
        )  # fmt: skip

    @property
    def done(self) -> bool:
        return bool(self._core.done)

    def start(self, now: float) -> list[bytes]:
        try:
            out: list[bytes] = self._core.start(now)
        finally:
            self.endpoint._sync()
        return out

    def on_datagram(self, data: Any, now: float) -> None:
        try:
            self._core.on_datagram(data, now)
        finally:
            self.endpoint._sync()

    def next_wakeup(self) -> float:
        return float(self._core.next_wakeup())

    def on_timer(self, now: float) -> list[bytes]:
        try:
            out: list[bytes] = self._core.on_timer(now)
        except _CoreTimeout as exc:
            self.endpoint._sync()
            raise self._timeout(*exc.args) from None
        self.endpoint._sync()
        return out

    def run(self, fd: int) -> None:
        """The whole call on the session's UDP socket ``fd``, the GIL released.

        Raises:
            P2pTimeoutError: no new data or ack for longer than the policy's deadline.
            P2pError: peers disagree on the call.
            OSError: the socket failed.
        """
        try:
            self._core.run(fd)
        except _CoreTimeout as exc:
            raise self._timeout(*exc.args) from None
        finally:
            self.endpoint._sync()

    def _timeout(self, seconds: float, remaining: int) -> Exception:
        return P2pTimeoutError(stall_message(self.endpoint, seconds, remaining))

    def result(self) -> np.ndarray:
        """The sum, this rank's part of it (reduce_scatter) or every rank's parts
        (all_gather), as :meth:`hostlib.ring.RingCall.result`.

        Raises:
            P2pError: the call has not completed.
        """
        if not self.done:
            raise P2pError("allreduce has not completed")
        if self.phase != "reduce_scatter":
            return self.out
        r = self.spec.rank
        return self.out[int(self.bounds[r]) : int(self.bounds[r + 1])]
