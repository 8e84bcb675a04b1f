"""float32 <-> int32 block quantization for in-network aggregation (SwitchML's scheme).

A switch adds int32 lanes; floats must be turned into integers on a scale that every
worker shares and that cannot overflow when ``n`` workers' values are summed.

Per block (one packet's lanes) a worker computes its local exponent ``E`` with
``2**E <= max|x| < 2**(E+1)`` (``EXPONENT_MIN`` for an all-zero block). The switch keeps
the max over workers; every worker then quantizes the block with the *global* ``E``::

    k = ceil(log2(n))            # n workers
    s = 29 - E - k               # scale 2**s
    q = rint(x * 2**s)           # |x| < 2**(E+1)  =>  |q| <= 2**(30-k)
    sum of n terms               # |sum| <= n * 2**(30-k) <= 2**30 < 2**31 - 1: no overflow
    y = float32(sum * 2**-s)     # exact in float64, one rounding to float32

Error bound per element, with ``S`` the exact sum of the workers' float32 inputs::

    |y - S| <= n * 2**(E+k-30) * (1 + 2**-24) + 2**-24 * |S|

(each term rounds by at most half a unit ``2**-s``; the float32 conversion adds half an
ulp of the result). Relative to the block's largest input that is ``n * 2**(k-30)``: about
6e-8 for 8 workers, float32's own epsilon. Scaling by powers of two keeps dequantization
exact, which SwitchML's ``INT32_MAX / (n * 2**E)`` scale does not.
"""

from __future__ import annotations

import math

import numpy as np

from hostlib.protocol import EXPONENT_MAX, EXPONENT_MIN, MAX_WORKERS

_F32_SHIFT_MIN = -126  # 2**s is a normal float32 in this range
_F32_SHIFT_MAX = 127

__all__ = [
    "block_exponents",
    "dequantize",
    "dequantize_into",
    "error_bound",
    "headroom_bits",
    "quantize_block",
    "quantize_into",
    "scale_shift",
]


def headroom_bits(num_workers: int) -> int:
    """``ceil(log2(num_workers))``: bits kept free so the sum of all workers fits.

    Raises:
        ValueError: num_workers outside 1..MAX_WORKERS.
    """
    if not 1 <= num_workers <= MAX_WORKERS:
        raise ValueError(f"num_workers {num_workers} outside 1..{MAX_WORKERS}")
    return (num_workers - 1).bit_length()


def block_exponents(blocks: np.ndarray) -> np.ndarray:
    """Exponent ``E`` of each row of ``blocks``: ``2**E <= max|row| < 2**(E+1)``, as int8.

    All-zero rows get ``EXPONENT_MIN``; exponents are clamped to the int8 header field
    (clamping upward keeps ``max|row| < 2**(E+1)`` true; float32 never exceeds 2**128).

    Raises:
        ValueError: the data holds NaN or infinity (no integer scale can carry them).
    """
    absmax = np.max(np.abs(blocks), axis=1) if blocks.size else np.zeros(len(blocks))
    if not np.all(np.isfinite(absmax)):
        raise ValueError("cannot quantize NaN or infinity")
    _, exp = np.frexp(absmax.astype(np.float64))
    e = np.where(absmax > 0, exp - 1, EXPONENT_MIN)
    return np.clip(e, EXPONENT_MIN, EXPONENT_MAX).astype(np.int8)


def scale_shift(exponent: int | np.ndarray, num_workers: int) -> int | np.ndarray:
    """The power of two ``s`` of the quantization scale for a global block exponent."""
    return 29 - np.asarray(exponent, dtype=np.int64) - headroom_bits(num_workers)


def quantize_block(block: np.ndarray, exponent: int, num_workers: int, out: np.ndarray) -> None:
    """Write ``rint(block * 2**s)`` into ``out`` (any int32 view, e.g. big-endian wire).

    ``exponent`` must be the max over all workers of their block exponents, so that every
    worker uses the same scale and the sum cannot overflow.
    """
    s = 29 - exponent - headroom_bits(num_workers)
    if _F32_SHIFT_MIN <= s <= _F32_SHIFT_MAX:
        # Scaling by a power of two representable in float32 is exact: no float64 pass.
        scaled = block * np.float32(2.0**s)
    else:
        scaled = np.ldexp(block.astype(np.float64), s)
    np.rint(scaled, out=scaled)
    out[:] = scaled


def dequantize(sums: np.ndarray, exponents: np.ndarray, num_workers: int) -> np.ndarray:
    """float32 values of int32 block sums (rows) with their global exponents (one per row)."""
    shift = np.asarray(scale_shift(exponents, num_workers))
    # float32(sum) is the one rounding; scaling it by a normal power of two is exact as
    # long as the results stay normal (shift <= 126). Other rows take a float64 pass.
    out = sums.astype(np.float32)
    fast = (shift >= -_F32_SHIFT_MAX) & (shift <= -_F32_SHIFT_MIN)
    if fast.all():
        out *= np.ldexp(np.float32(1.0), -shift).astype(np.float32)[:, None]
        return out
    rows = np.flatnonzero(fast)
    out[rows] *= np.ldexp(np.float32(1.0), -shift[rows]).astype(np.float32)[:, None]
    slow = np.flatnonzero(~fast)
    out[slow] = np.ldexp(sums[slow].astype(np.float64), -shift[slow][:, None])
    return out


def quantize_into(block: np.ndarray, shift: int, out: np.ndarray, scratch: np.ndarray) -> None:
    """:func:`quantize_block` with the scale's power of two ``shift`` (:func:`scale_shift`)
    given and a float32 ``scratch`` of the block's size: the per-packet form, which
    allocates nothing."""
    if _F32_SHIFT_MIN <= shift <= _F32_SHIFT_MAX:
        np.multiply(block, np.float32(2.0**shift), out=scratch)
        np.rint(scratch, out=scratch)
        out[:] = scratch
    else:
        out[:] = np.rint(np.ldexp(block.astype(np.float64), shift))


def dequantize_into(sums: np.ndarray, shift: int, out: np.ndarray) -> None:
    """One block of :func:`dequantize` (its scale's power of two ``shift``), written into
    ``out`` (float32): the same single rounding (``float32(sum)``, then a power of two,
    exact while the result stays normal; else one float64 pass). ``sums`` may be any
    int32 view (e.g. the big-endian wire)."""
    if -_F32_SHIFT_MAX <= shift <= -_F32_SHIFT_MIN:
        np.multiply(sums, np.float32(2.0**-shift), out=out, dtype=np.float32)
    else:
        out[:] = np.ldexp(sums.astype(np.float64), -shift)


def error_bound(
    absmax: np.ndarray, num_workers: int, lanes: int, reference: np.ndarray
) -> np.ndarray:
    """Per-element bound on ``|allreduce(x) - sum(x)|`` for float32 INA allreduce.

    Args:
        absmax: elementwise max over workers of ``|x_r|`` (1-D, any float dtype).
        num_workers: workers in the job.
        lanes: lanes per packet (the block size of the exponents).
        reference: the exact (float64) elementwise sum over workers.

    Raises:
        ValueError: shapes differ or lanes < 1.
    """
    if absmax.shape != reference.shape or absmax.ndim != 1:
        raise ValueError("absmax and reference must be 1-D arrays of one shape")
    if lanes < 1:
        raise ValueError(f"lanes {lanes} < 1")
    n = absmax.size
    nblocks = math.ceil(n / lanes)
    padded = np.zeros(nblocks * lanes, dtype=np.float64)
    padded[:n] = absmax
    e = block_exponents(padded.reshape(nblocks, lanes)).astype(np.int64)
    k = headroom_bits(num_workers)
    per_block = num_workers * np.ldexp(1.0, e + k - 30) * (1 + 2.0**-24)
    return np.repeat(per_block, lanes)[:n] + 2.0**-24 * np.abs(reference)
