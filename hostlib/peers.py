"""The point-to-point sessions: a worker's ring or tree allreduce over a real transport.

Layer: hostlib sessions, above the engines it runs (``hostlib.p2p``'s endpoint and calls,
``hostlib.ring``'s and ``hostlib.tree``'s calls, and their native core in
``hostlib.native``), beside ``hostlib.session``'s INA sessions. This module owns:

* :class:`PeerCollective`: one worker's session of host-based collectives: its endpoint
  (Python or native), the transport, the lock a call or the responder holds while it
  reads the socket, and each call's engine (:meth:`PeerCollective.new_call`);
* ``_Responder``: the thread that answers peers between calls (``hostlib.p2p``: "Why no
  rank is left waiting at the end of a call");
* :class:`RingAllreduce` (with ``reduce_scatter`` and ``all_gather``) and
  :class:`TreeAllreduce`: the sessions whose calls are ring and tree calls.

They moved here from ``hostlib.p2p``, ``hostlib.ring`` and ``hostlib.tree``, which keep
a deprecated alias (PEP 562) for each, so that the engines import no session.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hostlib.errors import P2pError
from hostlib.ina import RetryPolicy
from hostlib.native import (
    ENGINE_ENV,
    NativeCollectiveCall,
    NativeP2pEndpoint,
    engine_name,
    native_p2p_unavailable,
)
from hostlib.p2p import CollectiveCall, P2pEndpoint
from hostlib.p2pwire import PeerSpec
from hostlib.ring import RingCall
from hostlib.session import as_numpy, reduce_flat
from hostlib.transport.base import Transport
from hostlib.tree import TreeCall

__all__ = ["PeerCollective", "RingAllreduce", "TreeAllreduce"]

_RECV_BYTES = 65536


class _Responder:
    """Answers the session's peers while no call runs: a daemon thread that waits for
    the socket (or a wake-up) with the GIL released, and under the session's lock acks
    duplicates of finished calls and keeps (and acks) the early packets of the next one.

    Why it must exist: a call ends only when every packet it sent is acknowledged, and
    the acknowledgement of a call's last packet can be lost. Its receiver has finished
    the call then and may wait anywhere else (a barrier, another session's call, the
    training step): without someone answering on its socket, the sender would
    retransmit into silence until its deadline (TCP has TIME_WAIT for this).
    """

    def __init__(self, session: PeerCollective, fileno: int) -> None:
        self._session = session
        self._fileno = fileno
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._serve, name=f"inalab-p2p-responder-{session.spec.rank}", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        session = self._session
        try:
            while not self._stopping:
                ready = select.select([self._fileno, self._wake_r], [], [])[0]
                if self._wake_r in ready or self._stopping:
                    break
                with session.lock:  # blocks for the rest of a call that runs now
                    if self._stopping:
                        break
                    session.serve_idle(time.perf_counter())
        except BaseException as exc:  # handed to the next call, which raises it
            self.error = exc

    def stop(self) -> None:
        """End the thread (it holds no lock when this returns)."""
        self._stopping = True
        with contextlib.suppress(BlockingIOError):  # full of wake-ups already
            os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)


class PeerCollective:
    """A worker's session of a host-based allreduce over a real transport.

    Every rank must make the same sequence of calls with the same sizes and dtypes.

    Args:
        spec: this worker's rank and every rank's address.
        transport: a bound transport at ``spec.addrs[spec.rank]``.
        policy: retransmission timing and the no-progress deadline.
        engine: ``"native"`` (the C core, ``hostlib.native``: ring and tree calls run on
            the socket with the GIL released) or ``"python"`` (the specification);
            ``None``: ``INALAB_HOST_ENGINE``, else the native one where it was built.

    Raises:
        ValueError: an unknown engine, or ``"native"`` where it was not built.
    """

    _call_type: type[CollectiveCall] = CollectiveCall

    def __init__(
        self,
        spec: PeerSpec,
        transport: Transport,
        policy: RetryPolicy | None = None,
        *,
        engine: str | None = None,
    ) -> None:
        self.spec = spec
        self.transport = transport
        self.engine = engine_name({ENGINE_ENV: engine} if engine else None)
        if self.engine == "native" and native_p2p_unavailable() is not None:
            if engine == "native":
                raise ValueError(f"native p2p engine: {native_p2p_unavailable()}")
            self.engine = "python"
        native = self.engine == "native"
        self.endpoint: P2pEndpoint | NativeP2pEndpoint = (
            NativeP2pEndpoint(spec, policy) if native else P2pEndpoint(spec, policy)
        )
        # The native core does the socket's I/O itself where the transport allows it.
        native_io = getattr(transport, "native_io", False)
        self._fileno = getattr(transport, "fileno", None) if native_io else None
        self._ranks = {addr: rank for rank, addr in enumerate(spec.addrs)}
        self._buf = bytearray(_RECV_BYTES)
        self._broken: str | None = None
        self.lock = threading.Lock()
        """Held by whoever reads the socket: a call, or the responder between calls."""
        self._responder: _Responder | None = None
        # From the start: ranks enter the first call apart too (28 ms on star4), and
        # a faster peer's packets are then acknowledged as early instead of timing out.
        self._start_responder()

    @property
    def retransmissions(self) -> int:
        return self.endpoint.stats.retransmitted

    @property
    def late_answers(self) -> int:
        """DATA that arrived here again after it had arrived: a peer's retransmission
        whose first copy (or its ack) was only late, or a datagram duplicated on the way.
        Summed over every rank, the retransmissions that were not needed."""
        return self.endpoint.stats.duplicates

    @property
    def late_timers(self) -> int:
        """Timers served late and re-armed instead of fired (``RetryPolicy.late_timer``)."""
        return self.endpoint.stats.late_timers

    @property
    def fast_retransmissions(self) -> int:
        """Of :attr:`retransmissions`, those sent because later packets to the same
        peer were acknowledged first (the rest waited for a timer)."""
        return self.endpoint.stats.fast_retransmitted

    def allreduce(
        self,
        x: Any,
        inplace: bool = False,
        *,
        lanes: int | None = None,
        window: int | None = None,
        out: Any = None,
    ) -> Any:
        """Sum ``x`` over all ranks; every rank gets the same bytes.

        Args:
            x: a float32 or int32 numpy array or torch CPU tensor, any shape.
            inplace: write the result into ``x`` (and return it).
            out: write the result into this array or tensor instead (and return it):
                ``x``'s dtype and size, contiguous, writable; the native engine reduces
                in that memory (``x`` itself with ``inplace``) rather than in a new array.
            lanes: elements per packet of this call (``None``: ``spec.lanes``); every
                rank must pass the same.
            window: packets in flight per peer in this call (``None``: ``spec.window``).

        Returns:
            The sum, of ``x``'s type, dtype and shape. int32 sums wrap; float32 sums are
            added in float32, within ``(n-1) * 2**-24 * sum|x|`` per element (first order).

        Raises:
            TypeError: unsupported type or dtype, a non-CPU tensor, a non-integer knob.
            ValueError: lanes outside ``1..MAX_LANES`` or window outside ``1..2**20``.
            P2pTimeoutError: a peer stopped answering for ``policy.deadline``.
            P2pError: peers disagree on the call, or the session broke earlier.
        """
        return self.run(self._call_type, x, inplace, lanes=lanes, window=window, out=out)

    def run(
        self,
        call_type: type[CollectiveCall],
        x: Any,
        inplace: bool = False,
        *,
        lanes: int | None = None,
        window: int | None = None,
        out: Any = None,
    ) -> Any:
        """One allreduce with another algorithm's call (e.g. a
        :class:`~hostlib.tree.TreeCall` on a ring session) over this session's channels.

        The calls of a session share its per-peer channels and call numbers, so every
        rank must make the same sequence of calls, of the same types. Arguments, return
        value and errors as for :meth:`allreduce`.
        """
        self._check_usable()

        def reduce(flat: np.ndarray, target: np.ndarray | None) -> np.ndarray:
            return self._run_call(self.new_call(call_type, flat, lanes, window, out=target))

        return reduce_flat(x, inplace, reduce, out=out)

    def new_call(
        self,
        call_type: type[CollectiveCall],
        flat: np.ndarray,
        lanes: int | None,
        window: int | None,
        phase: str = "allreduce",
        *,
        out: np.ndarray | None = None,
    ) -> Any:
        """One call of ``call_type`` (ring calls with their ``phase``) on this session's
        engine: the native core for ring and tree calls where the session is native,
        reducing in ``out`` where given (an allreduce's result memory; the Python calls
        keep their own arrays)."""
        ep = self.endpoint
        if isinstance(ep, NativeP2pEndpoint):
            if call_type not in (RingCall, TreeCall):
                raise P2pError(f"the native engine runs ring and tree calls, not {call_type}")
            tree = call_type is TreeCall
            return NativeCollectiveCall(
                ep, flat, lanes=lanes, window=window, phase=phase, tree=tree, out=out
            )
        if call_type is RingCall:
            return RingCall(ep, flat, lanes=lanes, window=window, phase=phase)
        return call_type(ep, flat, lanes=lanes, window=window)

    def _check_usable(self) -> None:
        responder = self._responder
        if responder is not None and responder.error is not None and not self._broken:
            self._broken = f"answering peers between calls failed: {responder.error!r}"
        if self._broken:
            raise P2pError(f"session unusable after an earlier failure: {self._broken}")

    def _run_call(self, call: Any) -> np.ndarray:
        """Drive ``call`` to its end; a failure breaks the session. Between calls the
        responder answers the peers (see :class:`_Responder`)."""
        with self.lock:
            try:
                if isinstance(call, NativeCollectiveCall) and self._fileno is not None:
                    call.run(self._fileno())
                else:
                    self._drive(call)
            except P2pError as exc:
                self._broken = str(exc)
                raise
        return call.result()

    def _start_responder(self) -> None:
        fileno = getattr(self.transport, "fileno", None)
        if fileno is not None:  # a transport without a descriptor has no idle time
            self._responder = _Responder(self, fileno())

    def serve_idle(self, now: float) -> None:
        """Take every datagram waiting on the socket and answer it, as between calls
        (the caller holds :attr:`lock`): duplicates of a finished call are acknowledged
        again, the next call's early packets kept and acknowledged."""
        ep, view = self.endpoint, memoryview(self._buf)
        if isinstance(ep, NativeP2pEndpoint) and self._fileno is not None:
            ep.serve_idle(self._fileno(), now)
            return
        while True:
            n, src = self.transport.recv_into(self._buf, 0.0)
            if not n:
                break
            if src in self._ranks:
                ep.on_datagram(view[:n], now)
                ep.count("late_answered")
            else:
                ep.count("foreign")
        ep.on_timer(now)
        self._send_all(ep.take_outbox())

    def _drive(self, call: Any) -> None:
        recv, view = self.transport.recv_into, memoryview(self._buf)
        self._send_all(call.start(time.perf_counter()))
        while not call.done:
            n, src = recv(self._buf, max(call.next_wakeup() - time.perf_counter(), 0.0))
            now = time.perf_counter()
            if n and src in self._ranks:
                call.on_datagram(view[:n], now)
            elif n:
                self.endpoint.count("foreign")
            self._send_all(call.on_timer(now))

    def _send_all(self, packets: Sequence[bytes | bytearray]) -> None:
        send, addrs = self.transport.send, self.spec.addrs
        for packet in packets:
            send(memoryview(packet), addrs[packet[3]])

    def close(self, linger: float | None = None) -> None:
        """Keep answering peers until nothing is unacknowledged and ``linger`` seconds
        (default: twice the policy's longest timeout) pass without a datagram, then close
        the transport. A peer whose last ack from us was lost needs this to finish.
        """
        if self._responder is not None:
            self._responder.stop()
            self._responder = None
        ep = self.endpoint
        quiet = 2 * ep.policy.max_timeout if linger is None else linger
        start = time.perf_counter()
        view = memoryview(self._buf)
        try:
            while True:
                now = time.perf_counter()
                last = max(ep.last_rx, start)
                if not ep.unacked and now >= last + quiet:
                    break
                if ep.unacked and now >= max(ep.last_progress, start) + ep.policy.deadline:
                    break  # the peer is gone: nothing more to do for it
                wake = min(ep.next_timer(), last + quiet) - now
                n, src = self.transport.recv_into(self._buf, max(wake, 0.0))
                now = time.perf_counter()
                if n and src in self._ranks:
                    ep.on_datagram(view[:n], now)
                ep.on_timer(now)
                self._send_all(ep.take_outbox())
        finally:
            self.transport.close()

    def __enter__(self) -> PeerCollective:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RingAllreduce(PeerCollective):
    """Ring sessions: ``RingAllreduce(spec, transport, policy).allreduce(x)``, and
    :meth:`reduce_scatter` and :meth:`all_gather`; each call may set its own packet width
    and window (``allreduce(x, lanes=256, window=8)``).

    See :class:`PeerCollective` for the arguments, the session rules and
    :meth:`close`.
    """

    _call_type = RingCall

    def reduce_scatter(self, x: Any, *, lanes: int | None = None, window: int | None = None) -> Any:
        """Sum ``x`` over all ranks and keep this rank's part: rank ``r`` of ``n`` gets
        ``sum[r * size // n : (r + 1) * size // n]`` (uneven sizes allowed; with fewer
        elements than ranks some parts are empty). ``n - 1`` ring steps.

        Args:
            x: the whole vector, the same size on every rank: a float32 or int32 numpy
                array or torch CPU tensor, any shape (flattened).
            lanes: elements per packet of this call (``None``: ``spec.lanes``); every
                rank must pass the same.
            window: packets in flight per peer in this call (``None``: ``spec.window``).

        Returns:
            This rank's part, 1-D, of ``x``'s type and dtype: int32 wrapping sums,
            float32 within ``(n-1) * 2**-24 * sum|x|`` per element (first order).

        Raises:
            TypeError: unsupported type or dtype, a non-CPU tensor, a non-integer knob.
            ValueError: lanes or window out of range.
            P2pTimeoutError: a peer stopped answering for ``policy.deadline``.
            P2pError: peers disagree on the call, or the session broke earlier.
        """
        return self._phase("reduce_scatter", x, lanes, window)

    def all_gather(self, x: Any, *, lanes: int | None = None, window: int | None = None) -> Any:
        """Every rank's ``x``, concatenated in rank order, on every rank (the same bytes).
        ``n - 1`` ring steps.

        Args:
            x: this rank's part, the same number of elements ``k`` on every rank: a
                float32 or int32 numpy array or torch CPU tensor, any shape (flattened).
            lanes: as for :meth:`reduce_scatter`.
            window: as for :meth:`reduce_scatter`.

        Returns:
            ``n * k`` elements, 1-D, of ``x``'s type and dtype.

        Raises:
            The errors of :meth:`reduce_scatter`; ranks passing different ``k`` fail
            with :class:`~hostlib.errors.P2pError` (or time out).
        """
        return self._phase("all_gather", x, lanes, window)

    def _phase(self, phase: str, x: Any, lanes: int | None, window: int | None) -> Any:
        self._check_usable()
        array, wrap = as_numpy(x)
        flat = np.ascontiguousarray(array).reshape(-1)
        call = self.new_call(RingCall, flat, lanes, window, phase)
        result = self._run_call(call)
        # A reduce-scatter's part is a view of the whole vector: keep only the part.
        return wrap(result.copy() if phase == "reduce_scatter" else result)


class TreeAllreduce(PeerCollective):
    """Tree allreduce sessions: ``TreeAllreduce(spec, transport, policy).allreduce(x)``,
    optionally with a per-call packet width and window (``allreduce(x, lanes=256,
    window=8)``).

    See :class:`PeerCollective` for the arguments, the session rules and
    :meth:`close`.
    """

    _call_type = TreeCall
