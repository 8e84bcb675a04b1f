"""emulation.mininet.datapaths: who emulates the links, which data plane each soft switch runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulation.mininet.datapaths import DatapathChoice, link_specs, netem_available, plan_links
from emulation.topology import Topology, parse_topology

NO_EBPF = "the eBPF data plane needs clang"


def _topo(link: dict[str, Any] | None = None, **switch: Any) -> Topology:
    return parse_topology({
        "switches": {"s1": switch or {}, "s2": {"kind": "bmv2"}},
        "hosts": {"h1": {}, "h2": {}},
        "links": [{"a": "h1", "b": "s1", **(link or {})}, ["h2", "s2"], ["s1", "s2"]],
    })  # fmt: skip


def test_auto_picks_ebpf_where_it_runs_and_no_link_delays() -> None:
    plan = plan_links(_topo({"loss": 0.01}), netem=False, ebpf_reason=None)
    assert plan.datapaths["s1"].datapath == "ebpf"
    assert plan.specs == {"s1": {1: "delay=0ms,loss=0.01,ingress"}}  # loss: in the program
    assert "s2" not in plan.datapaths  # bmv2 has no data plane to choose


def test_auto_keeps_python_and_says_why() -> None:
    delayed = plan_links(_topo({"delay": "2ms"}), netem=False, ebpf_reason=None)
    assert delayed.datapaths["s1"].datapath == "python"
    assert "delay" in delayed.datapaths["s1"].reason and "netem" in delayed.datapaths["s1"].reason
    missing = plan_links(_topo(), netem=False, ebpf_reason=NO_EBPF)
    assert missing.datapaths["s1"].datapath == "python"
    assert missing.datapaths["s1"].reason == NO_EBPF
    recorded = plan_links(_topo(), netem=False, ebpf_reason=None, pcap=True)
    assert recorded.datapaths["s1"].datapath == "python"
    assert "pcap" in recorded.datapaths["s1"].reason


def test_pcap_on_the_ebpf_data_plane_is_tcpdump_s_and_needs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/sbin/{name}")
    asked = plan_links(_topo(), netem=False, ebpf_reason=None, override="ebpf", pcap=True)
    assert asked.datapaths["s1"] == DatapathChoice("ebpf", "asked for")
    faulty = plan_links(_topo({"dup": 0.01, "bw": 100}), netem=False, ebpf_reason=None, pcap=True)
    assert faulty.datapaths["s1"].datapath == "ebpf"
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="datapath ebpf: --pcap records the eBPF data plane's "
                       "ports with tcpdump, not on PATH"):  # fmt: skip
        plan_links(_topo(), netem=False, ebpf_reason=None, override="ebpf", pcap=True)


def test_netem_takes_the_links_and_frees_the_switches() -> None:
    plan = plan_links(_topo({"delay": "2ms", "jitter": "1ms"}), netem=True, ebpf_reason=None)
    assert plan.netem and plan.specs == {}
    assert plan.datapaths["s1"].datapath == "ebpf"


def test_what_cannot_be_is_refused() -> None:
    with pytest.raises(ValueError, match="jitter, which needs netem"):
        plan_links(_topo({"jitter": "1ms"}), netem=False, ebpf_reason=None)
    with pytest.raises(ValueError, match="datapath ebpf: port 1's link has a delay"):
        plan_links(_topo({"delay": "2ms"}, datapath="ebpf"), netem=False, ebpf_reason=None)
    with pytest.raises(ValueError, match=f"datapath ebpf: {NO_EBPF}"):
        plan_links(_topo(), netem=False, ebpf_reason=NO_EBPF, override="ebpf")
    bmv2_only = parse_topology({
        "switches": {"s1": {"kind": "bmv2"}}, "hosts": {"h1": {}},
        "links": [{"a": "h1", "b": "s1", "loss": 0.1}],
    })  # fmt: skip
    with pytest.raises(ValueError, match="without netem only the soft switch"):
        plan_links(bmv2_only, netem=False, ebpf_reason=None)
    assert plan_links(bmv2_only, netem=True, ebpf_reason=None).netem


def test_an_override_wins_over_the_topology() -> None:
    topo = _topo(datapath="ebpf")
    plan = plan_links(topo, netem=False, ebpf_reason=None, override="python")
    assert plan.datapaths["s1"].datapath == "python"


def test_link_specs_emulate_each_direction_once() -> None:
    topo = parse_topology({
        "switches": {"s1": {}, "s2": {}}, "hosts": {"h1": {}},
        "links": [{"a": "h1", "b": "s1", "delay": 1}, {"a": "s1", "b": "s2", "loss": 0.5}],
    })  # fmt: skip
    assert link_specs(topo) == {
        "s1": {1: "delay=1ms,loss=0,ingress", 2: "delay=0ms,loss=0.5"},
        "s2": {1: "delay=0ms,loss=0.5"},
    }


def test_netem_probe_finds_the_module_loaded_or_on_disk(tmp_path: Path) -> None:
    assert not netem_available("6.1.0", tmp_path)
    module = tmp_path / "lib/modules/6.1.0/kernel/net/sched/sch_netem.ko.xz"
    module.parent.mkdir(parents=True)
    module.write_bytes(b"")
    assert netem_available("6.1.0", tmp_path) and not netem_available("6.2.0", tmp_path)
    (tmp_path / "sys/module/sch_netem").mkdir(parents=True)
    assert netem_available("6.2.0", tmp_path)


def test_duplication_and_reordering_go_to_the_ebpf_ports_on_any_kernel() -> None:
    faults = {"bw": 100, "loss": 0.05, "dup": 0.05, "reorder": 0.1}
    plan = plan_links(_topo(faults), netem=False, ebpf_reason=None)
    assert plan.specs == {"s1": {1: "delay=0ms,loss=0.05,dup=0.05,reorder=0.1,ingress"}}
    why = "port 1's link duplicates or reorders frames"
    assert plan.datapaths["s1"] == DatapathChoice("ebpf", why)
    with_netem = plan_links(_topo({**faults, "loss": 0}), netem=True, ebpf_reason=None)
    assert with_netem.specs == {"s1": {1: "delay=0ms,loss=0,dup=0.05,reorder=0.1,ingress"}}
    assert with_netem.datapaths["s1"].datapath == "ebpf"
    only_dup = plan_links(_topo({"dup": 0.2}), netem=False, ebpf_reason=None, override="auto")
    assert only_dup.specs == {"s1": {1: "delay=0ms,loss=0,dup=0.2,ingress"}}


@pytest.mark.parametrize(
    ("link", "switch", "kwargs", "why"),
    [
        ({"reorder": 0.1, "bw": 10}, {}, {"override": "python"}, "the Python data plane was"),
        ({"dup": 0.1}, {"datapath": "python"}, {}, "the Python data plane was asked for"),
        ({"dup": 0.1}, {}, {"ebpf_reason": NO_EBPF}, NO_EBPF),
        ({"reorder": 0.1, "bw": 10, "delay": "1ms"}, {}, {}, "port 1's link has a delay"),
    ],
)
def test_a_switch_that_cannot_run_ebpf_cannot_duplicate_or_reorder(
    link: dict[str, Any], switch: dict[str, Any], kwargs: dict[str, Any], why: str
) -> None:
    kwargs = {"netem": False, "ebpf_reason": None, **kwargs}
    prefix = (
        "switch s1: port 1's link duplicates or reorders frames, which only the eBPF data "
        "plane does: "
    )
    with pytest.raises(ValueError) as caught:
        plan_links(_topo(link, **switch), **kwargs)
    message = str(caught.value)
    assert message.startswith(prefix) and message[len(prefix) :].startswith(why)


def test_duplication_or_reordering_with_no_soft_switch_is_refused() -> None:
    bmv2_only = parse_topology({
        "switches": {"s1": {"kind": "bmv2"}}, "hosts": {"h1": {}},
        "links": [{"a": "h1", "b": "s1", "bw": 10, "reorder": 0.1}],
    })  # fmt: skip
    for netem in (False, True):
        with pytest.raises(ValueError, match="link h1-s1 asks for duplication or reordering"):
            plan_links(bmv2_only, netem=netem, ebpf_reason=None)


def test_reordering_needs_the_shaper_and_no_netem_in_its_class() -> None:
    with pytest.raises(ValueError, match=r"link h1-s1 asks for reordering, .* give it a rate"):
        plan_links(_topo({"reorder": 0.1}), netem=False, ebpf_reason=None)
    lossy = _topo({"bw": 10, "reorder": 0.1, "loss": 0.01})
    with pytest.raises(ValueError, match="reordering and netem's delay, jitter or loss"):
        plan_links(lossy, netem=True, ebpf_reason=None)
    assert (
        plan_links(lossy, netem=False, ebpf_reason=None)
        .specs["s1"][1]
        .endswith(",reorder=0.1,ingress")
    )
    # Duplication alone needs neither.
    assert plan_links(_topo({"dup": 0.1, "loss": 0.01}), netem=True, ebpf_reason=None).specs
