"""Ring and tree allreduce on the fake network: exactness, error bound, loss recovery.

The call engines and the p2p layer are the real ones; the wire is
``hostlib.transport.memory.FakeNetwork`` in virtual time. Its workers all send to one
"switch"; here that is a router forwarding each p2p datagram to the rank in its ``dst``
byte, as an L3 switch forwards non-INA traffic. Every link traversal (worker->router,
router->worker) is impaired separately.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import FakePeers, check_allreduce, random_inputs

from hostlib.errors import P2pError, P2pTimeoutError
from hostlib.ina import RetryPolicy
from hostlib.p2p import CollectiveCall, P2pEndpoint
from hostlib.p2pwire import P2P_ACK, P2P_DATA, P2P_HEADER, PeerSpec
from hostlib.protocol import HEADER_SIZE, LANES_PER_PACKET, PROTOCOL_VERSION
from hostlib.ring import RingCall
from hostlib.transport.memory import LinkModel
from hostlib.tree import TreeCall

LANES = 8
POLICY = RetryPolicy(timeout=0.0005, min_timeout=0.0002, max_timeout=0.002, deadline=5.0)
# A peer retransmits at least every max_timeout: 40 of them without an answer ends a call
# whose last ack was lost only with probability ~0.35**20 per such ack.
LINGER = 40 * POLICY.max_timeout
LOSSY = LinkModel(loss=0.1, duplicate=0.1, reorder=0.2, reorder_delay=0.001)
KINDS = {"ring": RingCall, "tree": TreeCall}
SIZES = [1, LANES - 1, LANES + 1, 3 * LANES * 8 + 5, 1009]


class Group(FakePeers):
    """``n`` ranks' sessions (endpoints) on one fake network, kept across calls."""

    def __init__(
        self,
        kind: str,
        n: int,
        link: LinkModel | None = None,
        seed: int = 0,
        lanes: int = LANES,
        window: int = 16,
    ) -> None:
        super().__init__(n, POLICY, lanes, window, link, seed)
        self.call_type = KINDS[kind]

    def allreduce(self, inputs: np.ndarray) -> list[np.ndarray]:
        return self.run(lambda ep, x: self.call_type(ep, x, linger=LINGER), inputs)


# ----------------------------------------------------------------- exact results
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_every_size_gives_the_sum_on_every_rank(kind: str, n: int, dtype: type) -> None:
    rng = np.random.default_rng(n)
    group = Group(kind, n)
    for size in SIZES:
        inputs = random_inputs(rng, dtype, n, size)
        check_allreduce(group.allreduce(inputs), inputs)
    assert group.retransmissions == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_empty_input_and_a_single_rank(kind: str) -> None:
    group = Group(kind, 3)
    results = group.allreduce(np.zeros((3, 0), dtype=np.int32))
    assert all(r.size == 0 for r in results)
    x = np.arange(5, dtype=np.float32)[None]
    np.testing.assert_array_equal(Group(kind, 1).allreduce(x)[0], x[0])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_int32_wraps_like_numpy(kind: str) -> None:
    inputs = np.full((4, 3), 2**31 - 1, dtype=np.int32)
    np.testing.assert_array_equal(Group(kind, 4).allreduce(inputs)[0], np.full(3, -4))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_float32_is_added_in_float32(kind: str) -> None:
    # The exact sum 1 + 2**-23 is a float32, but both orders add 1 first (ring: rank 2's
    # element, then rank 0's, then rank 1's; tree: root, left, right): 1 + 2**-24 rounds
    # to 1 (ties to even) twice.
    inputs = np.array([[1.0], [2.0**-24], [2.0**-24]], np.float32)
    assert Group(kind, 3).allreduce(inputs)[0][0] == np.float32(1.0)


# ----------------------------------------------------------------- an impaired wire
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("seed", range(12))
def test_loss_duplication_and_reordering_give_the_lossless_bytes(kind: str, seed: int) -> None:
    n = 2 + seed % 7
    rng = np.random.default_rng(100 + seed)
    plan = [(np.int32, 37), (np.float32, 3 * LANES * n + 5), (np.float32, 1), (np.int32, 301)]
    calls = [random_inputs(rng, dtype, n, size) for dtype, size in plan]
    clean, lossy = Group(kind, n), Group(kind, n, LOSSY, seed=seed)
    for inputs in calls:
        want = clean.allreduce(inputs)
        got = lossy.allreduce(inputs)
        check_allreduce(got, inputs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    assert lossy.net.lost > 0 and lossy.retransmissions > 0
    assert sum(ep.stats.duplicates for ep in lossy.endpoints) > 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_small_window_and_full_size_packets(kind: str) -> None:
    n, rng = 5, np.random.default_rng(7)
    group = Group(kind, n, LOSSY, seed=3, lanes=LANES_PER_PACKET, window=2)
    inputs = random_inputs(rng, np.int32, n, 1000003 % 4099)
    check_allreduce(group.allreduce(inputs), inputs)


def test_a_rank_ahead_by_one_call_has_its_messages_kept() -> None:
    addrs = (("a", 1), ("b", 2))
    eps = [P2pEndpoint(PeerSpec(r, addrs, LANES), POLICY) for r in range(2)]
    x = np.arange(3, dtype=np.int32)
    calls: list[CollectiveCall] = [RingCall(ep, x) for ep in eps]
    first = list(calls)
    held: list[bytes | bytearray] = []

    def exchange(wire: list[bytes | bytearray], hold_acks_to_0: bool) -> list:
        for p in wire:
            if hold_acks_to_0 and p[3] == 0 and p[0] == P2P_ACK:
                held.append(p)
            else:
                calls[p[3]].on_datagram(memoryview(bytes(p)), 0.0)
        return calls[0].on_timer(0.0) + calls[1].on_timer(0.0)

    # Rank 0 does not hear rank 1's acks: rank 1 finishes call 1 first and starts call 2.
    wire = calls[0].start(0.0) + calls[1].start(0.0)
    while not calls[1].done:
        wire = exchange(wire, hold_acks_to_0=True)
    calls[1] = RingCall(eps[1], 10 * x)
    wire = exchange(wire + calls[1].start(0.0), hold_acks_to_0=True)
    assert not calls[0].done and eps[0].call == 1 and eps[0]._stash
    wire += held
    for _ in range(100):
        wire = exchange(wire, hold_acks_to_0=False)
        if calls[0].done and calls[0] is first[0]:
            calls[0] = RingCall(eps[0], 10 * x)
            wire += calls[0].start(0.0)
    assert calls[0].done and calls[1].done
    for got, want in zip([*first, *calls], [2 * x, 2 * x, 20 * x, 20 * x], strict=True):
        np.testing.assert_array_equal(got.result(), want)


# ----------------------------------------------------------------- failures
def test_a_dead_peer_times_out_with_a_clear_error() -> None:
    group = Group("ring", 3)
    group.net.kill(group.addrs[2], 0.0)
    calls = {
        a: RingCall(ep, np.ones(20, np.int32))
        for a, ep in zip(group.addrs, group.endpoints, strict=True)
    }
    errors = group.net.run(calls)  # type: ignore[arg-type]
    err = errors[group.addrs[1]]
    assert isinstance(err, P2pTimeoutError)
    assert "rank 1 call 1: no progress" in str(err) and "{2:" in str(err)


def test_mismatched_sizes_are_reported() -> None:
    group = Group("tree", 2)
    calls = {
        group.addrs[0]: TreeCall(group.endpoints[0], np.ones(4, np.int32)),
        group.addrs[1]: TreeCall(group.endpoints[1], np.ones(3, np.int32)),
    }
    with pytest.raises(P2pError, match="expected"):
        group.net.run(calls)  # type: ignore[arg-type]


def test_bad_input_and_specs_are_rejected() -> None:
    ep = P2pEndpoint(PeerSpec(0, (("a", 1), ("b", 2))))
    with pytest.raises(TypeError, match="float64"):
        RingCall(ep, np.ones(3))
    with pytest.raises(ValueError, match="1-D"):
        TreeCall(ep, np.ones((2, 2), np.int32))
    with pytest.raises(ValueError, match="rank"):
        PeerSpec(2, (("a", 1), ("b", 2)))
    with pytest.raises(ValueError, match="share"):
        PeerSpec(0, (("a", 1), ("a", 1)))
    with pytest.raises(ValueError, match="lanes"):
        PeerSpec(0, (("a", 1),), lanes=0)


# ----------------------------------------------------------------- the wire
def test_the_header_is_16_bytes_and_no_ina_packet() -> None:
    assert P2P_HEADER.size == HEADER_SIZE == 16
    assert {P2P_DATA >> 4, P2P_ACK >> 4} == {0xA} != {PROTOCOL_VERSION}
    ep = P2pEndpoint(PeerSpec(1, (("a", 1), ("b", 2), ("c", 3)), lanes=4))
    call = RingCall(ep, np.array([1, 2, 3, 4, 5, 6], np.int32))
    (packet,) = call.start(0.0)  # segment 1 = [2, 4) goes to rank 2
    vt, flags, src, dst, seq, tag, callno, count = P2P_HEADER.unpack_from(packet)
    assert (vt, flags, src, dst, seq, tag, callno, count) == (P2P_DATA, 0, 1, 2, 1, 0, 1, 2)
    assert np.frombuffer(packet, "<i4", offset=16).tolist() == [3, 4]


def test_duplicates_are_acknowledged_again_but_delivered_once() -> None:
    addrs = (("a", 1), ("b", 2))
    eps = [P2pEndpoint(PeerSpec(r, addrs, LANES), POLICY) for r in range(2)]
    calls = [TreeCall(ep, np.full(3, r + 1, np.int32)) for r, ep in enumerate(eps)]
    calls[0].start(0.0)
    (up,) = calls[1].start(0.0)
    for _ in range(3):
        calls[0].on_datagram(memoryview(bytes(up)), 0.001)
    acks = calls[0].on_timer(0.001)
    kinds = [P2P_HEADER.unpack_from(p)[0] for p in acks]
    assert kinds.count(P2P_ACK) == 3 and kinds.count(P2P_DATA) == 1  # + the broadcast
    assert eps[0].stats.duplicates == 2
    assert math.isclose(eps[0].last_rx, 0.001)
