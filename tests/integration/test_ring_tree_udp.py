"""Ring and tree allreduce over real UDP sockets on 127.0.0.1, one thread per rank.

Each rank is a :class:`RingAllreduce` or :class:`TreeAllreduce` session on its own
:class:`UdpTransport` (a kernel-chosen port); no switch is involved, peers send to each
other directly. int32 results are compared exactly with a wrapping sum, float32 results
with the float32 summation bound; every rank must hold the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_allreduce, peer_ranks, random_inputs, wrapping_sum

from hostlib import RetryPolicy, RingAllreduce, TreeAllreduce
from hostlib.peers import PeerCollective

KINDS: dict[str, type[PeerCollective]] = {"ring": RingAllreduce, "tree": TreeAllreduce}
POLICY = RetryPolicy(deadline=20.0)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("lanes", [64, 2048])
def test_four_ranks_several_calls(kind: str, lanes: int) -> None:
    n, rng = 4, np.random.default_rng(lanes)
    plan = [
        (np.int32, 1),
        (np.float32, lanes + 1),
        (np.int32, 20011),
        (np.float32, 100 * lanes + 7),
    ]
    calls = [random_inputs(rng, dtype, n, size) for dtype, size in plan]

    def work(rank: int, session: PeerCollective) -> list[np.ndarray]:
        return [session.allreduce(inputs[rank]) for inputs in calls]

    per_rank = peer_ranks(KINDS[kind], n, work, POLICY, lanes=lanes)
    for i, inputs in enumerate(calls):
        check_allreduce([r[i] for r in per_rank], inputs)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_shapes_inplace_and_three_ranks(kind: str) -> None:
    n, rng = 3, np.random.default_rng(5)
    inputs = random_inputs(rng, np.int32, n, 7 * 11).reshape(n, 7, 11)

    def work(rank: int, session: PeerCollective) -> np.ndarray:
        x = inputs[rank].copy()
        assert session.allreduce(x, inplace=True) is x
        return x

    results = peer_ranks(KINDS[kind], n, work, POLICY, lanes=16, window=4)
    for got in results:
        np.testing.assert_array_equal(got, wrapping_sum(inputs.reshape(n, -1)).reshape(7, 11))
