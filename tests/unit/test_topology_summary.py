"""emulation.topology.summary: a topology's job as dynamiccl's model sees it, the links a
calibration ran across, and the summary file ``inalab decide --summary`` reads."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dynamiccl.model import DEFAULT_PROFILE, MeasuredLinks, TopologySummary, estimate
from emulation.mininet.emulate import apply_overrides
from emulation.topology import TopologyError, load_topology, parse_topology
from emulation.topology.summary import (
    decide_summary,
    measured_links,
    summarize_topology,
    summary_json,
)

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def test_star_has_no_contention() -> None:
    s = summarize_topology(load_topology(TOPOLOGIES / "star4.yaml"))
    assert s.link_bandwidth == pytest.approx(1000e6 / 8)
    assert s.hops == 1 and s.oversubscription == 1.0 and s.fan_in == 4
    assert s.contention == {"ina": 1.0, "ring": 1.0, "tree": 1.0}
    assert s.switch_reachable and s.slots is None


def test_flat_leaf_spine_funnels_a_leaf_into_one_uplink() -> None:
    s = summarize_topology(load_topology(TOPOLOGIES / "leaf_spine.yaml"), slots=16)
    assert s.hops == 2 and s.fan_in == 8 and s.slots == 16
    assert s.oversubscription == pytest.approx(4.0)  # 4 hosts' 1 Gbit/s on a 1 Gbit/s uplink
    assert s.contention["ina"] == pytest.approx(4.0)  # the leaves only forward
    assert s.contention["ring"] == 1.0


def test_hierarchical_leaf_spine_sends_one_partial_sum_up() -> None:
    s = summarize_topology(load_topology(TOPOLOGIES / "leaf_spine_hier.yaml"))
    assert s.contention["ina"] == 1.0
    assert s.fan_in == 4  # a leaf sums its 4 hosts; the spine sums 2 leaves
    assert s.oversubscription == pytest.approx(4.0)  # the cabling is the same


def test_delay_and_loss_come_from_the_worst_path() -> None:
    topo = parse_topology(
        {
            "switches": {"s1": {}},
            "hosts": {"h1": {}, "h2": {}},
            "links": [
                {"a": "h1", "b": "s1", "delay": "2ms", "loss": 0.01, "bw": 100},
                {"a": "h2", "b": "s1", "bw": 10},
            ],
        }
    )
    s = summarize_topology(topo)
    assert s.delay == pytest.approx(2e-3) and s.loss == pytest.approx(0.01)
    assert s.link_bandwidth == pytest.approx(10e6 / 8)
    assert s.switch_reachable  # no jobs: all hosts on the first aggregating switch


def test_forwarding_only_networks_cannot_aggregate() -> None:
    s = summarize_topology(load_topology(TOPOLOGIES / "tutorials_triangle.json"))
    assert not s.switch_reachable
    assert not estimate("ina", 4096, 3, DEFAULT_PROFILE, s).available


def test_measured_links_are_the_jobs_links_as_applied() -> None:
    star4 = apply_overrides(load_topology(TOPOLOGIES / "star4.yaml"), bw=100, delay=2.5)
    assert measured_links(star4) == MeasuredLinks("star4", 1, 100.0, 2.5, 0.0, 0.0)
    unshaped = apply_overrides(load_topology(TOPOLOGIES / "star4.yaml"), loss=0.01)
    links = measured_links(replace(unshaped, links=tuple(
        replace(link, bw=None) for link in unshaped.links)))  # fmt: skip
    assert links.bw_mbit is None and links.loss == pytest.approx(0.01)


def test_measured_links_follow_the_job_and_the_worst_path() -> None:
    topo = parse_topology(
        {
            "switches": {"s1": {}, "s2": {}},
            "hosts": {"h1": {}, "h2": {}, "h3": {}},
            "links": [
                {"a": "h1", "b": "s1", "bw": 100, "delay": "1ms"},
                {"a": "h2", "b": "s2", "bw": 1000, "jitter": "0.5ms"},
                {"a": "s1", "b": "s2", "bw": 40, "delay": "2ms", "loss": 0.02},
                {"a": "h3", "b": "s2", "bw": 10},
            ],
            "jobs": [
                {"id": 3, "workers": ["h1", "h2"], "switch": "s2"},
                {"id": 5, "workers": ["h2"], "switch": "s2"},
            ],
        }
    )
    first = measured_links(topo)
    assert (first.job, first.bw_mbit, first.delay_ms) == (3, 40.0, 3.0)  # h1 -> s1 -> s2
    assert first.loss == pytest.approx(0.02) and first.jitter_ms == 0.5
    other = measured_links(topo, 5)  # h3's 10 Mbit/s link is on neither job's paths
    assert (other.bw_mbit, other.delay_ms, other.loss) == (1000.0, 0.0, 0.0)
    with pytest.raises(KeyError, match="no job 7"):
        measured_links(topo, 7)


def test_unknown_job_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="no job 7"):
        summarize_topology(load_topology(TOPOLOGIES / "star4.yaml"), 7)


@pytest.mark.parametrize(
    ("topology", "job"),
    [("star4.yaml", None), ("leaf_spine.yaml", None), ("star8.yaml", 2)],
)
def test_summary_json_is_the_summary(topology: str, job: int | None) -> None:
    topo = load_topology(TOPOLOGIES / topology)
    doc = json.loads(summary_json(topo, job))
    assert TopologySummary.from_dict(doc) == summarize_topology(topo, job)


def test_decide_summary_gives_the_jobs_ranks() -> None:
    summary, job = decide_summary(TOPOLOGIES / "star8.yaml", None, 16)
    assert summary == summarize_topology(load_topology(TOPOLOGIES / "star8.yaml"), slots=16)
    assert (job.job, job.ranks, job.hosts) == (1, 8, 8)
    assert dict(job.per_job) == {1: 8, 2: 2, 4: 4, 5: 4}
    _, other = decide_summary(TOPOLOGIES / "star8.yaml", 4, None)
    assert (other.job, other.ranks) == (4, 4)


def test_decide_summary_of_a_topology_without_jobs() -> None:
    _, job = decide_summary(TOPOLOGIES / "tutorials_triangle.json", None, None)
    assert (job.job, job.ranks, job.hosts, dict(job.per_job)) == (None, 3, 3, {})


def test_decide_summary_raises_what_decide_reports() -> None:
    with pytest.raises(TopologyError, match="cannot read topology"):
        decide_summary(Path("/nonexistent.yaml"), None, None)
    with pytest.raises(KeyError, match="no job 9"):
        decide_summary(TOPOLOGIES / "star4.yaml", 9, None)
