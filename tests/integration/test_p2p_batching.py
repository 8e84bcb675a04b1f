"""Receive batching in the native p2p core: while a call still expects two batches of
messages, run() sleeps for about ``batch_datagrams`` datagrams' spacing and takes them in
one receive; the results are the same bytes, and a native rank keeps the protocol with a
rank on the Python engine. Real sockets on 127.0.0.1: the Python rank is the paced peer
(its per-packet work spaces the datagrams it sends, as a link would)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import in_threads, wrapping_sum

from hostlib import PeerSpec, RetryPolicy, RingAllreduce
from hostlib.native import native_p2p_unavailable
from hostlib.transport.udp import UdpTransport

pytestmark = pytest.mark.skipif(
    native_p2p_unavailable() is not None, reason=str(native_p2p_unavailable())
)

POLICY = RetryPolicy(deadline=10.0)


def _ring(x: np.ndarray, small: np.ndarray, batch: int) -> tuple[list[Any], list[Any], Any]:
    """Rank 0 native (``batch``), rank 1 Python: each rank's allreduce of ``x`` and of
    ``small``, and rank 0's endpoint."""
    transports = [UdpTransport() for _ in range(2)]
    addrs = tuple(t.local_addr for t in transports)
    engines = ("native", "python")
    sessions = [
        RingAllreduce(PeerSpec(r, addrs, lanes=64, window=16), t, POLICY, engine=engines[r])
        for r, t in enumerate(transports)
    ]
    sessions[0].endpoint.batch_datagrams = batch  # type: ignore[union-attr]
    naps: list[int] = []

    def body(rank: int) -> tuple[np.ndarray, np.ndarray]:
        s = sessions[rank]
        try:
            big = s.allreduce(x[rank])
            if rank == 0:
                naps.append(s.endpoint.naps)  # type: ignore[union-attr]
            return big, s.allreduce(small[rank])
        finally:
            s.close(linger=0.05)

    results = in_threads([lambda r=r: body(r) for r in range(2)])  # type: ignore[misc]
    ep = sessions[0].endpoint
    return [r[0] for r in results], [r[1] for r in results], (ep, naps[0])


@pytest.mark.parametrize("batch", [8, 0])
def test_receive_batching_takes_several_datagrams_per_wakeup(batch: int) -> None:
    rng = np.random.default_rng(11)
    x = rng.integers(-(2**31), 2**31, size=(2, 64 * 1500 + 5), dtype=np.int64).astype(np.int32)
    small = rng.integers(-1000, 1000, size=(2, 64 * 3), dtype=np.int32)
    big, tiny, (ep, naps_after_big) = _ring(x, small, batch)
    for got in big:
        np.testing.assert_array_equal(got, wrapping_sum(x))
    for got in tiny:
        np.testing.assert_array_equal(got, wrapping_sum(small))
    # The small call expects fewer than two batches of messages: it never sleeps.
    assert ep.naps == naps_after_big
    if batch:
        assert naps_after_big > 0 and ep.received / ep.receives >= 4.0, (
            naps_after_big, ep.received, ep.receives,
        )  # fmt: skip
    else:
        assert ep.naps == 0


def test_batch_datagrams_refuses_a_negative_count() -> None:
    transports = [UdpTransport() for _ in range(2)]
    addrs = tuple(t.local_addr for t in transports)
    session = RingAllreduce(PeerSpec(0, addrs), transports[0], POLICY, engine="native")
    try:
        with pytest.raises(ValueError, match="batch_datagrams"):
            session.endpoint.batch_datagrams = -1  # type: ignore[union-attr]
        assert session.endpoint.batch_datagrams == 8  # type: ignore[union-attr]
    finally:
        session.close(linger=0)
        transports[1].close()
