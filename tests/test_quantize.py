"""Block quantization for communication (hpcfsdp/_kernels/quantize.py) against float64: per-element error at
most half a step of its block, zeros, constant blocks, and non-finite blocks that come back NaN."""
import math

import ml_dtypes
import numpy as np
import pytest

from hpcfsdp._kernels import quantize as Q

KINDS = ["int8", "int4", "fp8"]


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-6, 6, n))  # magnitudes from 1e-3 to 1e3, per element
    return x.astype(np.float32)


def _half_step_float64(x, kind, block):
    """Half a quantization step per element, computed independently in float64."""
    qmax = {"int8": 127, "int4": 7, "fp8": 448}[kind]
    out = np.empty(x.size)
    for b in range(0, x.size, block):
        blk = x[b:b + block].astype(np.float64)
        scale = np.abs(blk).max() / qmax
        if kind == "fp8":
            y = np.abs(blk) / (scale if scale > 0 else 1.0)
            e = np.floor(np.log2(np.maximum(y, 2.0 ** -6)))
            out[b:b + block] = 2.0 ** (e - 3) / 2 * scale
        else:
            out[b:b + block] = scale / 2
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,block", [(1000, 256), (257, 256), (5, 2), (4096, 64), (1, 256)])
def test_round_trip_error_is_at_most_half_a_step(kind, n, block):
    x = _data(n, seed=n)
    p = Q.quantize(x, kind, block)
    assert p.dtype == np.uint8 and p.size == Q.payload_bytes(kind, n, block)
    assert p.size == ((n + 1) // 2 if kind == "int4" else n) + 4 * math.ceil(n / block)
    back = Q.dequantize(p, kind, n, block, np.float32)
    err = np.abs(back.astype(np.float64) - x.astype(np.float64))
    bound = _half_step_float64(x, kind, block)
    assert np.all(err <= bound * (1 + 1e-5) + 1e-30), (err / np.maximum(bound, 1e-30)).max()
    np.testing.assert_allclose(Q.step_bound(x, kind, block), bound, rtol=1e-6)
    assert np.max(err) > 0 or n == 1  # it really rounds


@pytest.mark.parametrize("kind", KINDS)
def test_zeros_constants_and_non_finite_blocks(kind):
    x = np.zeros(12, np.float32)
    x[4:8] = -3.25
    x[8:12] = [1.0, np.nan, 2.0, 3.0]
    back = Q.dequantize(Q.quantize(x, kind, 4), kind, 12, 4, np.float32)
    np.testing.assert_array_equal(back[:4], 0.0)
    np.testing.assert_allclose(back[4:8], -3.25, rtol=1e-6)  # the absmax element is exact
    assert np.isnan(back[8:]).all()  # NaN propagates over its block, never a number
    y = np.array([1.0, 2.0, np.inf, 0.5, 1.0, 1.0], np.float32)
    back = Q.dequantize(Q.quantize(y, kind, 2), kind, 6, 2, np.float32)
    assert np.isfinite(back[:2]).all() and np.isnan(back[2:4]).all() and np.isfinite(back[4:]).all()


def test_bf16_input_and_output_and_out_buffers():
    x = _data(300).astype(ml_dtypes.bfloat16)
    out = np.empty(Q.payload_bytes("int8", 300, 128), np.uint8)
    assert Q.quantize(x, "int8", 128, out=out) is out
    dst = np.empty(300, ml_dtypes.bfloat16)
    assert Q.dequantize(out, "int8", 300, 128, ml_dtypes.bfloat16, out=dst) is dst
    err = np.abs(dst.astype(np.float64) - x.astype(np.float64))
    assert np.all(err <= _half_step_float64(x.astype(np.float32), "int8", 128) * 1.01 + np.abs(x.astype(np.float64)) / 128)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="quantization dtype 'int2'"):
        Q.quantize(np.ones(4, np.float32), "int2", 4)
    with pytest.raises(ValueError, match="block_size=3"):
        Q.quantize(np.ones(4, np.float32), "int4", 3)
    with pytest.raises(ValueError, match="int8 payload of 4 elements has 8 bytes, got 7"):
        Q.dequantize(np.zeros(7, np.uint8), "int8", 4, 4, np.float32)


def test_fp8_codes_and_values_equal_ml_dtypes_casts():
    """The e4m3 codes come from float32 bits and decode through a table (See [Note: e4m3 codes by bits]): both
    equal ml_dtypes' casts, ties (to even) and subnormals included."""
    import ml_dtypes

    rng = np.random.default_rng(4)
    y = (rng.standard_normal(200_000) * np.exp(rng.uniform(-14, 6.2, 200_000))).astype(np.float32)
    reps = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    reps = np.sort(reps[np.isfinite(reps) & (reps >= 0)])
    ties = ((reps[1:] + reps[:-1]) / 2).astype(np.float32)  # exactly halfway between neighbours
    y = np.clip(np.concatenate([y, ties, -ties, reps, -reps, [0.0, -0.0]]).astype(np.float32), -448, 448)
    want = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(Q._e4m3_codes(y, np), want)
    np.testing.assert_array_equal(Q._E4M3_VALUES[want], want.view(ml_dtypes.float8_e4m3fn).astype(np.float32))


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
def test_residual_is_what_the_round_trip_lost(kind):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(1001) * np.exp(rng.uniform(-4, 4, 1001))).astype(np.float32)
    x[300:310] = np.nan  # a non-finite block owes nothing
    res = np.full(x.size, 7.0, np.float32)
    payload = Q.quantize(x, kind, 64, residual=res)
    np.testing.assert_array_equal(payload, Q.quantize(x, kind, 64))  # the same payload either way
    back = Q.dequantize(payload, kind, x.size, 64, np.float64)
    lost = np.where(np.isfinite(back), x.astype(np.float64) - back, 0.0)
    blocks = np.nan_to_num(np.concatenate([x, np.zeros(1024 - x.size, np.float32)])).reshape(-1, 64)
    peak = np.repeat(np.abs(blocks).max(axis=1), 64)[:x.size]  # float32 rounding: a few ulps of the block's peak
    assert np.all(res[256:320] == 0) and np.abs(lost).max() > 0
    assert np.all(np.abs(res - lost) <= 4 * 2.0 ** -23 * peak), np.abs(res - lost).max()
    with pytest.raises(ValueError, match="residual must be 1001 float32 values"):
        Q.quantize(x, kind, 64, residual=np.zeros(5, np.float32))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1024, 333, 7])
def test_rows_are_the_row_by_row_payloads_laid_end_to_end(kind, n):
    rows = 3
    x = np.concatenate([_data(n, seed=r) for r in range(rows)])
    x[n + 5] = np.nan  # a non-finite block in the middle row only
    p = Q.payload_bytes(kind, n, 64)
    res = np.full(rows * n, -1.0, np.float32)
    got = Q.quantize(x, kind, 64, residual=res, rows=rows)
    assert got.size == rows * p
    for r in range(rows):
        res_r = np.empty(n, np.float32)
        want = Q.quantize(x[r * n:(r + 1) * n], kind, 64, residual=res_r)
        np.testing.assert_array_equal(got[r * p:(r + 1) * p], want)
        np.testing.assert_array_equal(res[r * n:(r + 1) * n].view(np.uint32), res_r.view(np.uint32))
    back = Q.dequantize(got, kind, n, 64, np.float32, rows=rows)
    for r in range(rows):
        np.testing.assert_array_equal(back[r * n:(r + 1) * n].view(np.uint32),
                                      Q.dequantize(got[r * p:(r + 1) * p], kind, n, 64, np.float32).view(np.uint32))
    assert np.isnan(back[n:2 * n][:64]).all() and np.isfinite(back[:n]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_sum_adds_the_rows_in_float32_row_0_first(kind):
    n, rows = 777, 4
    x = np.concatenate([_data(n, seed=10 + r) for r in range(rows)])
    pay = Q.quantize(x, kind, 128, rows=rows)
    vals = Q.dequantize(pay, kind, n, 128, np.float32, rows=rows).reshape(rows, n)
    want = vals[0].copy()
    for r in range(1, rows):
        want = (want + vals[r]).astype(np.float32)
    got = Q.dequantize_sum(pay, kind, n, 128, rows)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    exact = vals.astype(np.float64).sum(axis=0)  # 3 float32 adds: each rounding within eps/2 of its partial sum
    assert np.all(np.abs(got - exact) <= 1.5 * np.finfo(np.float32).eps * np.abs(vals).astype(np.float64).sum(axis=0))
    out = np.empty(n, np.float32)
    assert Q.dequantize_sum(pay, kind, n, 128, rows, out=out) is out
    np.testing.assert_array_equal(out, got)


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match="rows=2 must be a positive integer dividing the 5 elements"):
        Q.quantize(np.ones(5, np.float32), "int8", 4, rows=2)
    pay = Q.quantize(np.ones(8, np.float32), "int8", 4, rows=2)
    with pytest.raises(ValueError, match="3 int8 payloads of 4 elements have 24 bytes, got 16"):
        Q.dequantize(pay, "int8", 4, 4, np.float32, rows=3)
    with pytest.raises(ValueError, match="rows=0"):
        Q.dequantize_sum(pay, "int8", 4, 4, 0)
    with pytest.raises(ValueError, match="out must be 4 float32 values"):
        Q.dequantize_sum(pay, "int8", 4, 4, 2, out=np.empty(4, np.float64))
