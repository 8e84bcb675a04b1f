"""The wire floor without a network: its native sender on real loopback sockets, its
arithmetic and flags, and the refusals of ``inalab emulate ... wire-floor`` that come
before any network is built (no root)."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest

from emulation.bench.fabric import LoopbackFabric
from emulation.bench.wirefloor import (
    LATE_SHARE_BOUND,
    RankFloor,
    WireFloor,
    measure_wire_floor,
    report_lines,
)
from emulation.cli import build_parser, main

_wirecore = pytest.importorskip("emulation.bench._wirecore")

STAR4 = str(Path(__file__).resolve().parents[2] / "topologies" / "star4.yaml")


@pytest.mark.parametrize(
    "args",
    [
        (-1, 0, 8, 1024, 1e8, 0.1, 0.0),  # no descriptor
        (0, 0, 0, 1024, 1e8, 0.1, 0.0),  # no datagram per period
        (0, 0, 1025, 1024, 1e8, 0.1, 0.0),  # batch above the bound
        (0, 0, 8, 7, 1e8, 0.1, 0.0),  # datagram below the sequence number
        (0, 0, 8, 65508, 1e8, 0.1, 0.0),  # above IPv4's largest UDP payload
        (0, 0, 8, 1024, 0.0, 0.1, 0.0),  # no rate
        (0, 0, 8, 1024, float("nan"), 0.1, 0.0),
        (0, 0, 8, 1024, 1e8, -1.0, 0.0),  # no interval
        (0, 0, 8, 1024, 1e8, 0.1, 61.0),  # a quiet wait past the bound
    ],
)
def test_the_sender_refuses_bad_arguments(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="need descriptors"):
        _wirecore.run(*args)


def test_a_descriptor_that_is_no_socket_is_an_oserror() -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(OSError):
            _wirecore.run(r, r, 4, 1024, 1e8, 0.05, 0.0)
    finally:
        os.close(r)
        os.close(w)


def test_one_sender_paces_and_counts_what_it_sent_to_itself() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        rx.bind(("127.0.0.1", 0))
        tx.connect(rx.getsockname())
        c = _wirecore.run(tx.fileno(), rx.fileno(), 4, 1024, 50e6, 0.2, 0.05)
    assert set(c) == {"sent", "received", "late_periods", "periods", "seconds", "cpu_s"}
    assert c["sent"] == 4 * c["periods"] > 0
    assert c["received"] == c["sent"]  # loopback: nothing lost, all drained at the end
    assert 0 <= c["late_periods"] <= c["periods"]
    assert c["seconds"] >= 0.2 and c["cpu_s"] > 0


def test_every_rank_receives_what_the_previous_one_sent_over_loopback() -> None:
    floor = measure_wire_floor(LoopbackFabric(), 3, 2064, 4, 100.0, 0.3)
    assert [r.rank for r in floor.ranks] == [0, 1, 2]
    for i, r in enumerate(floor.ranks):
        assert r.sent == 4 * r.periods > 0
        assert r.received == floor.ranks[i - 1].sent
        assert r.cpu_s > 0 and r.seconds >= 0.3
    assert floor.lost == 0 and floor.link_drops == {}
    doc = floor.to_json()
    assert (doc["datagram_bytes"], doc["batch"], doc["rate_mbit"]) == (2064, 4, 100.0)
    assert [d["received"] for d in doc["ranks"]] == [r.received for r in floor.ranks]
    assert doc["cpu_s_per_gbit"] == round(floor.mean_cpu_s_per_gbit, 4) > 0
    assert any(line.startswith("# floor: ") for line in report_lines(floor, "loopback"))


@pytest.mark.parametrize(
    ("workers", "datagram", "batch", "rate", "seconds"),
    [(1, 1024, 4, 100.0, 1.0), (2, 4, 4, 100.0, 1.0), (2, 1024, 0, 100.0, 1.0),
     (2, 1024, 4, 0.0, 1.0), (2, 1024, 4, 100.0, 0.0)],
)  # fmt: skip
def test_measuring_refuses_bad_parameters_before_starting_ranks(
    workers: int, datagram: int, batch: int, rate: float, seconds: float
) -> None:
    with pytest.raises(ValueError):
        measure_wire_floor(LoopbackFabric(), workers, datagram, batch, rate, seconds)


def _floor(*ranks: RankFloor, drops: dict[str, int] | None = None) -> WireFloor:
    return WireFloor(1000, 8, 950.0, tuple(ranks), drops or {})


def test_the_floor_is_the_ranks_mean_cpu_per_gbit_sent() -> None:
    # 125,000 datagrams of 1,000 bytes are one Gbit.
    a = RankFloor(0, 125_000, 250_000, 0.2, 1.0, 1000, 0)
    b = RankFloor(1, 250_000, 125_000, 0.2, 2.0, 1000, 0)
    floor = _floor(a, b)
    assert math.isclose(floor.cpu_s_per_gbit(a), 0.2)
    assert math.isclose(floor.cpu_s_per_gbit(b), 0.1)
    assert math.isclose(floor.mean_cpu_s_per_gbit, 0.15)
    assert math.isclose(floor.gbit_per_s(a), 1.0) and math.isclose(floor.gbit_per_s(b), 1.0)
    assert floor.lost == 0  # a got all of b's, b all of a's
    assert math.isnan(floor.cpu_s_per_gbit(RankFloor(2, 0, 0, 0.1, 1.0, 0, 0)))


def test_losses_and_a_host_bound_rank_are_flagged() -> None:
    bound = int(LATE_SHARE_BOUND * 1000)
    ok = RankFloor(0, 1000, 990, 0.1, 1.0, 1000, bound)  # at the bound: still paced
    floor = _floor(ok, RankFloor(1, 1000, 1000, 0.1, 1.0, 1000, bound), drops={"s1-eth1": 10})
    assert floor.lost == 10 and not floor.host_bound
    lines = report_lines(floor, "star")
    assert "# lost: 10 datagrams sent were not received (link drops: s1-eth1 10)" in lines
    assert not any(line.startswith("# host-bound") for line in lines)
    late = _floor(ok, RankFloor(1, 1000, 1000, 0.1, 1.0, 1000, bound + 1))
    assert late.host_bound
    assert any(line.startswith("# host-bound") for line in report_lines(late, "star"))


def test_the_command_line_takes_the_floors_options() -> None:
    args = build_parser().parse_args(["emulate", STAR4, "wire-floor"])
    assert (args.action, args.seconds, args.rate, args.batch, args.lanes) == (
        "wire-floor", 5.0, None, 8, None
    )  # fmt: skip
    args = build_parser().parse_args(
        ["emulate", STAR4, "wire-floor", "--rate", "90", "--batch", "4", "--lanes", "64"]
    )
    assert (args.rate, args.batch, args.lanes) == (90.0, 4, 64)


def test_unshaped_host_links_need_a_rate_before_any_network_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo = tmp_path / "flat.yaml"
    topo.write_text(
        "name: flat\nswitches: {s1: {kind: soft}}\nhosts: {h1: {}, h2: {}}\n"
        "links: [[h1, s1], [h2, s1]]\njobs: [{id: 1, workers: [h1, h2], switch: s1}]\n"
    )
    assert main(["emulate", str(topo), "wire-floor"]) == 2
    err = capsys.readouterr().err
    assert "wire-floor needs every host link shaped at one rate (here: unshaped)" in err
    assert "give --rate MBIT (or --bw MBIT)" in err
