"""Ring and tree allreduce over real UDP sockets on 127.0.0.1, one thread per rank.

Each rank is a :class:`RingAllreduce` or :class:`TreeAllreduce` session on its own
:class:`UdpTransport` (a kernel-chosen port); no switch is involved, peers send to each
other directly. int32 results are compared exactly with a wrapping sum, float32 results
with the float32 summation bound; every rank must hold the same bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import random_inputs, wrapping_sum

from hostlib import PeerSpec, RetryPolicy, RingAllreduce, TreeAllreduce
from hostlib.p2p import PeerCollective
from hostlib.transport.udp import UdpTransport

KINDS: dict[str, type[PeerCollective]] = {"ring": RingAllreduce, "tree": TreeAllreduce}
POLICY = RetryPolicy(deadline=20.0)
THREAD_TIMEOUT = 120.0


def run_ranks(
    n: int, make: type[PeerCollective], work: Callable[[int, PeerCollective], Any], **spec: Any
) -> list[Any]:
    """Run ``work(rank, session)`` on ``n`` sessions in threads; return their results."""
    transports = [UdpTransport() for _ in range(n)]
    addrs = tuple(t.local_addr for t in transports)
    sessions = [make(PeerSpec(r, addrs, **spec), t, POLICY) for r, t in enumerate(transports)]
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = work(rank, sessions[rank])
        except BaseException as exc:
            errors.append(exc)
        finally:
            sessions[rank].close(linger=0.05)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(THREAD_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


def check(results: list[np.ndarray], inputs: np.ndarray) -> None:
    for got in results:
        np.testing.assert_array_equal(got.view(np.uint32), results[0].view(np.uint32))
    if inputs.dtype == np.int32:
        np.testing.assert_array_equal(results[0], wrapping_sum(inputs))
        return
    n = len(inputs)
    wide = np.abs(inputs.astype(np.float64)).sum(axis=0)
    bound = (n - 1) * 2.0**-24 / (1 - (n - 1) * 2.0**-24) * wide + n * 2.0**-52 * wide
    err = np.abs(results[0].astype(np.float64) - inputs.astype(np.float64).sum(axis=0))
    assert np.all(err <= bound)


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

    per_rank = run_ranks(n, KINDS[kind], work, lanes=lanes)
    for i, inputs in enumerate(calls):
        check([r[i] for r in per_rank], inputs)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_shapes_inplace_and_three_ranks(kind: str) -> None:
    n, rng = 3, np.random.default_rng(5)
    inputs = random_inputs(rng, np.int32, n, 7 * 11).reshape(n, 7, 11)

    def work(rank: int, session: PeerCollective) -> np.ndarray:
        x = inputs[rank].copy()
        assert session.allreduce(x, inplace=True) is x
        return x

    results = run_ranks(n, KINDS[kind], work, lanes=16, window=4)
    for got in results:
        np.testing.assert_array_equal(got, wrapping_sum(inputs.reshape(n, -1)).reshape(7, 11))
