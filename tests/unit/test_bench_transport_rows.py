"""Bench rows labelled with INA's transport: an ``ina`` row carries ``transport`` (``udp``
or ``rdma``) in the JSON and back; the host-to-host algorithms' rows carry none."""

from __future__ import annotations

from emulation.bench.config import BenchConfig
from emulation.bench.report import Row, merge_ranks
from emulation.bench.sweep import _transport
from emulation.bench.workers import SizeResult


def _per_rank() -> list[list[SizeResult]]:
    return [[SizeResult(4096, 1024, 10.0 + r, 0, 0.0)] for r in range(2)]


def test_an_ina_row_says_its_transport_in_the_json_and_back() -> None:
    (row,) = merge_ranks("ina", "int32", _per_rank(), transport="rdma")
    doc = row.to_json()
    assert doc["transport"] == "rdma"
    assert Row.from_json(doc, 2).transport == "rdma"
    (ring,) = merge_ranks("ring", "int32", _per_rank())
    assert "transport" not in ring.to_json() and Row.from_json(ring.to_json(), 2).transport is None


def test_the_sweep_labels_ina_rows_only() -> None:
    rdma = BenchConfig(sizes=(4096,), algos=("ina", "ring"), lanes=256, slots=8,
                       transport="rdma", msg_packets=2)  # fmt: skip
    assert [_transport(rdma, a) for a in ("ina", "ring", "gloo")] == ["rdma", None, None]
    assert _transport(BenchConfig(sizes=(4096,)), "ina") == "udp"
