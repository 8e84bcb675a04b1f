"""reduce_scatter and all_gather: the ring's halves and INA's reduce-scatter.

The ring's are checked on the fake network (``hostlib.transport.memory.FakeNetwork``, a
router forwarding each p2p datagram to the rank in its ``dst`` byte, every traversal
impaired separately) and over real UDP sockets on 127.0.0.1, one thread per rank. INA's
runs against an in-process soft switch (a :class:`SwitchServer` thread) over UDP.

Rank ``r`` of ``n`` owns elements ``[r * size // n, (r + 1) * size // n)``. int32 parts
must equal the wrapping sum exactly; float32 parts stay within ``gamma_(n-1) * sum|x|``
(the ring) or are bit-identical to the protocol's reference (INA); an all-gather copies,
so every rank holds exactly the concatenation of the parts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from helpers import (
    FakePeers,
    SwitchJob,
    expected,
    float_sum_bound,
    in_threads,
    peer_ranks,
    random_inputs,
    switch_thread,
    wrapping_sum,
)

from emulation.softswitch.pipeline import Pipeline
from emulation.softswitch.server import SwitchServer
from hostlib import PeerSpec, RetryPolicy, RingAllreduce
from hostlib.errors import P2pError
from hostlib.p2p import P2pEndpoint
from hostlib.ring import RingCall
from hostlib.session import part_bounds
from hostlib.transport.memory import LinkModel
from hostlib.tree import TreeCall

LANES = 8
POLICY = RetryPolicy(timeout=0.0005, min_timeout=0.0002, max_timeout=0.002, deadline=5.0)
LINGER = 40 * POLICY.max_timeout  # see tests/unit/test_ring_tree.py
LOSSY = LinkModel(loss=0.1, duplicate=0.1, reorder=0.2, reorder_delay=0.001)
UDP_POLICY = RetryPolicy(deadline=20.0)
SWITCH_LANES = 64
SWITCH_SLOTS = 16
_job_ids = itertools.count(300)


def sizes_for(n: int) -> list[int]:
    """Odd sizes, one below the rank count (some parts empty), and empty."""
    return sorted({1, 7, 1001, 3 * LANES + 1, max(n - 1, 0), 0})


# ----------------------------------------------------------------- the fake network
class FakeRing(FakePeers):
    """``n`` ranks' p2p endpoints on one fake network, kept across calls."""

    def __init__(self, n: int, link: LinkModel | None = None, seed: int = 0) -> None:
        super().__init__(n, POLICY, LANES, 16, link, seed)

    def reduce_scatter(self, inputs: np.ndarray, **knobs: Any) -> list[np.ndarray]:
        return self.run(
            lambda ep, x: RingCall(ep, x, LINGER, phase="reduce_scatter", **knobs), inputs
        )

    def all_gather(self, parts: np.ndarray, **knobs: Any) -> list[np.ndarray]:
        return self.run(lambda ep, x: RingCall(ep, x, LINGER, phase="all_gather", **knobs), parts)


def check_parts(parts: Sequence[np.ndarray], inputs: np.ndarray) -> None:
    """Rank r's part is the sum's ``part_bounds`` slice: exact, or within the bound."""
    n, size = inputs.shape
    for r, got in enumerate(parts):
        lo, hi = part_bounds(size, n, r)
        assert got.dtype == inputs.dtype and got.shape == (hi - lo,)
        if inputs.dtype == np.int32:
            np.testing.assert_array_equal(got, wrapping_sum(inputs)[lo:hi])
        else:
            err = np.abs(got.astype(np.float64) - inputs.astype(np.float64).sum(axis=0)[lo:hi])
            assert np.all(err <= float_sum_bound(inputs)[lo:hi])


def check_gathered(results: Sequence[np.ndarray], parts: np.ndarray) -> None:
    """Every rank holds exactly every part, in rank order."""
    for got in results:
        assert got.dtype == parts.dtype and got.shape == (parts.size,)
        np.testing.assert_array_equal(got.view(np.uint32), parts.reshape(-1).view(np.uint32))


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_ring_reduce_scatter_gives_each_rank_its_part(n: int, dtype: type) -> None:
    rng, ring = np.random.default_rng(n), FakeRing(n)
    for size in sizes_for(n):
        inputs = random_inputs(rng, dtype, n, size)
        check_parts(ring.reduce_scatter(inputs), inputs)
    assert ring.retransmissions == 0


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_ring_all_gather_gives_every_rank_every_part(n: int, dtype: type) -> None:
    rng, ring = np.random.default_rng(10 + n), FakeRing(n)
    for k in (0, 1, 7, LANES + 1, 333):
        parts = random_inputs(rng, dtype, n, k)
        check_gathered(ring.all_gather(parts), parts)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_halves_take_n_minus_1_steps(n: int) -> None:
    # One packet per segment: the reduce-scatter and the all-gather send n-1 messages
    # per rank, the allreduce 2(n-1).
    ring = FakeRing(n)
    inputs = np.ones((n, n * LANES), np.int32)
    ring.reduce_scatter(inputs)
    ring.all_gather(np.ones((n, LANES), np.int32))
    ring.run(lambda ep, x: RingCall(ep, x, LINGER), inputs)
    sent = [(ep.stats.sent - ep.stats.retransmitted) for ep in ring.endpoints]
    assert sent == [(n - 1) + (n - 1) + 2 * (n - 1)] * n


@pytest.mark.parametrize("seed", range(8))
def test_loss_duplication_and_reordering_give_the_lossless_bytes(seed: int) -> None:
    n, rng = 2 + seed % 7, np.random.default_rng(200 + seed)
    clean, lossy = FakeRing(n), FakeRing(n, LOSSY, seed=seed)
    plan = [
        ("rs", np.float32, 3 * LANES * n + 5, {}),
        ("ag", np.int32, 2 * LANES + 3, {"window": 1}),
        ("rs", np.int32, 301, {"lanes": 3}),
        ("ag", np.float32, 1, {"lanes": 64, "window": 2}),
    ]
    for kind, dtype, size, knobs in plan:
        inputs = random_inputs(rng, dtype, n, size)
        run = "reduce_scatter" if kind == "rs" else "all_gather"
        want = getattr(clean, run)(inputs, **knobs)
        got = getattr(lossy, run)(inputs, **knobs)
        if kind == "rs":
            check_parts(got, inputs)
        else:
            check_gathered(got, inputs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    assert lossy.net.lost > 0 and lossy.retransmissions > 0
    assert sum(ep.stats.duplicates for ep in lossy.endpoints) > 0


def test_all_gather_of_unequal_parts_is_reported() -> None:
    ring = FakeRing(2)
    with pytest.raises(P2pError, match="expected"):
        ring.run(
            lambda ep, x: RingCall(ep, x[: 3 + ep.spec.rank], phase="all_gather"),
            np.ones((2, 4), np.int32),
        )


def test_an_unknown_phase_is_rejected() -> None:
    ep = P2pEndpoint(PeerSpec(0, (("a", 1), ("b", 2))))
    with pytest.raises(ValueError, match="unknown ring phase"):
        RingCall(ep, np.ones(3, np.int32), phase="broadcast")


# ----------------------------------------------------------------- real UDP sockets
def ring_ranks(n: int, work: Callable[[int, RingAllreduce], Any], **spec: Any) -> list[Any]:
    """Run ``work(rank, session)`` on ``n`` ring sessions over UDP, one thread each."""
    return peer_ranks(RingAllreduce, n, work, UDP_POLICY, **spec)


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_reduce_scatter_and_all_gather_over_udp(n: int) -> None:
    rng = np.random.default_rng(40 + n)
    sums = [random_inputs(rng, dtype, n, size) for dtype, size in
            [(np.int32, 1001), (np.float32, 7), (np.int32, max(n - 1, 1))]]  # fmt: skip
    gathers = [random_inputs(rng, dtype, n, k) for dtype, k in [(np.float32, 1), (np.int32, 129)]]

    def work(rank: int, session: RingAllreduce) -> list[np.ndarray]:
        out = [session.reduce_scatter(inputs[rank]) for inputs in sums]
        return out + [session.all_gather(parts[rank]) for parts in gathers]

    per_rank = ring_ranks(n, work, lanes=64, window=8)
    for i, inputs in enumerate(sums):
        check_parts([r[i] for r in per_rank], inputs)
    for i, parts in enumerate(gathers):
        check_gathered([r[len(sums) + i] for r in per_rank], parts)


@pytest.mark.parametrize("n", [3, 5])
def test_a_mixed_sequence_of_calls_in_one_session(n: int) -> None:
    rng = np.random.default_rng(50 + n)
    a = random_inputs(rng, np.float32, n, 5000)
    b = random_inputs(rng, np.int32, n, 4099)
    c = random_inputs(rng, np.int32, n, 1001)
    d = random_inputs(rng, np.float32, n, 777)
    e = random_inputs(rng, np.int32, n, 3)

    def work(rank: int, s: RingAllreduce) -> list[np.ndarray]:
        return [
            s.allreduce(a[rank], lanes=64),
            s.reduce_scatter(b[rank], lanes=2048),
            s.all_gather(c[rank], window=1),
            s.run(TreeCall, d[rank], lanes=256, window=8),
            s.reduce_scatter(c[rank], lanes=3, window=32),
            s.allreduce(e[rank]),
            s.all_gather(d[rank], lanes=2048, window=32),
        ]

    per_rank = ring_ranks(n, work, lanes=128, window=4)
    results = list(zip(*per_rank, strict=True))
    for got in results[0]:
        np.testing.assert_array_equal(got.view(np.uint32), results[0][0].view(np.uint32))
        assert np.all(np.abs(got - a.astype(np.float64).sum(axis=0)) <= float_sum_bound(a))
    check_parts(results[1], b)
    check_gathered(results[2], c)
    for got in results[3]:
        np.testing.assert_array_equal(got.view(np.uint32), results[3][0].view(np.uint32))
        assert np.all(np.abs(got - d.astype(np.float64).sum(axis=0)) <= float_sum_bound(d))
    check_parts(results[4], c)
    for got in results[5]:
        np.testing.assert_array_equal(got, wrapping_sum(e))
    check_gathered(results[6], d)


def test_shapes_and_tensors_come_back_flat_and_of_their_type() -> None:
    torch = pytest.importorskip("torch")
    x = np.arange(2 * 3 * 5, dtype=np.int32).reshape(2, 3, 5)

    def work(rank: int, s: RingAllreduce) -> tuple[Any, Any, Any]:
        mine = x + rank
        return (
            s.reduce_scatter(mine),
            s.all_gather(torch.from_numpy(mine[rank])),
            s.reduce_scatter(torch.from_numpy(mine)),
        )

    rs, ag, rs_t = zip(*ring_ranks(2, work), strict=True)
    total = (2 * x + 1).reshape(-1)
    np.testing.assert_array_equal(np.concatenate(rs), total)
    assert all(isinstance(t, torch.Tensor) and t.shape == (30,) for t in ag)
    want = np.concatenate([(x + r)[r].reshape(-1) for r in range(2)])
    np.testing.assert_array_equal(ag[0].numpy(), want)
    np.testing.assert_array_equal(np.concatenate([t.numpy() for t in rs_t]), total)


# ----------------------------------------------------------------- INA on a soft switch
@pytest.fixture(scope="module")
def switch() -> Iterator[SwitchServer]:
    with switch_thread(Pipeline(SWITCH_LANES, 256)) as server:
        yield server


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_ina_reduce_scatter_keeps_each_workers_part(switch: SwitchServer, n: int) -> None:
    rng = np.random.default_rng(60 + n)
    plan = [(np.int32, 1001, None), (np.float32, 7, 1), (np.float32, 3001, 4), (np.int32, 1, 2)]
    if n > 1:
        plan.append((np.int32, n - 1, None))
    calls = [(random_inputs(rng, dtype, n, size), window) for dtype, size, window in plan]
    job = SwitchJob(switch, next(_job_ids), n, SWITCH_SLOTS, UDP_POLICY)
    try:
        per_rank = in_threads([
            lambda s=s: [s.reduce_scatter(x[s.spec.rank], window=w) for x, w in calls]
            for s in job.sessions
        ])  # fmt: skip
    finally:
        job.close()
    for i, (inputs, _) in enumerate(calls):
        want = expected(inputs, SWITCH_LANES)
        for r, got in enumerate(r[i] for r in per_rank):
            lo, hi = part_bounds(inputs.shape[1], n, r)
            assert got.dtype == inputs.dtype and got.shape == (hi - lo,)
            np.testing.assert_array_equal(got.view(np.uint32), want[lo:hi].view(np.uint32))
