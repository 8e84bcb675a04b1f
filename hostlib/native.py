"""The binding of the native INA core (``hostlib/_inacore.c``), and the choice of engine.

Layer: hostlib, beside ``hostlib.ina``. :class:`NativeInaAllreduce` is one worker's call
with the interface of :class:`~hostlib.ina.InaAllreduce` (``start``, ``on_datagram``,
``on_timer``, ``next_wakeup``, ``done``, ``result``, ``commit``), so the fake network
drives either engine and a differential test holds the native one to the Python one: the
same packets for the same events, bit-identical results. :meth:`NativeInaAllreduce.run`
is the production path: the whole call on the session's connected UDP socket in C, the
GIL released, batched ``recvmmsg``/``sendmmsg``, results written into the output as they
arrive.

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
from hostlib.ina import (
    SEQ_MODULUS,
    InaError,
    InaTimeoutError,
    JobSpec,
    RetryPolicy,
    _Rtt,
    check_window,
)

__all__ = [
    "ENGINES",
    "ENGINE_ENV",
    "NativeInaAllreduce",
    "engine_name",
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


@dataclass
class _NativeStats:
    sent: int = 0
    retransmitted: int = 0
    fast_retransmitted: int = 0
    stale: int = 0
    foreign: int = 0


class NativeInaAllreduce:
    """One worker's INA allreduce call on the native core: the arguments, errors and
    interface of :class:`~hostlib.ina.InaAllreduce`.

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
    ) -> None:
        if _core is None:
            raise ValueError(f"native INA engine: {_why_not}")
        if data.dtype not in (np.float32, np.int32):
            raise TypeError(f"allreduce supports float32 and int32, not {data.dtype}")
        if data.ndim != 1:
            raise ValueError("allreduce takes a 1-D array")
        if not 1 <= first_seq <= SEQ_MODULUS:
            raise ValueError(f"first_seq {first_seq} outside 1..{SEQ_MODULUS}")
        if uses.dtype != np.int64 or not uses.flags.c_contiguous:
            raise ValueError("uses must be a contiguous int64 array")
        slots = check_window(window, spec.slots)
        self.spec, self.policy, self.uses = spec, policy, uses
        self.first_seq = first_seq
        self.rtt = rtt or _Rtt(policy.timeout)
        self.count = data.size
        self.stats = _NativeStats()
        self._data = np.ascontiguousarray(data)  # the core reads it in place
        self._out = np.empty(data.size, dtype=self._data.dtype)
        self._core = _core.InaCore(
            spec.job_id, spec.rank, spec.num_workers, spec.lanes, slots, self._data,
            self._out, uses, first_seq, self.rtt.rto, self.rtt.srtt, self.rtt.rttvar,
            self.rtt.samples, policy.min_timeout, policy.max_timeout, policy.backoff,
            policy.deadline,
        )  # fmt: skip
        state = self._core.state
        self.window: int = state["window"]
        self.npackets: int = state["npackets"]
        self.nblocks: int = state["nblocks"]

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
        """Copy the core's counters and RTT estimate out (the session's estimator is
        shared across its calls, as the Python engine's is)."""
        s = self._core.state
        self.rtt.rto, self.rtt.srtt, self.rtt.rttvar = s["rto"], s["srtt"], s["rttvar"]
        self.rtt.samples = s["samples"]
        st = self.stats
        st.sent, st.retransmitted = s["sent"], s["retransmitted"]
        st.fast_retransmitted, st.stale, st.foreign = (
            s["fast_retransmitted"], s["stale"], s["foreign"],
        )  # fmt: skip
        return value

    def _timeout_message(self, seconds: float, waiting: list[int]) -> str:
        spec, done = self.spec, self._core.state["done"]
        return (
            f"job {spec.job_id} rank {spec.rank}: no result from switch {spec.switch} for "
            f"{seconds:.3f} s (deadline {self.policy.deadline} s); "
            f"{done}/{self.npackets} packets of the call done, waiting for packets "
            f"{waiting[:8]}{'...' if len(waiting) > 8 else ''}, "
            f"{self.stats.retransmitted} retransmissions"
        )

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
        w, n = self.window, self.npackets
        self.uses[:w] += n // w
        self.uses[: n % w] += 1
