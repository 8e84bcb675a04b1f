"""The tables the eBPF program computes RoCEv2's ICRC with, generated here into
``ina_gen.h`` (``layout.render_header``).

The ICRC is a CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320, as ``zlib.crc32``)
over a masked pseudo-header and the frame (``hostlib.rocev2.icrc`` is the reference;
docs/protocol.md, "INA over RoCEv2"). The program keeps the CRC's raw register (no
pre- or post-inversion) and needs two kinds of table:

- :func:`slice_tables`: slicing-by-4, four tables of 256 words: one step takes a
  little-endian 32-bit word of data (four bytes), so 4 KiB of lanes are 1,024 steps of
  four lookups instead of 4,096 of one;
- :func:`shift_tables`: the CRC register's advance over ``length`` zero bytes, a linear
  map of its 32 bits, byte-sliced into four tables. Because the register is linear,
  ``R(s, H + P) = shift(R(s, H)) ^ R(0, P)`` for a payload ``P`` of ``length`` bytes:
  the lanes of a result are run through the CRC once, and each reply (whose headers
  differ: queue pair, PSN, address) costs its headers and four lookups, not 4 KiB.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

__all__ = ["POLY", "raw_crc", "render_tables", "shift_tables", "slice_tables"]

POLY = 0xEDB88320
"""CRC-32's polynomial, bit-reflected (the one zlib and RoCEv2's ICRC use)."""

_MASK = 0xFFFFFFFF


def raw_crc(register: int, data: bytes) -> int:
    """The CRC-32 register after ``data`` from ``register`` (no inversion at either end):
    ``zlib.crc32(data, v) == ~raw_crc(~v, data)``."""
    return ~zlib.crc32(data, ~register & _MASK) & _MASK


def slice_tables() -> list[list[int]]:
    """Slicing-by-4: ``t[0]`` the byte-wise table, ``t[k][i]`` the register after ``i``'s
    byte and ``k`` zero bytes, so a word ``w`` is one step: ``c ^= w; c = t[3][c & 0xFF]
    ^ t[2][c >> 8 & 0xFF] ^ t[1][c >> 16 & 0xFF] ^ t[0][c >> 24]``."""
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (POLY if c & 1 else 0)
        t0.append(c)
    tables = [t0]
    for _ in range(3):
        prev = tables[-1]
        tables.append([(v >> 8) ^ t0[v & 0xFF] for v in prev])
    return tables


def shift_tables(length: int) -> list[list[int]]:
    """The register's advance over ``length`` zero bytes, byte-sliced: for a register
    ``c``, ``t[0][c & 0xFF] ^ t[1][c >> 8 & 0xFF] ^ t[2][c >> 16 & 0xFF] ^ t[3][c >> 24]``
    is ``raw_crc(c, bytes(length))``.

    Raises:
        ValueError: a negative ``length``.
    """
    if length < 0:
        raise ValueError(f"a shift over {length} bytes")
    zeros = bytes(length)
    return [[raw_crc(v << (8 * k), zeros) for v in range(256)] for k in range(4)]


def render_tables(name: str, tables: Sequence[Sequence[int]]) -> str:
    """``tables`` as a C ``static const __u32 name[N][256]`` (the program's read-only
    data)."""
    rows = []
    for table in tables:
        words = [f"0x{v:08x}" for v in table]
        lines = [", ".join(words[i : i + 8]) for i in range(0, len(words), 8)]
        rows.append("    {\n        " + ",\n        ".join(lines) + ",\n    },")
    return f"static const __u32 {name}[{len(tables)}][256] = {{\n" + "\n".join(rows) + "\n};\n"
