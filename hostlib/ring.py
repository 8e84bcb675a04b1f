"""Ring allreduce (reduce-scatter + all-gather) over hostlib's point-to-point layer.

Layer: hostlib collectives, the baseline INA is measured against (NCCL's and Gloo's
ring). The vector is cut into ``n`` segments (``bounds[g] = g * size // n``) and every
segment into packet-sized chunks of ``spec.lanes`` elements. At step ``s`` of
``2(n-1)``, rank ``r`` sends segment ``(r - s) mod n`` to rank ``r+1`` and receives
segment ``(r - s - 1) mod n`` from rank ``r-1``: in the first ``n-1`` steps
(reduce-scatter) it adds its own elements to what it receives, in the last ``n-1``
(all-gather) it stores the finished sums. Pipelined per chunk: chunk ``c`` of step ``s+1``
leaves as soon as chunk ``c`` of step ``s`` arrived, so a segment streams round the ring
instead of moving one step per round trip. Message tag = ``step * chunks_per_segment +
chunk``.

Every finished segment is computed on one rank and copied as bytes to the others, so all
ranks hold identical results; the additions of an element happen in a fixed order (round
the ring from the segment's first sender), so a run with loss is bit-identical to one
without. int32 wraps (numpy int32 addition); float32 is added in float32, as Gloo and NCCL
do: ``|error| <= (n-1) * 2**-24 * sum|x|`` per element, to first order.
"""

from __future__ import annotations

import numpy as np

from hostlib.p2p import CollectiveCall, P2pEndpoint, PeerCollective

__all__ = ["RingAllreduce", "RingCall"]


class RingCall(CollectiveCall):
    """One ring allreduce call of one rank (see :class:`~hostlib.p2p.CollectiveCall`).

    Raises:
        TypeError: data is not int32/float32.
        ValueError: data is not 1-D, or too large for 32-bit message tags.
    """

    def __init__(self, endpoint: P2pEndpoint, data: np.ndarray, linger: float = 0.0) -> None:
        super().__init__(endpoint, data, linger)
        n, r, lanes = self.spec.world_size, self.spec.rank, self.spec.lanes
        self.n, self.nsteps = n, 2 * (n - 1)
        self.next, self.prev = (r + 1) % n, (r - 1) % n
        self.bounds = (np.arange(n + 1, dtype=np.int64) * data.size) // n
        self.seg_chunks = -(-np.diff(self.bounds) // lanes)  # ceil
        self.cps = max(1, int(self.seg_chunks.max()))
        if self.nsteps * self.cps > 1 << 32:
            raise ValueError(f"{data.size} elements need more than 2**32 messages")
        self._remaining = sum(
            int(self.seg_chunks[self._recv_segment(s)]) for s in range(self.nsteps)
        )

    def _recv_segment(self, step: int) -> int:
        return (self.spec.rank - step - 1) % self.n

    def _chunk(self, segment: int, chunk: int) -> tuple[int, int]:
        lo = int(self.bounds[segment]) + chunk * self.spec.lanes
        return lo, min(lo + self.spec.lanes, int(self.bounds[segment + 1]))

    def _begin(self, now: float) -> None:
        if self.nsteps == 0:
            return
        own = self.spec.rank
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
        if step < self.n - 1:
            np.add(received, mine, out=mine)  # reduce-scatter
        else:
            mine[:] = received  # all-gather
        if step + 1 < self.nsteps:  # step s+1 sends the segment step s received
            self.endpoint.send(self.next, tag + self.cps, mine, now)


class RingAllreduce(PeerCollective):
    """Ring allreduce sessions: ``RingAllreduce(spec, transport, policy).allreduce(x)``.

    See :class:`~hostlib.p2p.PeerCollective` for the arguments, the session rules and
    :meth:`close`.
    """

    _call_type = RingCall
