"""The round-trip estimator's gains divided by the samples a round trip brings (RFC 7323,
Appendix G; ``hostlib.ina._Rtt.update``), and the p2p layer passing the packets in flight.

The point-to-point layer takes a sample from every acked packet, up to a 64-packet window
of them per round trip. With RFC 6298's gains per sample, ``rttvar`` shrank within one
round trip while a receiver's queue was short; when the queue grew, the round trip
doubled, and a whole window's timers fired before the acks came (star4 at 200 Mbit/s,
16 MiB ring: 10,950 timer retransmissions, all late answers). The native core computes
the same numbers (``test_native_p2p.py`` compares its round-trip state with these)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hostlib.ina import RetryPolicy, _Rtt
from hostlib.p2p import P2pEndpoint
from hostlib.p2pwire import PeerSpec

POLICY = RetryPolicy(timeout=0.02, min_timeout=0.001, max_timeout=1.0, deadline=5.0)
WINDOW = 64


def _rto_low(flight: int, round_trips: int = 20) -> float:
    """The lowest timeout while round trips alternate between 20 and 40 ms, a window of
    samples each (a receiver's queue short, then full, then short again)."""
    rtt, low = _Rtt(POLICY.timeout), float("inf")
    for trip in range(round_trips):
        sample = 0.020 if trip % 2 == 0 else 0.040
        for _ in range(WINDOW):
            rtt.update(sample, POLICY, flight)
            if trip >= 4:  # past the first round trips' start
                low = min(low, rtt.rto)
    return low


def test_a_window_of_samples_per_round_trip_keeps_the_timeout_above_the_long_trips() -> None:
    assert _rto_low(WINDOW) > 0.040  # rttvar spans the round trips' variation
    assert _rto_low(1) < 0.030  # RFC 6298's gains per sample: a 40 ms trip would time out


def test_one_sample_per_round_trip_is_rfc_6298_as_it_was() -> None:
    rtt = _Rtt(POLICY.timeout)
    rtt.update(0.010, POLICY)
    rtt.update(0.030, POLICY, 1)
    assert rtt.rttvar == 0.75 * 0.005 + 0.25 * abs(0.010 - 0.030)
    assert rtt.srtt == 0.875 * 0.010 + 0.125 * 0.030
    assert rtt.rto == rtt.srtt + 4 * rtt.rttvar


def test_a_sample_moves_the_estimate_by_the_gains_over_the_flight() -> None:
    rtt = _Rtt(POLICY.timeout)
    rtt.update(0.010, POLICY, 8)  # the first sample sets it whatever the flight
    assert (rtt.srtt, rtt.rttvar) == (0.010, 0.005)
    rtt.update(0.030, POLICY, 8)
    assert rtt.rttvar == pytest.approx(0.005 + (0.020 - 0.005) / 32)
    assert rtt.srtt == pytest.approx(0.010 + 0.020 / 64)


def test_the_endpoint_divides_by_the_packets_in_flight_but_not_the_samples_not_yet_taken() -> None:
    addrs = (("10.1.0.1", 7000), ("10.1.0.2", 7001))
    a, b = (P2pEndpoint(PeerSpec(r, addrs, 16, 8), POLICY) for r in (0, 1))
    got: list[Any] = []
    for ep in (a, b):
        ep.begin_call(lambda *m: got.append(m), 0.0)
    for tag in range(8):  # a window of 8 one-packet messages, all in flight
        a.send(1, tag, np.arange(4, dtype=np.int32) + tag, 0.0)
    data = a.take_outbox()
    assert len(data) == 8
    expected = _Rtt(POLICY.timeout)
    for i, packet in enumerate(data):  # acked one by one, 10 ms apart
        now = 0.010 * (i + 1)
        b.on_datagram(memoryview(bytes(packet)), now)
        (ack,) = b.take_outbox()
        a.on_datagram(memoryview(bytes(ack)), now)
        # The acked one and those still in flight, at most the samples taken before.
        expected.update(now, POLICY, min(8 - i, max(i, 1)))  # 1, 1, 2, 3, 4, 3, 2, 1
        assert (a.rtt.srtt, a.rtt.rttvar, a.rtt.rto) == (
            expected.srtt, expected.rttvar, expected.rto
        )  # fmt: skip
    assert not a.unacked and a.rtt.samples == 8
