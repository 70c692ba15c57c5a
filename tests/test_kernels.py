"""The fused CUDA kernels (hpcfsdp/_kernels): every source compiles for sm_90 with NVRTC, each NumPy twin equals the
unfused math in float64 and within bf16 tolerance, and the simulated RawModule holds a launch to CUDA's rules.

No GPU and no environment needed: the twins run on NumPy, the launches on hpcfsdp.testing.cuda_sim directly. The
ops that use the kernels are checked against the CPU path on the simulated device in tests/test_gpu_kernels.py.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from hpcfsdp import _kernels as K
from hpcfsdp._kernels import activation, nvrtc
from hpcfsdp.testing import cuda_sim as cs
from tests._gradcheck import fd_vjp

BF16 = np.dtype(ml_dtypes.bfloat16)
_erf = np.vectorize(math.erf)


def _module(family):
    return cs.RawModule(code=K.source(family), options=K._registry.OPTIONS, name_expressions=K.name_expressions(family))


def _launch(name, dtype, args):
    spec = K.KERNELS[name]
    fn = _module(spec.family).get_function(spec.expression(dtype))
    fn((4,), (128,), args)


def _dev(a):
    return cs.asarray(a)


# -- NVRTC ------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", sorted(K._registry.FAMILIES))
def test_every_family_compiles_for_sm90_with_nvrtc(family):
    r = nvrtc.compile_family(family, "sm_90")
    assert r.ok, r.log
    assert r.cubin_bytes > 1000
    instances = K.name_expressions(family)
    assert set(r.lowered) == set(instances) and len(instances) == 4 * sum(k.family == family for k in
                                                                           K.KERNELS.values())
    assert all(v.startswith("_Z") for v in r.lowered.values())  # each instance is in the cubin, mangled


def test_nvrtc_reports_a_source_error_with_its_log(monkeypatch):
    monkeypatch.setattr(nvrtc, "source", lambda family: K.source(family) + "\n__global__ void broken() { x; }\n")
    r = nvrtc.compile_family("activation")
    assert not r.ok and "identifier \"x\" is undefined" in r.log


# -- GELU -------------------------------------------------------------------------------------------------------
def _gelu_ref(x, approx):
    """gelu and its derivative in float64 from the textbook formulas (math.erf, math.tanh)."""
    if approx:
        k = math.sqrt(2 / math.pi)
        u = k * (x + 0.044715 * x ** 3)
        th = np.tanh(u)
        return 0.5 * x * (1 + th), 0.5 * (1 + th) + 0.5 * x * (1 - th ** 2) * k * (1 + 3 * 0.044715 * x ** 2)
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
    return x * cdf, cdf + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)


@pytest.mark.parametrize("approx", [0, 1])
def test_gelu_twins_equal_the_formula_in_float64_and_the_finite_difference(approx):
    x = np.linspace(-7, 7, 301)
    g = np.cos(x)
    y, dx = np.empty_like(x), np.empty_like(x)
    K.KERNELS["gelu_fwd"].twin([x, y, np.int64(x.size), np.int32(approx)], np.float64)
    K.KERNELS["gelu_bwd"].twin([g, x, dx, np.int64(x.size), np.int32(approx)], np.float64)
    ref_y, ref_s = _gelu_ref(x, approx)
    # the erf twin's approximation: 1.7e-8 in erf ([Note: erf]), times |x| <= 7 in gelu
    np.testing.assert_allclose(y, ref_y, rtol=0, atol=7 * 1e-8)
    np.testing.assert_allclose(dx, g * ref_s, rtol=0, atol=1e-7)
    h = 1e-6
    yp, ym = np.empty_like(x), np.empty_like(x)
    K.KERNELS["gelu_fwd"].twin([x + h, yp, np.int64(x.size), np.int32(approx)], np.float64)
    K.KERNELS["gelu_fwd"].twin([x - h, ym, np.int64(x.size), np.int32(approx)], np.float64)
    np.testing.assert_allclose(dx, g * (yp - ym) / (2 * h), rtol=0, atol=1e-6)


@pytest.mark.parametrize("approx", [0, 1])
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16), np.dtype(np.float32)])
def test_gelu_twins_in_half_precision_round_once_from_float(approx, dtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(1000) * 3).astype(dtype)
    y = np.empty_like(x)
    K.KERNELS["gelu_fwd"].twin([x, y, np.int64(x.size), np.int32(approx)], dtype)
    ref = _gelu_ref(x.astype(np.float64), approx)[0]
    assert y.dtype == dtype
    eps = {BF16: 2 ** -8, np.float16: 2 ** -11, np.float32: 2 ** -24}[dtype.type if dtype != BF16 else BF16]
    np.testing.assert_array_less(np.abs(y.astype(np.float64) - ref), eps * np.abs(ref) * 1.01 + 1e-6)


def test_bias_gelu_twin_equals_gelu_of_the_biased_input_rounded_once():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 10)).astype(BF16)
    b = rng.standard_normal(10).astype(BF16)
    g = rng.standard_normal((6, 10)).astype(BF16)
    for approx in (0, 1):
        y, dx = np.empty_like(x), np.empty_like(x)
        K.KERNELS["bias_gelu_fwd"].twin([x, b, y, np.int64(60), np.int64(10), np.int32(approx)], BF16)
        K.KERNELS["bias_gelu_bwd"].twin([g, x, b, dx, np.int64(60), np.int64(10), np.int32(approx)], BF16)
        v = (x.astype(np.float32) + b.astype(np.float32)).astype(BF16)  # the unfused x + b in bfloat16
        y2, dx2 = np.empty_like(v), np.empty_like(v)
        K.KERNELS["gelu_fwd"].twin([v, y2, np.int64(60), np.int32(approx)], BF16)
        K.KERNELS["gelu_bwd"].twin([g, v, dx2, np.int64(60), np.int32(approx)], BF16)
        np.testing.assert_array_equal(y.view(np.uint16), y2.view(np.uint16))
        np.testing.assert_array_equal(dx.view(np.uint16), dx2.view(np.uint16))


# -- the simulated RawModule ------------------------------------------------------------------------------------
def test_a_simulated_launch_runs_the_twin_on_device_arrays():
    x = np.linspace(-3, 3, 50, dtype=np.float32)
    dx_, dy = _dev(x), cs.empty(50, dtype=np.float32)
    _launch("gelu_fwd", np.float32, (dx_, dy, np.int64(50), np.int32(0)))
    ref = np.empty_like(x)
    K.KERNELS["gelu_fwd"].twin([x, ref, np.int64(50), np.int32(0)], np.float32)
    np.testing.assert_array_equal(dy.get(), ref)


def test_a_simulated_launch_refuses_what_a_gpu_would_get_wrong():
    x, y = _dev(np.ones(8, np.float32)), cs.empty(8, dtype=np.float32)
    with pytest.raises(cs.CudaSimError, match="pass a NumPy int64, not int"):
        _launch("gelu_fwd", np.float32, (x, y, 8, np.int32(0)))  # a Python int reaches the kernel as 8 bytes
    with pytest.raises(cs.CudaSimError, match="C-contiguous float32"):
        _launch("gelu_fwd", np.float32, (_dev(np.ones(16, np.float32))[::2], y, np.int64(8), np.int32(0)))
    with pytest.raises(cs.CudaSimError, match="C-contiguous float32"):
        _launch("gelu_fwd", np.float32, (_dev(np.ones(8, np.float64)), y, np.int64(8), np.int32(0)))
    with pytest.raises(cs.CudaSimError, match="3 arguments for 4 parameters"):
        _launch("gelu_fwd", np.float32, (x, y, np.int64(8)))
    fn = _module("activation").get_function("gelu_fwd<float>")
    with pytest.raises(cs.CudaSimError, match="2048 threads per block"):
        fn((1,), (2048,), (x, y, np.int64(8), np.int32(0)))
    with pytest.raises(cs.CudaSimError, match="not among the module's name_expressions"):
        cs.RawModule(code=K.source("activation"), name_expressions=["gelu_bwd<float>"]).get_function(
            "gelu_fwd<float>")
    with pytest.raises(cs.CudaSimError, match="source has no __global__ gelu_fwd"):
        cs.RawModule(code="// empty", name_expressions=["gelu_fwd<float>"]).get_function("gelu_fwd<float>")


def test_a_simulated_launch_is_ordered_like_a_kernel_on_its_stream():
    x = _dev(np.ones(8, np.float32))
    s = cs.cuda.Stream(non_blocking=True)
    y = cs.empty(8, dtype=np.float32)
    s.wait_event(cs.cuda.get_current_stream().record())  # the upload of x is ordered before the kernel
    with s:
        _launch("gelu_fwd", np.float32, (x, y, np.int64(8), np.int32(0)))
    with pytest.raises(cs.CudaSimError, match="read-after-write"):
        y + 1  # on the null stream, nothing ordered after the other stream's kernel
    s.synchronize()
    np.testing.assert_allclose((y + 0).get(), _gelu_ref(np.ones(8), 0)[0], rtol=1e-6)


def test_launch_checks_scalars_and_pointers_before_any_device_work():
    spec = K.KERNELS["gelu_fwd"]
    with pytest.raises(TypeError, match="parameter x needs a C-contiguous float32 array, got float64"):
        K._registry._checked_args(spec, np.float32, (np.ones(4), np.ones(4, np.float32), 4, 0))
    args = K._registry._checked_args(spec, np.float32, (np.ones(4, np.float32), np.ones(4, np.float32), 4, 1))
    assert type(args[2]) is np.int64 and type(args[3]) is np.int32
    assert activation.grid_for(1) == 1 and activation.grid_for(10 ** 9) == 132 * 32


# -- attention rows ---------------------------------------------------------------------------------------------
def _softmax_ref(s, scale, causal):
    a = s.astype(np.float64) * scale
    if causal:
        L, S = a.shape[-2:]
        a = np.where(np.tril(np.ones((L, S), bool)), a, -np.inf)
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("shape", [(2, 5, 5), (1, 3, 7)])
def test_causal_softmax_twins_equal_softmax_and_its_finite_difference_in_float64(causal, shape):
    rng = np.random.default_rng(3)
    s = rng.standard_normal(shape)
    L, S = shape[-2:]
    rows = s.size // S
    p = np.empty_like(s)
    K.KERNELS["causal_softmax_fwd"].twin([s, p, np.int64(rows), np.int32(L), np.int32(S), np.float32(0.5),
                                          np.int32(causal)], np.float64)
    np.testing.assert_allclose(p, _softmax_ref(s, 0.5, causal), rtol=1e-12, atol=1e-15)
    if causal:
        assert (p[..., np.triu_indices(L, 1, S)[0], np.triu_indices(L, 1, S)[1]] == 0).all()
    dp = rng.standard_normal(shape)
    ds = np.empty_like(s)
    K.KERNELS["softmax_bwd_scaled"].twin([p, dp, ds, np.int64(rows), np.int32(S), np.float32(0.5)], np.float64)
    np.testing.assert_allclose(ds, fd_vjp(lambda a: _softmax_ref(a, 0.5, causal), s, dp), rtol=0, atol=1e-8)


def test_causal_softmax_twin_in_bfloat16_reads_float_scores_and_rounds_once():
    rng = np.random.default_rng(4)
    s = (rng.standard_normal((4, 16, 16)) * 4).astype(np.float32)  # the float32 scores of bfloat16 q and k
    p = np.empty(s.shape, BF16)
    K.KERNELS["causal_softmax_fwd"].twin([s, p, np.int64(64), np.int32(16), np.int32(16), np.float32(0.25),
                                          np.int32(1)], BF16)
    ref = _softmax_ref(s.astype(np.float64), 0.25, True)
    np.testing.assert_array_less(np.abs(p.astype(np.float64) - ref), 2 ** -8 * ref + 1e-30)  # half an ulp (8 significant bits)
    dp = rng.standard_normal(s.shape).astype(np.float32)
    ds = np.empty(s.shape, BF16)
    K.KERNELS["softmax_bwd_scaled"].twin([p, dp, ds, np.int64(64), np.int32(16), np.float32(0.25)], BF16)
    pf = p.astype(np.float64)
    want = 0.25 * pf * (dp - (dp * pf).sum(-1, keepdims=True))
    np.testing.assert_array_less(np.abs(ds.astype(np.float64) - want), 2 ** -8 * np.abs(want) + 1e-6)


@pytest.mark.parametrize("dtype", [np.float64, BF16])
def test_heads_split3_and_merge3_twins_are_the_packed_projection_s_head_views_and_inverse(dtype):
    B, T, H, D = 2, 5, 3, 4
    x = np.random.default_rng(5).standard_normal((B, T, 3 * H * D)).astype(dtype)
    outs = [np.empty((B, H, T, D), dtype) for _ in range(3)]
    K.KERNELS["heads_split3"].twin([x, x, *outs, np.int64(B * H * T * D), np.int32(T), np.int32(H), np.int32(D),
                                    np.int32(0)], dtype)
    for i, o in enumerate(outs):  # q, k, v as the GPT's split(C) / view(B, T, H, D) / transpose(1, 2)
        np.testing.assert_array_equal(o, x[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3))
    bias = np.random.default_rng(6).standard_normal(3 * H * D).astype(dtype)
    K.KERNELS["heads_split3"].twin([x, bias, *outs, np.int64(B * H * T * D), np.int32(T), np.int32(H), np.int32(D),
                                    np.int32(1)], dtype)
    xb = (x.astype(np.float64) + bias.astype(np.float64)).astype(dtype)  # the Linear's bias add, rounded once
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, xb[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D).transpose(0, 2, 1, 3))
    back = np.full_like(x, np.nan)  # the merge inverts the split: the biased projection back
    K.KERNELS["heads_merge3"].twin([*outs, back, np.int64(B * H * T * D), np.int32(T), np.int32(H), np.int32(D)], dtype)
    np.testing.assert_array_equal(back, xb)


@pytest.mark.parametrize("dtype", [np.float64, BF16])
def test_dropout_twins_keep_where_the_draw_reaches_p_scaled_and_the_backward_uses_the_mask(dtype):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, 13)).astype(dtype)
    r = rng.random((5, 13), dtype=np.float32)
    y, keep = np.empty_like(x), np.empty(x.shape, np.uint8)
    K.KERNELS["dropout_fwd"].twin([x, r, y, keep, np.int64(x.size), np.float32(0.3), np.float32(1 / 0.7)], dtype)
    k = r >= np.float32(0.3)
    np.testing.assert_array_equal(keep, k.astype(np.uint8))
    # as the unfused op: (x * keep) * scale, rounded once in x's dtype
    np.testing.assert_array_equal(y, (x.astype(np.float64) * k * np.float32(1 / 0.7)).astype(dtype) if dtype == BF16
                                  else np.where(k, x * np.float32(1 / 0.7), 0.0))
    g = rng.standard_normal(x.shape).astype(dtype)
    dx = np.empty_like(g)
    K.KERNELS["dropout_bwd"].twin([g, keep, dx, np.int64(g.size), np.float32(1 / 0.7)], dtype)
    np.testing.assert_array_equal(dx, np.where(k, g.astype(np.float64) * np.float32(1 / 0.7), 0.0).astype(dtype))
