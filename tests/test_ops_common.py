"""The helpers the op families share (hpcfsdp/autograd/ops/_common.py), each once, and what unifying their copies
pinned: half precision computes in float32 on every backend (_up), reduction dims follow PyTorch (_axes: 0-d
inputs, repeated dims), F.normalize and Tensor.norm share one VectorNorm; against NumPy in float64."""
import math

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp.autograd.ops._common import _apply_along, _axes, _taps, _up


def _np(t):
    return t.detach().cpu().float().numpy() if t.dtype in (hp.float16, hp.bfloat16) else t.detach().cpu().numpy()


# -- _up: half precision in float32 on NumPy and CuPy alike --------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_up_upcasts_half_only(dtype):
    assert _up(np.ones(3, dtype=dtype)).dtype == np.float32
    for other in (np.float32, np.float64, np.int64):
        a = np.ones(3, dtype=other)
        assert _up(a) is a


def test_normalize_half_computes_its_norm_in_float32(device):
    # ||x||^2 = 1000 * 10^2 = 1e5 is past float16's 65504: a float16 norm is inf and normalize gave zeros on CUDA
    x = hp.full((1000,), 10.0, dtype=hp.float16, device=device)
    want = np.float16(10.0 / math.sqrt(1e5))
    np.testing.assert_array_equal(_np(F.normalize(x, dim=0)), np.full(1000, want, dtype=np.float32))
    assert x.norm().item() == float(np.float16(math.sqrt(1e5)))


_HALF_REFS = {  # float64 references of the activations that compute half precision through _up
    "elu": (lambda x: F.elu(x, 0.7), lambda a: np.where(a > 0, a, 0.7 * np.expm1(np.minimum(a, 0)))),
    "softplus": (lambda x: F.softplus(x, 2.0), lambda a: np.logaddexp(0, 2 * a) / 2),
    "mish": (F.mish, lambda a: a * np.tanh(np.logaddexp(0, a))),
    "selu": (F.selu,
             lambda a: 1.0507009873554805 * np.where(a > 0, a, 1.6732632423543772 * np.expm1(np.minimum(a, 0)))),
    "logsigmoid": (F.logsigmoid, lambda a: -np.logaddexp(0, -a)),
}


@pytest.mark.parametrize("name", sorted(_HALF_REFS))
@pytest.mark.parametrize("dtype", [hp.float16, hp.bfloat16])
def test_half_activations_round_once(device, name, dtype):
    fn, ref = _HALF_REFS[name]
    x = hp.tensor(np.linspace(-6, 6, 1201), dtype=dtype, device=device)
    a = _np(x).astype(np.float64)
    half = np.abs(ref(a)).astype(x._data.dtype)  # the float64 value rounded once to the half dtype
    want = np.sign(ref(a)) * half.astype(np.float64)
    ulp = (half.view(np.uint16) + np.uint16(1)).view(half.dtype).astype(np.float64) - half.astype(np.float64)
    got = _np(fn(x)).astype(np.float64)
    assert (np.abs(got - want) <= ulp).all(), np.abs(got - want).max()


# -- one VectorNorm: F.normalize and Tensor.norm ---------------------------------------------------------------------
def _dnorm(x, n, p):
    """d||x||_p / dx as PyTorch's norm_backward defines it (0 at x = 0 for p < 1, ties share the inf norms)."""
    s = np.sign(x)
    if p == 0:
        return np.zeros_like(x)
    if math.isinf(p):
        mask = (np.abs(x) == n).astype(float)
        return s * mask / mask.sum()
    if p < 1:
        return s * np.where(x == 0, 0, np.abs(np.where(x == 0, 1, x)) ** (p - 1)) * n ** (1 - p)
    return s * np.abs(x) ** (p - 1) / n ** (p - 1)


def _norm(x, p):
    a = np.abs(x)
    if p == math.inf:
        return a.max()
    if p == -math.inf:
        return a.min()
    if p == 0:
        return float((x != 0).sum())
    return (a ** p).sum() ** (1 / p)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, math.inf, -math.inf, 0.0])
def test_normalize_matches_float64_reference(p):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6))
    x[:, 4] = -x[:, 3]  # ties of |x|
    if math.isinf(p):  # ties of the max (min) |x|: they share the gradient
        ext = np.abs(x).argmax(1) if p > 0 else np.abs(x).argmin(1)
        x[:, 1] = -x[np.arange(4), ext]
        x[ext == 1, 5] = x[ext == 1, 1]
    else:
        x[:, 1] = 0.0  # zeros: for p < 1 PyTorch's gradient there is 0 (the old normalize gave NaN)
    w = rng.standard_normal((4, 6))
    t = hp.tensor(x, requires_grad=True)
    y = F.normalize(t, p=p, dim=1)
    (y * hp.tensor(w)).sum().backward()
    want_y, want_g = np.empty_like(x), np.empty_like(x)
    for i in range(4):
        n = _norm(x[i], p)
        want_y[i] = x[i] / max(n, 1e-12)
        want_g[i] = w[i] / n - (w[i] @ x[i]) / n ** 2 * _dnorm(x[i], n, p)
    np.testing.assert_allclose(_np(y), want_y, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_np(t.grad), want_g, rtol=1e-10, atol=1e-12)
    # the same op as Tensor.norm: normalize is x / max(x.norm(p, dim, keepdim=True), eps), gradients included
    t2 = hp.tensor(x, requires_grad=True)
    (t2 / t2.norm(p, 1, keepdim=True).clamp(min=1e-12) * hp.tensor(w)).sum().backward()
    np.testing.assert_allclose(_np(t.grad), _np(t2.grad), rtol=1e-12, atol=1e-15)


# -- _axes: PyTorch's reduction dims ------------------------------------------------------------------------------
def test_axes_helper():
    assert _axes(None, 3) is None and _axes((), 3) is None and _axes([], 0) is None
    assert _axes(-1, 3) == (2,) and _axes((2, 0), 3) == (0, 2) and _axes(np.int64(1), 2) == (1,)
    assert _axes(0, 0) is None and _axes((-1,), 0) is None  # a 0-d array has dims 0 and -1: nothing to reduce
    with pytest.raises(RuntimeError, match=r"dim 1 appears multiple times in the list of dims"):
        _axes((1, -2), 3)
    with pytest.raises(IndexError, match="Dimension out of range"):
        _axes(3, 3)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reductions_over_the_dim_of_a_0d_tensor(name):
    x = hp.tensor(3.5, requires_grad=True)
    for dim in (0, -1, (0,)):
        y = getattr(x, name)(dim)
        assert y.shape == () and y.item() == 3.5
        assert getattr(x, name)(dim, keepdim=True).shape == ()
    getattr(x, name)(0).backward()
    assert x.grad.item() == 1.0


def test_var_over_the_dim_of_a_0d_tensor():
    assert math.isnan(hp.tensor(3.5).var(0).item())  # one value, correction 1: 0 / 0, as PyTorch
    assert hp.tensor(3.5).var(0, correction=0).item() == 0.0


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "var"])
def test_reductions_reject_a_repeated_dim(name):
    x = hp.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"dim 0 appears multiple times in the list of dims"):
        getattr(x, name)((0, 0))
    with pytest.raises(RuntimeError, match=r"dim 1 appears multiple times in the list of dims"):
        getattr(x, name)((1, -1))


# -- _taps and _apply_along ------------------------------------------------------------------------------------------
def test_taps_in_c_order():
    assert list(_taps((2, 3))) == [(i, j) for i in range(2) for j in range(3)]
    assert list(_taps((2,))) == [(0,), (1,)] and list(_taps(())) == [()]


def test_apply_along_matches_einsum():
    rng = np.random.default_rng(5)
    y = rng.standard_normal((2, 3, 4, 5))
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((2, 5))
    np.testing.assert_allclose(_apply_along(y, [a, b], False), np.einsum("ki,lj,ncij->nckl", a, b, y), rtol=1e-12)
    np.testing.assert_allclose(_apply_along(y, [a, None], False), np.einsum("ki,ncij->nckj", a, y), rtol=1e-12)
    g = rng.standard_normal((2, 3, 6, 2))
    np.testing.assert_allclose(_apply_along(g, [a, b], True), np.einsum("ki,lj,nckl->ncij", a, b, g), rtol=1e-12)
