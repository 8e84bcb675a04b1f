"""Binary-tree allreduce (reduce to the root, then broadcast) over hostlib's p2p layer.

Layer: hostlib collectives, the latency-oriented baseline (NCCL's tree; this is a single
binary tree, not NCCL's double binary tree). Rank 0 is the root; rank ``r`` has children
``2r+1`` and ``2r+2`` (those below ``n``) and parent ``(r-1)//2``. The vector is cut into
chunks of ``lanes`` elements (the call's, by default ``spec.lanes``), pipelined: a rank
sends chunk ``c`` up as soon as it has chunk ``c`` from all its children, and passes
chunk ``c`` of the broadcast down as soon as it arrives. Message tag: ``c`` going up,
``nchunks + c`` coming down.

A rank adds in a fixed order, own + left child + right child, whatever order the children's
chunks arrive in, so a run with loss is bit-identical to one without; every rank receives
the root's bytes. int32 wraps; float32 is added in float32:
``|error| <= (n-1) * 2**-24 * sum|x|`` per element, to first order.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from hostlib.p2p import CollectiveCall

__all__ = ["TreeCall"]


class TreeCall(CollectiveCall):
    """One tree allreduce call of one rank (see :class:`~hostlib.p2p.CollectiveCall` for
    the arguments).

    Raises:
        TypeError: data is not int32/float32.
        ValueError: data is not 1-D, too large for 32-bit message tags, or lanes or
            window out of range.
    """

    def _prepare(self) -> None:
        n, r, data = self.spec.world_size, self.spec.rank, self.data
        self.nchunks = -(-data.size // self.lanes)
        if 2 * self.nchunks > 1 << 32:
            raise ValueError(f"{data.size} elements need more than 2**32 messages")
        self.parent = (r - 1) // 2 if r else -1
        self.children = [c for c in (2 * r + 1, 2 * r + 2) if c < n]
        # Children's partial sums, kept until the chunk is complete (fixed addition order).
        self._from_child = np.zeros((len(self.children), data.size), dtype=data.dtype)
        self._missing = np.full(self.nchunks, len(self.children), dtype=np.int64)
        self._remaining = self.nchunks * (len(self.children) + (self.parent >= 0))

    def _chunk(self, c: int) -> tuple[int, int]:
        lo = c * self.lanes
        return lo, min(lo + self.lanes, self.data.size)

    def _begin(self, now: float) -> None:
        if not self.children:
            for c in range(self.nchunks):
                self._reduced(c, now)

    def _reduced(self, c: int, now: float) -> None:
        """Chunk ``c`` holds this subtree's sum: pass it up, or at the root, down."""
        lo, hi = self._chunk(c)
        if self.parent >= 0:
            self.endpoint.send(self.parent, c, self.out[lo:hi], now)
        else:
            self._broadcast(c, now)

    def _broadcast(self, c: int, now: float) -> None:
        lo, hi = self._chunk(c)
        for child in self.children:
            self.endpoint.send(child, self.nchunks + c, self.out[lo:hi], now)

    def _on_message(self, src: int, tag: int, payload: memoryview, now: float) -> None:
        if src in self.children and tag < self.nchunks:
            lo, hi = self._chunk(tag)
            index = self.children.index(src)
            self._from_child[index, lo:hi] = self._received(payload, lo, hi)
            self._missing[tag] -= 1
            if self._missing[tag] == 0:
                mine = self.out[lo:hi]
                for partial in self._from_child:
                    np.add(mine, partial[lo:hi], out=mine)
                self._reduced(tag, now)
        elif src == self.parent and self.nchunks <= tag < 2 * self.nchunks:
            c = tag - self.nchunks
            lo, hi = self._chunk(c)
            self.out[lo:hi] = self._received(payload, lo, hi)
            self._broadcast(c, now)
        else:
            raise self._bad_tag(src, tag)


def __getattr__(name: str) -> Any:
    """``TreeAllreduce``, a session, moved up to ``hostlib.peers`` (issue #39): it still resolves
    here, imported on first use, with a ``DeprecationWarning``."""
    if name == "TreeAllreduce":
        from hostlib.peers import TreeAllreduce

        warnings.warn(f"{__name__}.{name} moved to hostlib.peers", DeprecationWarning, stacklevel=2)
        return TreeAllreduce
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
