"""The soft switch's link emulation as pure logic: loss, delay line, queue, ``--link``
(duplication and reordering: parsed here, refused by the Python data plane)."""

from __future__ import annotations

import argparse
import math
import random
import re

import pytest

from emulation.softswitch.cli import add_arguments, run
from emulation.softswitch.links import (
    DEFAULT_QUEUE,
    ONLY_EBPF,
    LinkDirection,
    LinkEmulator,
    LinkSpec,
    format_link,
    parse_delay,
    parse_link,
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _direction(spec: LinkSpec, seed: int = 0, clock: Clock | None = None) -> LinkDirection:
    return LinkDirection(spec, random.Random(seed), clock or Clock())


def _drop_pattern(link: LinkDirection, frames: int) -> list[bool]:
    return [link.offer(b"x") is None for _ in range(frames)]


def test_loss_rate_is_binomial() -> None:
    n, p = 20000, 0.1
    link = _direction(LinkSpec(loss=p), seed=7)
    lost = sum(_drop_pattern(link, n))
    assert abs(lost - n * p) <= 4 * math.sqrt(n * p * (1 - p))
    c = link.counters
    assert (c.offered, c.lost, c.delivered, c.queue_dropped) == (n, lost, n - lost, 0)


def test_the_same_seed_loses_the_same_frames() -> None:
    spec = LinkSpec(loss=0.3)
    first = _drop_pattern(_direction(spec, seed=1), 500)
    assert _drop_pattern(_direction(spec, seed=1), 500) == first
    assert _drop_pattern(_direction(spec, seed=2), 500) != first


def test_each_port_and_direction_has_its_own_reproducible_stream() -> None:
    specs = {1: LinkSpec(loss=0.5, ingress=True), 2: LinkSpec(loss=0.5)}
    a, b = LinkEmulator(specs, seed=3), LinkEmulator(specs, seed=3)
    patterns = {
        name: _drop_pattern(line, 200)
        for name, line in (("e1", a.egress[1]), ("i1", a.ingress[1]), ("e2", a.egress[2]))
    }
    assert len({tuple(p) for p in patterns.values()}) == 3
    assert _drop_pattern(b.ingress[1], 200) == patterns["i1"]
    assert _drop_pattern(LinkEmulator(specs, seed=4).egress[2], 200) != patterns["e2"]


def test_no_delay_passes_the_frame_itself() -> None:
    link = _direction(LinkSpec())
    frame = memoryview(bytearray(b"abc"))
    assert link.offer(frame) is frame
    assert link.next_due is None and link.counters.delivered == 1


def test_delay_line_keeps_order_due_times_and_copies() -> None:
    clock = Clock()
    link = _direction(LinkSpec(delay=0.002), clock=clock)
    buf = bytearray(b"first")
    assert link.offer(memoryview(buf)) is None
    buf[:] = b"reuse"  # the receive buffer is reused: the line must hold a copy
    clock.now += 0.0005
    assert link.offer(b"second") is None
    assert link.next_due == pytest.approx(100.002)
    assert link.release(100.0019) == []
    assert link.release(100.002) == [b"first"]
    assert link.next_due == pytest.approx(100.0025)
    assert link.release(101.0) == [b"second"]
    c = link.counters
    assert (c.offered, c.delivered, c.in_flight) == (2, 2, 0)
    assert link.next_due is None


def test_queue_tail_drops_beyond_its_limit() -> None:
    clock = Clock()
    link = _direction(LinkSpec(delay=0.01, queue=3), clock=clock)
    kept = [bytes([i]) for i in range(5)]
    for frame in kept:
        link.offer(frame)
    c = link.counters
    assert (c.offered, c.queue_dropped, c.in_flight, c.delivered) == (5, 2, 3, 0)
    assert link.release(clock.now + 0.01) == kept[:3]  # the tail was dropped
    link.offer(b"later")
    assert (c.queue_dropped, c.in_flight, c.delivered) == (2, 1, 3)
    assert c.offered == c.lost + c.queue_dropped + c.delivered + c.in_flight


def test_loss_comes_before_the_queue() -> None:
    link = _direction(LinkSpec(delay=1.0, loss=0.5, queue=10), seed=5)
    for _ in range(100):
        link.offer(b"x")
    c = link.counters
    assert c.lost > 0 and c.in_flight == 10 and c.queue_dropped == 100 - c.lost - 10


def test_emulator_releases_due_frames_of_every_direction() -> None:
    clock = Clock()
    specs = {1: LinkSpec(delay=0.001, ingress=True), 2: LinkSpec(delay=0.003), 3: LinkSpec()}
    emu = LinkEmulator(specs, clock=clock)
    emu.egress[2].offer(b"e2")
    emu.ingress[1].offer(b"i1")
    assert emu.egress[3].offer(b"e3") == b"e3"
    assert emu.next_due() == pytest.approx(100.001)
    assert list(emu.release(100.001)) == [("ingress", 1, b"i1")]
    assert emu.next_due() == pytest.approx(100.003)
    assert list(emu.release(100.01)) == [("egress", 2, b"e2")]
    assert emu.next_due() is None


def test_the_python_emulator_refuses_duplication_and_reordering() -> None:
    for spec in (LinkSpec(dup=0.1), LinkSpec(reorder=0.1)):
        with pytest.raises(ValueError, match=f"port 4: {re.escape(ONLY_EBPF)}"):
            LinkEmulator({1: LinkSpec(loss=0.1), 4: spec})


def test_stats_and_flat_counters() -> None:
    emu = LinkEmulator({1: LinkSpec(ingress=True), 2: LinkSpec(loss=0.5)})
    emu.egress[1].offer(b"x")
    stats = emu.stats()
    assert set(stats["ports"]) == {"1", "2"}
    assert set(stats["ports"]["1"]) == {"egress", "ingress"}
    assert set(stats["ports"]["2"]) == {"egress"}  # not emulated on ingress: no counts
    assert stats["ports"]["1"]["egress"] == {
        "offered": 1, "lost": 0, "queue_dropped": 0, "delivered": 1, "in_flight": 0,
    }  # fmt: skip
    flat = emu.counters()
    assert flat["link1_egress_delivered"] == 1 and flat["link2_egress_lost"] == 0
    assert len(flat) == 3 * 5
    assert not LinkEmulator({}) and emu


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250us", 250e-6), ("2ms", 0.002), ("0.1s", 0.1), ("2", 0.002), (" 1.5 ms", 0.0015),
     ("0", 0.0), ("1e-05s", 1e-05)],
)  # fmt: skip
def test_parse_delay(text: str, seconds: float) -> None:
    assert parse_delay(text) == pytest.approx(seconds)


def test_parse_link_reads_every_key() -> None:
    port, spec = parse_link("3:delay=2ms,loss=0.01,queue=100,ingress")
    assert port == 3
    assert spec == LinkSpec(delay=0.002, loss=0.01, queue=100, ingress=True)
    assert parse_link("1:") == (1, LinkSpec())
    assert parse_link("1:loss=0.1")[1].queue == DEFAULT_QUEUE
    assert parse_link("2:dup=0.05,reorder=0.1,ingress") == (
        2, LinkSpec(dup=0.05, reorder=0.1, ingress=True))  # fmt: skip


@pytest.mark.parametrize(
    "spec", [LinkSpec(), LinkSpec(delay=0.0201, loss=0.125, queue=7, ingress=True),
             LinkSpec(delay=3e-6), LinkSpec(loss=0.05, dup=0.05, reorder=0.1, ingress=True)],
)  # fmt: skip
def test_format_link_round_trips(spec: LinkSpec) -> None:
    assert parse_link(format_link(5, spec)) == (5, spec)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1", "is not PORT:KEY=VALUE"),
        ("x:loss=0.1", "is not PORT:KEY=VALUE"),
        ("600:loss=0.1", "a port 0..511"),
        ("1:loss=1", r"outside \[0, 1\)"),
        ("1:loss=-0.1", r"outside \[0, 1\)"),
        ("1:loss=nan", r"outside \[0, 1\)"),
        ("1:loss=lots", "is not a number"),
        ("1:delay=-2ms", "is not a number with us, ms or s"),
        ("1:delay=2min", "is not a number with us, ms or s"),
        ("1:queue=0", "not an integer >= 1"),
        ("1:queue=1.5", "not an integer >= 1"),
        ("1:ingress=yes", "takes no value"),
        ("1:loss", "needs a value"),
        ("1:colour=red", "unknown key 'colour'"),
        ("1:loss=0.1,loss=0.2", "given twice"),
        ("1:dup=1", r"dup 1.0 outside \[0, 1\)"),
        ("1:reorder=often", "reorder 'often' is not a number"),
    ],
)
def test_parse_link_errors(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_link(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"delay": -1.0}, "negative"), ({"loss": 1.0}, "outside"), ({"queue": 0}, "queue"),
     ({"queue": True}, "queue")],
)  # fmt: skip
def test_link_spec_rejects(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinkSpec(**kwargs)  # type: ignore[arg-type]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inalab switch", exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(argv)


def test_link_option_errors_reach_argparse() -> None:
    with pytest.raises(argparse.ArgumentError, match="unknown key"):
        _parse(["--link", "1:speed=10"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--link", "1:loss=0.1"], "--link needs --interface"),
        (["--link-stats", "s.json"], "--link-stats needs --interface"),
        (["-i", "1@lo", "--link", "2:loss=0.1"], "port 2 is not an --interface port"),
        (["-i", "1@lo", "--link", "1:loss=0.1", "--link", "1:ingress"], "a port is given twice"),
        (["-i", "1@lo", "--link", "1:reorder=0.1"], f"--link 1: {ONLY_EBPF}"),
    ],
)
def test_link_options_that_do_not_fit_the_ports(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Checked before any socket is opened: no root needed.
    assert run(_parse(["--p4runtime", "127.0.0.1:0", *argv])) == 2
    assert message in capsys.readouterr().err
