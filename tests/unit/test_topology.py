"""Topology files: the shipped ones load, the schema's rules hold, errors say where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulation.topology import (
    Host,
    Topology,
    TopologyError,
    aggregation_tree,
    load_topology,
    parse_topology,
)

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def small(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "switches": {"s1": {}, "s2": {"role": "forward", "kind": "bmv2"}},
        "hosts": {"h1": {}, "h2": {"ip": "192.168.1.7/16", "mac": "02:AA:00:00:00:01"}},
        "links": [["h1", "s1"], {"a": "h2", "b": "s2", "bw": 100, "delay": "250us"}, ["s1", "s2"]],
        "jobs": [{"id": 3, "workers": ["h2", "h1"], "switch": "s1"}],
    }
    doc.update(changes)
    return doc


def test_shipped_topologies_load() -> None:
    shapes = {
        "star4.yaml": (4, 1, 4),
        "star4_bmv2.yaml": (4, 1, 4),
        "star8.yaml": (8, 1, 8),
        "star8_fallback.yaml": (8, 2, 9),
        "star16_fallback.yaml": (16, 2, 17),
        "leaf_spine.yaml": (8, 3, 10),
        "leaf_spine_hier.yaml": (8, 3, 10),
        "leaf_spine_hier_bmv2.yaml": (8, 3, 10),
        "collnet2x2.yaml": (2, 1, 2),
        "fat_tree_k4.yaml": (16, 20, 48),
        "fat_tree_k4_hier.yaml": (16, 20, 48),
        "tutorials_triangle.json": (3, 3, 6),
    }
    assert {p.name for p in TOPOLOGIES.iterdir() if p.suffix in (".yaml", ".json")} == set(shapes)
    for name, (hosts, switches, links) in shapes.items():
        t = load_topology(TOPOLOGIES / name)
        assert (len(t.hosts), len(t.switches), len(t.links)) == (hosts, switches, links), name


def test_bmv2_variants_are_their_soft_topologies_on_bmv2() -> None:
    # The same hosts, links and jobs as the soft-switch file, every switch bmv2 at 64 lanes.
    for soft, bmv2 in (("star4", "star4_bmv2"), ("leaf_spine_hier", "leaf_spine_hier_bmv2")):
        a, b = (load_topology(TOPOLOGIES / f"{n}.yaml") for n in (soft, bmv2))
        assert (a.hosts, a.links, a.jobs) == (b.hosts, b.links, b.jobs)
        assert [(s.name, s.role) for s in a.switches] == [(s.name, s.role) for s in b.switches]
        assert {(s.kind, s.lanes) for s in b.switches} == {("bmv2", 64)}


def test_fat_tree_is_a_fat_tree() -> None:
    t = load_topology(TOPOLOGIES / "fat_tree_k4.yaml")
    # Every switch has k = 4 ports; each edge switch 2 hosts; core c1 aggregates.
    assert {len(t.ports(s.name)) for s in t.switches} == {4}
    for s in t.switches:
        if s.name.startswith("p") and "e" in s.name:
            assert sum(isinstance(t.node(n), Host) for n in t.ports(s.name).values()) == 2
    assert [s.name for s in t.switches if s.role == "aggregate"] == ["c1"]
    assert t.jobs[0].workers == tuple(f"h{i}" for i in range(1, 17))


def test_hierarchical_fat_tree_sums_at_edge_pod_and_core() -> None:
    flat = load_topology(TOPOLOGIES / "fat_tree_k4.yaml")
    hier = load_topology(TOPOLOGIES / "fat_tree_k4_hier.yaml")
    # The same network and job; edge switches and each pod's pPa1 aggregate too.
    assert (flat.hosts, flat.links, flat.jobs) == (hier.hosts, hier.links, hier.jobs)
    aggregating = {s.name for s in hier.switches if s.role == "aggregate"}
    pods = {f"p{p}{s}" for p in range(1, 5) for s in ("e1", "e2", "a1")}
    assert aggregating == {"c1"} | pods
    tree = aggregation_tree(hier, hier.jobs[0])
    assert tree.members["c1"] == ("p1a1", "p2a1", "p3a1", "p4a1")
    assert tree.members["p2a1"] == ("p2e1", "p2e2")
    assert tree.members["p2e2"] == ("h7", "h8")
    assert tree.parent["p2e2"] == "p2a1" and tree.parent["p2a1"] == "c1"


def test_aggregation_tree_flat_through_forwarding_leaves() -> None:
    t = load_topology(TOPOLOGIES / "leaf_spine.yaml")
    tree = aggregation_tree(t, t.jobs[0])
    assert not tree.hierarchical and tree.root == "spine"
    assert set(tree.host_switch.values()) == {"spine"}
    assert tree.members == {"spine": t.jobs[0].workers}


def test_aggregation_tree_hierarchical_with_aggregating_leaves() -> None:
    t = load_topology(TOPOLOGIES / "leaf_spine_hier.yaml")
    tree = aggregation_tree(t, t.jobs[0])
    assert tree.hierarchical
    assert tree.parent == {"leaf1": "spine", "leaf2": "spine"}
    assert tree.members == {
        "leaf1": ("h1", "h2", "h3", "h4"),
        "leaf2": ("h5", "h6", "h7", "h8"),
        "spine": ("leaf1", "leaf2"),
    }


def test_aggregation_tree_mixes_hosts_and_switches_at_one_level() -> None:
    # h1 on the root itself, h2 behind an aggregating s2: s1 sums h1 and s2.
    t = parse_topology(
        small(
            switches={"s1": {}, "s2": {}}, jobs=[{"id": 1, "workers": ["h2", "h1"], "switch": "s1"}]
        )
    )
    tree = aggregation_tree(t, t.jobs[0])
    assert tree.host_switch == {"h1": "s1", "h2": "s2"}
    assert tree.members == {"s1": ("h1", "s2"), "s2": ("h2",)}


def test_defaults_ports_and_addresses() -> None:
    t = parse_topology(small(defaults={"bw": 1000, "loss": 0.01, "reorder": 0.1}))
    assert t.host("h1").ip == "10.0.0.1/24" and t.host("h1").mac == "00:00:00:00:00:01"
    assert t.host("h2").address == "192.168.1.7" and t.host("h2").mac == "02:aa:00:00:00:01"
    assert t.ports("s1") == {1: "h1", 2: "s2"} and t.ports("s2") == {1: "h2", 2: "s1"}
    h2 = t.links[1]
    assert (h2.bw, h2.delay, h2.loss) == (100.0, 0.25, 0.01)  # own bw, default loss
    assert (h2.dup, h2.reorder) == (0.0, 0.1)
    assert t.links[0].bw == 1000.0
    assert t.attachment("h2") == ("s2", 1, h2)
    assert t.switch("s2").kind == "bmv2" and t.jobs[0].workers == ("h2", "h1")
    with pytest.raises(KeyError):
        t.switch("h1")


def test_explicit_ports_are_kept_and_others_fill_around_them() -> None:
    links = [{"a": "h1", "b": "s1", "ports": [None, 2]}, ["h2", "s1"], ["s1", "s2"], ["s2", "h3"]]
    hosts = {"h1": {}, "h2": {}, "h3": {}}
    t = parse_topology(small(links=links, hosts=hosts, jobs=[]))
    assert t.ports("s1") == {2: "h1", 3: "h2", 4: "s2"}


def test_tutorials_json_ports_delay_and_bandwidth() -> None:
    t = load_topology(TOPOLOGIES / "tutorials_triangle.json")
    assert t.ports("s1") == {1: "h1", 2: "s2", 3: "s3"}
    assert t.ports("s3") == {1: "h3", 2: "s1", 3: "s2"}
    last = t.links[-1]
    assert (last.a, last.b, last.b_port, last.delay, last.bw) == ("h3", "s3", 1, 5.0, 100.0)
    assert {s.kind for s in t.switches} == {"bmv2"} and t.jobs == ()
    assert t.host("h2").ip == "10.0.2.2/24"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"switches": {}}, "switches: a topology needs at least one switch"),
        ({"hosts": {"h1": {}, "s1": {}}}, "used by a host and a switch: s1"),
        ({"switches": {"s1": {"kind": "ovs"}}}, "switches.s1.kind: 'ovs' is not one of"),
        ({"switches": {"s1": {"role": "x"}, "s2": {}}}, "switches.s1.role"),
        ({"switches": {"s1": {"lanes": 0}, "s2": {}}}, "switches.s1.lanes: expected an integer"),
        ({"switches": {"s1": {"colour": 1}, "s2": {}}}, "unknown key(s) colour"),
        ({"hosts": {"h1": {"ip": "10.0.0.300"}, "h2": {}}}, "hosts.h1.ip"),
        ({"hosts": {"h1": {"mac": "xx"}, "h2": {}}}, "hosts.h1.mac"),
        ({"hosts": {"h1": {"ip": "10.0.0.2"}, "h2": {}}}, "hosts.h2: 10.0.0.2 is also h1's"),
        ({"hosts": {"h-1": {}, "h2": {}}}, "is not a node name"),
        ({"links": [["h1", "s9"]]}, "links[0].b: unknown node 's9'"),
        ({"links": [["h1", "h2"]]}, "links[0]: h1 and h2 are hosts"),
        ({"links": [["h1", "s1"], ["s1", "h1"]]}, "links[1]: a second link between"),
        ({"links": [["s1", "s1"]]}, "a link from s1 to itself"),
        ({"links": [{"a": "h1"}]}, "links[0]: a link names both ends"),
        ({"links": [{"a": "h1", "b": "s1", "bw": 0}]}, "links[0].bw: expected at least"),
        ({"links": [{"a": "h1", "b": "s1", "loss": 1.0}]}, "links[0].loss"),
        ({"links": [{"a": "h1", "b": "s1", "dup": 1.0}]}, "links[0].dup"),
        ({"links": [{"a": "h1", "b": "s1", "reorder": -0.1}]}, "links[0].reorder"),
        ({"links": [{"a": "h1", "b": "s1", "delay": "fast"}]}, "links[0].delay"),
        ({"links": [{"a": "h1", "b": "s1", "ports": [1, 1]}]}, "h1 is a host"),
        ({"links": [["h1", "s1-p1"], ["h2", "s2"], ["s1-p1", "s2"]]}, "port 1 of s1 is used twice"),
        ({"links": [["h1", "s1"], ["s1", "s2"]]}, "host h2 has 0 links"),
        ({"jobs": [{"id": 1, "workers": ["h1"], "switch": "s2"}]}, "jobs[0].switch: 's2' is not"),
        ({"jobs": [{"id": 1, "workers": ["h1", "h1"], "switch": "s1"}]}, "listed twice"),
        ({"jobs": [{"id": 1, "workers": ["s1"], "switch": "s1"}]}, "jobs[0].workers[0]"),
        ({"jobs": [{"id": 70000, "workers": ["h1"], "switch": "s1"}]}, "jobs[0].id"),
        (
            {"jobs": [{"id": 1, "workers": ["h1"], "switch": "s1"}] * 2},
            "jobs[1].id: job id 1 is used twice",
        ),
        ({"nodes": {}}, "unknown key(s) nodes"),
    ],
)
def test_invalid_topologies_say_where(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology(small(**changes), source="t.yaml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("t.yaml")


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read topology"):
        load_topology(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("links: [h1, {")
    with pytest.raises(TopologyError, match=r"bad\.yaml:1:14: not YAML"):
        load_topology(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"hosts": {},\n "links": ]}')
    with pytest.raises(TopologyError, match=r"bad\.json:2:11: not JSON: Expecting value$"):
        load_topology(bad_json)


# One line each, FILE:LINE:COLUMN first (1-based, as compilers and editors count), the
# place PyYAML found the problem at; what PyYAML was reading and where that started last.
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "hosts:\n  h1: {ip: 10.0.0.1\nlinks: []\n",
            "3:6: not YAML: expected ',' or '}', but got ':'"
            " (while parsing a flow mapping that starts at 2:7)",
        ),
        (
            "hosts:\n  h1: {}\n   h2: {}\n",
            "3:4: not YAML: expected <block end>, but found '<block mapping start>'"
            " (while parsing a block mapping that starts at 2:3)",
        ),
        ("hosts:\n  h1: {}\n  h2 {}: x: y\n", "3:11: not YAML: mapping values are not allowed"),
        ("hosts:\n\th1: {}\n", "2:1: not YAML: found character '\\t' that cannot start"),
        ("name: a\x07b\n", "1:8: not YAML: unacceptable character #x0007"),
        ("name: x\n- [h1, s1]\n", "2:1: not YAML: expected <block end>, but found '-'"),
    ],
)
def test_malformed_yaml_is_one_line_file_line_column(
    tmp_path: Path, text: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(TopologyError) as caught:
        load_topology(bad)
    assert str(caught.value).startswith(f"{bad}:{message}")
    assert "\n" not in str(caught.value)


def test_a_file_that_is_not_utf8_says_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: star\nhosts:\n  h\xe9: {}\n")
    with pytest.raises(TopologyError, match=r"bad\.yaml:3:4: not UTF-8 text \(byte 0xe9\)$"):
        load_topology(bad)


def test_schema_errors_in_a_yaml_file_name_its_line_and_column(tmp_path: Path) -> None:
    star4 = (TOPOLOGIES / "star4.yaml").read_text()
    cases = {
        # the value as written: in the link, in the defaults the link took it from
        ("- [h4, s1]", "- [h9, s1]"): "17:6: links[3].a: unknown node 'h9'",
        ("bw: 1000", "bw: fast"): "5:7: defaults.bw: expected a number, got 'fast'",
        ("h3: {}", "h3: {ranks: 0}"): "11:15: hosts.h3.ranks: expected an integer 1..32, got 0",
        # a missing value: the place of the mapping that lacks it
        ("{id: 1, workers", "{workers"): "19:5: jobs[0].id: expected an integer",
    }
    for (old, new), message in cases.items():
        assert old in star4
        bad = tmp_path / "star4.yaml"
        bad.write_text(star4.replace(old, new))
        with pytest.raises(TopologyError) as caught:
            load_topology(bad)
        assert str(caught.value).startswith(f"{bad}:{message}")
        assert caught.value.path  # kept for a caller that wants the place in the document
    # An error about the document as a whole has no one place.
    bad.write_text(star4.replace("  h4: {}\n", "  h4: {}\n  s1: {}\n"))
    with pytest.raises(TopologyError, match=rf"^{bad}: names used by a host and a switch: s1"):
        load_topology(bad)


def test_topology_is_pure_data() -> None:
    t = load_topology(TOPOLOGIES / "star4.yaml")
    assert isinstance(t, Topology) and t == load_topology(TOPOLOGIES / "star4.yaml")
    with pytest.raises(AttributeError):
        t.name = "other"  # type: ignore[misc]
