"""Links where a job's INA traffic converges before a switch sums it
(emulation.topology.convergence).

Pure functions of the shipped topologies: which links several streams share on their way
to the aggregating switch, the floor that sets, the advice worded for ``check`` and the
emulated bench's footnote.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from emulation.bench.cli import config_from_args
from emulation.cli import build_parser
from emulation.mininet.emulate import apply_overrides, convergence_footnote, emulation_metadata
from emulation.topology import Topology, load_topology
from emulation.topology.convergence import (
    Convergence,
    convergence_notes,
    converging_links,
    hierarchical_sibling,
)

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def _load(name: str) -> Topology:
    return load_topology(TOPOLOGIES / name)


def _links(topo: Topology) -> list[tuple[str, str, int]]:
    return [(c.below, c.above, c.fan_in) for c in converging_links(topo, topo.jobs[0])]


def test_flat_fat_tree_converges_at_edge_and_pod_uplinks() -> None:
    # Breadth-first from c1 routes each pod through pPa1: both edge uplinks to it carry
    # their two hosts' streams, and the pod's uplink to c1 all four.
    expected = []
    for p in range(1, 5):
        expected += [(f"p{p}e1", f"p{p}a1", 2), (f"p{p}e2", f"p{p}a1", 2), (f"p{p}a1", "c1", 4)]
    topo = _load("fat_tree_k4.yaml")
    assert _links(topo) == expected
    pod1 = converging_links(topo, topo.jobs[0])[2]
    assert pod1 == Convergence(1, "p1a1", "c1", "c1", ("h1", "h2", "h3", "h4"), 1000.0, 1000.0)
    assert pod1.floor_ratio == 4.0


@pytest.mark.parametrize(
    "name", ["fat_tree_k4_hier.yaml", "star4.yaml", "star8.yaml", "leaf_spine_hier.yaml",
             "collnet2x2.yaml"],
)  # fmt: skip
def test_aggregating_where_streams_meet_leaves_no_convergence(name: str) -> None:
    topo = _load(name)
    assert [converging_links(topo, job) for job in topo.jobs] == [[]] * len(topo.jobs)
    assert convergence_notes(topo, TOPOLOGIES / name) == []


def test_flat_leaf_spine_converges_at_the_leaf_uplinks() -> None:
    assert _links(_load("leaf_spine.yaml")) == [("leaf1", "spine", 4), ("leaf2", "spine", 4)]


def test_partial_hierarchy_counts_partial_sums_as_streams() -> None:
    # Edge switches aggregate, pod switches forward: each pod uplink carries two partial
    # sums, and the advice moves up to the pod switch.
    flat = _load("fat_tree_k4.yaml")
    edges = tuple(
        dataclasses.replace(s, role="aggregate") if "e" in s.name else s for s in flat.switches
    )
    topo = dataclasses.replace(flat, switches=edges, _index={})
    found = converging_links(topo, topo.jobs[0])
    assert [(c.below, c.above, c.sources) for c in found] == [
        (f"p{p}a1", "c1", (f"p{p}e1", f"p{p}e2")) for p in range(1, 5)
    ]
    assert "set `role: aggregate` on switch p1a1" in convergence_notes(topo)[0]


def test_the_floor_weighs_the_link_against_the_slowest_host_link() -> None:
    topo = _load("leaf_spine.yaml")
    links = tuple(
        dataclasses.replace(link, bw=8000.0 if link.a == "leaf1" else 100.0 if link.a == "leaf2"
                            else 1000.0)
        for link in topo.links
    )  # fmt: skip
    fast, slow = converging_links(dataclasses.replace(topo, links=links), topo.jobs[0])
    assert (fast.floor_ratio, slow.floor_ratio) == (0.5, 40.0)
    assert slow.to_dict() == {
        "job": 1, "link": ["leaf2", "spine"], "aggregator": "spine", "fan_in": 4,
        "sources": ["h5", "h6", "h7", "h8"], "link_mbit": 100.0, "host_mbit": 1000.0,
        "floor_ratio": 40.0,
    }  # fmt: skip
    notes = convergence_notes(dataclasses.replace(topo, links=links))
    assert "the link's rate carries them (4 x S at 8000 Mbit/s vs S at 1000 Mbit/s)" in notes[0]
    assert "INA needs at least 40x a host link's time" in notes[1]
    unshaped = dataclasses.replace(topo, links=tuple(dataclasses.replace(link, bw=None)
                                                     for link in topo.links))  # fmt: skip
    assert converging_links(unshaped, topo.jobs[0])[0].floor_ratio is None
    assert "unshaped: no time floor known" in convergence_notes(unshaped)[0]


def test_the_notes_point_at_the_hierarchical_file_beside_the_flat_one() -> None:
    notes = convergence_notes(_load("leaf_spine.yaml"), TOPOLOGIES / "leaf_spine.yaml")
    assert notes[0].startswith(
        "warning: job 1: link leaf1 - spine: fan-in 4 (h1, h2, h3, h4) unsummed toward spine,"
    )
    assert notes[0].endswith("set `role: aggregate` on switch leaf1 to sum them there")
    assert notes[-1] == (
        f"warning: or use {TOPOLOGIES / 'leaf_spine_hier.yaml'}, the same network"
        " aggregating lower in the tree"
    )
    assert hierarchical_sibling(TOPOLOGIES / "fat_tree_k4.yaml") == (
        TOPOLOGIES / "fat_tree_k4_hier.yaml"
    )
    assert hierarchical_sibling(TOPOLOGIES / "fat_tree_k4_hier.yaml") is None
    assert hierarchical_sibling(TOPOLOGIES / "star4.yaml") is None


def _bench_args(name: str, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["emulate", str(TOPOLOGIES / name), "bench", *flags])


def test_the_emulated_bench_footnotes_and_records_convergence(tmp_path: Path) -> None:
    args = _bench_args("fat_tree_k4.yaml", "--bw", "100,1000", "--algos", "ina,ring")
    topo = _load("fat_tree_k4.yaml")
    at_1000 = apply_overrides(topo, bw=1000)  # a sweep's footnote: its rate's links
    cfg = config_from_args(args, workers=16)
    lines = convergence_footnote(cfg, at_1000, args.topology, topo.jobs[0])
    assert len(lines) == 13
    assert lines[2] == (
        "# warning: job 1: link p1a1 - c1: fan-in 4 (h1, h2, h3, h4) unsummed toward c1, each"
        " way: INA needs at least 4x a host link's time (4 x S at 1000 Mbit/s vs S at 1000"
        " Mbit/s); set `role: aggregate` on switch p1a1 to sum them there"
    )
    assert lines[-1].startswith("# warning: or use ") and "fat_tree_k4_hier.yaml" in lines[-1]
    meta = emulation_metadata(apply_overrides(topo, bw=100), topo.jobs[0], tmp_path)
    assert [(c["link"], c["fan_in"]) for c in meta["convergence"]][2] == (["p1a1", "c1"], 4)
    assert meta["convergence"][2]["link_mbit"] == 100.0


@pytest.mark.parametrize(
    ("name", "algos"),
    [("fat_tree_k4.yaml", "ring,gloo"), ("fat_tree_k4_hier.yaml", "ina,ring")],
)
def test_no_footnote_without_switch_traffic_or_convergence(name: str, algos: str) -> None:
    args = _bench_args(name, "--algos", algos)
    topo = _load(name)
    cfg = config_from_args(args, workers=16)
    assert convergence_footnote(cfg, topo, args.topology, topo.jobs[0]) == []
