"""The norm kernels (hpcfsdp/_kernels/norm.cu): each NumPy twin equals LayerNorm / RMSNorm written out in float64 and
its finite difference, stays within bf16 tolerance, and runs as one simulated launch.

No GPU and no environment needed (see tests/test_kernels.py); the ops on the simulated device: tests/test_gpu_kernels.py.
"""
import ml_dtypes
import numpy as np
import pytest

from hpcfsdp import _kernels as K
from hpcfsdp._kernels import nvrtc, norm
from hpcfsdp.testing import cuda_sim as cs
from tests._gradcheck import fd_vjp

BF16 = np.dtype(ml_dtypes.bfloat16)
I64, I32 = np.int64, np.int32


def _ref(x, w, b, eps, rms):
    """The textbook formula in float64: (x - mean) / sqrt(var + eps) * w + b, or x / sqrt(mean(x^2) + eps) * w."""
    x = x.astype(np.float64)
    m = 0 if rms else x.mean(-1, keepdims=True)
    y = (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(np.float64)
    if b is not None:
        y = y + b.astype(np.float64)
    return y


def _fwd(x, w, b, eps, rms, dtype):
    rows, c = x.shape
    y, mean, rstd = np.empty_like(x), np.empty(rows, norm.acc_dtype(dtype)), np.empty(rows, norm.acc_dtype(dtype))
    K.KERNELS["norm_fwd"].twin([x, x if w is None else w, x if b is None else b, y, mean, rstd, I64(rows), I64(c),
                                np.float64(eps), I32(w is not None), I32(b is not None), I32(rms)], dtype)
    return y, mean, rstd


def _bwd(g, x, w, mean, rstd, rms, dtype):
    rows, c = x.shape
    dx, dw, db = np.empty_like(x), np.empty(c, x.dtype), np.empty(c, x.dtype)
    K.KERNELS["norm_bwd_dx"].twin([g, x, x if w is None else w, mean, rstd, x, dx, I64(rows), I64(c),
                                   I32(w is not None), I32(0), I32(rms)], dtype)
    K.KERNELS["norm_bwd_wb"].twin([g, x, mean, rstd, x, dw, db, db, I64(rows), I64(c), I32(rms), I32(0)], dtype)
    return dx, dw, db


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("rms", [0, 1])
def test_norm_twins_equal_the_formula_and_its_finite_difference_in_float64(rms, affine):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)) * 2 + 0.5
    w = rng.standard_normal(7) if affine[0] else None
    b = None if rms or not affine[1] else rng.standard_normal(7)
    eps = 1e-5
    y, mean, rstd = _fwd(x, w, b, eps, rms, np.float64)
    np.testing.assert_allclose(y, _ref(x, w, b, eps, rms), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(((x - (0 if rms else x.mean(1, keepdims=True))) ** 2).mean(1) + eps),
                               rtol=1e-13)
    g = rng.standard_normal(x.shape)
    dx, dw, db = _bwd(g, x, w, mean, rstd, rms, np.float64)

    def fd(f, a):
        return fd_vjp(f, a, g)

    np.testing.assert_allclose(dx, fd(lambda a: _ref(a, w, b, eps, rms), x), rtol=0, atol=1e-7)
    ww = np.ones(7) if w is None else w
    np.testing.assert_allclose(dw, fd(lambda a: _ref(x, a, b, eps, rms), ww), rtol=0, atol=1e-7)
    np.testing.assert_allclose(db, g.sum(0), rtol=1e-13)


@pytest.mark.parametrize("rms", [0, 1])
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16), np.dtype(np.float32)])
def test_norm_twins_in_low_precision_stay_within_its_rounding(rms, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((8, 8192)) * 3 + 1).astype(dtype)  # rows as wide as the issue asks
    w = (rng.standard_normal(8192)).astype(dtype)
    y, mean, rstd = _fwd(x, w, None, 1e-5, rms, dtype)
    assert y.dtype == dtype and mean.dtype == rstd.dtype == np.float32
    ref = _ref(x, w, None, 1e-5, rms)
    ulp = {BF16: 2 ** -8, np.dtype(np.float16): 2 ** -11, np.dtype(np.float32): 2 ** -24}[dtype]
    # one rounding of the output (two for RMSNorm: x * rstd, then times w), float32 accumulation
    np.testing.assert_array_less(np.abs(y.astype(np.float64) - ref), (2 + 2 * rms) * ulp * np.abs(ref) + 1e-5)
    g = rng.standard_normal(x.shape).astype(dtype)
    dx, dw, db = _bwd(g, x, w, mean, rstd, rms, dtype)
    dx64, dw64, _ = _bwd(g.astype(np.float64), x.astype(np.float64), w.astype(np.float64), mean.astype(np.float64),
                         rstd.astype(np.float64), rms, np.float64)
    assert dx.dtype == dw.dtype == db.dtype == dtype
    np.testing.assert_allclose(dx.astype(np.float64), dx64, rtol=4 * ulp, atol=4 * ulp * np.abs(dx64).max())
    np.testing.assert_allclose(dw.astype(np.float64), dw64, rtol=0, atol=8 * ulp * np.abs(dw64).max())
    np.testing.assert_allclose(db.astype(np.float64), g.astype(np.float64).sum(0), rtol=0,
                               atol=4 * ulp * np.abs(g.astype(np.float64).sum(0)).max())


def test_norm_launches_run_the_twins_on_the_simulated_device():
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((6, 33)).astype(np.float32), rng.standard_normal(33).astype(np.float32), \
        rng.standard_normal(33).astype(np.float32)
    mod = cs.RawModule(code=K.source("norm"), options=K._registry.OPTIONS, name_expressions=K.name_expressions("norm"))
    dx_, dw_, db_ = cs.asarray(x), cs.asarray(w), cs.asarray(b)
    y, mean, rstd = cs.empty((6, 33), dtype=np.float32), cs.empty(6, dtype=np.float32), cs.empty(6, dtype=np.float32)
    mod.get_function("norm_fwd<float>")((6,), (norm.BLOCK,), (dx_, dw_, db_, y, mean, rstd, I64(6), I64(33),
                                                              np.float64(1e-5), I32(1), I32(1), I32(0)))
    np.testing.assert_array_equal(y.get(), _fwd(x, w, b, 1e-5, 0, np.float32)[0])
    with pytest.raises(cs.CudaSimError, match="needs a C-contiguous float32 device array"):  # mean is "A": float32
        mod.get_function("norm_fwd<float>")((6,), (norm.BLOCK,), (dx_, dw_, db_, y, cs.empty(6, dtype=np.float64),
                                                                  rstd, I64(6), I64(33), np.float64(1e-5), I32(1),
                                                                  I32(1), I32(0)))
    with pytest.raises(cs.CudaSimError, match="512 threads per block; at most 256"):  # norm_bwd_wb's fixed tile
        mod.get_function("norm_bwd_wb<float>")((2,), (512,), (y, dx_, mean, rstd, dx_, dw_, db_, db_, I64(6), I64(33),
                                                             I32(0), I32(0)))


def test_launchers_pass_accumulation_typed_statistics_for_double():
    spec = K.KERNELS["norm_fwd"]
    mean = next(p for p in spec.params if p.name == "mean")
    assert spec.pointer_dtype(mean, np.float64) == np.float64 and spec.pointer_dtype(mean, BF16) == np.float32
    assert "norm" in K._registry.FAMILIES and nvrtc.norm is norm


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), BF16])
def test_add_norm_twin_is_the_residual_sum_then_the_norm_and_its_backward_adds_the_stream_s_gradient(dtype):
    rng = np.random.default_rng(7)
    rows, c = 6, 40
    x, y = (rng.standard_normal((rows, c)).astype(dtype) for _ in range(2))
    yb, w, b = (rng.standard_normal(c).astype(dtype) for _ in range(3))
    s, out = np.empty_like(x), np.empty_like(x)
    mean, rstd = np.empty(rows, norm.acc_dtype(dtype)), np.empty(rows, norm.acc_dtype(dtype))
    K.KERNELS["add_norm_fwd"].twin([x, y, yb, w, b, s, out, mean, rstd, I64(rows), I64(c), np.float64(1e-5), I32(1),
                                    I32(1), I32(1), I32(0)], dtype)
    f64 = np.float64
    want_s = (x.astype(f64) + (y.astype(f64) + yb.astype(f64)).astype(dtype).astype(f64)).astype(dtype)
    np.testing.assert_array_equal(s, want_s)  # rounded as the unfused adds: the same residual stream
    y2, _, _ = _fwd(s, w, b, 1e-5, 0, dtype)
    np.testing.assert_array_equal(out, y2)  # then exactly norm_fwd of it
    g_out, g_s = (rng.standard_normal((rows, c)).astype(dtype) for _ in range(2))
    ds, dw, db, dyb = np.empty_like(x), np.empty(c, dtype), np.empty(c, dtype), np.empty(c, dtype)
    K.KERNELS["norm_bwd_dx"].twin([g_out, s, w, mean, rstd, g_s, ds, I64(rows), I64(c), I32(1), I32(1), I32(0)], dtype)
    K.KERNELS["norm_bwd_wb"].twin([g_out, s, mean, rstd, ds, dw, db, dyb, I64(rows), I64(c), I32(0), I32(1)], dtype)
    gx_norm = fd_vjp(lambda a: _ref(a, w.astype(f64), b.astype(f64), 1e-5, 0), s.astype(f64), g_out.astype(f64))
    want_ds = gx_norm + g_s.astype(f64)
    tol = dict(rtol=0, atol=1e-7) if dtype == np.float64 else dict(rtol=2 ** -7, atol=2 ** -7 * np.abs(want_ds).max())
    np.testing.assert_allclose(ds.astype(f64), want_ds, **tol)
    np.testing.assert_allclose(dyb.astype(f64), ds.astype(f64).sum(0), rtol=2 ** -7 if dtype == BF16 else 1e-12,
                               atol=1e-3 if dtype == BF16 else 1e-12)
    np.testing.assert_allclose(db.astype(f64), g_out.astype(f64).sum(0), rtol=2 ** -7 if dtype == BF16 else 1e-12,
                               atol=1e-3 if dtype == BF16 else 1e-12)
