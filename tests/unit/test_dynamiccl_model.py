"""dynamiccl.model: the alpha-beta cost model, the profile file and the topology summary's
JSON (emulation.topology.summary derives summaries: tests/unit/test_topology_summary.py)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.model import (
    DEFAULT_PROFILE,
    PROFILE_SCHEMA,
    SUMMARY_SCHEMA,
    TREE_BYTE_FACTOR,
    AlgoParams,
    MeasuredLinks,
    Profile,
    ProfileError,
    SummaryError,
    TopologySummary,
    byte_coefficient,
    estimate,
    estimate_all,
    steps,
)
from hostlib.protocol import MAX_WORKERS

# alpha 10 us a step, 1 ns a byte for every algorithm; a switch far faster than that.
FLAT = Profile(
    ina=AlgoParams(10e-6, 1e-9),
    ring=AlgoParams(10e-6, 1e-9),
    tree=AlgoParams(10e-6, 1e-9),
    switch_rate=1e15,
    source="test",
)

sizes = st.integers(1, 1 << 32)
workers = st.integers(2, MAX_WORKERS)


# ----------------------------------------------------------------- the form


@pytest.mark.parametrize(
    ("algo", "n", "expected_steps", "expected_coeff"),
    [
        ("ring", 2, 2, 1.0),
        ("ring", 4, 6, 1.5),
        ("ring", 8, 14, 1.75),
        ("tree", 2, 2, TREE_BYTE_FACTOR),
        ("tree", 5, 6, TREE_BYTE_FACTOR),
        ("tree", 8, 6, TREE_BYTE_FACTOR),
        ("ina", 2, 1, 1.0),
        ("ina", 32, 1, 1.0),
        ("ring", 1, 0, 0.0),
        ("tree", 1, 0, 0.0),
        ("ina", 1, 1, 1.0),
    ],
)
def test_steps_and_bytes_follow_nccl(
    algo: str, n: int, expected_steps: int, expected_coeff: float
) -> None:
    assert steps(algo, n) == expected_steps
    assert byte_coefficient(algo, n) == pytest.approx(expected_coeff)


def test_ring_is_nccls_formula() -> None:
    # 2(n-1) steps, each alpha + (S/n) beta.
    size, n = 1 << 20, 4
    est = estimate("ring", size, n, FLAT)
    assert est.seconds == pytest.approx(2 * (n - 1) * (10e-6 + size / n * 1e-9))
    assert est.bound == "software" and est.stalls == 0


def test_tree_pays_twice_the_bytes_over_log_steps() -> None:
    size, n = 1 << 20, 8
    est = estimate("tree", size, n, FLAT)
    assert est.seconds == pytest.approx(2 * 3 * 10e-6 + TREE_BYTE_FACTOR * size * 1e-9)


def test_ina_is_one_step_and_the_message_once() -> None:
    size = 1 << 20
    assert estimate("ina", size, 8, FLAT).seconds == pytest.approx(10e-6 + size * 1e-9)


def test_ina_is_bounded_by_the_switch_rate() -> None:
    slow_switch = Profile(FLAT.ina, FLAT.ring, FLAT.tree, switch_rate=1e9)
    size, n = 1 << 20, 16
    est = estimate("ina", size, n, slow_switch)
    assert est.bound == "switch"
    assert est.transfer == pytest.approx(n * size / 1e9)
    # the hierarchy's fan-in, not the worker count, sets the bound when known
    hier = estimate("ina", size, n, slow_switch, TopologySummary(fan_in=4))
    assert hier.transfer == pytest.approx(4 * size / 1e9)


def test_ina_is_bounded_by_its_window() -> None:
    est = estimate("ina", 1 << 24, 4, FLAT, TopologySummary(slots=1))
    assert est.bound == "window"
    # one packet per round trip
    assert est.transfer == pytest.approx((1 << 24) * 10e-6 / FLAT.packet_bytes)


@pytest.mark.parametrize(
    ("summary", "n", "flag", "why"),
    [
        (TopologySummary(slots=0), 4, True, "no free switch slots"),
        (TopologySummary(switch_reachable=False), 4, True, "no switch"),
        (TopologySummary(), 4, False, "disabled"),
        (TopologySummary(), MAX_WORKERS + 1, True, "bitmap"),
    ],
)
def test_ina_unavailable_costs_infinity(
    summary: TopologySummary, n: int, flag: bool, why: str
) -> None:
    est = estimate("ina", 4096, n, FLAT, summary, ina_available=flag)
    assert est.seconds == math.inf and not est.available
    assert why in est.bound
    # the host-based algorithms are unaffected
    assert estimate("ring", 4096, n, FLAT, summary, ina_available=flag).available


def test_the_wire_is_a_floor_under_the_software() -> None:
    slow_link = TopologySummary(link_bandwidth=1e6, contention={"ina": 4.0})
    ring = estimate("ring", 1 << 20, 4, FLAT, slow_link)
    ina = estimate("ina", 1 << 20, 4, FLAT, slow_link)
    assert ring.bound == ina.bound == "wire"
    assert ring.transfer == pytest.approx(1.5 * (1 << 20) / 1e6)
    assert ina.transfer == pytest.approx(4 * (1 << 20) / 1e6)  # 4 streams share a link


def test_delay_adds_a_round_trip_per_step() -> None:
    far = TopologySummary(delay=1e-3)
    near = estimate("ring", 4096, 4, FLAT)
    assert estimate("ring", 4096, 4, FLAT, far).seconds == pytest.approx(near.seconds + 6 * 2e-3)


def test_loss_inflates_bytes_and_adds_timeouts() -> None:
    clean = estimate("ina", 1 << 20, 4, FLAT)
    lossy = estimate("ina", 1 << 20, 4, FLAT, TopologySummary(loss=0.1))
    assert lossy.transfer == pytest.approx(clean.transfer / 0.9)
    packets = (1 << 20) // FLAT.packet_bytes
    assert lossy.stalls == pytest.approx(packets * 0.1 * FLAT.timeout / FLAT.window)
    # the profile's loss and the path's combine
    both = Profile(FLAT.ina, FLAT.ring, FLAT.tree, FLAT.switch_rate, loss=0.1)
    combined = estimate("ina", 1 << 20, 4, both, TopologySummary(loss=0.1))
    assert combined.transfer == pytest.approx(clean.transfer / 0.81)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_sizes_and_workers_raise(bad: object) -> None:
    with pytest.raises(ValueError, match="size"):
        estimate("ring", bad, 4, FLAT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        estimate("ring", 4096, bad, FLAT)  # type: ignore[arg-type]


def test_unknown_algorithm_raises() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'nvls'"):
        estimate("nvls", 4096, 4, FLAT)


# ----------------------------------------------------------------- properties


@given(algo=st.sampled_from(["ina", "ring", "tree"]), n=workers, a=sizes, b=sizes)
def test_predicted_time_is_monotone_in_size(algo: str, n: int, a: int, b: int) -> None:
    small, large = sorted((a, b))
    topo = TopologySummary(link_bandwidth=125e6, loss=0.01, delay=1e-4)
    t_small = estimate(algo, small, n, DEFAULT_PROFILE, topo).seconds
    t_large = estimate(algo, large, n, DEFAULT_PROFILE, topo).seconds
    assert t_small <= t_large


@given(size=sizes, n=st.integers(2, MAX_WORKERS - 1))
def test_ring_grows_with_workers_and_ina_does_not_below_the_switch_bound(size: int, n: int) -> None:
    assert estimate("ring", size, n + 1, FLAT).seconds > estimate("ring", size, n, FLAT).seconds
    # FLAT's switch absorbs 1e15 bytes/s: far above 32 workers at 1 ns/byte
    assert estimate("ina", size, n + 1, FLAT).seconds == estimate("ina", size, n, FLAT).seconds


@given(size=sizes, n=workers)
def test_every_estimate_adds_up(size: int, n: int) -> None:
    for est in estimate_all(size, n, DEFAULT_PROFILE, TopologySummary(loss=0.05)).values():
        assert est.seconds == pytest.approx(est.latency + est.transfer + est.stalls)
        assert min(est.latency, est.transfer, est.stalls) >= 0


# ----------------------------------------------------------------- the profile file


def test_profile_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    DEFAULT_PROFILE.save(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == PROFILE_SCHEMA
    assert doc["algorithms"]["ring"] == {
        "alpha": DEFAULT_PROFILE.ring.alpha,
        "beta": DEFAULT_PROFILE.ring.beta,
    }
    assert "links" not in doc  # a loopback profile: older readers refuse unknown keys
    assert doc["workers"] == [4]
    assert Profile.load(path) == DEFAULT_PROFILE


def test_the_worker_counts_round_trip_and_none_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    replace(FLAT, workers=(2, 4, 8)).save(path)
    assert json.loads(path.read_text())["workers"] == [2, 4, 8]
    assert Profile.load(path).workers == (2, 4, 8)
    FLAT.save(path)  # not recorded: older readers refuse unknown keys
    assert "workers" not in json.loads(path.read_text())
    assert Profile.load(path).workers is None


LINKS = MeasuredLinks(topology="star4", job=1, bw_mbit=100.0, delay_ms=2.0, loss=0.01)


def test_a_profile_measured_across_links_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    profile = replace(FLAT, links=LINKS)
    profile.save(path)
    doc = json.loads(path.read_text())
    assert doc["links"] == {
        "topology": "star4",
        "job": 1,
        "bw_mbit": 100.0,
        "delay_ms": 2.0,
        "loss": 0.01,
        "jitter_ms": 0.0,
    }
    assert Profile.load(path) == profile
    assert LINKS.where == "star4 job 1"
    assert LINKS.describe() == "100 Mbit/s, 2 ms one way, loss 0.01"


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return path


def _good() -> dict[str, object]:
    return DEFAULT_PROFILE.to_dict()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema=99), "schema 99 is not 1"),
        (lambda d: d.pop("schema"), "schema None"),
        (lambda d: d.update(colour="red"), "unknown key.*colour"),
        (lambda d: d.pop("switch_rate"), "missing key 'switch_rate'"),
        (lambda d: d["algorithms"].pop("tree"), "'algorithms' must map"),
        (lambda d: d["algorithms"].update(ring={"alpha": 1}), r"algorithms\.ring: expected"),
        (lambda d: d["algorithms"].update(ina={"alpha": 1, "beta": -1}), "beta must be"),
        (lambda d: d.update(loss=1.0), r"loss must be in \[0, 1\)"),
        (lambda d: d.update(switch_rate=0), "switch_rate must be positive"),
        (lambda d: d.update(window=0), "window must be a positive integer"),
        (lambda d: d.update(switch_rate="fast"), "p.json"),
        (lambda d: d.update(links=[100]), "'links' must have the keys"),
        (lambda d: d.update(links={"topology": "star4", "job": 1}), "'links' must have"),
        (
            lambda d: d.update(links={**_links_doc(), "colour": "red"}),
            "'links' must have the keys",
        ),
        (lambda d: d.update(links={**_links_doc(), "bw_mbit": 0}), "bw_mbit must be positive"),
        (lambda d: d.update(links={**_links_doc(), "loss": 1.0}), r"links.loss must be in"),
        (lambda d: d.update(links={**_links_doc(), "delay_ms": -1}), "delay_ms must be"),
        (lambda d: d.update(links={**_links_doc(), "job": "one"}), "links.job must be"),
        (lambda d: d.update(workers=[]), "workers must be ascending positive integers"),
        (lambda d: d.update(workers=[8, 4]), r"workers must be .*\(8, 4\)"),
        (lambda d: d.update(workers=[4, 4]), "workers must be ascending"),
        (lambda d: d.update(workers=[0]), "workers must be ascending positive"),
        (lambda d: d.update(workers=["4"]), "workers must be"),
        (lambda d: d.update(workers=4), "workers must be"),
    ],
)
def test_bad_profiles_say_what_is_wrong(tmp_path: Path, edit: object, message: str) -> None:
    doc = _good()
    edit(doc)  # type: ignore[operator]
    with pytest.raises(ProfileError, match=message) as info:
        Profile.load(_write(tmp_path, doc))
    assert str(tmp_path / "p.json") in str(info.value)


def test_unreadable_or_non_json_profiles(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        Profile.load(bad)
    with pytest.raises(ProfileError, match="expected a JSON object"):
        Profile.load(_write(tmp_path, [1, 2]))


def _links_doc() -> dict[str, object]:
    return {"topology": "star4", "job": 1, "bw_mbit": 100.0, "delay_ms": 2.0, "loss": 0.0}


def test_default_profile_says_it_is_built_in_and_where_it_was_measured() -> None:
    source = DEFAULT_PROFILE.source
    assert source.startswith("built-in: inalab calibrate on 127.0.0.1")
    assert "2-core" in source and "workers 4" in source and "lanes 2048" in source
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", source)  # the date it was measured
    assert DEFAULT_PROFILE.links is None  # loopback: no emulated links
    assert DEFAULT_PROFILE.workers == (4,)  # as its source says
    assert DEFAULT_PROFILE.packet_bytes == 4 * 2048 and DEFAULT_PROFILE.window == 32


def test_default_profile_is_the_shipped_file() -> None:
    shipped = resources.files("dynamiccl").joinpath("default_profile.json").read_text()
    assert Profile.from_dict(json.loads(shipped)) == DEFAULT_PROFILE


# What the built-in profile's calibration run measured on its machine (inalab calibrate
# --workers 4 -e 16M, see DEFAULT_PROFILE), seconds per call with 4 workers, and the
# ring at 64 MiB: the median of five inalab bench runs there (0.90 to 2.26 s).
MEASURED_4_WORKERS = {
    ("ina", 1 << 20): 0.02098,
    ("ina", 16 << 20): 0.2721,
    ("ring", 1 << 20): 0.01826,
    ("ring", 16 << 20): 0.2974,
    ("ring", 64 << 20): 1.67,
    ("tree", 1 << 20): 0.03521,
    ("tree", 16 << 20): 0.3546,
}


@pytest.mark.parametrize(("algo", "size"), sorted(MEASURED_4_WORKERS))
def test_default_profile_predicts_hostlibs_own_algorithms(algo: str, size: int) -> None:
    # The old defaults were Gloo's ring: 177 ms at 64 MiB where hostlib's takes 1-2 s.
    predicted = estimate(algo, size, 4, DEFAULT_PROFILE).seconds
    measured = MEASURED_4_WORKERS[algo, size]
    assert measured / 2 <= predicted <= measured * 2, (predicted, measured)


# ----------------------------------------------------------------- the summary file

LEAF_SPINE = TopologySummary(
    link_bandwidth=125e6,
    delay=2e-3,
    hops=2,
    oversubscription=4.0,
    contention={"ina": 4.0, "ring": 1.0, "tree": 1.0},
    loss=0.01,
    fan_in=8,
    slots=16,
)


def test_a_summary_round_trips_through_json(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(LEAF_SPINE.to_dict()))
    assert TopologySummary.load(path) == LEAF_SPINE
    assert json.loads(path.read_text())["schema"] == SUMMARY_SCHEMA
    assert TopologySummary.from_dict(TopologySummary().to_dict()) == TopologySummary()


def test_an_omitted_field_keeps_its_default() -> None:
    doc = {"schema": SUMMARY_SCHEMA, "link_bandwidth": 1e6}
    assert TopologySummary.from_dict(doc) == TopologySummary(link_bandwidth=1e6)


def test_every_summary_field_is_checked() -> None:
    from dataclasses import fields

    from dynamiccl.model import _SUMMARY_VALUES

    assert set(_SUMMARY_VALUES) == {f.name for f in fields(TopologySummary)}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"schema": 2}, "schema 2 is not 1"),
        ({"colour": "red"}, r"unknown key\(s\) colour"),
        ({"contention": {"gloo": 2.0}}, r"unknown key\(s\) contention.gloo"),
        ({"contention": {"ina": 0.5}}, "contention must be an object of numbers >= 1"),
        ({"contention": [1]}, "contention must be an object"),
        ({"link_bandwidth": 0}, "link_bandwidth must be null"),
        ({"link_bandwidth": "fast"}, "link_bandwidth must be null"),
        ({"delay": -1}, "delay must be seconds >= 0"),
        ({"delay": float("nan")}, "delay must be"),
        ({"hops": 1.5}, "hops must be an integer"),
        ({"oversubscription": 0.5}, "oversubscription must be a number >= 1"),
        ({"loss": 1.0}, r"loss must be a probability in \[0, 1\)"),
        ({"switch_reachable": 1}, "switch_reachable must be true or false"),
        ({"fan_in": 0}, "fan_in must be null or an integer >= 1"),
        ({"slots": True}, "slots must be null or an integer >= 0"),
    ],
)
def test_bad_summaries_say_what_is_wrong(
    tmp_path: Path, edit: dict[str, object], message: str
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({**LEAF_SPINE.to_dict(), **edit}))
    with pytest.raises(SummaryError, match=message) as info:
        TopologySummary.load(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_unreadable_or_non_json_summaries(tmp_path: Path) -> None:
    with pytest.raises(SummaryError, match="cannot read summary"):
        TopologySummary.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SummaryError, match="not JSON"):
        TopologySummary.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(SummaryError, match="expected a JSON object, got list"):
        TopologySummary.load(bad)
