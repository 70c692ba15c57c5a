"""Reductions and scans (sum, mean, var, max/min, prod, logsumexp, cumsum/cumprod/cummax, median, quantile, nan-reductions)."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _distinct, _np, gradcheck, rand


# -- reductions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False), ((0, 2), True),
                                         ((0, 2), False)])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reductions(rng, name, dim, keepdim):
    a = rand(rng, 3, 4, 5, layout="t")
    if dim is None:
        gradcheck(lambda x: getattr(x, name)(), [a])
    else:
        gradcheck(lambda x: getattr(x, name)(dim, keepdim=keepdim), [a])


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim(rng, name, keepdim):
    a = rng.standard_normal((4, 5))
    gradcheck(lambda x: getattr(x, name)(1, keepdim=keepdim).values, [a])
    gradcheck(lambda x: getattr(x, name)(0, keepdim)[0] * 2, [a])
    gradcheck(lambda x: getattr(x, name)(), [a])


def test_amax_ties_share_gradient():
    x = hp.tensor([1.0, 3.0, 3.0, 2.0], requires_grad=True)
    x.amax().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0.5, 0.5, 0])


@pytest.mark.parametrize("dim,corr,keepdim", [(None, 1, False), (1, 1, False), (0, 0, True), ((0, 1), 1, False)])
def test_var(rng, dim, corr, keepdim):
    a = rand(rng, 4, 3, layout="s")
    gradcheck(lambda x: x.var(dim, correction=corr, keepdim=keepdim), [a])
    ref = np.var(a, axis=dim, ddof=corr, keepdims=keepdim)
    np.testing.assert_allclose(hp.tensor(a).var(dim, correction=corr, keepdim=keepdim).numpy(), ref, rtol=1e-12)


def test_var_unbiased_flag(rng):
    a = rng.standard_normal((6,))
    np.testing.assert_allclose(hp.tensor(a).var(unbiased=False).item(), np.var(a), rtol=1e-12)
    np.testing.assert_allclose(hp.tensor(a).var().item(), np.var(a, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(hp.tensor(a).std(0).item(), np.std(a, ddof=1), rtol=1e-12)


# -- scans and reductions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(rng, dim):
    a = rand(rng, 3, 4, layout="s")
    np.testing.assert_allclose(_np(hp.cumsum(hp.tensor(a), dim)), np.cumsum(a, axis=dim), rtol=1e-12)
    gradcheck(lambda x: hp.cumsum(x, dim), [a])
    gradcheck(lambda x: x.cumsum(dim=dim) ** 2, [a])


def test_cumsum_dtypes():
    assert hp.cumsum(hp.tensor([1, 2, 3], dtype=hp.int32), 0).dtype == hp.int64
    b = hp.cumsum(hp.tensor([True, False, True]), 0)
    assert b.dtype == hp.int64 and b.tolist() == [1, 1, 2]
    f = hp.cumsum(hp.tensor([1, 2, 3], dtype=hp.int32), 0, dtype=hp.float32)
    assert f.dtype == hp.float32 and f.tolist() == [1.0, 3.0, 6.0]
    assert hp.cumsum(hp.ones(4, dtype=hp.float16), 0).dtype == hp.float16
    assert hp.cumsum(hp.tensor(2.0), 0).item() == 2.0


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False)])
def test_prod(rng, dim, keepdim):
    a = rng.standard_normal((3, 4))
    ref = np.prod(a, axis=dim, keepdims=keepdim) if dim is not None else np.prod(a)
    np.testing.assert_allclose(_np(hp.prod(hp.tensor(a), dim, keepdim) if dim is not None else hp.prod(hp.tensor(a))),
                               ref, rtol=1e-12)
    gradcheck(lambda x: x.prod(dim, keepdim) if dim is not None else x.prod(), [a])
    z = a.copy()
    z[1, 2] = 0.0  # one zero, then two zeros in one row: the gradient is still the product of the others
    gradcheck(lambda x: x.prod(dim, keepdim) if dim is not None else x.prod(), [z])
    z[1, 0] = 0.0
    gradcheck(lambda x: x.prod(dim, keepdim) if dim is not None else x.prod(), [z])


def test_prod_dtypes():
    assert hp.prod(hp.tensor([1, 2, 3], dtype=hp.int32)).dtype == hp.int64
    assert hp.prod(hp.tensor([True, True])).dtype == hp.int64
    assert hp.prod(hp.tensor([1, 2, 3], dtype=hp.int32), 0, dtype=hp.float64).dtype == hp.float64


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), ((0, 1), False), (-1, False)])
def test_logsumexp(rng, dim, keepdim):
    a = rand(rng, 3, 4, layout="t") * 10
    axes = dim if isinstance(dim, tuple) else (dim,)
    m = a.max(axis=axes, keepdims=True)
    ref = np.log(np.exp(a - m).sum(axis=axes, keepdims=True)) + m
    ref = ref if keepdim else ref.squeeze(axes)
    np.testing.assert_allclose(_np(hp.logsumexp(hp.tensor(a), dim, keepdim)), ref, rtol=1e-12)
    gradcheck(lambda x: hp.logsumexp(x, dim, keepdim), [a])


def test_logsumexp_extremes_and_dtypes():
    inf = math.inf
    assert hp.logsumexp(hp.tensor([-inf, -inf]), 0).item() == -inf
    assert hp.logsumexp(hp.tensor([inf, 1.0]), 0).item() == inf
    assert hp.logsumexp(hp.tensor([1000.0, 1000.0]), 0).item() == pytest.approx(1000 + math.log(2))
    r = hp.logsumexp(hp.tensor([1, 2, 3], dtype=hp.int32), 0)
    assert r.dtype == hp.float32 and r.item() == pytest.approx(math.log(math.e + math.e ** 2 + math.e ** 3), rel=1e-6)


def test_count_nonzero():
    x = hp.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])
    r = hp.count_nonzero(x)
    assert r.dtype == hp.int64 and r.item() == 3
    assert hp.count_nonzero(x, dim=0).tolist() == [0, 1, 2] and hp.count_nonzero(x, dim=(0, 1)).item() == 3
    assert hp.count_nonzero(hp.tensor([True, False, True])).item() == 2


def test_amax_amin_over_dim_0():
    # amax(0) once reduced every dim (dim 0 read as "no dims"); the inf matrix norms reduce over dim 0
    x = hp.tensor([[1.0, 5.0], [3.0, 2.0], [0.0, 4.0]])
    assert x.amax(0).tolist() == [3.0, 5.0] and x.amin(0, keepdim=True).tolist() == [[0.0, 2.0]]
    assert x.amax().item() == 5.0 and x.amin(()).item() == 0.0


# -- scans, order statistics, nan-reductions --------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod(rng, dim):
    a = rand(rng, 3, 4, layout="s")
    np.testing.assert_allclose(_np(hp.cumprod(hp.tensor(a), dim)), np.cumprod(a, axis=dim), rtol=1e-12)
    gradcheck(lambda x: hp.cumprod(x, dim), [a])
    z = a.copy()
    z[1, 1] = 0.0
    gradcheck(lambda x: x.cumprod(dim), [z])
    z[1, 3] = z[2, 1] = 0.0
    gradcheck(lambda x: x.cumprod(dim), [z])
    assert hp.cumprod(hp.tensor([1, 2, 3], dtype=hp.int32), 0).dtype == hp.int64


def test_cummax_cummin(rng):
    r = hp.cummax(hp.tensor([1.0, 3.0, 3.0, 2.0, 3.0]), 0)
    assert r.values.tolist() == [1, 3, 3, 3, 3] and r.indices.tolist() == [0, 1, 2, 2, 4]
    assert r.indices.dtype == hp.int64
    r = hp.cummin(hp.tensor([2, 1, 1, 3, 1]), 0)
    assert r.values.tolist() == [2, 1, 1, 1, 1] and r.indices.tolist() == [0, 1, 2, 2, 4]
    r = hp.cummax(hp.tensor([1.0, math.nan, 3.0]), 0)
    assert math.isnan(r.values[2].item()) and r.indices.tolist() == [0, 1, 1]
    a = rng.permutation(12).reshape(3, 4) + rng.random((3, 4)) * 0.1
    v, i = hp.tensor(a).cummax(1)
    np.testing.assert_array_equal(_np(v), np.maximum.accumulate(a, axis=1))
    np.testing.assert_array_equal(_np(hp.cummin(hp.tensor(a), 0).values), np.minimum.accumulate(a, axis=0))
    gradcheck(lambda x: hp.cummax(x, 1).values + hp.cummin(x, 0).values, [a])


def test_median_kthvalue(rng):
    a = rng.permutation(20).reshape(4, 5) + 0.5
    x = hp.tensor(a)
    assert hp.median(x).item() == np.sort(a.ravel())[9]
    m = hp.median(x, 1)
    np.testing.assert_array_equal(_np(m.values), np.sort(a, 1)[:, 2])
    np.testing.assert_array_equal(_np(m.indices), np.argsort(a, 1)[:, 2])
    assert m.indices.dtype == hp.int64 and x.median(0, keepdim=True).values.shape == (1, 5)
    assert hp.median(hp.tensor([1.0, 2.0, 3.0, 4.0])).item() == 2.0  # the lower median, as PyTorch
    assert math.isnan(hp.median(hp.tensor([1.0, math.nan, 3.0])).item())
    r = hp.median(hp.tensor([[1.0, math.nan, 3.0]]), 1)
    assert math.isnan(r.values.item()) and r.indices.tolist() == [1]
    gradcheck(lambda t: hp.median(t, 1).values, [a])
    gradcheck(hp.median, [a])
    k = hp.kthvalue(x, 2, 0)
    np.testing.assert_array_equal(_np(k.values), np.sort(a, 0)[1])
    np.testing.assert_array_equal(_np(k.indices), np.argsort(a, 0)[1])
    gradcheck(lambda t: hp.kthvalue(t, 4).values, [a])
    assert hp.kthvalue(hp.tensor([3, 1, 2]), 2).values.item() == 2
    with pytest.raises(IndexError, match="out of range"):
        hp.kthvalue(x, 6)
    with pytest.raises(IndexError, match="non-zero size"):
        hp.median(hp.ones(0, 2), 0)


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile(rng, interpolation):
    a = rng.standard_normal((4, 5))
    q = np.array([0.0, 0.3, 0.5, 1.0])
    x = hp.tensor(a)
    np.testing.assert_allclose(_np(hp.quantile(x, hp.tensor(q), dim=1, interpolation=interpolation)),
                               np.quantile(a, q, axis=1, method=interpolation), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.quantile(x, 0.3, interpolation=interpolation)),
                               np.quantile(a, 0.3, method=interpolation), rtol=1e-12)
    r = x.quantile(hp.tensor(q), dim=0, keepdim=True, interpolation=interpolation)
    np.testing.assert_allclose(_np(r), np.quantile(a, q, axis=0, keepdims=True, method=interpolation), rtol=1e-12)
    assert hp.quantile(x, hp.tensor(q), keepdim=True).shape == (4, 1, 1)
    gradcheck(lambda t: hp.quantile(t, hp.tensor([0.3, 0.75], dtype=hp.float64), dim=0, interpolation=interpolation), [a])


def test_quantile_errors_and_nan():
    x = hp.tensor([1.0, math.nan, 2.0])
    assert math.isnan(hp.quantile(x, 0.5).item())
    with pytest.raises(RuntimeError, match=r"in the range \[0, 1\]"):
        hp.quantile(hp.ones(3), 1.5)
    with pytest.raises(RuntimeError, match="must be either float or double dtype"):  # PyTorch's type and message
        hp.quantile(hp.tensor([1, 2]), 0.5)
    with pytest.raises(RuntimeError, match="interpolation must be one of"):
        hp.quantile(hp.ones(3), 0.5, interpolation="cubic")


def test_nansum_nanmean_var_mean_std_mean(rng):
    a = rng.standard_normal((3, 4))
    a[0, 1] = a[2, 2] = np.nan
    x = hp.tensor(a)
    np.testing.assert_allclose(_np(hp.nansum(x)), np.nansum(a))
    np.testing.assert_allclose(_np(hp.nansum(x, 1, keepdim=True)), np.nansum(a, 1, keepdims=True))
    np.testing.assert_allclose(_np(hp.nanmean(x, 0)), np.nanmean(a, 0))
    np.testing.assert_allclose(_np(x.nanmean()), np.nanmean(a))
    gradcheck(lambda t: hp.nansum(t, 0) + hp.nanmean(t, 0), [a])
    assert hp.nansum(hp.tensor([1, 2], dtype=hp.int32)).dtype == hp.int64
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.nanmean(hp.tensor([1, 2]))
    b = rng.standard_normal((3, 4))
    v, m = hp.var_mean(hp.tensor(b), 1)
    np.testing.assert_allclose(_np(v), b.var(1, ddof=1)) and np.testing.assert_allclose(_np(m), b.mean(1))
    s, m = hp.std_mean(hp.tensor(b), dim=0, correction=0, keepdim=True)
    np.testing.assert_allclose(_np(s), b.std(0, keepdims=True)) and np.testing.assert_allclose(_np(m), b.mean(0,
                                                                                                         keepdims=True))
    v, _ = hp.var_mean(hp.tensor(b), False)
    np.testing.assert_allclose(_np(v), b.var())
    gradcheck(lambda t: hp.std_mean(t, 1), [b])


def test_diff(rng):
    a = rng.standard_normal((3, 5))
    x = hp.tensor(a)
    np.testing.assert_allclose(_np(hp.diff(x)), np.diff(a))
    np.testing.assert_allclose(_np(x.diff(2, 0)), np.diff(a, 2, 0))
    p, q = rng.standard_normal((3, 1)), rng.standard_normal((3, 2))
    np.testing.assert_allclose(_np(hp.diff(x, 2, prepend=hp.tensor(p), append=hp.tensor(q))),
                               np.diff(a, 2, prepend=p, append=q))
    gradcheck(lambda t, u: hp.diff(t, 2, 1, prepend=u), [a, p])
    assert hp.diff(hp.tensor([True, True, False])).tolist() == [False, True]
    assert hp.diff(hp.tensor([1, 3, 6, 10]), n=2, prepend=hp.tensor([0])).tolist() == [1, 1, 1]
    with pytest.raises(RuntimeError, match="at least one-dimensional"):
        hp.diff(hp.tensor(1.0))


def test_aminmax_msort_and_inplace_scans(rng):
    a = _distinct(rng, 3, 4)
    r = hp.aminmax(hp.tensor(a))
    assert type(r).__name__ == "aminmax" and r.min.item() == a.min() and r.max.item() == a.max()
    mn, mx = hp.tensor(a).aminmax(dim=1, keepdim=True)
    np.testing.assert_array_equal(_np(mn), a.min(1, keepdims=True))
    np.testing.assert_array_equal(_np(mx), a.max(1, keepdims=True))
    gradcheck(lambda x: hp.aminmax(x, dim=0).min + 2 * hp.aminmax(x, dim=0).max, [a])
    assert hp.aminmax(hp.tensor(3.0), dim=0).max.item() == 3.0 and hp.aminmax(hp.tensor([1, 2])).max.dtype == hp.int64
    with pytest.raises(RuntimeError, match="empty dimension"):
        hp.aminmax(hp.tensor([]))
    with pytest.raises(IndexError, match="non-zero size"):
        hp.aminmax(hp.ones(1, 0), dim=1)
    with pytest.raises(TypeError):
        hp.aminmax(hp.tensor(a), 1)  # dim is keyword-only, as PyTorch's
    np.testing.assert_array_equal(_np(hp.msort(hp.tensor(a))), np.sort(a, 0))
    t = hp.tensor([1, 2, 3], dtype=hp.int32)
    assert t.cumsum_(0) is t and t.tolist() == [1, 3, 6] and t.dtype == hp.int32
    assert hp.tensor([1.0, 2.0, 3.0]).cumprod_(0).tolist() == [1.0, 2.0, 6.0]
    with pytest.raises(RuntimeError, match="Bad in-place call"):
        hp.tensor([1, 2], dtype=hp.int32).cumsum_(0, dtype=hp.int64)
