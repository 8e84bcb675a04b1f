"""``inalab emulate T bench --transport rdma``'s decisions, without root
(emulation.mininet.roce): the lanes a path MTU allows, what a job must be, which
switches' replies carry an ICRC, and a switch whose program has no RoCEv2 tables named
with its kind."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from emulation.bench.fabric import FabricError
from emulation.mininet.roce import icrc_computed, install_roce, rdma_lanes, roce_problems
from emulation.topology import Topology, load_topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _topo(name: str) -> Topology:
    return load_topology(TOPOLOGIES / name)


def test_lanes_default_to_a_path_mtu_or_the_topologys_narrower_width() -> None:
    assert rdma_lanes(_topo("star4.yaml")) == 1024  # 4 KiB, not the bench's 2048 lanes
    assert rdma_lanes(_topo("star4_bmv2.yaml")) == 64  # p4/'s width: 256 B


def test_one_rank_a_host_and_one_aggregating_switch() -> None:
    star = _topo("star4.yaml")
    assert roce_problems(star, star.jobs[0]) == []
    crowded = _topo("collnet2x2.yaml")
    assert any("one rank a host" in p for p in roce_problems(crowded, crowded.jobs[0]))
    tree = _topo("leaf_spine_hier.yaml")
    assert any("hierarchical" in p for p in roce_problems(tree, tree.jobs[0]))


def test_only_the_soft_switchs_replies_carry_an_icrc() -> None:
    assert icrc_computed(_topo("star4.yaml"), ["s1"])
    assert not icrc_computed(_topo("star4_bmv2.yaml"), ["s1"])


def _em(topo_name: str, roce: object) -> SimpleNamespace:
    return SimpleNamespace(topology=_topo(topo_name),
                           controllers={"s1": SimpleNamespace(roce=roce)})  # fmt: skip


def test_a_program_without_roce_tables_is_named_with_its_kind() -> None:
    with pytest.raises(
        FabricError, match=r"^switch s1 \(bmv2\): its program has no RoCEv2 tables$"
    ):
        install_roce(_em("star4_bmv2.yaml", None), ["s1"], 1, ["10.0.0.1"], [[]], 2)  # type: ignore[arg-type]


def test_a_refused_install_names_the_switch() -> None:
    def refuse(*args: object) -> None:
        raise ValueError("1 addresses for 2 ranks")

    em = _em("star4.yaml", SimpleNamespace(install=refuse))
    with pytest.raises(FabricError, match=r"switch s1: RoCEv2 queue pairs of job 1: 1 addresses"):
        install_roce(em, ["s1"], 1, ["10.0.0.1"], [[], []], 2)  # type: ignore[arg-type]
    with pytest.raises(FabricError, match="one aggregating switch"):
        install_roce(em, ["s1", "s2"], 1, [], [], 2)  # type: ignore[arg-type]
