"""The vector runner itself: the schema refuses bad vectors, and a target that disagrees
with a vector fails it (so a green run of test_vectors.py means something).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from runner import (
    COUNTERS,
    DROP_REASONS,
    Expected,
    SoftSwitchTarget,
    VectorError,
    VectorFailure,
    load_vector,
    load_vectors,
    mismatches,
    pack,
    parse_vector,
    run_vector,
)

from emulation.softswitch import DropReason, Pipeline

SMALL: dict[str, Any] = {
    "description": "one worker, one packet",
    "ports": 2,
    "jobs": [{"job_id": 3, "slot_count": 1, "workers": [1]}],
    "steps": [
        {"send": {"port": 1, "ina": {"job_id": 3, "rank": 0, "seq": 1}, "lanes": [4, 5]}},
        {
            "expect": [
                {"port": 1, "ina": {"job_id": 3, "seq": 1}, "lanes": [4, 5], "mask": ["rank"]}
            ]
        },
        {"expect_counters": {"completed": 1, "results_sent": 1}},
    ],
}


def edited(path: str, value: Any) -> dict[str, Any]:
    """SMALL with the item at ``path`` (dotted, integers index lists) set to ``value``."""
    doc = copy.deepcopy(SMALL)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = doc
    for p in parents:
        node = node[p]
    node[last] = value
    return doc


def test_the_small_vector_is_valid_and_passes(tmp_path: Path) -> None:
    run_vector(parse_vector(SMALL, Path("small.json")), SoftSwitchTarget(), tmp_path)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("switch", {"lanes": 4}, r"switch\.lanes: must be 64"),
        ("ports", 0, r"ports: must be an integer in 1\.\.32"),
        ("jobs.0.workers", [1, 3], r"jobs\[0\]\.workers\[1\]: must be an integer in 1\.\.2"),
        ("jobs.0.workers", [1, 1], r"jobs\[0\]\.workers: a port is bound to two ranks"),
        ("jobs.0.upstream", {"port": 1, "rank": 0}, r"jobs\[0\]\.upstream\.port: is a worker"),
        ("jobs.0.upstream", {"port": 2, "rank": 32}, r"jobs\[0\]\.upstream\.rank: must be an"),
        ("jobs.0.upstream", {"port": 2}, r"jobs\[0\]\.upstream: missing rank"),
        ("drops", {"ingress": 0.5, "egress": 0}, r"drops\.ingress: must be 0 or 1"),
        ("targets", ["tofino"], r"targets: must list some of"),
        ("steps", [], r"steps: must be a list of at least 1"),
        ("steps.0", {"sned": {}}, r"steps\[0\]: unknown field\(s\) sned"),
        ("steps.0.send.ina.seq", 2**32, r"steps\[0\]\.send\.ina\.seq: must be an integer"),
        ("steps.0.send.ina", {"job_id": 3, "seq": 1}, r"steps\[0\]\.send\.ina: missing rank"),
        ("steps.0.send.ina.ptype", "ACK", r"steps\[0\]\.send\.ina\.ptype: must be one of"),
        ("steps.0.send.lanes", [2**31], r"steps\[0\]\.send\.lanes\[0\]: must be an integer"),
        ("steps.0.send.lanes", [0] * 65, r"steps\[0\]\.send\.lanes: 65 lanes, more than 64"),
        ("steps.0.send.lanes", {"fill": 1, "range": [0, 2]}, r"exactly one of \"fill\", \"range\""),
        (
            "steps.0",
            {"send_raw": {"port": 1, "hex": "00", "to": {"port": 2, "udp_dport": 9}}},
            r"steps\[0\]\.send_raw\.to: needs the vector to declare",
        ),
        ("steps.1.expect.0.mask", ["rnak"], r"expect\[0\]\.mask: unknown field\(s\) rnak"),
        ("steps.1.expect.0.port", 3, r"expect\[0\]\.port: must be an integer in 1\.\.2"),
        ("steps.2.expect_counters", {"drop_bogus": 1}, r"unknown field\(s\) drop_bogus"),
        ("steps.2", {"expect_none": {"timeout": 0}}, r"expect_none\.timeout: must be a number"),
    ],
)
def test_schema_rejects_a_malformed_vector(path: str, value: Any, message: str) -> None:
    with pytest.raises(VectorError, match=r"^bad\.json: .*" + message):
        parse_vector(edited(path, value), Path("bad.json"))


def test_unreadable_json_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"description": ')
    with pytest.raises(VectorError, match=r"^broken\.json: \(top\): not readable JSON"):
        load_vector(bad)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("steps.1.expect.0.lanes", [4, 6], r"steps\[1\] \(expect\): port 1 packet 0: 1 lane"),
        ("steps.1.expect.0.ina.seq", 2, r"steps\[1\] \(expect\): .*seq: expected 2, got 1"),
        ("steps.1.expect.0.port", 2, r"steps\[1\] \(expect\): port 2: packet 0 did not arrive"),
        ("steps.1", {"expect_none": {"timeout": 0.5}}, r"steps\[1\] \(expect_none\): port 1"),
        ("steps.2.expect_counters", {"completed": 2}, r"completed: expected \+2, got \+1"),
    ],
)
@pytest.mark.slow
def test_a_target_that_disagrees_fails_the_vector(
    path: str, value: Any, message: str, tmp_path: Path
) -> None:
    with pytest.raises(VectorFailure, match=r"^bad\.json: .*" + message):
        run_vector(
            parse_vector(edited(path, value), Path("bad.json")), SoftSwitchTarget(), tmp_path
        )


def test_a_strict_counter_left_out_must_not_move(tmp_path: Path) -> None:
    doc = copy.deepcopy(SMALL)
    doc["steps"].insert(2, copy.deepcopy(SMALL["steps"][0]))  # a retransmission, answered
    doc["steps"].insert(3, copy.deepcopy(SMALL["steps"][1]))
    doc["steps"][4]["expect_counters"]["results_sent"] = 2
    with pytest.raises(
        VectorFailure, match=r"steps\[4\] \(expect_counters\): retransmits_answered: expected \+0"
    ):
        run_vector(parse_vector(doc, Path("bad.json")), SoftSwitchTarget(), tmp_path)


def test_an_unexpected_extra_result_fails_expect(tmp_path: Path) -> None:
    doc = copy.deepcopy(SMALL)
    doc["steps"].insert(1, copy.deepcopy(SMALL["steps"][0]))  # answered: a second result
    doc["steps"] = doc["steps"][:3]
    doc["steps"].insert(2, {"expect_counters": {"completed": 1, "retransmits_answered": 1}})
    with pytest.raises(VectorFailure, match=r"steps\[3\] \(expect\): port 1 received an unexp"):
        run_vector(parse_vector(doc, Path("bad.json")), SoftSwitchTarget(), tmp_path)


def test_masked_fields_are_not_compared() -> None:
    fields = {
        "version": 1, "ptype": 2, "flags": 0, "job_id": 1, "rank": 0, "exponent": -128,
        "num_lanes": 1, "set": 0, "slot": 0, "reserved": 0, "seq": 5,
    }  # fmt: skip
    want = pack(fields) + (7).to_bytes(4, "big")
    got = pack(fields | {"rank": 3, "seq": 6}) + (8).to_bytes(4, "big")
    assert mismatches(Expected(1, want, frozenset({"rank", "seq", "lanes"}), False), got) == []
    problems = mismatches(Expected(1, want, frozenset({"rank"}), False), got)
    assert problems == [
        "seq: expected 5, got 6",
        "1 lane(s) differ (lane, expected, got): [(0, 7, 8)]",
    ]


def test_counter_names_are_the_pipelines() -> None:
    assert set(Pipeline(lanes=1, slots=1).counters()) == COUNTERS
    assert set(DROP_REASONS) == {r.value for r in DropReason}


def test_every_drop_reason_is_exercised_by_some_vector() -> None:
    seen: set[str] = set()
    for vector in load_vectors():
        for step in vector.steps:
            seen |= {k for k, v in step.counters.items() if v > 0}
    assert {f"drop_{r}" for r in DROP_REASONS} <= seen
    assert {"duplicates_ignored", "retransmits_answered", "completed"} <= seen
    assert {"sent_upstream", "upstream_resent", "results_from_upstream"} <= seen


def test_vector_files_are_plain_json_objects() -> None:
    for vector in load_vectors():
        assert isinstance(json.loads(vector.path.read_text()), dict)
