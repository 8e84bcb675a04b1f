"""The wire format: header layout, field ranges, malformed datagrams, shared constants."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostlib.protocol import (
    DEFAULT_SLOTS_PER_JOB,
    EXPONENT_MAX,
    EXPONENT_MIN,
    FLAG_RESEND,
    HEADER,
    HEADER_SIZE,
    INA_UDP_PORT,
    LANE_BYTES,
    LANES_PER_PACKET,
    MAX_LANES,
    MAX_SLOT,
    MAX_WORKERS,
    POOL_SET_BIT,
    PROTOCOL_VERSION,
    SLOT_MASK,
    SWITCH_SLOTS,
    Header,
    PacketType,
    ProtocolError,
    make_pool_index,
    pack_header,
    packet_size,
    split_pool_index,
    unpack_header,
)

# A jumbo frame's MTU less the IPv4 (20) and UDP (8) headers.
JUMBO_UDP_PAYLOAD = 9000 - 20 - 8

headers = st.builds(
    Header,
    ptype=st.sampled_from(PacketType),
    job_id=st.integers(0, 0xFFFF),
    rank=st.integers(0, 0xFF),
    slot=st.integers(0, MAX_SLOT),
    pool_set=st.integers(0, 1),
    seq=st.integers(0, 0xFFFFFFFF),
    num_lanes=st.integers(0, MAX_LANES) | st.just(0xFFFF),
    exponent=st.integers(EXPONENT_MIN, EXPONENT_MAX),
    flags=st.integers(0, 0xFF),
)

BASE = Header(PacketType.DATA, job_id=3, rank=1, slot=5, pool_set=1, seq=77, num_lanes=2)


def _datagram(h: Header) -> bytes:
    return pack_header(h) + bytes(h.num_lanes * LANE_BYTES)


def test_header_is_16_bytes() -> None:
    assert HEADER_SIZE == 16
    assert HEADER.size == 16
    assert len(pack_header(BASE)) == HEADER_SIZE


def test_known_encoding() -> None:
    h = Header(
        PacketType.RESULT,
        job_id=0x0102,
        rank=3,
        slot=0x0405,
        pool_set=1,
        seq=0x06070809,
        num_lanes=64,
        exponent=-2,
        flags=FLAG_RESEND,
    )
    assert pack_header(h) == bytes.fromhex("12 01 0102 03 fe 0040 8405 0000 06070809")


@given(headers)
def test_pack_unpack_round_trip(h: Header) -> None:
    assert unpack_header(_datagram(h)) == h


@given(headers)
def test_pack_into_buffer_matches_pack(h: Header) -> None:
    buf = bytearray(HEADER_SIZE + 3)
    assert pack_header(h, buf, 3) == b""
    assert bytes(buf[3:]) == pack_header(h)
    assert bytes(buf[:3]) == bytes(3)


def test_reserved_is_zero_on_send_and_ignored_on_receive() -> None:
    raw = bytearray(_datagram(BASE))
    assert raw[10:12] == b"\x00\x00"
    raw[10:12] = b"\xff\xff"
    assert unpack_header(raw) == BASE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", -1),
        ("version", 16),
        ("job_id", -1),
        ("job_id", 0x10000),
        ("rank", -1),
        ("rank", 0x100),
        ("slot", -1),
        ("slot", MAX_SLOT + 1),
        ("pool_set", -1),
        ("pool_set", 2),
        ("seq", -1),
        ("seq", 2**32),
        ("num_lanes", -1),
        ("num_lanes", 0x10000),
        ("exponent", EXPONENT_MIN - 1),
        ("exponent", EXPONENT_MAX + 1),
        ("flags", -1),
        ("flags", 0x100),
    ],
)
def test_out_of_range_field_raises_on_pack(field: str, value: int) -> None:
    change: dict[str, Any] = {field: value}
    bad = dataclasses.replace(BASE, **change)
    with pytest.raises(ProtocolError, match=field.split("_")[0]):
        pack_header(bad)
    with pytest.raises(ProtocolError):
        pack_header(bad, bytearray(HEADER_SIZE))


@pytest.mark.parametrize("ptype", [0, 3, 15, 16, -1, None, "DATA"])
def test_unknown_ptype_raises_on_pack(ptype: object) -> None:
    change: dict[str, Any] = {"ptype": ptype}
    bad = dataclasses.replace(BASE, **change)
    with pytest.raises(ProtocolError, match="ptype"):
        pack_header(bad)
    with pytest.raises(ProtocolError, match="ptype"):
        pack_header(bad, bytearray(HEADER_SIZE))


@pytest.mark.parametrize("ptype", list(PacketType))
def test_plain_int_ptype_packs_like_the_enum(ptype: PacketType) -> None:
    change: dict[str, Any] = {"ptype": int(ptype)}
    as_int = dataclasses.replace(BASE, **change)
    assert pack_header(as_int) == pack_header(dataclasses.replace(BASE, ptype=ptype))


@pytest.mark.parametrize(
    ("size", "offset"),
    [(0, 0), (HEADER_SIZE - 1, 0), (HEADER_SIZE, 1), (HEADER_SIZE + 3, 4), (HEADER_SIZE, 99)],
)
def test_pack_into_too_small_buffer_raises(size: int, offset: int) -> None:
    buf = bytearray(b"\xaa" * size)
    with pytest.raises(ProtocolError, match="no room"):
        pack_header(BASE, buf, offset)
    with pytest.raises(ProtocolError, match="no room"):
        pack_header(BASE, memoryview(buf), offset)
    assert buf == bytearray(b"\xaa" * size)  # nothing written


def test_protocol_error_is_a_value_error() -> None:
    assert issubclass(ProtocolError, ValueError)


@pytest.mark.parametrize("length", [0, 1, HEADER_SIZE - 1])
def test_truncated_raises(length: int) -> None:
    with pytest.raises(ProtocolError, match="truncated"):
        unpack_header(_datagram(BASE)[:length])


@pytest.mark.parametrize("version", [0, PROTOCOL_VERSION + 1, 15])
def test_unknown_version_raises(version: int) -> None:
    raw = bytearray(_datagram(BASE))
    raw[0] = (version << 4) | PacketType.DATA
    with pytest.raises(ProtocolError, match="version"):
        unpack_header(raw)


@pytest.mark.parametrize("ptype", sorted(set(range(16)) - {int(t) for t in PacketType}))
def test_unknown_type_raises(ptype: int) -> None:
    raw = bytearray(_datagram(BASE))
    raw[0] = (PROTOCOL_VERSION << 4) | ptype
    with pytest.raises(ProtocolError, match="type"):
        unpack_header(raw)


@pytest.mark.parametrize("delta", [-LANE_BYTES, -1, 1, LANE_BYTES])
def test_length_mismatch_raises(delta: int) -> None:
    raw = _datagram(BASE)
    raw = raw[:delta] if delta < 0 else raw + bytes(delta)
    with pytest.raises(ProtocolError, match="lanes"):
        unpack_header(raw)


def test_unpack_accepts_memoryview_and_bytearray() -> None:
    raw = _datagram(BASE)
    assert unpack_header(memoryview(raw)) == BASE
    assert unpack_header(bytearray(raw)) == BASE


@given(st.integers(0, MAX_SLOT), st.integers(0, 1))
def test_pool_index_round_trip(slot: int, pool_set: int) -> None:
    index = make_pool_index(slot, pool_set)
    assert 0 <= index <= 0xFFFF
    assert bool(index & POOL_SET_BIT) == bool(pool_set)
    assert split_pool_index(index) == (slot, pool_set)


def test_pool_index_layout() -> None:
    assert make_pool_index(0, 1) == 0x8000
    assert make_pool_index(MAX_SLOT, 0) == 0x7FFF
    assert split_pool_index(0xFFFF) == (MAX_SLOT, 1)


@pytest.mark.parametrize(("slot", "pool_set"), [(-1, 0), (MAX_SLOT + 1, 0), (0, 2), (0, -1)])
def test_pool_index_out_of_range_raises(slot: int, pool_set: int) -> None:
    with pytest.raises(ProtocolError):
        make_pool_index(slot, pool_set)


def test_constants_are_consistent() -> None:
    assert HEADER.format == "!BBHBbHHHI"  # network order: what a P4 parser extracts
    assert struct.calcsize(HEADER.format) == HEADER_SIZE
    assert 0 < PROTOCOL_VERSION <= 0xF
    assert 1024 <= INA_UDP_PORT <= 0xFFFF
    assert LANE_BYTES == 4
    assert 1 <= LANES_PER_PACKET <= MAX_LANES <= 0xFFFF
    assert packet_size(LANES_PER_PACKET) == HEADER_SIZE + 256
    assert packet_size(MAX_LANES) <= JUMBO_UDP_PAYLOAD
    assert MAX_WORKERS == 32
    assert (1 << MAX_WORKERS) - 1 == 0xFFFFFFFF  # every rank's bit fits the uint32 bitmap
    assert POOL_SET_BIT & SLOT_MASK == 0
    assert POOL_SET_BIT | SLOT_MASK == 0xFFFF
    assert MAX_SLOT == SLOT_MASK
    assert 1 <= DEFAULT_SLOTS_PER_JOB <= SWITCH_SLOTS <= MAX_SLOT + 1
    assert (EXPONENT_MIN, EXPONENT_MAX) == (-128, 127)  # the signed 8-bit field
    assert 0 < FLAG_RESEND <= 0xFF


def test_packet_types_fit_four_bits() -> None:
    assert all(0 < int(t) <= 0xF for t in PacketType)
    assert {t.name for t in PacketType} == {"DATA", "RESULT"}
