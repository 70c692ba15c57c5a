"""The softmax kernels (hpcfsdp/_kernels/softmax.cu): each NumPy twin equals softmax, log_softmax and cross-entropy
written out in float64 and their finite differences, stays within bf16 tolerance, and runs as one simulated launch.

No GPU and no environment needed (see tests/test_kernels.py); the ops on the simulated device: tests/test_gpu_kernels.py.
"""
import ml_dtypes
import numpy as np
import pytest

from hpcfsdp import _kernels as K
from hpcfsdp._kernels import softmax
from hpcfsdp.testing import cuda_sim as cs
from tests._gradcheck import fd_vjp

BF16 = np.dtype(ml_dtypes.bfloat16)
I64, I32 = np.int64, np.int32


def _sm_ref(x, log):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return np.log(p) if log else p


def _ce_ref(x, t, ignore, eps):
    """Per-row cross-entropy in float64: -(1 - eps) log p_t - eps / C sum_j log p_j, 0 where t == ignore."""
    lp = _sm_ref(x, True)
    c = x.shape[1]
    ok = t != ignore
    nll = -lp[np.arange(len(t)), np.where(ok, t, 0)]
    return np.where(ok, (1 - eps) * nll - eps / c * lp.sum(1), 0.0)


@pytest.mark.parametrize("log", [0, 1])
def test_softmax_twins_equal_the_formula_and_its_finite_difference_in_float64(log):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 9)) * 3
    y, dx = np.empty_like(x), np.empty_like(x)
    K.KERNELS["softmax_fwd"].twin([x, y, I64(4), I64(9), I32(log)], np.float64)
    np.testing.assert_allclose(y, _sm_ref(x, log), rtol=1e-12, atol=1e-15)
    g = rng.standard_normal(x.shape)
    K.KERNELS["softmax_bwd"].twin([g, y, dx, I64(4), I64(9), I32(log)], np.float64)
    np.testing.assert_allclose(dx, fd_vjp(lambda a: _sm_ref(a, log), x, g), rtol=0, atol=1e-8)


@pytest.mark.parametrize("log", [0, 1])
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_softmax_twins_in_half_precision_round_once_from_float(log, dtype):
    x = (np.random.default_rng(1).standard_normal((16, 8192)) * 4).astype(dtype)
    y = np.empty_like(x)
    K.KERNELS["softmax_fwd"].twin([x, y, I64(16), I64(8192), I32(log)], dtype)
    ref = _sm_ref(x, log)
    ulp = 2 ** -8 if dtype == BF16 else 2 ** -11
    np.testing.assert_array_less(np.abs(y.astype(np.float64) - ref), ulp * np.abs(ref) * 1.01 + 1e-6)


def _ce(x, t, ignore, eps, mode, dtype):
    n, c = x.shape
    f = softmax.acc_dtype(dtype)
    loss, grad = np.empty(n, f), np.empty_like(x)
    out, den, flag = np.empty(n if mode == 0 else (), dtype), np.empty(1, f), np.empty(1, np.int64)
    K.KERNELS["ce_fwd"].twin([x, t, loss, grad, I64(n), I64(c), I64(ignore), np.float64(eps)], dtype)
    K.KERNELS["ce_reduce"].twin([t, loss, out, den, flag, I64(n), I64(c), I64(ignore), I32(mode)], dtype)
    return out, grad, den, flag


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_cross_entropy_twins_equal_the_formula_and_its_finite_difference_in_float64(mode, eps):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 5)) * 2
    t = np.array([0, 4, -100, 2, 2, 1])
    out, grad, den, flag = _ce(x, t, -100, eps, mode, np.float64)
    per_row = _ce_ref(x, t, -100, eps)
    want = [per_row, per_row.sum(), per_row.sum() / 5][mode]
    np.testing.assert_allclose(out, want, rtol=1e-13)
    assert den[0] == 5 and flag[0] == -1
    g = rng.standard_normal(6) if mode == 0 else np.array(1.7)
    dx = np.empty_like(x)
    K.KERNELS["ce_bwd"].twin([grad, g, den, dx, I64(x.size), I64(5), I32(mode)], np.float64)
    loss = [lambda a: _ce_ref(a, t, -100, eps), lambda a: _ce_ref(a, t, -100, eps).sum(),
            lambda a: _ce_ref(a, t, -100, eps).sum() / 5][mode]
    np.testing.assert_allclose(dx, fd_vjp(loss, x, g), rtol=0, atol=1e-8)
    assert (dx[2] == 0).all()  # the ignored row


def test_cross_entropy_twin_flags_the_first_bad_target_row_and_zeroes_it():
    x = np.zeros((5, 3), np.float32)
    out, grad, den, flag = _ce(x, np.array([0, 3, -100, -1, 7]), -100, 0.0, 2, np.float32)
    assert flag[0] == 1 and den[0] == 4 and (grad[[1, 3, 4]] == 0).all()
    out, _, den, flag = _ce(x, np.array([-100, -100, -100, -100, -100]), -100, 0.0, 2, np.float32)
    assert flag[0] == -1 and den[0] == 0 and np.isnan(out)  # 0 / 0, as the unfused mean


def test_cross_entropy_twin_in_bfloat16_stays_within_its_rounding():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 1000)) * 3).astype(BF16)
    t = rng.integers(0, 1000, 64)
    out, grad, _, _ = _ce(x, t, -100, 0.1, 0, BF16)
    ref = _ce_ref(x, t, -100, 0.1)
    np.testing.assert_array_less(np.abs(out.astype(np.float64) - ref), 2 ** -8 * np.abs(ref) + 1e-6)
    p = _sm_ref(x, False) - 0.1 / 1000
    p[np.arange(64), t] -= 0.9
    np.testing.assert_array_less(np.abs(grad.astype(np.float64) - p), 2 ** -8 * np.abs(p) + 1e-7)


def test_softmax_launches_run_the_twins_on_the_simulated_device():
    x = np.random.default_rng(4).standard_normal((3, 70)).astype(np.float32)
    mod = cs.RawModule(code=K.source("softmax"), options=K._registry.OPTIONS,
                       name_expressions=K.name_expressions("softmax"))
    y = cs.empty((3, 70), dtype=np.float32)
    mod.get_function("softmax_fwd<float>")((3,), (softmax.BLOCK,), (cs.asarray(x), y, I64(3), I64(70), I32(1)))
    ref = np.empty_like(x)
    K.KERNELS["softmax_fwd"].twin([x, ref, I64(3), I64(70), I32(1)], np.float32)
    np.testing.assert_array_equal(y.get(), ref)
    with pytest.raises(cs.CudaSimError, match="parameter tgt needs a C-contiguous int64 device array"):
        mod.get_function("ce_fwd<float>")((3,), (softmax.BLOCK,), (
            cs.asarray(x), cs.asarray(np.zeros(3, np.int32)), cs.empty(3, dtype=np.float32), y, I64(3), I64(70),
            I64(-100), np.float64(0)))
