"""Bytes on the wire per call: a host's head rank reads its link's transmit counter, the
rows sum the hosts, and the JSON carries it (absent on loopback)."""

from __future__ import annotations

import socket

import pytest

from emulation.bench.report import Row, merge_ranks
from emulation.bench.workers import Placement, SizeResult, _own_link, link_tx_bytes


def test_the_link_counter_is_the_interface_s_and_moves_with_traffic() -> None:
    before = link_tx_bytes("lo")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(bytes(1000), ("127.0.0.1", 9))  # discard; loopback counts it either way
    assert link_tx_bytes("lo") - before >= 1000 + 28
    with pytest.raises(KeyError, match="no interface 'nope0'"):
        link_tx_bytes("nope0")


def test_only_a_host_s_head_rank_in_its_own_namespace_measures() -> None:
    assert _own_link(Placement()) is None  # loopback: lo carries every rank's traffic
    host = Placement(netns="/proc/1/ns/net", ifname="h1-eth0")
    assert _own_link(host) == "h1-eth0"
    second = Placement(netns="/proc/1/ns/net", ifname="h1-eth0", local_rank=1)
    assert _own_link(second) is None


def _result(sent: int | None) -> SizeResult:
    return SizeResult(4096, 1024, 10.0, 0, 0.0, sent_bytes=sent)


def test_rows_sum_the_hosts_and_round_trip_through_json() -> None:
    (row,) = merge_ranks("ina", "int32", [[_result(5000)], [_result(None)], [_result(7000)]])
    assert row.sent_bytes == 12000
    back = Row.from_json(row.to_json(), row.num_workers)
    assert back.sent_bytes == 12000
    (loop,) = merge_ranks("ring", "int32", [[_result(None)], [_result(None)]])
    assert loop.sent_bytes is None and "sent_bytes" not in loop.to_json()
