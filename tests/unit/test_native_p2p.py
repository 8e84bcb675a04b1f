"""The native point-to-point core against the Python engine (differential test).

Ring allreduce, reduce_scatter and all_gather and the tree allreduce run on the fake
network twice, once on :class:`~hostlib.p2p.P2pEndpoint` with RingCall/TreeCall (the
specification) and once on the native core, with the same random loss, duplication and
reordering drawn per transmission: every datagram each rank emits, with its event and
virtual time, the results, the counters and the RTT estimates must be identical, for 200
seeds per collective and dtype, 1 to 8 ranks, odd sizes, several packet widths and
windows, stalls of the whole machine (timers served late), and calls that follow each
other on one session's channels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import ROUTER, Router, random_inputs

from hostlib.errors import P2pError
from hostlib.ina import RetryPolicy
from hostlib.native import NativeCollectiveCall, NativeP2pEndpoint, native_p2p_unavailable
from hostlib.p2p import P2pEndpoint
from hostlib.p2pwire import PeerSpec
from hostlib.ring import RingCall
from hostlib.transport.memory import FakeNetwork, LinkModel
from hostlib.tree import TreeCall

pytestmark = pytest.mark.skipif(
    native_p2p_unavailable() is not None, reason=str(native_p2p_unavailable())
)

POLICY = RetryPolicy(timeout=0.002, min_timeout=0.0005, max_timeout=0.02, deadline=5.0)
LINKS = [
    LinkModel(),
    LinkModel(loss=0.05),
    LinkModel(loss=0.1, duplicate=0.1, reorder=0.2, reorder_delay=0.001),
]
OPERATIONS = ("allreduce", "reduce_scatter", "all_gather", "tree")


class Recorder:
    def __init__(self, call: Any, log: list[tuple[str, float, bytes]]) -> None:
        self.call, self.log = call, log

    @property
    def done(self) -> bool:
        return bool(self.call.done)

    def next_wakeup(self) -> float:
        return float(self.call.next_wakeup())

    def start(self, now: float) -> list[Any]:
        out = self.call.start(now)
        self.log.extend(("start", now, bytes(p)) for p in out)
        return list(out)

    def on_datagram(self, data: memoryview, now: float) -> None:
        self.call.on_datagram(data, now)

    def on_timer(self, now: float) -> list[Any]:
        out = self.call.on_timer(now)
        self.log.extend(("timer", now, bytes(p)) for p in out)
        return list(out)


# A finished rank stays on the fake network this long without a datagram (virtual
# seconds) to answer a peer whose last ack was lost: the fake network's driver stops
# feeding finished calls, as no responder runs there. A peer retransmits at least every
# max_timeout, so 40 of them (as tests/unit/test_ring_tree.py) leave a finished rank
# unreachable only after ~40 losses in a row; 0.1 s (5 of them) once lost all of them on
# the loss-10% link (each copy crosses it twice) after the D-SACK change moved the draws.
LINGER = 40 * POLICY.max_timeout


def _make(native: bool, operation: str, ep: Any, x: np.ndarray, lanes: int, window: int) -> Any:
    if native:
        tree = operation == "tree"
        phase = "allreduce" if tree else operation
        return NativeCollectiveCall(
            ep, x, LINGER, lanes=lanes, window=window, phase=phase, tree=tree
        )
    if operation == "tree":
        return TreeCall(ep, x, LINGER, lanes=lanes, window=window)
    return RingCall(ep, x, LINGER, lanes=lanes, window=window, phase=operation)


def _session(native: bool, operation: str, seed: int, dtype: type) -> tuple[list[Any], list[Any]]:
    rng = np.random.default_rng(seed)
    n = 1 + seed % 8
    link = LINKS[seed % 3]
    addrs = [(f"10.1.0.{r + 1}", 7000 + r) for r in range(n)]
    kind = NativeP2pEndpoint if native else P2pEndpoint
    endpoints = [kind(PeerSpec(r, tuple(addrs), 16, 4), POLICY) for r in range(n)]
    net = FakeNetwork(Router(addrs), ROUTER, link, seed=seed)
    logs: list[list[tuple[str, float, bytes]]] = [[] for _ in range(n)]
    results: list[Any] = []
    for _ in range(3):
        size = int(rng.integers(0, 12 * 16))
        lanes, window = int(rng.choice([2, 5, 16])), int(rng.integers(1, 6))
        per_rank = size // n if operation == "all_gather" else size
        inputs = random_inputs(rng, dtype, n, per_rank) if per_rank else np.zeros((n, 0), dtype)
        if seed % 4 == 1:  # the machine stalls (timers served late): before, inside, past
            for _ in range(3):
                net.stall(net.now + float(rng.uniform(0, 0.01)), float(rng.uniform(0, 0.04)))
        calls = {
            a: _make(native, operation, endpoints[r], inputs[r], lanes, window)
            for r, a in enumerate(addrs)
        }
        recorders = {a: Recorder(calls[a], logs[r]) for r, a in enumerate(addrs)}
        errors = net.run(recorders)  # type: ignore[arg-type]
        assert all(e is None for e in errors.values()), errors
        results.extend(np.array(calls[a].result()) for a in addrs)
    for ep in endpoints:
        s = ep.stats
        results.append(
            np.array(
                [
                    s.sent, s.retransmitted, s.fast_retransmitted, s.duplicates, s.spurious,
                    s.late_timers,
                ]
            )
        )
        results.append(np.array([ep.rtt.rto, ep.rtt.srtt, ep.rtt.rttvar, ep.rtt.samples]))
    return logs, results


QUICK = 12
"""Seeds in the quick run; the rest of the 200 are marked slow."""


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize(
    "seed", [s if s < QUICK else pytest.param(s, marks=pytest.mark.slow) for s in range(200)]
)
def test_native_p2p_emits_what_the_python_engine_emits(
    seed: int, operation: str, dtype: type
) -> None:
    want_logs, want = _session(False, operation, seed, dtype)
    got_logs, got = _session(True, operation, seed, dtype)
    for rank, (g, w) in enumerate(zip(got_logs, want_logs, strict=True)):
        assert len(g) == len(w), f"rank {rank}: {len(g)} datagrams, the specification {len(w)}"
        for k, (ge, we) in enumerate(zip(g, w, strict=True)):
            assert ge == we, f"rank {rank}, datagram {k}: {ge} vs {we}"
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def test_a_wrong_message_raises_the_python_engines_error() -> None:
    addrs = (("10.1.0.1", 1), ("10.1.0.2", 2))
    messages = []
    for native in (False, True):
        eps = [
            (NativeP2pEndpoint if native else P2pEndpoint)(PeerSpec(r, addrs, 8, 4), POLICY)
            for r in range(2)
        ]
        a = _make(native, "allreduce", eps[0], np.zeros(16, np.int32), 16, 4)
        b = _make(native, "allreduce", eps[1], np.zeros(24, np.int32), 16, 4)  # another size
        b.start(0.0)
        packets = a.start(0.0)
        with pytest.raises(P2pError) as err:
            for p in packets:
                b.on_datagram(memoryview(bytes(p)), 0.001)
        messages.append(str(err.value))
    assert messages[0] == messages[1], messages


# ------------------------------------------------- where the native ring reads its input
def _ring_results(native: bool, xs: list[np.ndarray], outs: list[Any]) -> list[np.ndarray]:
    """One ring allreduce of ``len(xs)`` ranks on a lossy fake network, each rank's
    result (in ``outs[r]`` where it is not None)."""
    n = len(xs)
    addrs = [(f"10.1.0.{r + 1}", 7000 + r) for r in range(n)]
    kind = NativeP2pEndpoint if native else P2pEndpoint
    eps = [kind(PeerSpec(r, tuple(addrs), 16, 4), POLICY) for r in range(n)]
    if native:
        calls = [
            NativeCollectiveCall(eps[r], xs[r], LINGER, lanes=5, window=3, out=outs[r])
            for r in range(n)
        ]
    else:
        calls = [RingCall(eps[r], xs[r], LINGER, lanes=5, window=3) for r in range(n)]
    net = FakeNetwork(Router(addrs), ROUTER, LINKS[2], seed=7)
    errors = net.run(dict(zip(addrs, calls, strict=True)))  # type: ignore[arg-type]
    assert all(e is None for e in errors.values()), errors
    return [np.asarray(c.result()) for c in calls]


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_a_ring_reduces_into_separate_memory_from_the_input_where_it_is(dtype: type) -> None:
    # The core reads each rank's input in place and writes input + received into the
    # result: the input stays as it was, and the bytes are the specification's.
    rng = np.random.default_rng(1)
    xs = list(random_inputs(rng, dtype, 3, 101))
    kept = [x.copy() for x in xs]
    outs = [np.full_like(x, 7) for x in xs]  # garbage that must not leak into the sum
    got = _ring_results(True, xs, outs)
    want = _ring_results(False, kept, [None] * 3)
    for g, w, out in zip(got, want, outs, strict=True):
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
        assert np.shares_memory(g, out)
    for x, k in zip(xs, kept, strict=True):
        np.testing.assert_array_equal(x, k)


def test_a_ring_over_a_strided_or_overlapping_input_copies_it_first() -> None:
    rng = np.random.default_rng(2)
    base = [random_inputs(rng, np.int32, 1, 202)[0] for _ in range(3)]
    strided = [b[::2] for b in base]  # not contiguous: the core cannot read it in place
    want = _ring_results(False, [s.copy() for s in strided], [None] * 3)
    got = _ring_results(True, strided, [None] * 3)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    # the result overlapping the input by half: read in place, it would read sums
    xs = [np.concatenate([b[:101], np.zeros(50, np.int32)]) for b in base]
    ins = [x[:101] for x in xs]
    want = _ring_results(False, [i.copy() for i in ins], [None] * 3)
    got = _ring_results(True, ins, [x[50:151] for x in xs])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_core_takes_a_separate_input_for_ring_allreduce_only() -> None:
    from hostlib import _p2pcore

    ep = NativeP2pEndpoint(PeerSpec(0, (("10.1.0.1", 1), ("10.1.0.2", 2)), 8, 4), POLICY)
    out, x = np.zeros(16, np.int32), np.ones(16, np.int32)
    with pytest.raises(ValueError, match="ring allreduce"):
        _p2pcore.Call(ep.core, 3, out, False, 8, 4, 0.0, x)  # a tree
    with pytest.raises(ValueError, match="differ in size"):
        _p2pcore.Call(ep.core, 0, out, False, 8, 4, 0.0, x[:8])
