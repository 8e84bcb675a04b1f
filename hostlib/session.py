"""A worker's INA session: one job, a transport, and the slot state kept across calls;
and :class:`StripedInaSession`, one job striped across several aggregators."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from hostlib.ina import InaAllreduce, InaError, JobSpec, RetryPolicy, _Rtt, out_buffer
from hostlib.native import NativeInaAllreduce, engine_name
from hostlib.transport.base import Transport

__all__ = [
    "InaSession",
    "StripedInaSession",
    "as_numpy",
    "close_all",
    "part_bounds",
    "reduce_flat",
    "stripe_bounds",
]

_RECV_BYTES = 65536


class _InaCollectives:
    """``allreduce`` and ``reduce_scatter`` over a session's ``_allreduce_flat``."""

    spec: JobSpec
    _broken: str | None = None

    def _allreduce_flat(
        self, flat: np.ndarray, target: np.ndarray | None = None, window: int | None = None
    ) -> np.ndarray:
        raise NotImplementedError

    def allreduce(
        self, x: Any, inplace: bool = False, *, window: int | None = None, out: Any = None
    ) -> Any:
        """Sum ``x`` over all workers of the job.

        Args:
            x: a float32 or int32 numpy array or torch CPU tensor, any shape.
            inplace: write the result into ``x`` (and return it).
            out: write the result into this array or tensor instead (and return it):
                ``x``'s dtype and size, contiguous, writable. With ``inplace`` or ``out``
                the native engine writes each result packet straight into that memory.
            window: use only slots ``0..window-1`` of the job's ``spec.slots`` for this
                call (``None``: all of them); every worker must pass the same. Each slot
                keeps its own set alternation, so calls with different windows mix.

        Returns:
            The sum, of ``x``'s type, dtype and shape. float32 sums are within
            ``hostlib.quantize.error_bound``; int32 sums are exact (wrapping).

        Raises:
            TypeError: unsupported type or dtype, a non-CPU tensor, a non-integer window,
                an ``out`` of another dtype.
            ValueError: NaN or infinity in float32 data, a window outside
                ``1..spec.slots``, or an ``out`` of another size, not contiguous or
                read-only (or given with ``inplace``).
            InaTimeoutError: the switch or a peer stopped answering for ``policy.deadline``.
            InaError: the session broke in an earlier call.
        """
        self._check_usable()
        return reduce_flat(
            x, inplace, functools.partial(self._allreduce_flat, window=window), out=out
        )

    def reduce_scatter(self, x: Any, *, window: int | None = None) -> Any:
        """Sum ``x`` over all workers and keep this worker's part: an INA allreduce (the
        same packets) of which rank ``r`` of ``n = spec.num_workers`` returns
        ``sum[r * size // n : (r + 1) * size // n]`` (:func:`part_bounds`).

        The parts follow ``spec.rank`` and ``spec.num_workers``, the job's numbering on
        the switch; a caller with its own numbering (a leaf's ranks under hierarchical
        aggregation) slices :meth:`allreduce`'s result itself.

        Args:
            x: a float32 or int32 numpy array or torch CPU tensor, any shape (flattened).
            window: as for :meth:`allreduce`.

        Returns:
            This worker's part, 1-D, of ``x``'s type and dtype: float32 within
            ``hostlib.quantize.error_bound`` of the exact sum, int32 exact (wrapping).

        Raises:
            The errors of :meth:`allreduce`.
        """
        self._check_usable()
        array, wrap = as_numpy(x)
        flat = np.ascontiguousarray(array).reshape(-1)
        lo, hi = part_bounds(flat.size, self.spec.num_workers, self.spec.rank)
        return wrap(self._allreduce_flat(flat, window=window)[lo:hi].copy())

    def _check_usable(self) -> None:
        if self._broken:
            raise InaError(f"session unusable after an earlier failure: {self._broken}")


class InaSession(_InaCollectives):
    """Runs INA allreduce calls of one worker of one job over a transport.

    Every worker of the job must make the same sequence of calls with the same sizes and
    windows (as with any collective): the per-slot set alternation is derived from it.

    Args:
        spec: the job as configured on the switch (this worker's rank and address).
        transport: a bound transport whose ``local_addr`` the switch has for this rank.
        policy: retransmission timing and the no-progress deadline.
        engine: ``"native"`` (the C core, ``hostlib.native``) or ``"python"`` (the
            specification, ``hostlib.ina``); ``None``: ``INALAB_HOST_ENGINE``, else the
            native one where it was built.
        batch_results: results the native core sleeps for before it receives them in one
            batch while a whole window is in flight (``None``: its default, 4; 0: never);
            see :class:`~hostlib.native.NativeInaAllreduce`.

    Raises:
        ValueError: an unknown engine, or ``"native"`` where it was not built.
    """

    def __init__(
        self,
        spec: JobSpec,
        transport: Transport,
        policy: RetryPolicy | None = None,
        *,
        engine: str | None = None,
        batch_results: int | None = None,
    ) -> None:
        self.spec = spec
        self.transport = transport
        self.engine = engine_name({"INALAB_HOST_ENGINE": engine} if engine else None)
        connect = getattr(transport, "connect", None)
        if connect is not None:  # the session's transport talks to the switch alone
            connect(spec.switch)
        # The native core runs a whole call on the connected socket itself, where the
        # transport allows it (UdpTransport.native_io).
        native_io = connect is not None and getattr(transport, "native_io", False)
        self._fileno = getattr(transport, "fileno", None) if native_io else None
        self.policy = policy or RetryPolicy()
        self.uses = np.zeros(spec.slots, dtype=np.int64)
        self.rtt = _Rtt(self.policy.timeout)
        self.retransmissions = 0
        self.fast_retransmissions = 0
        """Of :attr:`retransmissions`, those sent because results of later packets
        arrived first (the rest waited for a timer)."""
        self.late_answers = 0
        """Results that arrived for packets already answered: the switch's answer to a
        retransmission whose first answer was only late (a spurious retransmission), or a
        result duplicated on the way."""
        self.late_timers = 0
        """Timers served late and re-armed instead of fired (``RetryPolicy.late_timer``):
        this worker was not running when they expired (the machine stalled)."""
        self.late_samples = 0
        """Round trips the estimator took from late answers: timeouts proved spurious
        (docs/protocol.md, "Timeouts")."""
        self.batch_results = batch_results
        """The native core's receive batching (:class:`~hostlib.native.NativeInaAllreduce`;
        ``None``: its default)."""
        self.naps = 0
        """The native core's sleeps before a receive, over the session's calls."""
        self.receives = 0
        self.received = 0
        """Datagrams the native core took in its :attr:`receives` receive calls, over the
        session's calls on the socket: ``received / receives`` results per wake-up."""
        self.next_seq = 1
        self.packets = 0
        """Packets of this worker's completed calls (first copies), for statistics."""
        self._buf = bytearray(_RECV_BYTES)
        self._broken: str | None = None

    def _allreduce_flat(
        self, flat: np.ndarray, target: np.ndarray | None = None, window: int | None = None
    ) -> np.ndarray:
        engine: InaAllreduce | NativeInaAllreduce
        flagged = getattr(self.transport, "results_flagged", True)
        if self.engine == "native":
            engine = NativeInaAllreduce(
                self.spec, flat, self.uses, self.policy, self.rtt,
                first_seq=self.next_seq, window=window, out=target,
                batch_results=self.batch_results, flagged=flagged,
            )  # fmt: skip
        else:
            engine = InaAllreduce(
                self.spec, flat, self.uses, self.policy, self.rtt,
                first_seq=self.next_seq, window=window, flagged=flagged,
            )  # fmt: skip
        try:
            if isinstance(engine, NativeInaAllreduce) and self._fileno is not None:
                engine.run(self._fileno())
            else:
                self._drive(engine)
        except InaError as exc:
            # The switch's slot sets no longer match ours: the job must be re-created.
            self._broken = str(exc)
            raise
        engine.commit()
        self.next_seq = engine.next_seq
        self.packets += engine.npackets
        self.retransmissions += engine.stats.retransmitted
        self.fast_retransmissions += engine.stats.fast_retransmitted
        self.late_answers += engine.stats.stale
        self.late_timers += engine.stats.late_timers
        self.late_samples += engine.stats.late_samples
        if isinstance(engine, NativeInaAllreduce):
            self.naps += engine.naps
            self.receives += engine.receives
            self.received += engine.received
        return engine.result()

    def _drive(self, engine: InaAllreduce | NativeInaAllreduce) -> None:
        transport, dest = self.transport, self.spec.switch
        send, recv = transport.send, transport.recv_into
        view = memoryview(self._buf)
        now = time.perf_counter()
        for packet in engine.start(now):
            send(packet, dest)
        while not engine.done:
            wait = engine.next_wakeup() - time.perf_counter()
            n, src = recv(self._buf, max(wait, 0.0))
            now = time.perf_counter()
            if n and src == dest:
                reply = engine.on_datagram(view[:n], now)
                if reply is not None:
                    send(reply, dest)
            elif n:
                engine.stats.foreign += 1
            if now >= engine.next_wakeup():
                for packet in engine.on_timer(now):
                    send(packet, dest)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> InaSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StripedInaSession(_InaCollectives):
    """One worker's INA job striped across several aggregators (scale-out, as BytePS
    spreads a tensor over its summation servers).

    Each aggregator holds the same job with the same workers, and one
    :class:`InaSession` per aggregator talks to it on a socket of its own. A call cuts
    the flat input at block boundaries into one stripe per aggregator
    (:func:`stripe_bounds`) and runs the stripes at once: the native engine runs each
    without the GIL, so K aggregators give K times one aggregator's bandwidth where the
    links allow. As the cuts fall on block boundaries, every packet carries the same
    lanes it would carry through one aggregator: float32 results are bit-identical to
    one aggregator's, int32 exact. A stripe's result is written where it belongs in the
    output, with no copy for the native engine.

    A stripe that fails (its aggregator stopped answering) fails the call once every
    stripe has ended, with the error naming that aggregator, and the session is unusable
    afterwards (its slot sets no longer match the aggregator's); no stripe is left
    running.

    Args:
        stripes: one session per aggregator, in the order every worker uses (the same
            job id, rank, workers, lanes and slots on each).

    Raises:
        ValueError: no stripes, or stripes that disagree on the job.
    """

    def __init__(self, stripes: Sequence[InaSession]) -> None:
        if not stripes:
            raise ValueError("a striped session needs at least one aggregator")
        first = stripes[0].spec
        ours = (first.job_id, first.rank, first.num_workers, first.lanes, first.slots)
        for s in stripes[1:]:
            theirs = (s.spec.job_id, s.spec.rank, s.spec.num_workers, s.spec.lanes, s.spec.slots)
            if theirs != ours:
                raise ValueError(
                    f"aggregator {s.spec.switch} has job {theirs} (job, rank, workers, "
                    f"lanes, slots), aggregator {first.switch} has {ours}"
                )
        self.stripes = list(stripes)
        self.spec = first
        self._broken = None
        self._pool = (
            ThreadPoolExecutor(len(stripes) - 1, thread_name_prefix="ina-stripe")
            if len(stripes) > 1
            else None
        )

    @property
    def transports(self) -> list[Transport]:
        """Each stripe's transport, in aggregator order."""
        return [s.transport for s in self.stripes]

    @property
    def retransmissions(self) -> int:
        return sum(s.retransmissions for s in self.stripes)

    @property
    def fast_retransmissions(self) -> int:
        return sum(s.fast_retransmissions for s in self.stripes)

    @property
    def late_answers(self) -> int:
        return sum(s.late_answers for s in self.stripes)

    @property
    def late_timers(self) -> int:
        return sum(s.late_timers for s in self.stripes)

    @property
    def late_samples(self) -> int:
        return sum(s.late_samples for s in self.stripes)

    @property
    def packets(self) -> int:
        """Packets of this worker's completed calls, over every aggregator."""
        return sum(s.packets for s in self.stripes)

    def _allreduce_flat(
        self, flat: np.ndarray, target: np.ndarray | None = None, window: int | None = None
    ) -> np.ndarray:
        out = np.empty_like(flat) if target is None else target
        count = len(self.stripes)
        runs = [
            (k, lo, hi)
            for k in range(count)
            for lo, hi in [stripe_bounds(flat.size, self.spec.lanes, count, k)]
            if hi > lo or (k == 0 and flat.size == 0)  # an empty call runs once: its checks
        ]

        def one(k: int, lo: int, hi: int) -> None:
            got = self.stripes[k]._allreduce_flat(flat[lo:hi], out[lo:hi], window)
            if got.size and got.ctypes.data != out[lo:hi].ctypes.data:
                out[lo:hi] = got  # the Python engine keeps its own array

        futures: list[tuple[int, Future[None]]] = []
        if self._pool is not None:
            futures = [(k, self._pool.submit(one, k, lo, hi)) for k, lo, hi in runs[1:]]
        failures: list[tuple[int, BaseException]] = []
        for k, lo, hi in runs[:1]:
            try:
                one(k, lo, hi)
            except BaseException as exc:  # wait for the others before raising
                failures.append((k, exc))
        for k, future in futures:
            error = future.exception()  # waits: each stripe ends by its own deadline
            if error is not None:
                failures.append((k, error))
        if failures:
            k, first = failures[0]
            where = f"aggregator {k + 1} of {count} ({_addr(self.stripes[k].spec.switch)})"
            self._broken = f"{where}: {first}"
            if isinstance(first, InaError):
                raise type(first)(f"{where}: {first}") from first
            raise first
        return out

    def close(self) -> None:
        """Close every stripe's transport (the first error raised after all)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        close_all(self.stripes)

    def __enter__(self) -> StripedInaSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_all(closables: Iterable[Any]) -> None:
    """Call ``close()`` on each in order; the first error is raised after all were
    closed."""
    errors = []
    for c in closables:
        try:
            c.close()
        except Exception as exc:  # close the others too, then report the first
            errors.append(exc)
    if errors:
        raise errors[0]


def stripe_bounds(size: int, lanes: int, stripes: int, index: int) -> tuple[int, int]:
    """Where stripe ``index`` of ``stripes`` lies in a ``size``-element input carried in
    ``lanes``-element blocks: the blocks cut as :func:`part_bounds` cuts elements, so
    every stripe but the last starts and ends on a block boundary (with fewer blocks than
    stripes, some stripes are empty).

    Raises:
        ValueError: ``stripes`` below 1, ``index`` outside ``0..stripes-1``, or ``lanes``
            below 1.
    """
    if lanes < 1:
        raise ValueError(f"lanes {lanes} must be positive")
    blocks = -(-size // lanes)
    lo, hi = part_bounds(blocks, stripes, index)
    return min(lo * lanes, size), min(hi * lanes, size)


def _addr(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


Reduce = Callable[[np.ndarray, np.ndarray | None], np.ndarray]
"""An engine's run on a flat input: ``reduce(flat, target)`` returns the result, written
into ``target`` (a flat, contiguous, writable array of the input's dtype and size) where
one is given and the engine can; the result is then ``target`` itself."""


def reduce_flat(x: Any, inplace: bool, reduce: Reduce, out: Any = None) -> Any:
    """Run ``reduce`` on ``x`` flattened (a contiguous 1-D numpy array) and give the result
    ``x``'s shape and type, or write it into ``x`` with ``inplace``, or into ``out``: what
    every host allreduce (INA, ring, tree) does around its engine.

    The engine gets the memory the result belongs in (``x`` itself when in place and
    contiguous, or ``out``), so an engine that writes results where they arrive (the
    native ones) needs neither a new array per call nor a copy.

    Raises:
        TypeError: ``x`` or ``out`` is neither a numpy array nor a CPU torch tensor, or
            ``out`` has another dtype than ``x``.
        ValueError: ``out`` has another size, is not contiguous, is read-only, overlaps
            ``x``, or is given with ``inplace``.
    """
    array, wrap = as_numpy(x)
    flat = np.ascontiguousarray(array).reshape(-1)
    target: np.ndarray | None = None
    if out is not None:
        if inplace:
            raise ValueError("give inplace or out, not both")
        target = out_buffer(as_numpy(out)[0], array)
        if np.may_share_memory(target, array):
            raise ValueError("out overlaps the input: use inplace to reduce in place")
    elif inplace and array.flags.c_contiguous and array.flags.writeable:
        target = array.reshape(-1)  # x's own memory
    result = reduce(flat, target)
    if target is None:
        result = result.reshape(array.shape)
        if inplace:
            array[...] = result
            return x
        return wrap(result)
    if result.ctypes.data != target.ctypes.data:  # an engine that kept its own array
        target[...] = result
    return x if inplace else out


def part_bounds(size: int, parts: int, index: int) -> tuple[int, int]:
    """Where part ``index`` of a ``size``-element vector cut into ``parts`` lies:
    ``[index * size // parts, (index + 1) * size // parts)``, the ring's segments (uneven
    sizes allowed; with fewer elements than parts some parts are empty).

    Raises:
        ValueError: ``parts`` below 1, or ``index`` outside ``0..parts-1``.
    """
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"part {index} of {parts} does not exist")
    return index * size // parts, (index + 1) * size // parts


def as_numpy(x: Any) -> tuple[np.ndarray, Any]:
    """A numpy view of ``x`` and a function turning a result array back into x's type.

    Raises:
        TypeError: ``x`` is neither a numpy array nor a CPU torch tensor.
    """
    if isinstance(x, np.ndarray):
        return x, lambda a: a
    module = type(x).__module__
    if module.startswith("torch"):
        if x.device.type != "cpu":
            raise TypeError(f"tensor on {x.device}: stage it to CPU first")
        import torch  # only when given a tensor: torch is an optional dependency

        return x.detach().numpy(), torch.from_numpy
    raise TypeError(f"allreduce takes a numpy array or torch tensor, not {type(x).__name__}")
