"""Block quantization: exponents, bit-exact scaling, no int32 overflow, the error bound."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from helpers import (
    INT32_MAX,
    INT32_MIN,
    assert_within_bound,
    float_reference,
    quantized_sums,
    random_inputs,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hostlib.protocol import EXPONENT_MAX, EXPONENT_MIN, MAX_WORKERS
from hostlib.quantize import (
    block_exponents,
    dequantize,
    dequantize_into,
    error_bound,
    headroom_bits,
    quantize_block,
    quantize_into,
    scale_shift,
)

F32_MAX = float(np.finfo(np.float32).max)
WORKER_COUNTS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32]
ALL_EXPONENTS = range(EXPONENT_MIN, EXPONENT_MAX + 1)


def below(power: int) -> np.float32:
    """The largest float32 strictly below ``2**power`` (float32 max for 2**128)."""
    if power >= 128:
        return np.float32(F32_MAX)
    return np.nextafter(np.float32(2.0**power), np.float32(0))


def shift(e: int, n: int) -> int:
    return 29 - e - headroom_bits(n)


def reference_quantize(block: np.ndarray, e: int, n: int) -> np.ndarray:
    """rint(x * 2**s) in float64, where scaling a float32 by a power of two is exact."""
    return np.rint(np.ldexp(block.astype(np.float64), shift(e, n))).astype(np.int64)


def block_for(rng: np.random.Generator, e: int, n: int, lanes: int = 64) -> np.ndarray:
    """float32 values with ``max|x| < 2**(e+1)``: uniform, tiny and subnormal, exact
    rounding ties (where float32 can hold them), the largest value below the limit."""
    top = below(e + 1)
    x = (rng.uniform(-1.0, 1.0, lanes) * float(top)).astype(np.float32)
    x[:8] = (x[:8] * np.float32(2.0**-30)).astype(np.float32)  # far below the block max
    x[8:12] = np.array([1, -2, 3, -5], dtype=np.float32) * np.float32(2.0**-149)
    s = shift(e, n)
    ties = np.ldexp(np.array([0.5, -0.5, 1.5, -2.5, 2**20 + 0.5, -(2**23) + 0.5]), -s)
    ok = (np.abs(ties) < float(top)) & (ties.astype(np.float32).astype(np.float64) == ties)
    x[12 : 12 + ok.sum()] = ties[ok]
    x[-2:] = [top, -top]
    x = np.clip(x, -top, top)  # the float32 cast may round up to 2**(e+1)
    assert float(np.abs(x).max()) < 2.0 ** (e + 1)
    return x


# ----------------------------------------------------------------- headroom and exponents
@pytest.mark.parametrize(
    ("n", "k"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (16, 4), (17, 5), (32, 5)]
)
def test_headroom_bits_is_ceil_log2(n: int, k: int) -> None:
    assert headroom_bits(n) == k
    assert scale_shift(0, n) == 29 - k


@pytest.mark.parametrize("n", [0, -1, MAX_WORKERS + 1])
def test_headroom_bits_rejects_bad_worker_counts(n: int) -> None:
    with pytest.raises(ValueError, match="num_workers"):
        headroom_bits(n)


def test_block_exponent_brackets_the_block_max() -> None:
    rng = np.random.default_rng(1)
    mant = rng.uniform(1.0, 2.0, 4000)
    exps = rng.integers(-126, 127, 4000)
    rows = np.ldexp(mant, exps).astype(np.float32)
    blocks = np.outer(rows, np.float32([-1.0, 0.25, 0.0, -0.5])).astype(np.float32)
    e = block_exponents(blocks).astype(np.int64)
    absmax = np.abs(blocks).max(axis=1).astype(np.float64)
    assert np.all(np.ldexp(1.0, e) <= absmax)
    assert np.all(absmax < np.ldexp(1.0, e + 1))


def test_block_exponent_at_powers_of_two_and_just_below() -> None:
    for e in range(-149, 128):  # every float32 binade, subnormals included
        rows = [[np.float32(2.0**e), 0.0], [0.0, -below(e + 1)]]
        got = block_exponents(np.array(rows, dtype=np.float32))
        want = max(e, EXPONENT_MIN)  # clamped upward: max|x| < 2**(E+1) still holds
        assert got.dtype == np.int8
        assert got.tolist() == [want, want], e


def test_block_exponent_of_zero_and_extremes() -> None:
    tiny = np.float32(2.0**-149)
    blocks = np.array(
        [[0.0, -0.0], [tiny, 0.0], [0.0, -F32_MAX], [2.0**-127, 0.0], [2.0**-128, 0.0]],
        dtype=np.float32,
    )
    assert block_exponents(blocks).tolist() == [EXPONENT_MIN, EXPONENT_MIN, 127, -127, -128]
    assert block_exponents(np.zeros((3, 0), dtype=np.float32)).tolist() == [EXPONENT_MIN] * 3
    assert block_exponents(np.zeros((0, 8), dtype=np.float32)).tolist() == []


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_block_exponent_rejects_nan_and_infinity(bad: float) -> None:
    blocks = np.ones((3, 4), dtype=np.float32)
    blocks[1, 2] = bad
    with pytest.raises(ValueError, match="NaN or infinity"):
        block_exponents(blocks)


# ----------------------------------------------------------------- quantize
def test_quantize_matches_float64_reference_over_the_full_exponent_range() -> None:
    rng = np.random.default_rng(2)
    paths = {"float32": 0, "float64": 0}
    for e in ALL_EXPONENTS:
        for n in (1, 2, 5, 32):
            block = block_for(rng, e, n)
            out = np.empty(block.size, dtype=">i4")  # the wire's big-endian view
            quantize_block(block, e, n, out)
            np.testing.assert_array_equal(out.astype(np.int64), reference_quantize(block, e, n))
            paths["float32" if -126 <= shift(e, n) <= 127 else "float64"] += 1
    assert min(paths.values()) > 50, paths  # both the fast and the float64 path ran


@pytest.mark.parametrize("e", [-121, -110, -101, -100, 0, 97, 127])
def test_quantize_rounds_ties_to_even_in_both_paths(e: int) -> None:
    n = 4  # s > 127 (the float64 path) for e < -100
    s = shift(e, n)
    units = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -7.0])
    block = np.ldexp(units, -s).astype(np.float32)
    assert np.all(block.astype(np.float64) == np.ldexp(units, -s))
    out = np.empty(block.size, dtype=np.int32)
    quantize_block(block, e, n, out)
    assert out.tolist() == [0, 2, 2, 0, -2, -2, 3, -7]


def test_quantized_sum_of_adversarial_blocks_fits_int32() -> None:
    for n in range(1, MAX_WORKERS + 1):
        k = headroom_bits(n)
        for e in ALL_EXPONENTS:
            top = below(e + 1)
            s = shift(e, n)
            # 2**m - 0.5 units rounds *up* to 2**m (ties to even); the largest such value.
            up = np.ldexp(2.0**23 - 0.5, -s)
            blk = np.array([top, top, -top, top], dtype=np.float32)
            if np.float32(up) == up and up < float(top):
                blk[1] = up
            q = np.empty(blk.size, dtype=np.int32)
            quantize_block(blk, e, n, q)
            assert np.abs(q.astype(np.int64)).max() <= 2 ** (30 - k)
            total = n * q.astype(np.int64)  # every worker sends the same block
            assert total.min() >= INT32_MIN and total.max() <= INT32_MAX, (n, e)


def test_quantized_sums_of_random_data_fit_int32_for_every_worker_count() -> None:
    rng = np.random.default_rng(3)
    for n in range(1, MAX_WORKERS + 1):
        inputs = random_inputs(rng, np.float32, n, 300)
        inputs[:, 5] = below(20) * np.float32(1 if n % 2 else -1)  # every worker at the edge
        sums, _ = quantized_sums(inputs, 64)
        assert sums.min() >= INT32_MIN and sums.max() <= INT32_MAX


# ----------------------------------------------------------------- dequantize
def reference_dequantize(sums: np.ndarray, exps: np.ndarray, n: int) -> np.ndarray:
    shifts = np.array([shift(int(e), n) for e in exps])
    return np.ldexp(sums.astype(np.float64), -shifts[:, None]).astype(np.float32)


def dequantize_cases(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Int32 sums of every exponent, restricted to values whose float32 result is finite."""
    exps = np.array(ALL_EXPONENTS, dtype=np.int8)
    sums = rng.integers(INT32_MIN, INT32_MAX, (exps.size, 16), endpoint=True)
    sums[:, :8] = [0, 1, -1, 2**24 + 1, -(2**24) - 3, 2**30, INT32_MIN, INT32_MAX]
    sums[:, 8:10] = rng.integers(-1000, 1000, (exps.size, 2))
    shifts = np.array([shift(int(e), n) for e in exps])
    finite = np.abs(np.ldexp(sums.astype(np.float64), -shifts[:, None])) <= F32_MAX
    return np.where(finite, sums, 0).astype(np.int32), exps


@pytest.mark.parametrize("n", [1, 3, 8, 32])
def test_dequantize_matches_float64_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    sums, exps = dequantize_cases(rng, n)
    shifts = np.array([shift(int(e), n) for e in exps])
    fast = (shifts >= -127) & (shifts <= 126)
    assert fast.any() and not fast.all()
    for rows in (slice(None), fast, ~fast):  # mixed, all-fast and all-float64 batches
        got = dequantize(sums[rows], exps[rows], n)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(
            got.view(np.uint32), reference_dequantize(sums[rows], exps[rows], n).view(np.uint32)
        )


# ----------------------------------------------------------------- the error bound
def exact_errors(result: np.ndarray, inputs: np.ndarray) -> list[Fraction]:
    """|result - sum(inputs)| per element, in exact rational arithmetic."""
    # float32 values are integer multiples of 2**-149: sum them as Python ints.
    scaled = np.ldexp(inputs.astype(np.float64), 149)
    totals = [sum(int(v) for v in col) for col in scaled.T]
    pairs = zip(result, totals, strict=True)
    return [abs(Fraction(float(y)) - Fraction(t, 2**149)) for y, t in pairs]


def bound_for(inputs: np.ndarray, lanes: int) -> np.ndarray:
    wide = inputs.astype(np.float64)
    reference = np.array([float(sum(Fraction(float(v)) for v in col)) for col in wide.T])
    return error_bound(np.abs(wide).max(axis=0), len(inputs), lanes, reference)


finite_f32 = st.floats(
    min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    st.integers(1, MAX_WORKERS),
    st.integers(1, 16),
    st.data(),
)
@pytest.mark.slow
def test_error_bound_holds_for_arbitrary_inputs(n: int, lanes: int, data: st.DataObject) -> None:
    size = data.draw(st.integers(1, 40))
    inputs = data.draw(hnp.arrays(np.float32, (n, size), elements=finite_f32))
    result = float_reference(inputs, lanes)  # asserts the int32 sums did not overflow
    errors = exact_errors(result, inputs)
    bound = bound_for(inputs, lanes)
    for i, (err, b) in enumerate(zip(errors, bound, strict=True)):
        assert err <= Fraction(float(b)), (i, float(err), b)


@pytest.mark.parametrize("n", WORKER_COUNTS)
def test_error_bound_holds_on_random_data(n: int) -> None:
    rng = np.random.default_rng(100 + n)
    inputs = random_inputs(rng, np.float32, n, 200)
    result = float_reference(inputs, 16)
    errors = exact_errors(result, inputs)
    assert all(e <= Fraction(float(b)) for e, b in zip(errors, bound_for(inputs, 16), strict=True))


@pytest.mark.parametrize("n", WORKER_COUNTS)
@pytest.mark.parametrize("e", [-100, -20, 0, 20, 90])
def test_error_bound_is_tight_on_adversarial_data(n: int, e: int) -> None:
    """Every worker sends exact rounding ties that round the same way: the quantization
    error reaches n half-units, which is the bound's main term."""
    lanes = 16
    s = shift(e, n)
    units = np.array([2 * t + 0.5 for t in range(lanes - 1)])  # ties that round down
    units[1::2] = -units[1::2] - 1  # ... and negative ones that round away (up in size)
    row = np.concatenate([[1.5 * 2.0**e], np.ldexp(units, -s)])
    inputs = np.tile(row.astype(np.float32), (n, 1))
    assert np.all(inputs[0].astype(np.float64) == row)  # the ties are exact in float32
    result = float_reference(inputs, lanes)
    errors = np.array([float(x) for x in exact_errors(result, inputs)])
    bound = bound_for(inputs, lanes)
    assert np.all(errors <= bound)
    half_units = n * 2.0 ** (e + headroom_bits(n) - 30)
    np.testing.assert_array_equal(errors[1:], half_units)
    assert np.all(bound[1:] <= 4 * errors[1:])  # tight: within 4x of what is reached
    assert bound[1:].max() <= errors[1:].max() * (1 + 2**-16)


@pytest.mark.parametrize("n", [1, 2, 7, 32])
def test_error_bound_holds_for_large_random_arrays(n: int) -> None:
    rng = np.random.default_rng(7 * n)
    inputs = random_inputs(rng, np.float32, n, 20_000)
    assert_within_bound(float_reference(inputs, 64), inputs, 64)


def test_error_bound_rejects_bad_arguments() -> None:
    a = np.ones(4)
    with pytest.raises(ValueError, match="one shape"):
        error_bound(a, 2, 4, np.ones(5))
    with pytest.raises(ValueError, match="one shape"):
        error_bound(np.ones((2, 2)), 2, 4, np.ones((2, 2)))
    with pytest.raises(ValueError, match="lanes"):
        error_bound(a, 2, 0, a)


@pytest.mark.parametrize("n", [1, 4, 32])
def test_the_per_block_forms_match_the_whole_array_forms(n: int) -> None:
    # quantize_into / dequantize_into are what the engine runs per packet: bit for bit
    # what quantize_block / dequantize give, on both paths (normal and float64 scales).
    rng = np.random.default_rng(n)
    exps = np.array([EXPONENT_MIN, -126, -100, -3, 0, 5, 100, EXPONENT_MAX], dtype=np.int8)
    # |x| < 2**(e+1) in each row (a zero row for EXPONENT_MIN), as the exponent promises.
    spread = rng.uniform(-1.99, 1.99, (len(exps), 64)) * np.exp2(exps.astype(np.float64))[:, None]
    blocks = np.where(exps[:, None] == EXPONENT_MIN, 0.0, spread).astype(np.float32)
    scratch = np.empty(64, dtype=np.float32)
    sums = np.empty((len(exps), 64), dtype=np.int32)
    for row, e in enumerate(exps):
        want = np.empty(64, dtype=">i4")
        quantize_block(blocks[row], int(e), n, want)
        got = np.empty(64, dtype=">i4")
        quantize_into(blocks[row], int(scale_shift(int(e), n)), got, scratch)
        assert got.tobytes() == want.tobytes()
        sums[row] = got
    whole = dequantize(sums, exps, n)
    for row, e in enumerate(exps):
        out = np.empty(64, dtype=np.float32)
        dequantize_into(sums[row].astype(">i4"), int(scale_shift(int(e), n)), out)
        assert out.tobytes() == whole[row].tobytes()
