"""Duplication and reordering as ``inalab emulate`` takes them: the flags, the links as
applied and described, and the lanes a reordering port gets (no root: commands only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation.cli import build_parser
from emulation.mininet.emulate import apply_overrides, describe_links
from emulation.softswitch.ebpf import layout
from emulation.softswitch.ebpf.lanes import LANE_HELD, LANE_IN_ORDER, lane_commands
from emulation.topology import load_topology

STAR4 = Path(__file__).resolve().parents[2] / "topologies/star4.yaml"


def test_the_flags_set_every_links_duplication_and_reordering() -> None:
    args = build_parser().parse_args(
        ["emulate", str(STAR4), "--link-dup", "0.05", "--link-reorder", "0.1", "up"]
    )
    assert (args.link_dup, args.link_reorder) == (0.05, 0.1)
    topo = apply_overrides(load_topology(STAR4), bw=200, dup=args.link_dup,
                           reorder=args.link_reorder)  # fmt: skip
    assert {(link.dup, link.reorder) for link in topo.links} == {(0.05, 0.1)}
    assert describe_links(topo, False) == (
        "every link 200 Mbit/s, 0 ms one way, loss 0, dup 0.05, reorder 0.1 each way; rate by "
        "HTB, duplication and reordering by the eBPF switches' ports"
    )
    assert "dup" not in describe_links(apply_overrides(topo, dup=0.0, reorder=0.0), False)


@pytest.mark.parametrize("flag", ["--link-dup", "--link-reorder"])
def test_a_probability_of_one_is_refused(flag: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["emulate", str(STAR4), flag, "1", "up"])


def test_a_reordering_port_gets_two_lanes_under_its_link_class() -> None:
    commands = lane_commands("s1-eth1", queue=100)
    assert [c[:9] for c in commands] == [
        ["tc", "class", "add", "dev", "s1-eth1", "parent", "5:1", "classid", "5:3"],
        ["tc", "qdisc", "add", "dev", "s1-eth1", "parent", "5:3", "handle", "13:"],
        ["tc", "class", "add", "dev", "s1-eth1", "parent", "5:1", "classid", "5:4"],
        ["tc", "qdisc", "add", "dev", "s1-eth1", "parent", "5:4", "handle", "14:"],
    ]
    assert commands[0][-2:] == ["prio", "0"] and commands[2][-2:] == ["prio", "1"]
    assert commands[1][-3:] == ["pfifo", "limit", "100"]
    assert len(lane_commands("s1-eth1")) == 2  # no queue: the interface's default
    # The program steers by skb->priority: the same class ids, in its header.
    header = layout.render_header(64)
    assert f"#define INA_LANE_IN_ORDER {LANE_IN_ORDER}" in header
    assert f"#define INA_LANE_HELD {LANE_HELD}" in header
    with pytest.raises(ValueError, match="queue 0"):
        lane_commands("s1-eth1", queue=0)
