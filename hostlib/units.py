"""Message sizes as people type them: nccl-tests' syntax, shared by every layer's commands.

The base layer's spelling of a size (``4096``, ``4K``, ``1M``, ``1G``; binary multiples),
so ``inalab bench`` (emulation) and ``inalab decide`` (dynamiccl) read and print sizes
alike without one importing the other. Pure functions; nothing else of ours is imported.
"""

from __future__ import annotations

import re

__all__ = ["format_size", "parse_size"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse an nccl-tests size: digits with an optional K, M or G suffix (powers of 1024).

    Raises:
        ValueError: anything else, or zero.
    """
    m = _SIZE_RE.match(text)
    if m is None:
        raise ValueError(f"invalid size {text!r}: expected bytes like 4096, 4K, 1M or 1G")
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value == 0:
        raise ValueError(f"invalid size {text!r}: must be positive")
    return value


def format_size(nbytes: int) -> str:
    """The shortest exact nccl-tests spelling of ``nbytes`` (``4096`` -> ``"4K"``)."""
    for suffix in ("G", "M", "K"):
        unit = _UNITS[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)
