"""The eBPF data plane's RoCEv2 part without clang or root: the ICRC tables icrc.py
generates (held to zlib and to ``hostlib.rocev2.icrc``, composed as ``roce.bpf.h``
composes them), and the RoCEv2 map layout (held to the protocol, the P4 tables' widths
and the soft switch's register arrays).
"""

from __future__ import annotations

import ctypes
import random
import re
import socket
import struct
import zlib

import pytest

from controller.p4info import P4Info
from emulation.softswitch.ebpf import icrc, layout, roce_maps
from emulation.softswitch.roce_tables import ROCE_ARRAYS
from hostlib import rocev2
from hostlib.protocol import (
    ROCE_BTH_SIZE,
    ROCE_ICRC_SIZE,
    ROCE_IMMDT_SIZE,
    ROCE_PSN_SEQ_SHIFT,
    ROCE_QP_REGISTERS,
    ROCE_RETH_SIZE,
    ROCE_UDP_PORT,
    RoceOpcode,
)

_MASK = 0xFFFFFFFF


def _sliced(register: int, data: bytes) -> int:
    """The program's crc_word over ``data`` (whole words, little-endian)."""
    t = icrc.slice_tables()
    for (w,) in struct.iter_unpack("<I", data):
        c = register ^ w
        register = t[3][c & 0xFF] ^ t[2][c >> 8 & 0xFF] ^ t[1][c >> 16 & 0xFF] ^ t[0][c >> 24]
    return register


def _shifted(c: int, t: list[list[int]]) -> int:
    """The program's join: the register advanced over the lanes' length of zeros."""
    return t[0][c & 0xFF] ^ t[1][c >> 8 & 0xFF] ^ t[2][c >> 16 & 0xFF] ^ t[3][c >> 24]


def test_slicing_by_four_is_zlibs_crc32() -> None:
    rng = random.Random(40)
    for words in (1, 3, 64, 1024):
        data = rng.randbytes(4 * words)
        assert ~_sliced(_MASK, data) & _MASK == zlib.crc32(data)


def test_a_shift_is_the_register_over_zero_bytes() -> None:
    rng = random.Random(41)
    length = 256
    tables = icrc.shift_tables(length)
    for _ in range(50):
        register = rng.getrandbits(32)
        assert _shifted(register, tables) == icrc.raw_crc(register, bytes(length))


def test_shift_tables_refuse_a_negative_length() -> None:
    with pytest.raises(ValueError, match="-1 bytes"):
        icrc.shift_tables(-1)


def _program_icrc(src: str, dst: str, headers: bytes, lanes: bytes) -> int:
    """The ICRC of a reply as roce_write computes it: the pseudo-header and headers word
    by word, joined to the lanes' own register by the shift over the lanes' length."""
    udp_len = 8 + len(headers) + len(lanes) + ROCE_ICRC_SIZE
    pseudo = b"\xff" * 8 + struct.pack("!BBHHHBBH", 0x45, 0xFF, 20 + udp_len, 0, 0x4000, 0xFF,
                                       17, 0xFFFF)  # fmt: skip
    pseudo += socket.inet_aton(src) + socket.inet_aton(dst)
    pseudo += struct.pack("!HHHH", ROCE_UDP_PORT, ROCE_UDP_PORT, udp_len, 0xFFFF)
    masked = headers[:4] + b"\xff" + headers[5:]
    head = _sliced(_MASK, pseudo + masked)
    register = _shifted(head, icrc.shift_tables(len(lanes))) ^ _sliced(0, lanes)
    return ~register & _MASK


@pytest.mark.parametrize("opcode", list(RoceOpcode))
def test_the_programs_composition_is_rocev2s_icrc(opcode: RoceOpcode) -> None:
    lanes = random.Random(int(opcode)).randbytes(1024)
    frame = rocev2.RoceFrame(opcode, 0x800012, 0xABCDE, lanes, 0x1_0000_2000, 0xA001, 2048,
                             rocev2.pack_imm(7, -3))  # fmt: skip
    payload = rocev2.build_frame(frame, "10.0.0.254", "10.0.0.1")
    headers = payload[: -len(lanes) - ROCE_ICRC_SIZE]
    got = _program_icrc("10.0.0.254", "10.0.0.1", headers, lanes)
    assert got == int.from_bytes(payload[-ROCE_ICRC_SIZE:], "little")
    assert got == rocev2.icrc("10.0.0.254", "10.0.0.1", ROCE_UDP_PORT, payload[:-4])


def test_the_header_takes_roces_constants_from_the_protocol() -> None:
    header = layout.render_header(64)
    defines = dict(re.findall(r"#define (\w+) (-?\d+)", header))
    assert int(defines["ROCE_UDP_PORT"]) == ROCE_UDP_PORT
    assert int(defines["ROCE_BTH_SIZE"]) == ROCE_BTH_SIZE
    assert int(defines["ROCE_RETH_SIZE"]) == ROCE_RETH_SIZE
    assert int(defines["ROCE_IMMDT_SIZE"]) == ROCE_IMMDT_SIZE
    assert int(defines["ROCE_ICRC_SIZE"]) == ROCE_ICRC_SIZE
    assert int(defines["ROCE_QP_REGISTERS"]) == ROCE_QP_REGISTERS
    assert int(defines["ROCE_PSN_SEQ_SHIFT"]) == ROCE_PSN_SEQ_SHIFT
    assert int(defines["ROCE_FIELD_MASK"]) == rocev2.PSN_MASK == rocev2.QPN_MASK
    for op in RoceOpcode:
        assert int(defines[f"ROCE_{op.name}"]) == op
    # The opcodes the program tells apart by range: FIRST..ONLY_IMM, in this order.
    assert [int(op) for op in RoceOpcode] == list(range(0x26, 0x2C))
    assert "static const __u32 ina_crc32[4][256]" in header
    assert "static const __u32 ina_crc_shift[4][256]" in header


def test_the_crc_tables_in_the_header_are_icrc_pys() -> None:
    header = layout.render_header(16)
    body = header.split("ina_crc_shift[4][256] = {", 1)[1].split("};", 1)[0]
    words = [int(w, 16) for w in re.findall(r"0x[0-9a-f]{8}", body)]
    assert words == [v for t in icrc.shift_tables(16 * 4) for v in t]


def test_queue_pair_cells_hold_the_soft_switchs_register_arrays_in_order() -> None:
    fields = [name for name, _ in layout.InaRoceQp._fields_]
    assert fields[0] == "lock"
    assert [f"roce_{f}" for f in fields[1:]] == list(ROCE_ARRAYS)
    assert {f"roce_{f}": f for f in fields[1:]} == roce_maps._QP_FIELDS


def _bits(cls: type[ctypes.Structure], field: str) -> int:
    return 8 * ctypes.sizeof(dict(cls._fields_)[field])


def test_roce_map_fields_hold_every_value_the_p4_tables_can() -> None:
    info = P4Info.load()

    def match(table: str, field: str) -> int:
        return next(int(f.bitwidth) for f in info.table(table).match_fields if f.name == field)

    def param(action: str, name: str) -> int:
        return next(int(p.bitwidth) for p in info.action(action).params if p.name == name)

    checks = [
        (layout.InaRoceReplyKey, "job", match("Egress.roce.roce_replies", "job_id")),
        (layout.InaRoceReplyKey, "rank", match("Egress.roce.roce_replies", "rank")),
        (layout.InaRoceReplyKey, "position", match("Egress.roce.roce_replies", "position")),
        (layout.InaRoceRequest, "job", param("Ingress.roce.set_roce_qp", "job_id")),
        (layout.InaRoceRequest, "rank", param("Ingress.roce.set_roce_qp", "rank")),
        (layout.InaRoceRequest, "qp_reg", param("Ingress.roce.set_roce_qp", "qp_reg")),
        (layout.InaRoceReply, "qpn", param("Egress.roce.set_roce_reply", "qpn")),
        (layout.InaRoceReply, "rkey", param("Egress.roce.set_roce_reply", "rkey")),
        (layout.InaRoceReply, "va", param("Egress.roce.set_roce_reply", "va")),
        (layout.InaRoceReply, "psn_reg", param("Egress.roce.set_roce_reply", "psn_index")),
    ]
    for cls, field, width in checks:
        assert _bits(cls, field) >= width, f"{cls.__name__}.{field}: {width} bits"
