"""CollNet-style allreduce for hosts with several ranks (NCCL CollNet Chain/Direct + SHARP).

The ranks of one host reduce locally through shared memory, one head rank per host
(local rank 0) runs the in-network allreduce across hosts, and the result is broadcast
back through the same shared memory. This module owns the host-local part: a
:class:`LocalGroup` (what the ranks of one host share) and :class:`CollNetAllreduce` (one
rank's side of a call). The step across hosts is any ``inter`` callable; :func:`ina_inter`
makes one from an :class:`~hostlib.session.InaSession`.

One call, on every local rank::

    copy x into my row of the shared buffer        barrier "gather"
    sum my 1/L column chunk over the L rows         barrier "reduce"
    head only: result = inter(local sum)            barrier "broadcast"
    copy the result out

Reduce-scatter style, so no rank does all the local work. Three barriers per call are
enough: a rank writes its row of call k+1 only after every rank has passed "broadcast"
of call k (so all reads of the rows of call k are done), and the result area of call k+1
is written only after every rank has passed "gather" of call k+1 (so all copies of the
result of call k are done).

Shared memory and Python's resource tracker: the parent creates (and alone unlinks) the
segment; children attach by name. On Python < 3.13 attaching registers the segment with
the attaching process's resource tracker. Processes started by ``multiprocessing`` (spawn,
fork or forkserver) share their parent's tracker, which keeps a *set* of names: the
registration is a no-op there, and unregistering in the child would remove the parent's
entry (the tracker then prints a KeyError when the parent unlinks). Only a process with a
tracker of its own unregisters, or its tracker would unlink the segment when it exits.
"""

from __future__ import annotations

import os
import secrets
import struct
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from multiprocessing.synchronize import Barrier

    from hostlib.session import InaSession, StripedInaSession

__all__ = [
    "SHM_PREFIX",
    "CollNetAllreduce",
    "CollNetError",
    "Inter",
    "LocalGroup",
    "ina_inter",
]

SHM_PREFIX = "inalab-cn-"
"""Name prefix of the shared-memory segments (``/dev/shm/inalab-cn-*`` on Linux)."""

Inter = Callable[[np.ndarray], np.ndarray]
"""The head's step across hosts: the allreduce of this host's local sum over all heads.
A call given a window (:meth:`CollNetAllreduce.allreduce`) calls it as ``inter(local,
window=window)``: :func:`ina_inter`'s accepts that keyword."""

_DTYPES = {np.dtype(np.int32): 1, np.dtype(np.float32): 2}
_DTYPE_NAMES = {1: "int32", 2: "float32"}
_ALIGN = 64  # cache line: rows and reduce chunks start on one, so ranks never share a line
_DESC = struct.Struct("<qq")  # (dtype code, element count) of a rank's current call
_ERR_BYTES = 240  # a failing rank's message, length-prefixed, for its siblings' errors
_SLOT_BYTES = 256  # per-rank header slot: descriptor + message
_REDUCE_BLOCK = 16384  # elements summed over all rows at a time (64 KiB: stays in cache)


class CollNetError(RuntimeError):
    """A CollNet allreduce could not complete on this rank.

    ``step`` names where this rank noticed: ``"gather"``, ``"reduce"``, ``"inter"`` or
    ``"broadcast"`` (a rank still waking from a barrier when a sibling breaks the group
    reports that barrier's step).
    After a timeout or a failed sibling the group's barrier is broken and every later
    call fails too; a disagreement about dtype or size leaves the group usable.
    """

    def __init__(self, message: str, step: str) -> None:
        super().__init__(message)
        self.step = step

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.step))


class LocalGroup:
    """What the ranks of one host share: a shared-memory segment and a barrier.

    Create it in the parent before starting the rank processes and pass it to them as a
    ``Process`` argument (like any ``multiprocessing`` lock, it pickles only then). The
    creating process owns the segment: it calls :meth:`unlink` (or uses the group as a
    context manager) once the ranks are done; children only attach and close. Should the
    creator exit without unlinking, its resource tracker removes the segment (and warns).

    Segment layout: one 256-byte header slot per rank, then one row of ``capacity``
    bytes (rounded up to 64) per rank, then a result area of the same size.

    Args:
        local_size: ranks on this host (L).
        capacity: the largest input of one call, in bytes per rank.
        ctx: the ``multiprocessing`` context that will start the ranks.
        timeout: seconds a rank waits at a barrier before :class:`CollNetError`. The
            siblings wait for the head's ``inter`` step, so it must exceed the slowest
            one (e.g. the INA session's ``RetryPolicy.deadline``).

    Raises:
        ValueError: local_size or capacity below 1, or timeout not positive.
        OSError: the segment cannot be created.
    """

    def __init__(
        self, local_size: int, capacity: int, ctx: BaseContext, timeout: float = 60.0
    ) -> None:
        if local_size < 1 or capacity < 1:
            raise ValueError(
                f"need local_size >= 1 and capacity >= 1, not {local_size}, {capacity}"
            )
        if not timeout > 0:
            raise ValueError(f"timeout {timeout} is not positive")
        self.local_size = local_size
        self.capacity = capacity
        self.timeout = float(timeout)
        self.stride = -(-capacity // _ALIGN) * _ALIGN
        self.header_bytes = -(-local_size * _SLOT_BYTES // _ALIGN) * _ALIGN
        self.size = self.header_bytes + (local_size + 1) * self.stride
        self.barrier: Barrier = ctx.Barrier(local_size)
        self._shm: shared_memory.SharedMemory | None = shared_memory.SharedMemory(
            name=f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(4)}", create=True, size=self.size
        )
        self.name = self._shm.name
        self._owner_pid = os.getpid()
        self._tracker = _tracker_id()

    @classmethod
    def join(
        cls,
        name: str,
        local_size: int,
        capacity: int,
        local_rank: int,
        timeout: float = 60.0,
        creator_tracker: tuple[int, int] | None = None,
    ) -> LocalGroup:
        """The group of ``local_size`` ranks started apart (torchrun's local ranks, which
        share no parent to hand them a ``multiprocessing`` barrier), by the segment's
        ``name``, agreed on beforehand (the ``"ina"`` torch backend agrees on it through
        the c10d store): local rank 0 creates the segment and owns it (:meth:`unlink`),
        the others attach, waiting up to ``timeout`` for it to appear, and :meth:`close`
        it. The barrier lives at the segment's end
        (:class:`~hostlib.shmbarrier.ShmBarrier`), one handle per rank.

        ``creator_tracker``, on the other ranks: local rank 0's :attr:`tracker` (passed
        along with the name), so that a rank sharing its resource tracker (a
        ``multiprocessing`` sibling) leaves the registration alone, and one with a
        tracker of its own (torchrun's) withdraws it; ``None``: withdraw it.

        Raises:
            ValueError: sizes out of range, or a local rank outside ``0..local_size-1``.
            CollNetError: the segment did not appear within ``timeout``.
            FileExistsError: local rank 0 found a segment of that name already.
        """
        from hostlib.shmbarrier import ShmBarrier, barrier_bytes

        if local_size < 1 or capacity < 1 or not 0 <= local_rank < local_size:
            raise ValueError(f"no local rank {local_rank} of {local_size} with capacity {capacity}")
        group = cls.__new__(cls)
        group.local_size, group.capacity, group.timeout = local_size, capacity, float(timeout)
        group.stride = -(-capacity // _ALIGN) * _ALIGN
        group.header_bytes = -(-local_size * _SLOT_BYTES // _ALIGN) * _ALIGN
        data = group.header_bytes + (local_size + 1) * group.stride
        group.size = data + barrier_bytes(local_size)
        # The creator's tracker unlinks a segment it was left with; another rank's must
        # not: attach() unregisters where the tracker is not the creator's.
        group.name = name
        group._tracker = _tracker_id() if local_rank == 0 else creator_tracker
        if local_rank == 0:
            shm = shared_memory.SharedMemory(name=name, create=True, size=group.size)
            group._owner_pid = os.getpid()
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    shm = _attach(name, creator_tracker)
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise CollNetError(f"no segment {name!r} after {timeout} s: is "
                                           "local rank 0 up?", "join") from None  # fmt: skip
                    time.sleep(0.01)
            group._owner_pid = -1  # not this process's to unlink
        group._shm = shm
        barrier = ShmBarrier(cast(memoryview, shm.buf)[data : group.size], local_size, local_rank)
        group.barrier = barrier  # type: ignore[assignment]  # wait/abort as Barrier's
        return group

    @property
    def tracker(self) -> tuple[int, int] | None:
        """The creator's resource tracker (see :meth:`join`)."""
        return self._tracker

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shm"] = None  # children attach by name; only the creator holds the segment
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (
            f"LocalGroup(name={self.name!r}, local_size={self.local_size}, "
            f"capacity={self.capacity}, timeout={self.timeout})"
        )

    def attach(self) -> shared_memory.SharedMemory:
        """Map the segment in this process, without handing it to a tracker that would
        unlink it at this process's exit. Close the result when done.

        Raises:
            FileNotFoundError: the segment was unlinked.
        """
        return _attach(self.name, self._tracker)

    def unlink(self) -> None:
        """Remove the segment (creator only; a second call does nothing). Ranks still
        attached keep their mapping until they close it.

        Raises:
            CollNetError: called in a process other than the creator.
        """
        if os.getpid() != self._owner_pid:
            raise CollNetError("only the process that created a LocalGroup unlinks it", "unlink")
        shm = self._close_own()
        if shm is not None:
            shm.unlink()

    def close(self) -> None:
        """A group joined by name (:meth:`join`), on a rank other than 0: drop this
        process's mapping. Rank 0 unlinks instead."""
        self._close_own()

    def leave(self) -> None:
        """This process is done with the group: :meth:`unlink` in the creator,
        :meth:`close` elsewhere."""
        if os.getpid() == self._owner_pid:
            self.unlink()
        else:
            self.close()

    def _close_own(self) -> shared_memory.SharedMemory | None:
        release = getattr(self.barrier, "release", None)  # a ShmBarrier (join) views it
        if release is not None:
            release()
        shm, self._shm = self._shm, None
        if shm is not None:
            shm.close()
        return shm

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unlink()


class CollNetAllreduce:
    """One local rank's side of CollNet allreduce calls on a :class:`LocalGroup`.

    Every local rank of the host makes the same sequence of calls with the same dtype and
    element count, as with any collective.

    Args:
        group: the host's group, as created by the parent.
        local_rank: this rank's index on the host, 0..local_size-1; 0 is the head.
        inter: the head's allreduce across hosts (see :func:`ina_inter`); ``None`` for a
            single host. Must be ``None`` on the other local ranks.

    Raises:
        ValueError: local_rank out of range, or ``inter`` given to a non-head rank.
        OSError: the segment does not exist (already unlinked).
    """

    def __init__(self, group: LocalGroup, local_rank: int, inter: Inter | None = None) -> None:
        if not 0 <= local_rank < group.local_size:
            raise ValueError(f"local_rank {local_rank} outside 0..{group.local_size - 1}")
        if local_rank != 0 and inter is not None:
            raise ValueError("only the head (local_rank 0) runs the inter-host step")
        self.group = group
        self.local_rank = local_rank
        self.inter = inter
        self._shm: shared_memory.SharedMemory | None = group.attach()
        self._broken: str | None = None
        self._step = "gather"

    def allreduce(self, x: np.ndarray, *, window: int | None = None) -> np.ndarray:
        """Sum ``x`` over all local ranks and, through the head's ``inter``, all hosts.

        int32 sums wrap like the switch's (numpy int32 addition). float32 local sums are
        float32 additions in local-rank order, ``((x_0 + x_1) + x_2) + ...`` elementwise,
        whichever rank computes a chunk: the result is a function of the inputs alone and
        bitwise identical on all local ranks (they copy the same bytes).

        What a call can set is the INA leg's window; its packet width is the switch's
        (fixed by the job), and the host-local step moves whole buffers through shared
        memory, with neither packets nor a window.

        Args:
            x: an int32 or float32 numpy array, any shape, at most ``capacity`` bytes.
            window: the head's INA window for this call (slots ``0..window-1`` of the
                job's, see :meth:`~hostlib.session.InaSession.allreduce`); ``None``: all.
                Every head must pass the same; other local ranks' windows are unused.

        Returns:
            A new array of ``x``'s dtype and shape.

        Raises:
            TypeError: not a numpy array, or another dtype.
            ValueError: ``x`` is larger than the group's capacity.
            CollNetError: a barrier timed out (a sibling died or is stuck), a sibling or
                the head's ``inter`` failed (a window outside the job's slots among
                them), the local ranks disagree on dtype or size, or the group broke in
                an earlier call.
        """
        if self._broken is not None:
            raise CollNetError(f"group unusable after an earlier failure: {self._broken}", "gather")
        buf = self._shm.buf if self._shm is not None else None
        if buf is None:
            raise CollNetError("allreduce after close()", "gather")
        if not isinstance(x, np.ndarray):
            raise TypeError(f"allreduce takes a numpy array, not {type(x).__name__}")
        code = _DTYPES.get(x.dtype)
        if code is None:
            raise TypeError(f"dtype {x.dtype} is not int32 or float32")
        if x.nbytes > self.group.capacity:
            raise ValueError(
                f"{x.nbytes} bytes exceed the group's capacity of {self.group.capacity} per rank"
            )
        try:
            rows, result = self._gather(buf, x, code)
        except BaseException as exc:
            self._fail(buf, exc)
            raise
        disagreement = self._disagreement(buf)
        if disagreement:
            # Every rank read the same descriptors and raises alike; the extra barrier
            # keeps a fast rank from writing its next call's descriptor before a slow
            # one has read this call's. The group stays usable.
            try:
                self._wait("gather")
            except BaseException as exc:
                self._fail(buf, exc)
                raise
            raise CollNetError(disagreement, "gather")
        try:
            return self._reduce_and_broadcast(rows, result, x.shape, window)
        except BaseException as exc:
            self._fail(buf, exc)
            raise

    def allreduce_pieces(self, x: np.ndarray, *, window: int | None = None) -> np.ndarray:
        """:meth:`allreduce` of a 1-D array of any size: in pieces of the group's capacity,
        one call each (every local rank cuts its array alike, since all pass the same
        size). A new array.

        Raises:
            The errors of :meth:`allreduce`.
        """
        step = max(1, self.group.capacity // x.itemsize) if isinstance(x, np.ndarray) else 0
        if not step or x.ndim != 1 or x.size <= step:
            return self.allreduce(x, window=window)
        out = np.empty_like(x)
        for lo in range(0, x.size, step):
            out[lo : lo + step] = self.allreduce(x[lo : lo + step], window=window)
        return out

    def _gather(
        self, buf: memoryview, x: np.ndarray, code: int
    ) -> tuple[list[np.ndarray], np.ndarray]:
        g, count = self.group, x.size
        self._step = "gather"
        rows = [
            np.frombuffer(buf, x.dtype, count, g.header_bytes + r * g.stride)
            for r in range(g.local_size)
        ]
        result = np.frombuffer(buf, x.dtype, count, g.header_bytes + g.local_size * g.stride)
        _DESC.pack_into(buf, self.local_rank * _SLOT_BYTES, code, count)
        np.copyto(rows[self.local_rank].reshape(x.shape), x)
        self._wait("gather")
        return rows, result

    def _reduce_and_broadcast(
        self,
        rows: list[np.ndarray],
        result: np.ndarray,
        shape: tuple[int, ...],
        window: int | None = None,
    ) -> np.ndarray:
        count, me = result.size, self.local_rank
        self._step = "reduce"
        chunk = -(-count // self.group.local_size)
        chunk = -(-chunk // 16) * 16  # 16 elements = 64 bytes: chunks start on a line
        _reduce_rows(rows, result, me * chunk, min((me + 1) * chunk, count))
        self._wait("reduce")
        if self.inter is not None and count:
            self._step = "inter"
            _run_inter(self.inter, result, shape, window)
        self._step = "broadcast"
        self._wait("broadcast")
        return result.reshape(shape).copy()

    def _wait(self, step: str) -> None:
        barrier, timeout = self.group.barrier, self.group.timeout
        start = time.monotonic()
        try:
            barrier.wait(timeout)
        except threading.BrokenBarrierError:
            waited = time.monotonic() - start
            if waited >= timeout - 0.01:
                why = (
                    f"timed out after {waited:.1f} s waiting for the other local ranks "
                    "(one died or is stuck)"
                )
            else:
                why = "another local rank broke the group" + self._sibling_errors()
            self._broken = f"local rank {self.local_rank}, step {step!r}: {why}"
            raise CollNetError(self._broken, step) from None

    def _disagreement(self, buf: memoryview) -> str:
        """Why the local ranks' calls do not match ('' when they do)."""
        descs = [_DESC.unpack_from(buf, r * _SLOT_BYTES) for r in range(self.group.local_size)]
        if all(d == descs[0] for d in descs):
            return ""
        have = ", ".join(
            f"rank {r}: {_DTYPE_NAMES.get(c, '?')}[{n}]" for r, (c, n) in enumerate(descs)
        )
        return f"local ranks disagree on dtype or size ({have})"

    def _fail(self, buf: memoryview, exc: BaseException) -> None:
        """Tell the siblings why (this rank's header slot), then break the barrier so none
        waits. A rank that found the barrier broken (``_wait``) only passes it on."""
        if self._broken is None:
            self._broken = f"{type(exc).__name__}: {exc}"
            text = f"local rank {self.local_rank} failed in step {self._step!r}: {self._broken}"
            data = text.encode()[: _ERR_BYTES - 4]
            base = self.local_rank * _SLOT_BYTES + _DESC.size
            buf[base + 4 : base + 4 + len(data)] = data
            struct.pack_into("<i", buf, base, len(data))
        self.group.barrier.abort()

    def _sibling_errors(self) -> str:
        buf = self._shm.buf if self._shm is not None else None
        if buf is None:
            return ""
        texts = []
        for r in range(self.group.local_size):
            base = r * _SLOT_BYTES + _DESC.size
            (n,) = struct.unpack_from("<i", buf, base)
            if r != self.local_rank and 0 < n <= _ERR_BYTES - 4:
                texts.append(bytes(buf[base + 4 : base + 4 + n]).decode(errors="replace"))
        return (": " + "; ".join(texts)) if texts else ""

    def close(self) -> None:
        """Unmap the segment (the creator of the group unlinks it)."""
        shm, self._shm = self._shm, None
        if shm is not None:
            shm.close()

    def __enter__(self) -> CollNetAllreduce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ina_inter(session: InaSession | StripedInaSession) -> Inter:
    """The head's inter-host step as an INA allreduce over ``session``: the session's job
    has one worker per host (the heads), and its rank is the host's index. It takes a
    ``window`` keyword (the session's per-call window)."""

    def inter(local: np.ndarray, window: int | None = None) -> np.ndarray:
        return np.asarray(session.allreduce(local, window=window))

    return inter


def _run_inter(
    inter: Inter, result: np.ndarray, shape: tuple[int, ...], window: int | None = None
) -> None:
    """The head's step: ``result = inter(result)`` in place in the shared result area
    (``inter(result, window=window)`` when a window is given)."""
    local = result.reshape(shape)
    local.flags.writeable = False  # inter gets a view of the shared area: it must not write
    try:
        if window is None:
            out = np.asarray(inter(local))
        else:
            out = np.asarray(cast(Callable[..., np.ndarray], inter)(local, window=window))
    except Exception as exc:
        raise CollNetError(f"inter-host step failed: {type(exc).__name__}: {exc}", "inter") from exc
    if out.dtype != result.dtype or out.size != result.size:
        raise CollNetError(
            f"inter returned {out.dtype}[{out.size}], expected {result.dtype}[{result.size}]",
            "inter",
        )
    np.copyto(result, out.reshape(-1))


def _reduce_rows(rows: list[np.ndarray], out: np.ndarray, lo: int, hi: int) -> None:
    """``out[lo:hi] = ((rows[0] + rows[1]) + rows[2]) + ...`` over ``[lo, hi)``, a cache-sized
    block at a time (the order of additions per element does not depend on the blocks)."""
    for b in range(lo, hi, _REDUCE_BLOCK):
        e = min(b + _REDUCE_BLOCK, hi)
        acc = out[b:e]
        if len(rows) == 1:
            np.copyto(acc, rows[0][b:e])
            continue
        np.add(rows[0][b:e], rows[1][b:e], out=acc)
        for row in rows[2:]:
            np.add(acc, row[b:e], out=acc)


def _attach(name: str, creator_tracker: tuple[int, int] | None) -> shared_memory.SharedMemory:
    """Attach segment ``name`` created by a process whose tracker is ``creator_tracker``."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, track=False)
    shm = shared_memory.SharedMemory(name)
    if _tracker_id() != creator_tracker:
        from multiprocessing import resource_tracker

        # A tracker of our own registered it: undo that (the name as the tracker has it).
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm


def _tracker_id() -> tuple[int, int] | None:
    """Identity of this process's resource tracker: the (device, inode) of the pipe to it.
    Processes sharing a tracker hold ends of the same pipe."""
    if os.name != "posix" or sys.version_info >= (3, 13):
        return None
    from multiprocessing import resource_tracker

    fd = resource_tracker.getfd()
    if fd is None:
        return None
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)
