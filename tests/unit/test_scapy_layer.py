"""The scapy INA layer agrees byte for byte with hostlib.protocol, in frames and pcaps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Padding, Raw
from scapy.utils import rdpcap, wrpcap

from hostlib.protocol import (
    EXPONENT_MIN,
    FLAG_RESEND,
    HEADER_SIZE,
    INA_UDP_PORT,
    MAX_LANES,
    PROTOCOL_VERSION,
    Header,
    PacketType,
    pack_header,
    unpack_header,
)
from hostlib.scapy_layer import INA

LANES = np.array([0, 1, -1, 2**31 - 1, -(2**31), 123456, -7, 42], dtype=np.int32)

HEADER = Header(
    ptype=PacketType.RESULT,
    job_id=0xBEEF,
    rank=31,
    slot=0x7FFE,
    pool_set=1,
    seq=0xDEADBEEF,
    num_lanes=len(LANES),
    exponent=-3,
    flags=FLAG_RESEND,
)


def _wire(h: Header = HEADER, lanes: np.ndarray = LANES) -> bytes:
    return pack_header(h) + lanes.astype(">i4").tobytes()


def _scapy(h: Header = HEADER, lanes: np.ndarray = LANES) -> INA:
    return INA(
        version=h.version,
        ptype=int(h.ptype),
        flags=h.flags,
        job_id=h.job_id,
        rank=h.rank,
        exponent=h.exponent,
        pool_set=h.pool_set,
        slot=h.slot,
        seq=h.seq,
        lanes=[int(v) for v in lanes],
    )


def _check_fields(p: INA, h: Header = HEADER, lanes: np.ndarray = LANES) -> None:
    assert p.version == PROTOCOL_VERSION
    assert p.ptype == h.ptype
    assert int(p.flags) == h.flags
    assert p.job_id == h.job_id
    assert p.rank == h.rank
    assert p.exponent == h.exponent
    assert p.num_lanes == h.num_lanes
    assert p.pool_set == h.pool_set
    assert p.slot == h.slot
    assert p.reserved == 0
    assert p.seq == h.seq
    assert p.lanes == [int(v) for v in lanes]


def test_dissects_bytes_packed_by_protocol() -> None:
    p = INA(_wire())
    _check_fields(p)
    assert Raw not in p
    assert Padding not in p


def test_dissects_the_largest_lane_count() -> None:
    # scapy caps list fields at conf.max_list_count (100) unless the field says otherwise.
    lanes = np.arange(-MAX_LANES // 2, MAX_LANES // 2, dtype=np.int32)
    h = Header(PacketType.DATA, 1, 0, 0, 0, 1, MAX_LANES)
    frame = IP(bytes(IP(dst="127.0.0.1") / UDP(dport=INA_UDP_PORT) / _wire(h, lanes)))
    _check_fields(frame[INA], h, lanes)


def test_bytes_after_the_lanes_are_padding() -> None:
    p = INA(_wire() + b"\x00\x01")
    _check_fields(p)
    assert p[Padding].load == b"\x00\x01"
    assert Raw not in p


def test_names_type_and_flags() -> None:
    p = INA(_wire())
    assert p.sprintf("%ptype%") == "RESULT"
    assert "RESEND" in p.sprintf("%flags%")
    assert "job=48879" in p.summary()


def test_built_by_scapy_serialises_to_identical_bytes() -> None:
    wire = _wire()
    assert bytes(_scapy()) == wire
    assert unpack_header(bytes(_scapy())) == HEADER


def test_defaults_are_an_empty_data_header() -> None:
    raw = bytes(INA())
    assert len(raw) == HEADER_SIZE
    h = unpack_header(raw)
    assert (h.ptype, h.num_lanes, h.exponent, h.version) == (
        PacketType.DATA,
        0,
        EXPONENT_MIN,
        PROTOCOL_VERSION,
    )


def test_num_lanes_is_computed_from_lanes() -> None:
    raw = bytes(INA(lanes=[5, -5, 7]))
    assert unpack_header(raw).num_lanes == 3
    assert np.array_equal(np.frombuffer(raw, ">i4", offset=HEADER_SIZE), [5, -5, 7])


@pytest.mark.parametrize("exponent", [EXPONENT_MIN, -1, 0, 127])
def test_exponent_is_signed(exponent: int) -> None:
    h = Header(PacketType.DATA, 1, 0, 0, 0, 0, 0, exponent=exponent)
    assert INA(pack_header(h)).exponent == exponent
    assert bytes(INA(job_id=1, exponent=exponent)) == pack_header(h)


def test_ether_ip_udp_frame_round_trips() -> None:
    frame = (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src="10.0.0.1", dst="10.0.0.254")
        / UDP(sport=40000)
        / _scapy()
    )
    raw = bytes(frame)
    assert frame[UDP].dport == INA_UDP_PORT
    assert raw.endswith(_wire())
    back = Ether(raw)
    assert INA in back
    _check_fields(back[INA])
    assert bytes(back) == raw


def test_result_from_the_switch_port_dissects() -> None:
    raw = bytes(IP() / UDP(sport=INA_UDP_PORT, dport=40000) / Raw(_wire()))
    back = IP(raw)
    assert INA in back
    _check_fields(back[INA])


def test_other_udp_ports_are_not_ina() -> None:
    back = IP(bytes(IP() / UDP(sport=40000, dport=40001) / Raw(_wire())))
    assert INA not in back


def test_ethernet_padding_stays_padding() -> None:
    # A zero-lane packet gives a 58-byte frame; Ethernet pads it to 60.
    h = Header(PacketType.DATA, 7, 1, 3, 0, 11, 0)
    empty = np.zeros(0, dtype=np.int32)
    raw = bytes(Ether() / IP() / UDP(sport=40000, dport=INA_UDP_PORT) / Raw(_wire(h, empty)))
    assert len(raw) == 58
    raw += bytes(60 - len(raw))
    back = Ether(raw)
    _check_fields(back[INA], h, empty)
    assert Padding in back
    assert Raw not in back


def test_pcap_round_trip(tmp_path: Path) -> None:
    h2 = Header(PacketType.DATA, 1, 2, 0, 0, 5, len(LANES), exponent=4)
    frames = [
        Ether() / IP(dst="10.0.0.254") / UDP(sport=40000) / _scapy(),
        Ether() / IP(dst="10.0.0.254") / UDP(sport=40001) / _scapy(h2, LANES[::-1]),
    ]
    path = tmp_path / "ina.pcap"
    wrpcap(str(path), frames)
    packets = rdpcap(str(path))
    assert len(packets) == 2
    _check_fields(packets[0][INA])
    _check_fields(packets[1][INA], h2, LANES[::-1])
    assert bytes(packets[1][INA]) == _wire(h2, LANES[::-1])


def test_importing_hostlib_does_not_import_scapy() -> None:
    # Workers import hostlib; scapy costs half a second and belongs to tooling only.
    code = "import sys, hostlib, hostlib.protocol; print('scapy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "False"
