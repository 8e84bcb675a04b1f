"""Fallback nodes in topologies: a switch of ``role: fallback``, named by the aggregating
switch it is linked to (``fallback: f1``), is a server behind that switch, never an
aggregator of worker traffic. The shipped files load, the rules hold, errors say where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulation.topology import (
    TopologyError,
    aggregation_tree,
    load_topology,
    parse_topology,
)
from emulation.topology.convergence import converging_links
from emulation.topology.summary import summarize_topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def doc(**changes: Any) -> dict[str, Any]:
    """Three hosts on s1, with f1 its fallback; s2 a forwarding switch beside it."""
    out: dict[str, Any] = {
        "switches": {
            "s1": {"fallback": "f1"},
            "f1": {"role": "fallback"},
            "s2": {"role": "forward"},
        },
        "hosts": {"h1": {}, "h2": {}, "h3": {}},
        "links": [["h1", "s1"], ["h2", "s1"], ["h3", "s2"], ["s1", "s2"], ["s1", "f1"]],
        "jobs": [{"id": 1, "workers": ["h1", "h2", "h3"], "switch": "s1"}],
    }
    out.update(changes)
    return out


@pytest.mark.parametrize(
    ("name", "hosts", "jobs"),
    [("star8_fallback.yaml", 8, [4, 5]), ("star16_fallback.yaml", 16, [4, 5, 6, 7])],
)
def test_shipped_fallback_topologies(name: str, hosts: int, jobs: list[int]) -> None:
    t = load_topology(TOPOLOGIES / name)
    s1, f1 = t.switch("s1"), t.switch("f1")
    assert (s1.role, s1.fallback) == ("aggregate", "f1")
    assert (f1.kind, f1.role, f1.fallback) == ("soft", "fallback", None)
    assert t.ports("f1") == {1: "s1"} and t.ports("s1")[hosts + 1] == "f1"
    assert [j.job_id for j in t.jobs] == jobs
    for job in t.jobs:
        assert len(job.workers) == 4 and job.switch == "s1"
        tree = aggregation_tree(t, job)
        assert tree.members == {"s1": job.workers} and not tree.hierarchical
        assert converging_links(t, job) == []
        summary = summarize_topology(t, job.job_id)
        assert (summary.hops, summary.fan_in, summary.switch_reachable) == (1, 4, True)
    hosts_of = [h for job in t.jobs for h in job.workers]
    assert len(set(hosts_of)) == hosts  # every host in one job: --jobs runs them all


def test_a_fallback_is_not_an_aggregator_of_worker_traffic() -> None:
    t = parse_topology(doc())
    tree = aggregation_tree(t, t.jobs[0])
    assert tree.host_switch == {"h1": "s1", "h2": "s1", "h3": "s1"}
    assert "f1" not in tree.members
    # Without jobs, dynamiccl's view takes the aggregating switch, never the fallback.
    t = parse_topology(doc(jobs=[], switches={"f1": {"role": "fallback"}, "s1": {"fallback": "f1"},
                                              "s2": {"role": "forward"}}))  # fmt: skip
    assert summarize_topology(t).fan_in == 3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"switches": {"s1": {"fallback": "f9"}, "f1": {"role": "fallback"}, "s2": {}}},
            "switches.s1.fallback: 'f9' is not a switch",
        ),
        (
            {"switches": {"s1": {"fallback": "s2"}, "f1": {"role": "fallback"}, "s2": {}}},
            "switches.s1.fallback: s2 has role aggregate; a fallback has role fallback",
        ),
        (
            {"switches": {"s1": {"fallback": "h1"}, "f1": {"role": "fallback"}, "s2": {}}},
            "switches.s1.fallback: 'h1' is not a switch",
        ),
        (
            {"switches": {"s1": {"fallback": 3}, "f1": {"role": "fallback"}, "s2": {}}},
            "switches.s1.fallback: expected a switch name, got 3",
        ),
        (
            {
                "switches": {
                    "s1": {"fallback": "f1"},
                    "f1": {"role": "fallback"},
                    "s2": {"role": "forward", "fallback": "f1"},
                }
            },
            "switches.s2.fallback: only an aggregate switch has a fallback, not a forward switch",
        ),
        (
            {
                "switches": {
                    "s1": {"fallback": "f1"},
                    "f1": {"role": "fallback", "fallback": "s1"},
                    "s2": {},
                }
            },
            "switches.f1.fallback: only an aggregate switch has a fallback, not a fallback switch",
        ),
        (
            {
                "switches": {
                    "s1": {"fallback": "f1"},
                    "f1": {"role": "fallback", "kind": "bmv2"},
                    "s2": {},
                }
            },
            "switches.f1.kind: a fallback is inalab's soft switch on a server, not bmv2",
        ),
        (
            {"switches": {"s1": {}, "f1": {"role": "fallback"}, "s2": {}}},
            "switches.f1: fallback f1 is no switch's: name it on the aggregating switch it is"
            " linked to (fallback: f1)",
        ),
        (
            {
                "switches": {
                    "s1": {"fallback": "f1"},
                    "f1": {"role": "fallback"},
                    "s2": {"fallback": "f1"},
                }
            },
            "switches.s2.fallback: f1 is the fallback of s1 already: one switch a fallback",
        ),
        (
            {"links": [["h1", "s1"], ["h2", "s1"], ["h3", "s2"], ["s1", "s2"], ["s2", "f1"]]},
            "switches.f1: fallback f1 is linked to s2; a fallback has one link, to s1, which"
            " names it",
        ),
        (
            {
                "links": [
                    ["h1", "s1"],
                    ["h2", "s1"],
                    ["h3", "s2"],
                    ["s1", "s2"],
                    ["s1", "f1"],
                    ["s2", "f1"],
                ]
            },
            "switches.f1: fallback f1 is linked to s1, s2; a fallback has one link, to s1",
        ),
        (
            {"links": [["h1", "s1"], ["h2", "s1"], ["h3", "f1"], ["s1", "s2"], ["s1", "f1"]]},
            "switches.f1: fallback f1 is linked to h3, s1; a fallback has one link, to s1",
        ),
        (
            {"links": [["h1", "s1"], ["h2", "s1"], ["h3", "s2"], ["s1", "s2"]]},
            "switches.f1: fallback f1 is linked to nothing; a fallback has one link, to s1",
        ),
        (
            {"jobs": [{"id": 1, "workers": ["h1"], "switch": "f1"}]},
            "jobs[0].switch: 'f1' is not a switch with role aggregate (s1)",
        ),
        (
            {"switches": {"s1": {"fallback": "f1"}, "f1": {"role": "fallbacks"}, "s2": {}}},
            "switches.f1.role: 'fallbacks' is not one of aggregate, forward, fallback",
        ),
    ],
)
def test_fallback_rules_say_where(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology(doc(**changes), source="t.yaml")
    assert str(caught.value).startswith("t.yaml: ") and message in str(caught.value)


def test_a_fallback_error_in_a_file_names_its_line_and_column(tmp_path: Path) -> None:
    text = (TOPOLOGIES / "star8_fallback.yaml").read_text()
    bad = tmp_path / "star8_fallback.yaml"
    bad.write_text(text.replace("fallback: f1}", "fallback: f2}"))
    with pytest.raises(TopologyError) as caught:
        load_topology(bad)
    line = next(n for n, x in enumerate(text.splitlines(), 1) if "fallback: f1}" in x)
    column = text.splitlines()[line - 1].index("f1}") + 1
    assert str(caught.value) == (
        f"{bad}:{line}:{column}: switches.s1.fallback: 'f2' is not a switch (a fallback is a"
        " switch of role fallback)"
    )
