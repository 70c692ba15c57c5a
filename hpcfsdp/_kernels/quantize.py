"""Block quantization of flat float arrays for communication: int8, int4 (two per byte) and float8 e4m3, each
block of ``block`` elements with a float32 scale (its absmax over the code's largest value).

[Note: Quantized payloads]
A payload is one uint8 array: the codes (n bytes for int8 and fp8, ceil(n/2) for int4), then the scales (one
float32 per block, ceil(n/block) of them, as bytes). Every rank computes the same payload from the same input,
so ranks that dequantize the same payloads get the same values. Codes round to nearest: an int8/int4 element
is off by at most half its block's step (scale); an fp8 element by half an e4m3 ulp of its scaled value. A
block holding a NaN or an infinity gets a NaN scale, so it dequantizes to NaN everywhere: a non-finite value
never comes back as a number. A block of zeros has scale 0 and comes back as zeros. ``rows=R`` takes R
arrays of n elements each (one array of R * n) to R payloads laid end to end, and back: the pieces of a collective
(one per rank or host) are one call, and on CuPy one launch; ``dequantize_sum`` sums the rows' values in float32
(row 0 first, rounded at each add) in the same single pass. The work is vectorised
over blocks on NumPy; nothing loops over blocks in Python. On CuPy each direction is one fused kernel
(quantize.cu: one launch per bucket, no host synchronisation), whose NumPy twin is the NumPy path itself, so the
two agree bit for bit (See [Note: Fused kernels] in _registry.py).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from hpcfsdp._backend import array_module

from ._registry import kernel, launch, use_fused

__all__ = ["KINDS", "payload_bytes", "quantize", "dequantize", "dequantize_sum", "step_bound"]

_QMAX = {"int8": 127.0, "int4": 7.0, "fp8": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)}
KINDS = tuple(_QMAX)


def _check(kind: str, block: int) -> None:
    if kind not in _QMAX:
        raise ValueError(f"quantization dtype {kind!r}: expected one of {', '.join(KINDS)}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or (kind == "int4" and block % 2):
        raise ValueError(f"block_size={block!r}: expected an integer >= 2 (even for int4)")


def _code_bytes(kind: str, n: int) -> int:
    return (n + 1) // 2 if kind == "int4" else n


def payload_bytes(kind: str, n: int, block: int) -> int:
    """Bytes of the payload of ``n`` elements (See [Note: Quantized payloads])."""
    _check(kind, block)
    return _code_bytes(kind, n) + 4 * math.ceil(n / block)


def _blocks(x, block: int, rows: int = 1):
    """``x`` as (rows * blocks, block) float32, each of its ``rows`` rows zero-padded to whole blocks: a view when it
    already is float32 of whole blocks, else a padded copy."""
    xp = array_module(x)
    n = x.size // rows
    nb = math.ceil(n / block)
    if n == nb * block and x.dtype == np.float32 and x.flags.c_contiguous:
        return x.reshape(rows * nb, block)
    xb = xp.zeros((rows, nb * block), np.float32)
    xb[:, :n] = x.reshape(rows, n)
    return xb.reshape(rows * nb, block)


# [Note: e4m3 codes by bits]
# ml_dtypes' float32 -> float8_e4m3fn cast runs element by element; the codes of scaled values (|y| <= 448, no
# NaN: a non-finite block is zeroed first) come from the float32 bits instead, round to nearest even as the cast:
# a normal value keeps its sign, exponent and top 3 mantissa bits after adding the rounding bias below bit 20
# (exponent rebiased from 127 to 7: minus 120 << 3), a value under 2**-6 is a subnormal, rint(|y| * 2**9) steps
# of 2**-9 (the carry into 8 is the smallest normal). Decoding indexes the 256 codes' float32 values. Both are
# tested equal to ml_dtypes' casts.
_E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def _e4m3_codes(y, xp):
    """uint8 e4m3 codes of float32 ``y`` (|y| <= 448, finite), flat (See [Note: e4m3 codes by bits])."""
    u = np.uint32
    b = y.reshape(-1).view(u)
    a = b & u(0x7FFFFFFF)
    t = a >> u(20)
    t &= u(1)
    t += a
    t += u(0x7FFFF)
    t >>= u(20)
    t -= u(120 << 3)
    small = a < u(0x3C800000)  # the bits of 2**-6
    if bool(small.any()):
        t[small] = xp.rint(a[small].view(np.float32) * np.float32(512.0)).astype(u)
    codes = t.astype(np.uint8)
    codes |= (b >> u(24)).astype(np.uint8) & np.uint8(0x80)
    return codes


def _rows(size: int, rows, what: str) -> int:
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or size % rows:
        raise ValueError(f"{what}: rows={rows!r} must be a positive integer dividing the {size} elements")
    return size // rows


def quantize(x, kind: str, block: int, out=None, residual=None, rows: int = 1):
    """The payload of flat float array ``x`` (a new uint8 array, or written into ``out``); with ``rows``, the
    payloads of its ``rows`` equal pieces, end to end. With ``residual`` (a float32 array of x's size), also write
    there what the rounding lost: x minus its dequantized value (0 in a non-finite block), from the scaled values at
    hand rather than a second decoding pass."""
    _check(kind, block)
    xp = array_module(x)
    n = _rows(x.size, rows, "quantize")
    total = rows * payload_bytes(kind, n, block)
    if out is None:
        out = xp.empty(total, np.uint8)
    elif out.size != total or out.dtype != np.uint8:
        raise ValueError(f"quantize: out must be {total} uint8 bytes, got {out.size} {out.dtype}")
    if residual is not None and (residual.size != x.size or residual.dtype != np.float32):
        raise ValueError(f"quantize: residual must be {x.size} float32 values, got {residual.size} {residual.dtype}")
    if use_fused(x):
        return _fused_quantize(xp, x, kind, block, out, residual, rows)
    return _quantize_xp(xp, x, kind, block, out, residual, rows)


def _quantize_xp(xp, x, kind, block, out, residual, rows=1):
    """quantize's vectorised NumPy path (also the fused kernels' twin)."""
    n = x.size // rows
    nb = math.ceil(n / block)
    cb = _code_bytes(kind, n)
    o = out.reshape(rows, cb + 4 * nb)
    xb = _blocks(x, block, rows)
    # absmax without an |x| temporary: max(max, -min) (both propagate NaN)
    absmax = xp.maximum(xb.max(axis=1), -xb.min(axis=1)) if nb else xp.zeros(0, np.float32)
    finite = xp.isfinite(absmax)
    scale = xp.where(finite, absmax / np.float32(_QMAX[kind]), np.float32(np.nan)).astype(np.float32)
    inv = np.float32(1.0) / xp.where(finite & (scale > 0), scale, np.float32(1.0))
    y = xb * inv[:, None]
    if not bool(finite.all()):
        y[~finite] = 0.0  # the block's NaN scale carries the non-finite value
    if kind == "fp8":
        codes = _e4m3_codes(y, xp)
        o[:, :n] = codes.reshape(rows, nb * block)[:, :n]
        if residual is not None:  # y - its e4m3 value, scaled back
            y -= xp.asarray(_E4M3_VALUES)[codes].reshape(y.shape)
    else:
        # |y| <= qmax up to rounding (the scale is absmax / qmax), so rint lands in [-qmax, qmax]: no clip
        q = xp.rint(y)
        qr = q.reshape(rows, nb * block)[:, :n]
        if kind == "int4":
            u = (qr + np.float32(8)).astype(np.uint8)
            if n % 2:
                u = xp.concatenate([u, xp.full((rows, 1), 8, np.uint8)], axis=1)
            xp.bitwise_or(u[:, 0::2], u[:, 1::2] << np.uint8(4), out=o[:, :cb])
        elif rows == 1:
            out.reshape(-1)[:n].view(np.int8)[...] = qr.reshape(-1)
        else:
            o[:, :n] = qr.astype(np.int8).view(np.uint8)
        if residual is not None:
            y -= q
    if residual is not None:
        y *= xp.where(finite, scale, np.float32(0.0))[:, None]
        residual.reshape(rows, n)[...] = y.reshape(rows, nb * block)[:, :n]
    o[:, cb:] = scale.reshape(rows, nb).view(np.uint8)
    return out


def _check_payload(payload, kind, n, block, rows, what):
    _check(kind, block)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"{what}: rows={rows!r}: expected a positive integer")
    want = rows * payload_bytes(kind, n, block)
    if payload.size != want:
        some = f"a {kind} payload of {n} elements has" if rows == 1 else f"{rows} {kind} payloads of {n} elements have"
        raise ValueError(f"{what}: {some} {want} bytes, got {payload.size}")


def dequantize(payload, kind: str, n: int, block: int, dtype, out=None, rows: int = 1):
    """The ``n`` values of ``payload`` as ``dtype`` (a new array, or written into ``out``); with ``rows``, the
    values of ``rows`` payloads laid end to end, row after row (``rows * n`` values)."""
    _check_payload(payload, kind, n, block, rows, "dequantize")
    xp = array_module(payload)
    if use_fused(payload):
        return _fused_dequantize(xp, payload, kind, n, block, dtype, out, rows)
    return _dequantize_xp(xp, payload, kind, n, block, dtype, out, rows)


def dequantize_sum(payload, kind: str, n: int, block: int, rows: int, out=None):
    """The float32 sum of the values of ``rows`` payloads of ``n`` elements laid end to end (row 0 first, rounded
    at each add), in one pass (a new array, or written into float32 ``out``)."""
    _check_payload(payload, kind, n, block, rows, "dequantize_sum")
    if out is not None and (out.size != n or out.dtype != np.float32):
        raise ValueError(f"dequantize_sum: out must be {n} float32 values, got {out.size} {out.dtype}")
    xp = array_module(payload)
    if not use_fused(payload):
        return _dequantize_sum_xp(xp, payload, kind, n, block, rows, out)
    direct = out is not None and out.flags.c_contiguous
    y = out.reshape(-1) if direct else xp.empty(n, np.float32)
    grid = max(1, min(math.ceil(n / 256), _GRID_MAX))
    launch("dequantize_sum", np.float32, grid, 256, (_flat(xp, payload), y, n, rows, block, _KIND_CODE[kind]))
    if out is None:
        return y
    if not direct:
        out[...] = y.reshape(out.shape)
    return out


def _dequantize_sum_xp(xp, payload, kind, n, block, rows, out):
    """dequantize_sum's NumPy path (also the fused kernel's twin)."""
    p = payload.reshape(rows, -1)
    total = xp.empty(n, np.float32) if out is None or not out.flags.c_contiguous else out.reshape(-1)
    _dequantize_xp(xp, p[0], kind, n, block, np.float32, total)
    if rows > 1:
        part = xp.empty(n, np.float32)
        for r in range(1, rows):  # over the rows (hosts), each vectorised
            total += _dequantize_xp(xp, p[r], kind, n, block, np.float32, part)
    if out is None:
        return total
    if total is not out.reshape(-1):
        out[...] = total.reshape(out.shape)
    return out


def _dequantize_xp(xp, payload, kind, n, block, dtype, out, rows=1):
    """dequantize's vectorised NumPy path (also the fused kernel's twin)."""
    nb = math.ceil(n / block)
    cb = _code_bytes(kind, n)
    p = payload.reshape(rows, cb + 4 * nb)
    codes = p[:, :cb]
    scale = xp.ascontiguousarray(p[:, cb:]).view(np.float32).reshape(-1)
    if kind == "fp8":
        vals = xp.asarray(_E4M3_VALUES)[codes]
    elif kind == "int4":
        u = xp.empty((rows, 2 * cb), np.uint8)
        u[:, 0::2] = codes & np.uint8(15)
        u[:, 1::2] = codes >> np.uint8(4)
        vals = u[:, :n].astype(np.float32) - np.float32(8)
    else:
        vals = codes.view(np.int8)  # cast to float32 by the multiply below
    if n == nb * block:  # whole blocks: one multiply, into ``out`` when it is float32
        if out is not None and out.dtype == np.float32 and out.flags.c_contiguous:
            xp.multiply(vals.reshape(rows * nb, block), scale[:, None], out=out.reshape(rows * nb, block))
            return out
        res = (vals.reshape(rows * nb, block) * scale[:, None]).reshape(-1)
    else:
        full = xp.zeros((rows, nb * block), np.float32)
        full[:, :n] = vals  # (int8 codes cast on the copy)
        res = (full.reshape(rows * nb, block) * scale[:, None]).reshape(rows, nb * block)[:, :n]
    if out is None:
        return res.reshape(-1).astype(dtype, copy=False)
    out[...] = res.reshape(out.shape)
    return out


# -- the fused kernels (quantize.cu) ---------------------------------------------------------------------------
BLOCK = 256  # threads per quantization block: quantize.cu's Q_THREADS (its block reductions are written for it)
_KIND_CODE = {"int8": 0, "int4": 1, "fp8": 2}
_CODE_KIND = {v: k for k, v in _KIND_CODE.items()}
_GRID_MAX = 132 * 64
_SIZES = [("n", "scalar", "long long"), ("rows", "scalar", "long long"), ("block", "scalar", "int"),
          ("kind", "scalar", "int")]


@kernel("quantize_blocks", "quantize", [("x", "in"), ("out", "out", "unsigned char")] + _SIZES, block_max=BLOCK)
def _quantize_twin(args, dtype):
    x, out, n, rows, block, kind = args
    _quantize_xp(np, x, _CODE_KIND[int(kind)], int(block), out, None, int(rows))


@kernel("quantize_blocks_ef", "quantize", [("x", "in"), ("out", "out", "unsigned char"), ("residual", "out", "float")]
        + _SIZES, block_max=BLOCK)
def _quantize_ef_twin(args, dtype):
    x, out, residual, n, rows, block, kind = args
    _quantize_xp(np, x, _CODE_KIND[int(kind)], int(block), out, residual, int(rows))


@kernel("dequantize_blocks", "quantize", [("payload", "in", "unsigned char"), ("y", "out")] + _SIZES)
def _dequantize_twin(args, dtype):
    payload, y, n, rows, block, kind = args
    _dequantize_xp(np, payload, _CODE_KIND[int(kind)], int(n), int(block), dtype, y, int(rows))


@kernel("dequantize_sum", "quantize", [("payload", "in", "unsigned char"), ("y", "out")] + _SIZES)
def _dequantize_sum_twin(args, dtype):
    payload, y, n, rows, block, kind = args
    _dequantize_sum_xp(np, payload, _CODE_KIND[int(kind)], int(n), int(block), int(rows), y)


def _flat(xp, a):
    return a.reshape(-1) if a.flags.c_contiguous else xp.ascontiguousarray(a).reshape(-1)


def _fused_quantize(xp, x, kind, block, out, residual, rows=1):
    x, n = _flat(xp, x), x.size // rows
    grid = max(1, min(rows * math.ceil(n / block), _GRID_MAX))
    if residual is None:
        launch("quantize_blocks", x.dtype, grid, BLOCK, (x, _flat(xp, out), n, rows, block, _KIND_CODE[kind]))
    else:
        direct = residual.flags.c_contiguous
        r = residual.reshape(-1) if direct else xp.empty(rows * n, np.float32)
        launch("quantize_blocks_ef", x.dtype, grid, BLOCK, (x, _flat(xp, out), r, n, rows, block, _KIND_CODE[kind]))
        if not direct:
            residual[...] = r.reshape(residual.shape)
    return out


def _fused_dequantize(xp, payload, kind, n, block, dtype, out, rows=1):
    dtype = np.dtype(dtype) if out is None else out.dtype
    direct = out is not None and out.flags.c_contiguous
    y = out.reshape(-1) if direct else xp.empty(rows * n, dtype)
    grid = max(1, min(math.ceil(rows * n / 256), _GRID_MAX))
    launch("dequantize_blocks", dtype, grid, 256, (_flat(xp, payload), y, n, rows, block, _KIND_CODE[kind]))
    if out is None:
        return y
    if not direct:
        out[...] = y.reshape(out.shape)
    return out


def step_bound(x, kind: str, block: int):
    """Per element of ``x``: the largest error the round trip may make (half a step; See [Note: Quantized
    payloads]), in float64. For tests and the step-time model's accuracy notes."""
    _check(kind, block)
    xb = _blocks(np.asarray(x, np.float64), block).astype(np.float64)
    scale = np.abs(xb).max(axis=1, keepdims=True) / _QMAX[kind]
    if kind != "fp8":
        bound = np.broadcast_to(scale / 2, xb.shape)
    else:  # half an e4m3 ulp of the scaled value (3 mantissa bits; subnormals below 2**-6)
        y = np.abs(xb) / np.where(scale > 0, scale, 1.0)
        e = np.floor(np.log2(np.maximum(y, 2.0 ** -6)))
        bound = 2.0 ** (e - 3) / 2 * scale
    return bound.reshape(-1)[:np.asarray(x).size]
