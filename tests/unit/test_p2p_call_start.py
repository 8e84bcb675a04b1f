"""Ring ranks that enter a call apart, in virtual time, on both p2p engines.

A rank that finished a call answers its peers between calls (the session's responder):
it keeps and acknowledges the next call's early packets. While it then starts that call
(queueing its first messages under the session's lock) nobody answers: 6-9 ms on this
VM (star4, 64 MiB, by pcap), and a faster peer's timers, at the 10 ms floor by then,
fired. The responder's acks carry FLAG_EARLY, and until a peer answers a DATA of the
current call without it, packets to it wait at least ``RetryPolicy.timeout`` (20 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import ROUTER, Router, check_allreduce, random_inputs

from hostlib.ina import RetryPolicy
from hostlib.native import NativeCollectiveCall, NativeP2pEndpoint, native_p2p_unavailable
from hostlib.p2p import P2pEndpoint
from hostlib.p2pwire import FLAG_EARLY, P2P_ACK, P2P_HEADER, PeerSpec
from hostlib.ring import RingCall
from hostlib.transport.memory import FakeNetwork, LinkModel

WORKERS = 4
LANES = 16
WINDOW = 4
# 0.5 ms each way: a window of 4 crosses a ring hop every millisecond, so a call's
# packets are still flowing when the late rank stops answering; the estimator sits at
# its 10 ms floor.
LINK = LinkModel(latency=0.0005)
POLICY = RetryPolicy(timeout=0.02, min_timeout=0.01, max_timeout=0.5, deadline=30.0)
FLOOR = RetryPolicy(timeout=0.01, min_timeout=0.01, max_timeout=0.5, deadline=30.0)

_NO_NATIVE = native_p2p_unavailable()
P2P = [
    pytest.param(False, id="python"),
    pytest.param(
        True, id="native", marks=pytest.mark.skipif(_NO_NATIVE is not None, reason=str(_NO_NATIVE))
    ),
]


class Session:
    """One rank's session of back-to-back ring calls, driven by the fake network like
    ``hostlib.peers.PeerCollective``: between calls the endpoint answers as the responder
    does for ``idle`` seconds, then nothing reads the socket for ``deaf`` seconds (the
    rank starting its call), then the next call starts and takes what arrived meanwhile."""

    def __init__(
        self, endpoint: Any, native: bool, inputs: list[np.ndarray], idle: float, deaf: float
    ) -> None:
        self.ep, self.native, self.inputs = endpoint, native, inputs
        self.idle, self.deaf = idle, deaf
        self.results: list[np.ndarray] = []
        self.acks: list[tuple[bytes, int]] = []  # every ACK sent, with calls started then
        self.call: Any = None
        self.state, self.until = "call", 0.0
        self.held: list[bytes] = []

    def _new_call(self, now: float) -> list[Any]:
        x = self.inputs[len(self.results)]
        if self.native:
            self.call = NativeCollectiveCall(self.ep, x, lanes=LANES, window=WINDOW)
        else:
            self.call = RingCall(self.ep, x, lanes=LANES, window=WINDOW)
        self.state = "call"
        out = list(self.call.start(now))
        for data in self.held:
            self.call.on_datagram(memoryview(data), now)
        self.held = []
        return self._record(out + list(self.call.on_timer(now)))

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.inputs)

    def start(self, now: float) -> list[Any]:
        return self._new_call(now)

    def _record(self, packets: list[Any]) -> list[Any]:
        started = len(self.results) + (self.state == "call")
        self.acks += [(bytes(p), started) for p in packets if p[0] == P2P_ACK]
        return packets

    def next_wakeup(self) -> float:
        if self.state == "call":
            return float(self.call.next_wakeup())
        if self.state == "idle":
            return min(float(self.ep.next_timer()), self.until)
        return self.until

    def on_datagram(self, data: memoryview, now: float) -> None:
        if self.state == "call":
            self.call.on_datagram(data, now)
        elif self.state == "idle":
            self.ep.on_datagram(data, now)
        else:
            self.held.append(bytes(data))

    def on_timer(self, now: float) -> list[Any]:
        out: list[Any] = []
        if self.state == "call":
            out += self._record(list(self.call.on_timer(now)))
            if self.call.done:
                self.results.append(np.array(self.call.result()))
                if not self.done:
                    self.state, self.until = "idle", now + self.idle
        if self.state == "idle":
            self.ep.on_timer(now)
            out += self._record(list(self.ep.take_outbox()))
            if now >= self.until:
                self.state, self.until = "deaf", now + self.deaf
        if self.state == "deaf" and now >= self.until:
            out += self._new_call(now)
        return out


def _two_calls(native: bool, idle: float, deaf: float, policy: RetryPolicy = POLICY) -> Any:
    """Two int32 ring calls of four ranks; rank 3 answers as the responder for ``idle``
    seconds after its first call, then not at all for ``deaf`` seconds, then enters the
    second. Each rank's stats and sessions."""
    rng = np.random.default_rng(5)
    addrs = [(f"10.2.0.{r + 1}", 7100 + r) for r in range(WORKERS)]
    kind: Any = NativeP2pEndpoint if native else P2pEndpoint
    endpoints = [kind(PeerSpec(r, tuple(addrs), LANES, WINDOW), policy) for r in range(WORKERS)]
    inputs = [random_inputs(rng, np.int32, WORKERS, 100 * LANES) for _ in range(2)]
    sessions = [
        Session(endpoints[r], native, [inputs[0][r], inputs[1][r]],
                idle if r == 3 else 0.0, deaf if r == 3 else 0.0)
        for r in range(WORKERS)
    ]  # fmt: skip
    net = FakeNetwork(Router(addrs), ROUTER, LINK, seed=0)
    errors = net.run(dict(zip(addrs, sessions, strict=True)))
    assert all(e is None for e in errors.values()), errors
    for k in range(2):
        check_allreduce([s.results[k] for s in sessions], inputs[k])
    return [ep.stats for ep in endpoints], sessions


@pytest.mark.parametrize("native", P2P)
def test_a_rank_deaf_for_15_ms_while_entering_its_call_gets_nothing_again(native: bool) -> None:
    stats, sessions = _two_calls(native, idle=0.005, deaf=0.015)
    assert [s.retransmitted for s in stats] == [0] * WORKERS
    # rank 3's responder acknowledged rank 2's early packets, and said so
    early = [a for a, _ in sessions[3].acks if P2P_HEADER.unpack(a)[1] & FLAG_EARLY]
    assert early and {P2P_HEADER.unpack(a)[3] for a in early} == {2}
    _every_ack_says_whether_its_call_had_started(sessions)


@pytest.mark.parametrize("native", P2P)
def test_with_the_floor_for_an_entering_peer_its_sender_resends_the_window(native: bool) -> None:
    stats, _ = _two_calls(native, idle=0.005, deaf=0.015, policy=FLOOR)
    assert [s.retransmitted for s in stats] == [0, 0, WINDOW, 0]


@pytest.mark.parametrize("native", P2P)
def test_a_rank_deaf_longer_than_the_timeout_costs_one_window_sent_again(native: bool) -> None:
    stats, _ = _two_calls(native, idle=0.005, deaf=0.025)
    assert [s.retransmitted for s in stats] == [0, 0, WINDOW, 0]


def _every_ack_says_whether_its_call_had_started(sessions: list[Session]) -> None:
    """FLAG_EARLY exactly on the acks of DATA of a call their sender had not started."""
    for s in sessions:
        for ack, started in s.acks:
            call, flags = P2P_HEADER.unpack(ack)[6], P2P_HEADER.unpack(ack)[1]
            assert bool(flags & FLAG_EARLY) == (call > started), (call, started, flags)


@pytest.mark.parametrize("native", P2P)
def test_acks_carry_the_early_flag_only_before_their_call(native: bool) -> None:
    _, sessions = _two_calls(native, idle=0.0, deaf=0.0)
    _every_ack_says_whether_its_call_had_started(sessions)
