"""The bench's reduce-scatter and all-gather: what runs them, their sizes, bus factors,
CPU per Gbit, and how a rank's result is judged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from emulation.bench.config import BenchConfig, default_algorithms
from emulation.bench.cpu import RowCpu
from emulation.bench.notes import legend
from emulation.bench.report import Row, bus_factor, format_table
from emulation.bench.workers import WorkerPlan, check_result, make_input, reference


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor(4) == 1.5 and bus_factor(4, "allreduce") == 1.5
    assert bus_factor(4, "reduce_scatter") == bus_factor(4, "all_gather") == 0.75
    assert bus_factor(1, "all_gather") == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor(4, "broadcast")


def test_defaults_and_refusals_per_collective() -> None:
    assert default_algorithms("allreduce") == ("ina", "gloo")
    assert default_algorithms("reduce_scatter") == ("ina", "gloo")
    assert default_algorithms("all_gather") == ("ring", "gloo")
    BenchConfig(sizes=(4096,), algos=("ina", "ring", "gloo"), collective="reduce_scatter")
    with pytest.raises(ValueError, match="tree, auto cannot run reduce_scatter"):
        BenchConfig(sizes=(4096,), algos=("tree", "auto"), collective="reduce_scatter")
    with pytest.raises(ValueError, match="ina cannot run all_gather"):
        BenchConfig(sizes=(4096,), algos=("ina",), collective="all_gather")
    with pytest.raises(ValueError, match="not 4092 B"):  # 1023 int32 over 4 ranks
        BenchConfig(sizes=(4092,), algos=("ring",), dtype="int32", collective="all_gather")
    with pytest.raises(ValueError, match="collective 'gather'"):
        BenchConfig(sizes=(4096,), algos=("ring",), collective="gather")


def _row(algo: str, collective: str) -> Row:
    cpu = RowCpu(workers=(0.5, 0.5, 0.5, 0.5), start=0.0, end=1.0)
    return Row(algo, 1 << 20, 1 << 18, "float32", 4, 1000.0, 1000.0, 1000.0, 0,
               cpu=cpu, collective=collective)  # fmt: skip


def test_cpu_per_gbit_counts_what_each_rank_sends() -> None:
    # 1 MiB in 1 ms at half a core: 0.5 ms of CPU per call.
    mib_gbit = (1 << 20) * 8 / 1e9
    ina = _row("ina", "reduce_scatter").worker_cpu_s_per_gbit
    ring = _row("ring", "reduce_scatter").worker_cpu_s_per_gbit
    gather = _row("gloo", "all_gather").worker_cpu_s_per_gbit
    assert ina == pytest.approx(0.5e-3 / mib_gbit, rel=1e-3)  # the whole vector, once
    assert ring == pytest.approx(0.5e-3 / (mib_gbit * 0.75), rel=1e-3)  # (n-1)/n of it
    assert gather == ring
    allreduce = _row("ring", "allreduce").worker_cpu_s_per_gbit
    assert allreduce == pytest.approx(0.5e-3 / (mib_gbit * 1.5), rel=1e-3)


def test_rows_keep_their_collective_through_json() -> None:
    row = dataclasses.replace(_row("ring", "all_gather"), cpu=None)
    doc = row.to_json()
    assert doc["collective"] == "all_gather" and doc["redop"] == "none"
    assert Row.from_json(doc, 4) == row
    old = {k: v for k, v in doc.items() if k != "collective"}  # a document from before
    assert Row.from_json(old, 4).collective == "allreduce"
    table = format_table("ring", [row])
    assert "# collective: all_gather" in table
    assert "busbw = algbw * (n-1)/n" in "\n".join(legend([row]))  # once, above the tables
    assert "  none  " in table


def _plan(collective: str, dtype: str, rank: int, algo: str = "ring") -> WorkerPlan:
    return WorkerPlan(algo, rank, 4, (4096,), dtype, 1, 0, 7, 64, 8, 5.0, collective=collective)


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_a_reduce_scatter_part_is_judged_where_it_lies(dtype: str) -> None:
    count = 1000
    total, _ = reference(7, 4, count, dtype)
    for rank in range(4):
        plan = _plan("reduce_scatter", dtype, rank)
        part = total[rank * 250 : (rank + 1) * 250].astype(dtype)
        assert check_result(plan, "ring", part, count)[0] == 0
        wrong = part.copy()
        wrong[3] += 64
        assert check_result(plan, "ring", wrong, count)[0] == 1
        other = total[((rank + 1) % 4) * 250 :][:250].astype(dtype)  # another rank's part
        assert check_result(plan, "ring", other, count)[0] > 0
    with pytest.raises(ValueError, match="this rank's part"):
        check_result(_plan("reduce_scatter", dtype, 0), "ring", total.astype(dtype), count)


def test_an_all_gather_must_deliver_every_input_exactly_in_rank_order() -> None:
    parts = [make_input(7, r, 250, "float32") for r in range(4)]
    plan = _plan("all_gather", "float32", 2)
    assert check_result(plan, "gloo", np.concatenate(parts), 1000) == (0, 0.0)
    swapped = np.concatenate([parts[1], parts[0], *parts[2:]])
    assert check_result(plan, "gloo", swapped, 1000)[0] > 0
    nudged = np.concatenate(parts)
    nudged[999] = np.nextafter(nudged[999], np.float32(np.inf))  # one ulp: still wrong
    assert check_result(plan, "gloo", nudged, 1000)[0] == 1
