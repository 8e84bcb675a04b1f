"""A barrier in shared memory for processes that share no parent.

``hostlib.collnet.LocalGroup`` takes its barrier from ``multiprocessing``, which only a
common parent can hand to its children. torchrun's local ranks are started apart, so
the ``"ina"`` torch backend needs a barrier that ranks join by the segment's name: this
one lives in the segment itself.

Layout (``barrier_bytes(size)``, 8-byte words): word 0 is the broken flag (any rank
sets it to 1: a timeout or an abort); word 1 + r is rank r's generation, written by rank
r alone. ``wait`` increments its own generation and waits until every rank's is at least
as large, so no word has two writers and no atomic read-modify-write is needed. An
aligned 8-byte store is single-copy atomic on x86-64 and AArch64; x86-64's store order
makes the data a rank wrote before its generation visible before it (AArch64 would need
a release store: the native core's job, where this barrier belongs eventually).

Waiting polls, spinning a little and then sleeping with a back-off up to
``MAX_SLEEP``: no futex from Python.
"""

from __future__ import annotations

import threading
import time

import numpy as np

__all__ = ["MAX_SLEEP", "ShmBarrier", "barrier_bytes"]

MAX_SLEEP = 200e-6
"""Longest sleep between polls (seconds): a waiting rank's added latency, at most."""

_SPINS = 200


def barrier_bytes(size: int) -> int:
    """Bytes a barrier of ``size`` ranks takes (a multiple of 64)."""
    return -(-(8 * (1 + size)) // 64) * 64


class ShmBarrier:
    """Rank ``rank``'s handle on a barrier of ``size`` ranks in ``buf`` (zeroed by the
    creator of the segment before any rank waits).

    ``wait`` and ``abort`` behave as ``multiprocessing.Barrier``'s: a barrier broken by a
    timeout or an abort raises :class:`threading.BrokenBarrierError` in every waiter,
    now and later.

    Raises:
        ValueError: ``buf`` too small, or ``rank`` outside ``0..size-1``.
    """

    def __init__(self, buf: memoryview, size: int, rank: int) -> None:
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside 0..{size - 1}")
        if len(buf) < barrier_bytes(size):
            raise ValueError(f"{len(buf)} bytes hold no barrier of {size} ranks")
        self._words = np.frombuffer(buf, dtype=np.int64, count=1 + size)
        self.size, self.rank = size, rank
        self._generation = int(self._words[1 + rank])

    def release(self) -> None:
        """Drop this handle's view of the segment (before the segment is closed)."""
        self._words = np.zeros(1 + self.size, dtype=np.int64)
        self._words[0] = 1  # a released handle is broken for its owner

    @property
    def broken(self) -> bool:
        return bool(self._words[0])

    def abort(self) -> None:
        """Break the barrier: every rank waiting, or waiting later, raises."""
        self._words[0] = 1

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every rank has called ``wait`` as often as this one.

        Raises:
            threading.BrokenBarrierError: the barrier broke (an abort, or a rank's
                timeout), or ``timeout`` seconds passed (which breaks it).
        """
        words = self._words
        if words[0]:
            raise threading.BrokenBarrierError
        self._generation += 1
        words[1 + self.rank] = self._generation
        deadline = None if timeout is None else time.monotonic() + timeout
        sleep, spins = 1e-6, 0
        others = words[1:]
        while int(others.min()) < self._generation:
            if words[0]:
                raise threading.BrokenBarrierError
            spins += 1
            if spins > _SPINS:
                if deadline is not None and time.monotonic() >= deadline:
                    words[0] = 1
                    raise threading.BrokenBarrierError
                time.sleep(sleep)
                sleep = min(2 * sleep, MAX_SLEEP)
