"""The RoCEv2 codec (hostlib.rocev2) against scapy's independent RoCE layer: every opcode
INA sends parses to the same fields there, and the ICRC equals the one scapy computes."""

from __future__ import annotations

import random

import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

from hostlib import rocev2
from hostlib.protocol import (
    EXPONENT_MAX,
    EXPONENT_MIN,
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    RoceOpcode,
)

SRC, DST = "10.0.0.1", "10.0.0.9"


def _frame(op: RoceOpcode, rng: random.Random, lanes: int = 64) -> rocev2.RoceFrame:
    return rocev2.RoceFrame(
        op,
        dest_qp=rng.randrange(1 << 24),
        psn=rng.randrange(1 << 24),
        payload=rng.randbytes(lanes * 4),
        va=rocev2.pack_request_va(rng.randrange(1 << 32), rng.randint(-128, 127)),
        rkey=rng.randrange(1 << 16),
        dma_length=lanes * 4 * rng.randint(1, 8),
        imm=rng.randrange(1 << 32),
    )


def _scapy_icrc(op: int, qp: int, psn: int, rest: bytes, sport: int) -> bytes:
    """The ICRC trailer scapy computes for the same packet, built field by field."""
    pkt = (
        IP(src=SRC, dst=DST, id=0, flags="DF")
        / UDP(sport=sport, dport=ROCE_UDP_PORT)
        / ScapyBTH(opcode=op, dqpn=qp, psn=psn)
        / Raw(rest)
    )
    return raw(pkt)[-ROCE_ICRC_SIZE:]


@pytest.mark.parametrize("op", list(RoceOpcode))
@pytest.mark.parametrize("sport", [ROCE_UDP_PORT, 49152])
def test_every_opcode_parses_in_scapy_and_carries_scapys_icrc(op: RoceOpcode, sport: int) -> None:
    rng = random.Random(op * 7 + sport)
    for _ in range(20):
        frame = _frame(op, rng, lanes=rng.choice([1, 28, 64, 256]))
        body = rocev2.build_frame(frame, SRC, DST, sport)
        udp = UDP(sport=sport, dport=ROCE_UDP_PORT)
        wire = IP(raw(IP(src=SRC, dst=DST, id=0, flags="DF") / udp / Raw(body)))
        bth = wire[ScapyBTH]
        assert (bth.opcode, bth.dqpn, bth.psn, bth.pkey) == (op, frame.dest_qp, frame.psn, 0xFFFF)
        rest = body[ROCE_BTH_SIZE:-ROCE_ICRC_SIZE]
        assert body[-ROCE_ICRC_SIZE:] == _scapy_icrc(op, frame.dest_qp, frame.psn, rest, sport)
        assert rocev2.icrc_ok(SRC, DST, sport, body)
        back = rocev2.parse_frame(body)
        assert back.payload == frame.payload and back.psn == frame.psn
        has_reth = op in rocev2.RETH_OPCODES
        has_imm = op in rocev2.IMM_OPCODES
        assert (back.va, back.rkey, back.dma_length) == (
            (frame.va, frame.rkey, frame.dma_length) if has_reth else (0, 0, 0)
        )
        assert back.imm == (frame.imm if has_imm else None)
        headers = ROCE_BTH_SIZE + has_reth * ROCE_RETH_SIZE + has_imm * ROCE_IMMDT_SIZE
        assert len(body) == headers + len(frame.payload) + ROCE_ICRC_SIZE


def test_the_icrc_covers_the_addresses_and_every_unmasked_byte() -> None:
    rng = random.Random(3)
    body = bytearray(rocev2.build_frame(_frame(RoceOpcode.UC_WRITE_FIRST, rng), SRC, DST))
    assert not rocev2.icrc_ok(SRC, "10.0.0.8", ROCE_UDP_PORT, body)
    assert not rocev2.icrc_ok(SRC, DST, 4790, body)
    for at in range(len(body) - ROCE_ICRC_SIZE):
        body[at] ^= 0x01
        # Byte 4 holds FECN, BECN and reserved bits: ones in the ICRC, so free to change
        # on the way (a switch marking congestion leaves the ICRC valid).
        assert rocev2.icrc_ok(SRC, DST, ROCE_UDP_PORT, body) == (at == 4), at
        body[at] ^= 0x01


def test_message_opcodes_follow_the_position_in_the_message() -> None:
    assert rocev2.message_opcode(0, 1) == RoceOpcode.UC_WRITE_ONLY_IMM
    assert rocev2.message_opcode(0, 1, immediate=False) == RoceOpcode.UC_WRITE_ONLY
    ops = [rocev2.message_opcode(i, 4) for i in range(4)]
    assert ops == [RoceOpcode.UC_WRITE_FIRST, RoceOpcode.UC_WRITE_MIDDLE,
                   RoceOpcode.UC_WRITE_MIDDLE, RoceOpcode.UC_WRITE_LAST_IMM]  # fmt: skip
    for bad in ((4, 4), (-1, 2), (0, 0)):
        with pytest.raises(rocev2.RoceError, match="of a message"):
            rocev2.message_opcode(*bad)


@pytest.mark.parametrize("exponent", [EXPONENT_MIN, -1, 0, 1, EXPONENT_MAX])
@pytest.mark.parametrize("seq", [0, 1, 0xFFFFFF, 0x1000000, 0xFFFFFFFF])
def test_seq_and_exponent_round_trip_through_va_and_immediate(seq: int, exponent: int) -> None:
    va = rocev2.pack_request_va(seq, exponent)
    assert va & 0xFFFFFF == 0
    assert rocev2.split_request_va(va) == (seq, exponent)
    assert rocev2.split_imm(rocev2.pack_imm(seq, exponent)) == (seq & 0xFFFFFF, exponent)


def test_psn_wraps_at_24_bits() -> None:
    assert rocev2.psn_add(0xFFFFFF, 1) == 0
    assert rocev2.psn_add(0xFFFFFE, 5) == 3


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:10], "truncated"),
        (lambda b: b[:ROCE_BTH_SIZE + 8], "no RETH"),
        (lambda b: bytes([0x04]) + b[1:], "not a UC RDMA WRITE"),
        (lambda b: b[:1] + bytes([0x01]) + b[2:], "transport version 1"),
        (lambda b: b[:1] + bytes([0x20]) + b[2:], "pad count 2"),
    ],
)  # fmt: skip
def test_a_malformed_frame_is_one_clear_error(mutate: object, message: str) -> None:
    body = rocev2.build_frame(_frame(RoceOpcode.UC_WRITE_ONLY_IMM, random.Random(1)), SRC, DST)
    with pytest.raises(rocev2.RoceError, match=message):
        rocev2.parse_frame(mutate(body))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("field", "value"),
    [("dest_qp", 1 << 24), ("psn", -1), ("rkey", 1 << 32), ("pkey", 1 << 16)],
)
def test_a_field_out_of_range_is_refused_on_build(field: str, value: int) -> None:
    frame = _frame(RoceOpcode.UC_WRITE_FIRST, random.Random(2))
    bad = rocev2.RoceFrame(**{**{f: getattr(frame, f) for f in frame.__slots__}, field: value})
    with pytest.raises(rocev2.RoceError, match=f"{field}="):
        rocev2.build_frame(bad, SRC, DST)


def test_odd_payloads_and_bad_exponents_are_refused() -> None:
    frame = rocev2.RoceFrame(RoceOpcode.UC_WRITE_MIDDLE, 1, 1, b"abc")
    with pytest.raises(rocev2.RoceError, match="not whole words"):
        rocev2.build_frame(frame, SRC, DST)
    with pytest.raises(rocev2.RoceError, match="exponent=128"):
        rocev2.pack_request_va(1, 128)
    with pytest.raises(rocev2.RoceError, match="not IPv4"):
        rocev2.icrc("::1", DST, 1, bytes(ROCE_BTH_SIZE))
    assert not rocev2.icrc_ok(SRC, DST, 1, b"short")
