"""dynamiccl.tuner: decisions as the NCCL example tuner plugin's CSV rule file."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamiccl.model import AlgoParams, Profile
from dynamiccl.policy import Decision, choose
from dynamiccl.tuner import (
    NCCL_ALGORITHM,
    TunerRule,
    format_rules,
    parse_rules,
    tuner_rules,
    write_rules,
)


def _by_threshold(*steps: tuple[int, str]) -> Callable[[int], Decision]:
    """size -> the algorithm of the last threshold at or below it."""

    def decide(size: int) -> Decision:
        algo = [a for t, a in steps if size >= t][-1]
        return Decision(algo, {}, "test")

    return decide


def test_adjacent_equal_choices_merge_into_one_rule() -> None:
    decide = _by_threshold((0, "ina"), (65536, "tree"), (1 << 22, "ring"))
    rules = tuner_rules(decide, "allreduce", 4096, 1 << 30, n_ranks=8)
    assert [r.line() for r in rules] == [
        "allreduce,4096,65535,collnet_direct,simple,-1,-1,8",
        "allreduce,65536,4194303,tree,simple,-1,-1,8",
        "allreduce,4194304,1073741824,ring,simple,-1,-1,8",
    ]


def test_one_choice_everywhere_is_one_rule() -> None:
    rules = tuner_rules(_by_threshold((0, "ring")), "allreduce", 1, 1000)
    assert rules == [TunerRule("allreduce", 1, 1000, "ring")]


@given(lo=st.integers(1, 1 << 20), span=st.integers(0, 1 << 32), t=st.integers(1, 1 << 33))
def test_rules_cover_the_range_exactly_once(lo: int, span: int, t: int) -> None:
    hi = lo + span
    rules = tuner_rules(_by_threshold((0, "ina"), (t, "ring")), "allreduce", lo, hi)
    assert rules[0].min_bytes == lo and rules[-1].max_bytes == hi
    for a, b in itertools.pairwise(rules):
        assert b.min_bytes == a.max_bytes + 1
        assert a.algorithm != b.algorithm
    assert all(r.min_bytes <= r.max_bytes for r in rules)


def test_algorithm_names_are_the_example_plugins() -> None:
    assert NCCL_ALGORITHM == {"ina": "collnet_direct", "ring": "ring", "tree": "tree"}


def test_the_file_reads_back(tmp_path: Path) -> None:
    rules = tuner_rules(_by_threshold((0, "ina"), (1 << 20, "ring")), "allreduce", 1024, 1 << 24)
    path = tmp_path / "nccl_tuner.conf"
    write_rules(path, rules, "made by a test\nsecond line")
    text = path.read_text()
    lines = text.splitlines()
    assert lines[:3] == ["# made by a test", "# second line", "# " + _HEADER]
    assert all(len(line.split(",")) == 8 for line in lines[3:])
    assert parse_rules(text) == rules


_HEADER = "collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"


def test_parse_rules_rejects_malformed_lines() -> None:
    with pytest.raises(ValueError, match="line 2: expected 8 fields"):
        parse_rules("# ok\nallreduce,0,1,ring\n")
    with pytest.raises(ValueError, match=r"line 1: .*not an integer"):
        parse_rules("allreduce,0,big,ring,simple,-1,-1,-1")
    assert parse_rules("\n# only comments\n") == []
    assert format_rules([]).strip() == "# " + _HEADER


def test_bad_range_raises() -> None:
    with pytest.raises(ValueError, match="min_bytes <= max_bytes"):
        tuner_rules(_by_threshold((0, "ring")), "allreduce", 2048, 1024)
    with pytest.raises(ValueError):
        tuner_rules(_by_threshold((0, "ring")), "allreduce", 0, 1024)


def test_rules_from_the_real_policy() -> None:
    profile = Profile(
        ina=AlgoParams(5e-6, 10e-9),
        ring=AlgoParams(50e-6, 0.1e-9),
        tree=AlgoParams(50e-6, 1e-9),
        switch_rate=1e15,
    )
    rules = tuner_rules(
        lambda s: choose("allreduce", s, 8, None, profile), "allreduce", 4096, 1 << 30
    )
    assert rules[0].algorithm == "collnet_direct" and rules[-1].algorithm == "ring"
    no_switch = tuner_rules(
        lambda s: choose("allreduce", s, 8, None, profile, ina_available=False),
        "allreduce",
        4096,
        1 << 30,
    )
    assert all(r.algorithm != "collnet_direct" for r in no_switch)
