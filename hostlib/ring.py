"""Ring allreduce (reduce-scatter + all-gather) over hostlib's point-to-point layer, and
its two halves as collectives of their own.

Layer: hostlib collectives, the baseline INA is measured against (NCCL's and Gloo's
ring). The vector is cut into ``n`` segments (``bounds[g] = g * size // n``) and every
segment into packet-sized chunks of ``lanes`` elements (the call's, by default
``spec.lanes``). At step ``s`` of ``2(n-1)``, rank ``r`` sends segment ``(r - s) mod n``
to rank ``r+1`` and receives segment ``(r - s - 1) mod n`` from rank ``r-1``: in the
first ``n-1`` steps (reduce-scatter) it adds its own elements to what it receives, in the
last ``n-1`` (all-gather) it stores the finished sums. Pipelined per chunk: chunk ``c`` of
step ``s+1`` leaves as soon as chunk ``c`` of step ``s`` arrived, so a segment streams
round the ring instead of moving one step per round trip. Message tag = ``step *
chunks_per_segment + chunk`` (``step`` counted from the call's first).

``reduce_scatter`` runs the first ``n-1`` steps and ``all_gather`` the last ``n-1``, each
on its own. After the reduce-scatter steps rank ``r`` holds the finished segment
``(r+1) mod n``; both halves therefore relabel the segments (the algorithm's segment
``a`` is the data's segment ``(a-1) mod n``), so that rank ``r`` ends the reduce-scatter
with data segment ``r`` and starts the all-gather from it.

Every finished segment is computed on one rank and copied as bytes to the others, so all
ranks hold identical results; the additions of an element happen in a fixed order (round
the ring from the segment's first sender), so a run with loss is bit-identical to one
without. int32 wraps (numpy int32 addition); float32 is added in float32, as Gloo and NCCL
do: ``|error| <= (n-1) * 2**-24 * sum|x|`` per element, to first order, in an allreduce
and a reduce-scatter alike (the same ``n-1`` additions; the segments of a reduce-scatter
start from another rank, so its float32 bytes may differ from the allreduce's). An
all-gather only copies.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from hostlib.p2p import CollectiveCall, P2pEndpoint

__all__ = ["RING_PHASES", "RingCall"]

RING_PHASES = ("allreduce", "reduce_scatter", "all_gather")
"""What a :class:`RingCall` runs: both halves, or one."""


class RingCall(CollectiveCall):
    """One ring call of one rank (see :class:`~hostlib.p2p.CollectiveCall` for the other
    arguments).

    Args:
        phase: ``"allreduce"``; ``"reduce_scatter"``: ``data`` is the whole vector and
            :meth:`result` this rank's summed part; ``"all_gather"``: ``data`` is this
            rank's part (every rank's of the same size) and :meth:`result` all parts in
            rank order.

    Raises:
        TypeError: data is not int32/float32.
        ValueError: data is not 1-D, too large for 32-bit message tags, an unknown phase,
            or lanes or window out of range.
    """

    def __init__(
        self,
        endpoint: P2pEndpoint,
        data: np.ndarray,
        linger: float = 0.0,
        *,
        lanes: int | None = None,
        window: int | None = None,
        phase: str = "allreduce",
    ) -> None:
        self.phase = phase  # read by _prepare, which the base class's __init__ calls
        super().__init__(endpoint, data, linger, lanes=lanes, window=window)

    def _prepare(self) -> None:
        phase, data = self.phase, self.data
        if phase not in RING_PHASES:
            raise ValueError(f"unknown ring phase {phase!r} (known: {', '.join(RING_PHASES)})")
        n, r = self.spec.world_size, self.spec.rank
        self.n = n
        self.next, self.prev = (r + 1) % n, (r - 1) % n
        # Steps [first, first + nsteps) of the allreduce's 2(n-1).
        self.first = n - 1 if phase == "all_gather" else 0
        self.nsteps = 2 * (n - 1) if phase == "allreduce" else n - 1
        self._relabel = 0 if phase == "allreduce" else 1
        size = data.size
        if phase == "all_gather":
            size = n * data.size
            self.out = np.zeros(size, dtype=data.dtype)
            self.out[r * data.size : (r + 1) * data.size] = data
        self.bounds = (np.arange(n + 1, dtype=np.int64) * size) // n
        self.seg_chunks = -(-np.diff(self.bounds) // self.lanes)  # ceil
        self.cps = max(1, int(self.seg_chunks.max()))
        if self.nsteps * self.cps > 1 << 32:
            raise ValueError(f"{size} elements need more than 2**32 messages")
        self._remaining = sum(
            int(self.seg_chunks[self._recv_segment(s)]) for s in range(self.nsteps)
        )

    def _segment(self, step: int) -> int:
        """The data segment rank ``r`` sends at the call's ``step``."""
        return (self.spec.rank - self.first - step - self._relabel) % self.n

    def _recv_segment(self, step: int) -> int:
        return self._segment(step + 1)

    def _chunk(self, segment: int, chunk: int) -> tuple[int, int]:
        lo = int(self.bounds[segment]) + chunk * self.lanes
        return lo, min(lo + self.lanes, int(self.bounds[segment + 1]))

    def _begin(self, now: float) -> None:
        if self.nsteps == 0:
            return
        own = self._segment(0)
        for c in range(int(self.seg_chunks[own])):
            lo, hi = self._chunk(own, c)
            self.endpoint.send(self.next, c, self.out[lo:hi], now)

    def _on_message(self, src: int, tag: int, payload: memoryview, now: float) -> None:
        step, c = divmod(tag, self.cps)
        if src != self.prev or step >= self.nsteps:
            raise self._bad_tag(src, tag)
        segment = self._recv_segment(step)
        if c >= self.seg_chunks[segment]:
            raise self._bad_tag(src, tag)
        lo, hi = self._chunk(segment, c)
        received = self._received(payload, lo, hi)
        mine = self.out[lo:hi]
        if self.first + step < self.n - 1:
            np.add(received, mine, out=mine)  # reduce-scatter
        else:
            mine[:] = received  # all-gather
        if step + 1 < self.nsteps:  # step s+1 sends the segment step s received
            self.endpoint.send(self.next, tag + self.cps, mine, now)

    def result(self) -> np.ndarray:
        """The sum (allreduce), this rank's part of it (reduce_scatter: ``bounds[r]`` to
        ``bounds[r+1]``), or all ranks' parts (all_gather).

        Raises:
            P2pError: the call has not completed.
        """
        out = super().result()
        if self.phase != "reduce_scatter":
            return out
        r = self.spec.rank
        return out[int(self.bounds[r]) : int(self.bounds[r + 1])]


def __getattr__(name: str) -> Any:
    """``RingAllreduce``, a session, moved up to ``hostlib.peers`` (issue #39): it still resolves
    here, imported on first use, with a ``DeprecationWarning``."""
    if name == "RingAllreduce":
        from hostlib.peers import RingAllreduce

        warnings.warn(f"{__name__}.{name} moved to hostlib.peers", DeprecationWarning, stacklevel=2)
        return RingAllreduce
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
