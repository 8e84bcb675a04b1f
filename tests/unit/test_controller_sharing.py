"""The controller's part of sharing that needs no switch: where a job's shared slots lie
in the region (``SharedEntry.cells``) and where the controller places a new job in it
(``best_offset``: the least overlap with the jobs already there)."""

from __future__ import annotations

import pytest

from controller.sharing import SharedEntry, best_offset, regions


def test_cells_wrap_around_the_region() -> None:
    entry = SharedEntry(job_id=3, count=5, base=100, size=4, offset=2)
    assert entry.cells() == [102, 103, 100, 101, 102]


def test_the_first_job_starts_at_the_region_start() -> None:
    assert best_offset([], 8, 3) == 0


def test_a_second_job_goes_where_the_first_is_not() -> None:
    first = SharedEntry(1, count=3, base=0, size=8, offset=0)
    assert best_offset([first], 8, 3) == 3
    second = SharedEntry(2, count=3, base=0, size=8, offset=3)
    # cells 6, 7 are free: a window of 3 there overlaps one cell; from 6 (6, 7, 0) too,
    # and from 5 (5, 6, 7) also one: the lowest of the least
    assert best_offset([first, second], 8, 3) == 5


@pytest.mark.parametrize("count", [8, 16, 17])
def test_whole_laps_cost_every_offset_alike(count: int) -> None:
    first = SharedEntry(1, count=2, base=0, size=8, offset=0)
    want = 0 if count % 8 == 0 else 2  # the remainder avoids cells 0 and 1
    assert best_offset([first], 8, count) == want


def test_regions_are_named_once() -> None:
    a = SharedEntry(1, 2, base=60, size=4, offset=0)
    b = SharedEntry(2, 4, base=60, size=4, offset=1)
    assert regions([a, b]) == {(60, 4)}
