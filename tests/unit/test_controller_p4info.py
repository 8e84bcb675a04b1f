"""The P4Info index, value encoding and entry builders of the controller (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from controller import (
    DEFAULT_P4INFO_PATH,
    EncodingError,
    P4Info,
    P4InfoError,
    counter_entry,
    decode_value,
    encode_value,
    entity,
    multicast_group_entry,
    register_entry,
    table_entry,
)
from hostlib.protocol import SWITCH_DROPS

P4INFO = P4Info.load()
JOB_PARAMS = {"num_workers": 4, "slot_base": 256, "slot_count": 128, "mgid": 7}
TOO_MANY_WORKERS = {**JOB_PARAMS, "num_workers": 256}


def test_default_path_is_the_repository_p4info() -> None:
    repo = Path(__file__).resolve().parents[2]
    assert repo / "p4" / "ina.p4info.txtpb" == DEFAULT_P4INFO_PATH
    # + roce_requests, roce_jobs, roce_replies; shared, fallback, behind
    assert len(P4INFO.tables) == 5 + 3 + 3
    assert len(P4INFO.actions) == 11 + 6 + 6
    assert len(P4INFO.counters) == 4 + 4  # + the per-job counters of sharing
    # + RoCEv2's queue pairs, sharing's owner
    assert len(P4INFO.registers) == 3 + 2 + 1 + 64 + 2 + 6 + 1 + 1


@pytest.mark.parametrize("key", ["Ingress.jobs.jobs", "jobs", 0x02030001])
def test_a_table_is_found_by_name_alias_and_id(key: str | int) -> None:
    table = P4INFO.table(key)
    assert (table.id, table.name, table.size) == (0x02030001, "Ingress.jobs.jobs", 1024)


def test_match_fields_and_params_by_name_and_id() -> None:
    workers = P4INFO.table("Ingress.workers.workers")
    assert [(f.name, f.bitwidth) for f in workers.match_fields] == [
        ("job_id", 16),
        ("rank", 8),
        ("ipv4_src", 32),
        ("udp_src_port", 16),
    ]
    assert workers.match_field("ipv4_src") == workers.match_field(3)
    assert workers.match_field(3).match_type == "EXACT"
    set_job = P4INFO.action("Ingress.jobs.set_job")
    assert set_job.param("mgid").id == 4
    assert set_job.param(2).name == "slot_base"
    assert P4INFO.table("jobs").action_scope(0x01030002) == "DEFAULT_ONLY"
    assert P4INFO.table("jobs").action_scope(0x01090001) is None


def test_counters_and_registers() -> None:
    assert P4INFO.counter("Egress.drops").size == len(SWITCH_DROPS) == 14
    assert P4INFO.counter(0x12010001).unit == "PACKETS"
    assert P4INFO.register("Ingress.exponents.exponent").bitwidth == 8
    assert P4INFO.register(0x1607003F).name == "Ingress.values.lane_63"


@pytest.mark.parametrize(
    ("lookup", "pattern"),
    [
        (lambda: P4INFO.table("Ingress.jobs"), "no table 'Ingress.jobs'"),
        (lambda: P4INFO.table(0x02030099), "no table 0x02030099"),
        (lambda: P4INFO.action("set_jobs"), "no action"),
        (lambda: P4INFO.counter("Ingress.seq"), "no counter"),
        (lambda: P4INFO.register("Ingress.drops"), "no register"),
        (lambda: P4INFO.table("jobs").match_field("rank"), r"no match field 'rank' .*job_id"),
        (lambda: P4INFO.action("set_job").param(9), "no parameter 9"),
    ],
)
def test_unknown_names_and_ids_raise(lookup: object, pattern: str) -> None:
    with pytest.raises(P4InfoError, match=pattern):
        lookup()  # type: ignore[operator]


def test_bad_p4info_sources_raise(tmp_path: Path) -> None:
    with pytest.raises(P4InfoError, match="cannot read"):
        P4Info.load(tmp_path / "missing.txtpb")
    with pytest.raises(P4InfoError, match="not a text-format"):
        P4Info.from_text("tables { nonsense: 1 }")
    with pytest.raises(P4InfoError, match="not a serialised"):
        P4Info.from_bytes(b"\xff\xff\xff")
    with pytest.raises(P4InfoError, match=r"expected a p4.config.v1.P4Info"):
        P4Info(p4runtime_pb2.TableEntry())
    twice = p4info_pb2.P4Info()
    twice.actions.add().preamble.id = 1
    twice.actions.add().preamble.id = 1
    with pytest.raises(P4InfoError, match="two actions with id"):
        P4Info(twice)


def test_serialised_p4info_round_trips() -> None:
    again = P4Info.from_bytes(P4INFO.message.SerializeToString())
    assert again.message == P4INFO.message


@pytest.mark.parametrize(
    ("value", "bitwidth", "encoded"),
    [
        (0, 16, b"\x00"),
        (7, 16, b"\x07"),
        (0x1388, 16, b"\x13\x88"),
        (511, 9, b"\x01\xff"),
        ("10.0.0.1", 32, b"\x0a\x00\x00\x01"),
        ("0.0.0.3", 32, b"\x03"),
        ("02:00:00:00:00:01", 48, b"\x02\x00\x00\x00\x00\x01"),
        ("00-00-00-00-AB-cd", 48, b"\xab\xcd"),
        ("::1", 128, b"\x01"),
        (b"\x00\x00\x07", 16, b"\x07"),
        (b"\x00", 8, b"\x00"),
    ],
)
def test_encode_known_values(value: int | str | bytes, bitwidth: int, encoded: bytes) -> None:
    assert encode_value(value, bitwidth) == encoded


@pytest.mark.parametrize(
    ("value", "bitwidth"),
    [
        (512, 9),
        (-1, 8),
        (256, 8),
        ("10.0.0.1", 16),
        ("ff:ff:ff:ff:ff:ff", 47),
        ("not an address", 32),
        ("10.0.0.256", 32),
        (b"\x01\x00", 8),
        (True, 1),
        (1.0, 8),
        (1, 0),
    ],
)
def test_encode_rejects(value: object, bitwidth: int) -> None:
    with pytest.raises(EncodingError):
        encode_value(value, bitwidth)  # type: ignore[arg-type]


@given(st.integers(1, 160).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, 2**w - 1))))
def test_encoding_round_trips_canonically(width_value: tuple[int, int]) -> None:
    bitwidth, value = width_value
    data = encode_value(value, bitwidth)
    assert decode_value(data, bitwidth) == value
    assert data == b"\x00" or data[0] != 0  # canonical: no leading zero byte
    assert len(data) <= (bitwidth + 7) // 8
    padded = data.rjust((bitwidth + 7) // 8, b"\x00")
    assert encode_value(padded, bitwidth) == data
    assert decode_value(padded, bitwidth) == value


@given(st.integers(1, 160).flatmap(lambda w: st.tuples(st.just(w), st.integers(2**w, 2**w * 4))))
def test_values_too_wide_are_rejected(width_value: tuple[int, int]) -> None:
    bitwidth, value = width_value
    with pytest.raises(EncodingError, match=f"unsigned {bitwidth}-bit"):
        encode_value(value, bitwidth)
    with pytest.raises(EncodingError):
        decode_value(value.to_bytes((value.bit_length() + 7) // 8, "big"), bitwidth)


def test_decode_rejects_empty_bytes() -> None:
    with pytest.raises(EncodingError, match="empty"):
        decode_value(b"", 8)


def test_table_entry_puts_fields_in_p4info_order() -> None:
    entry = table_entry(
        P4INFO,
        "replicas",
        {"egress_port": 3, "job_id": 7, "egress_rid": 1},
        "set_destination",
        {"dst_port": 5000, "dst_ip": "10.0.0.1", "dst_mac": "02:00:00:00:00:01"},
    )
    assert entry.table_id == 0x020A0001
    assert [(m.field_id, m.exact.value) for m in entry.match] == [
        (1, b"\x07"),
        (2, b"\x01"),
        (3, b"\x03"),
    ]
    assert entry.action.action.action_id == 0x010A0001
    assert [p.param_id for p in entry.action.action.params] == [1, 2, 3]
    assert entry.action.action.params[1].value == b"\x0a\x00\x00\x01"


@pytest.mark.parametrize(
    ("table", "match", "action", "params", "error", "pattern"),
    [
        ("jobs", {"job_id": 7}, "job_miss", {}, P4InfoError, "cannot use action"),
        ("jobs", {"job_id": 7}, "flood", {"mgid": 1}, P4InfoError, "cannot use action"),
        ("jobs", {}, "set_job", JOB_PARAMS, P4InfoError, "no value for match field job_id"),
        ("jobs", {"job_id": 7}, "set_job", {"mgid": 7}, P4InfoError, "num_workers, slot_base"),
        ("jobs", {"job_id": 7, "rank": 1}, "set_job", JOB_PARAMS, P4InfoError, "rank"),
        ("jobs", {"job_id": 7}, "set_job", {**JOB_PARAMS, "x": 1}, P4InfoError, "'x'"),
        ("jobs", {"job_id": 2**16}, "set_job", JOB_PARAMS, EncodingError, "16-bit"),
        ("jobs", {"job_id": 7}, "set_job", TOO_MANY_WORKERS, EncodingError, "8-bit"),
    ],
)
def test_table_entry_rejects(
    table: str,
    match: dict[str, int],
    action: str,
    params: dict[str, int],
    error: type[Exception],
    pattern: str,
) -> None:
    with pytest.raises(error, match=pattern):
        table_entry(P4INFO, table, match, action, params)


def test_register_and_counter_entries() -> None:
    cell = register_entry(P4INFO, "Ingress.exponents.exponent", 3, 0x80)
    assert (cell.register_id, cell.index.index, cell.data.bitstring) == (0x16060001, 3, b"\x80")
    assert not register_entry(P4INFO, "Ingress.seq").HasField("index")
    assert counter_entry(P4INFO, "Ingress.drops", 10).index.index == 10
    with pytest.raises(P4InfoError, match="index 1 is out of range"):
        register_entry(P4INFO, "Ingress.drop_simulator.probability", 1)
    with pytest.raises(P4InfoError, match="out of range"):
        counter_entry(P4INFO, "Ingress.drops", 14)
    with pytest.raises(EncodingError):
        register_entry(P4INFO, "Ingress.exponents.exponent", 0, 0x100)


def test_multicast_group_entry_checks_its_numbers() -> None:
    group = multicast_group_entry(5, [(1, 0), (2, 1)])
    assert [(r.egress_port, r.instance) for r in group.replicas] == [(1, 0), (2, 1)]
    for group_id, replicas in [(0, [(1, 0)]), (5, [(1, 0), (1, 0)]), (5, [(-1, 0)])]:
        with pytest.raises(EncodingError):
            multicast_group_entry(group_id, replicas)


def test_entity_wraps_each_kind_once() -> None:
    wrapped = entity(multicast_group_entry(5, [(1, 0)]))
    assert wrapped.packet_replication_engine_entry.multicast_group_entry.multicast_group_id == 5
    assert entity(wrapped) is wrapped
    assert entity(counter_entry(P4INFO, "Ingress.drops")).WhichOneof("entity") == "counter_entry"
    with pytest.raises(TypeError):
        entity(p4runtime_pb2.Update())
