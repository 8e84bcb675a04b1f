"""Spurious timeouts of the p2p layer (``hostlib.p2p``'s docstring): every ack echoes
the FLAG_RESEND of the DATA it answers, so an ack that names a retransmitted packet and
answers its original shows the timer fired only on a delay, and that delay enters the
round-trip estimate; an ack of a copy (the original or its ack lost, or a duplicate of
the copy) teaches nothing.

Two endpoints in virtual time, datagrams handed over by hand. The native engine does the
same on every event: ``test_native_p2p.py`` compares their packets and round-trip state
under loss and duplication, which produce every case."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hostlib.ina import RetryPolicy
from hostlib.p2p import P2pEndpoint
from hostlib.p2pwire import FLAG_DUPLICATE, P2P_HEADER, PeerSpec
from hostlib.protocol import FLAG_RESEND

POLICY = RetryPolicy(timeout=0.002, min_timeout=0.0005, max_timeout=0.05, deadline=5.0)
ADDRS = (("10.1.0.1", 7000), ("10.1.0.2", 7001))


def _pair() -> tuple[P2pEndpoint, P2pEndpoint]:
    a, b = (P2pEndpoint(PeerSpec(r, ADDRS, 16, 4), POLICY) for r in (0, 1))
    got: list[Any] = []
    a.begin_call(lambda *m: got.append(m), 0.0)
    b.begin_call(lambda *m: got.append(m), 0.0)
    return a, b


def _one(ep: P2pEndpoint) -> bytes:
    out = ep.take_outbox()
    assert len(out) == 1, out
    return bytes(out[0])


def _sent_then_timed_out(a: P2pEndpoint) -> tuple[bytes, bytes]:
    a.send(1, 0, np.arange(4, dtype=np.int32), 0.0)
    original = _one(a)
    fires = a.next_timer()
    assert fires == pytest.approx(POLICY.timeout)
    a.on_timer(fires)
    copy = _one(a)
    assert a.stats.retransmitted == 1
    return original, copy


def test_an_ack_of_the_original_makes_the_delay_a_sample() -> None:
    a, b = _pair()
    original, copy = _sent_then_timed_out(a)
    assert copy[1] & FLAG_RESEND and not original[1] & FLAG_RESEND
    b.on_datagram(memoryview(original), 0.009)  # the original was only late: 9 ms
    first_ack = _one(b)
    assert first_ack[1] & (FLAG_RESEND | FLAG_DUPLICATE) == 0
    a.on_datagram(memoryview(first_ack), 0.010)
    assert not a.unacked
    assert a.stats.spurious == 1 and a.rtt.samples == 1
    assert a.rtt.srtt == pytest.approx(0.010)  # from the original send to its ack
    assert a.rtt.rto == pytest.approx(0.030)  # srtt + 4 * srtt / 2: above the 9 ms delay
    b.on_datagram(memoryview(copy), 0.011)  # the copy arrives: b had it
    dsack = _one(b)
    assert dsack[1] & FLAG_DUPLICATE and dsack[1] & FLAG_RESEND
    assert P2P_HEADER.unpack_from(dsack)[4] == 1
    a.on_datagram(memoryview(dsack), 0.012)  # once only
    assert a.stats.spurious == 1 and a.rtt.samples == 1


def test_a_copy_that_replaced_a_lost_ack_teaches_nothing() -> None:
    a, b = _pair()
    original, copy = _sent_then_timed_out(a)
    b.on_datagram(memoryview(original), 0.001)
    _one(b)  # its ack is lost
    b.on_datagram(memoryview(copy), 0.003)
    dsack = _one(b)
    assert dsack[1] & FLAG_DUPLICATE and dsack[1] & FLAG_RESEND
    a.on_datagram(memoryview(dsack), 0.004)  # the first ack a sees answers the copy
    assert not a.unacked
    assert a.stats.spurious == 0 and a.rtt.samples == 0
    assert a.rtt.rto == pytest.approx(POLICY.timeout * POLICY.backoff)  # backed off, kept


def test_a_duplicated_copy_of_a_lost_original_teaches_nothing() -> None:
    """The network duplicates the copy that replaced a lost original: the second ack is
    a D-SACK, and still no sample (the first version of this took one, from the original
    send, timeout included, and the lossy tests' timeouts grew 2.6 times)."""
    a, b = _pair()
    _original, copy = _sent_then_timed_out(a)  # the original is lost
    for at in (0.003, 0.0031):
        b.on_datagram(memoryview(copy), at)
    ack, dsack = (bytes(x) for x in b.take_outbox())
    assert ack[1] == FLAG_RESEND and dsack[1] == FLAG_RESEND | FLAG_DUPLICATE
    a.on_datagram(memoryview(ack), 0.004)
    a.on_datagram(memoryview(dsack), 0.0041)
    assert not a.unacked
    assert a.stats.spurious == 0 and a.rtt.samples == 0
