"""Statistics ops of the reduce family: logcumsumexp, nanmedian, mode, histc, cov, corrcoef, trapezoid/trapz and
cumulative_trapezoid, against NumPy float64, with finite-difference gradients and PyTorch's errors."""
import numpy as np
import pytest

import hpcfsdp as hp

from _gradcheck import gradcheck

RNG = np.random.default_rng(3)
NAN = float("nan")


def _t(a):
    return hp.tensor(np.asarray(a))


# -- logcumsumexp ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_logcumsumexp_values_and_gradient(dim):
    a = RNG.standard_normal((4, 5)) * 3
    ref = np.log(np.cumsum(np.exp(a), axis=dim))
    out = _t(a).logcumsumexp(dim)
    assert out.dtype == hp.float64
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(hp.logcumsumexp(_t(a), dim).numpy(), ref, rtol=1e-12)
    gradcheck(lambda x: x.logcumsumexp(dim), [a.copy()])


def test_logcumsumexp_extremes_dtypes_and_errors():
    out = hp.logcumsumexp(hp.tensor([-1000.0, 0.0, 1000.0], dtype=hp.float64), 0)
    np.testing.assert_allclose(out.numpy(), [-1000.0, np.log1p(np.exp(-1000.0)), 1000.0])
    np.testing.assert_array_equal(hp.tensor([-np.inf, -np.inf, 1.0]).logcumsumexp(0).numpy(), [-np.inf, -np.inf, 1.0])
    np.testing.assert_array_equal(hp.tensor([np.inf, 1.0]).logcumsumexp(0).numpy(), [np.inf, np.inf])
    assert hp.tensor(2.0).logcumsumexp(0).item() == 2.0
    h = hp.tensor([1.0, 2.0, 3.0], dtype=hp.float16).logcumsumexp(0)
    assert h.dtype == hp.float16
    np.testing.assert_allclose(h.float().numpy(), np.log(np.cumsum(np.exp([1.0, 2.0, 3.0]))), rtol=1e-3)
    x = hp.tensor([1.0, 2.0, 700.0, 3.0], dtype=hp.float64, requires_grad=True)  # no overflow in the gradient
    x.logcumsumexp(0).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()
    with pytest.raises(NotImplementedError, match="logcumsumexp"):
        hp.tensor([1, 2, 3]).logcumsumexp(0)
    with pytest.raises(IndexError):
        hp.ones(2, 3).logcumsumexp(2)


# -- nanmedian ---------------------------------------------------------------------------------------------
def test_nanmedian_values_indices():
    x = hp.tensor([[1.0, NAN, 3.0, 2.0], [NAN, NAN, NAN, NAN], [4.0, NAN, NAN, NAN]])
    assert hp.nanmedian(x).item() == 2.0  # lower median of 1, 2, 3, 4
    r = x.nanmedian(1)
    assert type(r).__name__ == "nanmedian" and r._fields == ("values", "indices")
    np.testing.assert_array_equal(r.values.numpy(), [2.0, NAN, 4.0])
    np.testing.assert_array_equal(r.indices.numpy()[[0, 2]], [3, 0])
    assert r.indices.dtype == hp.int64
    r = hp.nanmedian(hp.tensor([[1.0, 2.0], [3.0, NAN]]), 0, keepdim=True)
    np.testing.assert_array_equal(r.values.numpy(), [[1.0, 2.0]])
    np.testing.assert_array_equal(r.indices.numpy(), [[0, 0]])
    assert np.isnan(hp.nanmedian(hp.tensor([NAN, NAN])).item())
    assert np.isnan(hp.nanmedian(hp.zeros(0)).item())
    assert hp.nanmedian(hp.tensor([1, 2, 3, 4])).item() == 2
    r = hp.tensor([1, 2, 3, 4]).nanmedian(0)
    assert r.values.item() == 2 and r.indices.item() == 1
    with pytest.raises(IndexError, match="non-zero size"):
        hp.zeros(0, 3).nanmedian(0)


def test_nanmedian_matches_numpy_and_gradient():
    a = RNG.permutation(30).reshape(5, 6).astype(np.float64)
    a[RNG.random((5, 6)) < 0.3] = np.nan
    a[0, :] = np.arange(6.0)
    got = _t(a).nanmedian(1).values.numpy()
    for row, g in zip(a, got):
        v = np.sort(row[~np.isnan(row)])
        assert (np.isnan(g) and v.size == 0) or g == v[(v.size - 1) // 2]
    b = RNG.permutation(12).reshape(3, 4).astype(np.float64)
    b[1, 2] = np.nan
    gradcheck(lambda x: x.nanmedian(1).values, [b.copy()])
    gradcheck(lambda x: x.nanmedian(), [b.copy()])


# -- mode --------------------------------------------------------------------------------------------------
def test_mode_smallest_of_most_frequent_last_index():
    r = hp.mode(hp.tensor([[1, 2, 2, 3, 3, 1], [5, 5, 4, 4, 1, 0]]))
    assert type(r).__name__ == "mode" and r._fields == ("values", "indices")
    np.testing.assert_array_equal(r.values.numpy(), [1, 4])
    np.testing.assert_array_equal(r.indices.numpy(), [5, 3])
    r = hp.tensor([2, 1, 2, 1, 3]).mode()
    assert (r.values.item(), r.indices.item()) == (1, 3)
    r = hp.mode(hp.tensor([[1, 2], [3, 3]]), 0, keepdim=True)
    np.testing.assert_array_equal(r.values.numpy(), [[1, 2]])
    np.testing.assert_array_equal(r.indices.numpy(), [[0, 0]])
    r = hp.mode(hp.tensor([1.0, NAN, NAN, 2.0]))  # NaNs are all distinct
    assert (r.values.item(), r.indices.item()) == (1.0, 0)
    r = hp.mode(hp.tensor(3.0))
    assert (r.values.item(), r.indices.item()) == (3.0, 0)
    with pytest.raises(IndexError, match="mode\\(\\): Expected reduction dim 1 to have non-zero size"):
        hp.zeros(3, 0).mode(1)


def test_mode_against_numpy_and_gradient():
    a = RNG.integers(0, 4, (6, 9))
    r = _t(a).mode(1)
    for row, v, i in zip(a, r.values.numpy(), r.indices.numpy()):
        vals, counts = np.unique(row, return_counts=True)
        assert v == vals[np.argmax(counts)]
        assert i == np.nonzero(row == v)[0][-1]
    # the gradient goes to the selected index (ties make finite differences meaningless), as PyTorch's
    x = hp.tensor([[1.0, 2.0, 2.0, 0.5], [3.0, 3.0, 1.0, 1.0]], dtype=hp.float64, requires_grad=True)
    r = x.mode(1)
    (r.values * hp.tensor([2.0, 3.0], dtype=hp.float64)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 0, 2, 0], [0, 0, 0, 3]])
    np.testing.assert_array_equal(r.indices.numpy(), [2, 3])


# -- histc -------------------------------------------------------------------------------------------------
def test_histc_values():
    np.testing.assert_array_equal(hp.histc(hp.tensor([1.0, 2, 1, 4, 5]), bins=4).numpy(), [2, 1, 0, 2])
    np.testing.assert_array_equal(hp.tensor([1.0, 2, 1, 4, 5]).histc(4, 0, 3).numpy(), [0, 2, 1, 0])
    np.testing.assert_array_equal(hp.histc(hp.tensor([2.0, 2, 2]), bins=4).numpy(), [0, 0, 3, 0])
    np.testing.assert_array_equal(hp.histc(hp.tensor([[0.0, 1], [1, 1]]), bins=2).numpy(), [1, 3])
    np.testing.assert_array_equal(hp.histc(hp.tensor([1.0, NAN, 3]), bins=3, min=0, max=4).numpy(), [1, 0, 1])
    np.testing.assert_array_equal(hp.histc(hp.tensor([1.0, np.inf, 3]), bins=3, min=0, max=4).numpy(), [1, 0, 1])
    e = hp.histc(hp.zeros(0, dtype=hp.float64), bins=2)
    assert e.dtype == hp.float64 and e.tolist() == [0.0, 0.0]
    a = RNG.standard_normal(200)
    x = hp.tensor(a, requires_grad=True)
    h = hp.histc(x, bins=7, min=-1.5, max=2.0)
    assert h.dtype == hp.float64 and not h.requires_grad
    np.testing.assert_array_equal(h.numpy(), np.histogram(a, bins=7, range=(-1.5, 2.0))[0])
    assert hp.histc(hp.ones(3)).shape == (100,)


def test_histc_errors():
    with pytest.raises(NotImplementedError, match="histc"):
        hp.histc(hp.tensor([1, 2, 3]), bins=3)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        hp.histc(hp.tensor([1.0, 2, 3]), bins=3, min=3, max=1)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        hp.histc(hp.tensor([1.0, 2, 3]), bins=0)
    with pytest.raises(RuntimeError, match="is not finite"):
        hp.histc(hp.tensor([1.0, NAN, 3]), bins=3)
    with pytest.raises(RuntimeError, match="is not finite"):
        hp.histc(hp.tensor([1.0, np.inf, 3]), bins=3)


# -- cov / corrcoef ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_cov_matches_numpy(correction):
    a = RNG.standard_normal((3, 7))
    np.testing.assert_allclose(hp.cov(_t(a), correction=correction).numpy(), np.cov(a, ddof=correction),
                               rtol=1e-12)
    f = RNG.integers(1, 4, 7)
    w = RNG.random(7) + 0.1
    got = _t(a).cov(correction=correction, fweights=_t(f), aweights=_t(w)).numpy()
    np.testing.assert_allclose(got, np.cov(a, ddof=correction, fweights=f, aweights=w), rtol=1e-10)
    np.testing.assert_allclose(hp.cov(_t(a), aweights=_t(w)).numpy(), np.cov(a, aweights=w), rtol=1e-10)
    gradcheck(lambda x: hp.cov(x, correction=correction), [a.copy()])
    gradcheck(lambda x, ww: hp.cov(x, aweights=ww), [a.copy(), w.copy()])


def test_cov_shapes_dtypes_and_errors():
    v = hp.cov(hp.tensor([1, 2, 4]))
    assert v.ndim == 0 and v.dtype == hp.float32
    np.testing.assert_allclose(v.item(), np.var([1, 2, 4], ddof=1), rtol=1e-6)
    with pytest.warns(UserWarning, match="degrees of freedom is <= 0"):
        assert np.isnan(hp.cov(hp.tensor(3.0)).item())
    with pytest.warns(UserWarning, match="degrees of freedom"):
        assert np.isinf(hp.cov(hp.tensor([[0.0, 1.0]]), correction=2).item())
    x = hp.tensor([[0.0, 1, 2], [2, 1, 0]])
    with pytest.raises(RuntimeError, match="two or fewer dimensions"):
        hp.cov(hp.zeros(2, 2, 2))
    with pytest.raises(RuntimeError, match="fweights to have integral dtype"):
        hp.cov(x, fweights=hp.tensor([1.0, 2, 3]))
    with pytest.raises(RuntimeError, match="fweights to have integral dtype"):
        hp.cov(x, fweights=hp.tensor([True, True, False]))
    with pytest.raises(RuntimeError, match="fweights cannot be negative"):
        hp.cov(x, fweights=hp.tensor([1, -2, 3]))
    with pytest.raises(RuntimeError, match="aweights cannot be negative"):
        hp.cov(x, aweights=hp.tensor([1, -2, 3.0]))
    with pytest.raises(RuntimeError, match="aweights to have floating point dtype"):
        hp.cov(x, aweights=hp.tensor([1, 2, 3]))
    with pytest.raises(RuntimeError, match="same numel as there are observations"):
        hp.cov(x, aweights=hp.tensor([1.0, 2.0]))


def test_corrcoef():
    a = RNG.standard_normal((4, 9))
    np.testing.assert_allclose(hp.corrcoef(_t(a)).numpy(), np.corrcoef(a), rtol=1e-12)
    np.testing.assert_allclose(_t(a).corrcoef().numpy(), np.corrcoef(a), rtol=1e-12)
    assert hp.corrcoef(hp.tensor([1, 2, 4])).item() == 1.0
    with np.errstate(invalid="ignore"):
        c = hp.corrcoef(hp.tensor([[0.0, 1, 2], [2, 1, 0], [1, 1, 1]])).numpy()
    np.testing.assert_array_equal(c[:2, :2], [[1, -1], [-1, 1]])
    assert np.isnan(c[2]).all()
    gradcheck(lambda x: hp.corrcoef(x), [a[:3, :5].copy()])


# -- trapezoid ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_trapezoid_matches_numpy(dim):
    y = RNG.standard_normal((4, 5))
    n = y.shape[dim]
    x = np.cumsum(RNG.random(n) + 0.1)
    np.testing.assert_allclose(hp.trapezoid(_t(y), dim=dim).numpy(), np.trapezoid(y, axis=dim), rtol=1e-12)
    np.testing.assert_allclose(hp.trapezoid(_t(y), dx=0.5, dim=dim).numpy(), np.trapezoid(y, dx=0.5, axis=dim),
                               rtol=1e-12)
    np.testing.assert_allclose(hp.trapezoid(_t(y), _t(x), dim=dim).numpy(), np.trapezoid(y, x, axis=dim),
                               rtol=1e-12)
    np.testing.assert_allclose(hp.trapz(_t(y), _t(x), dim=dim).numpy(), np.trapezoid(y, x, axis=dim), rtol=1e-12)
    gradcheck(lambda yy, xx: hp.trapezoid(yy, xx, dim=dim), [y.copy(), x.copy()])
    gradcheck(lambda yy: hp.trapezoid(yy, dx=2.0, dim=dim), [y.copy()])


def _cumtrap_ref(y, x=None, dx=1.0, axis=-1):
    y = np.moveaxis(y, axis, -1)
    d = np.diff(x) if x is not None else dx
    out = np.cumsum(d * (y[..., 1:] + y[..., :-1]) / 2, axis=-1)
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("dim", [0, -1])
def test_cumulative_trapezoid(dim):
    y = RNG.standard_normal((4, 5))
    x = np.cumsum(RNG.random(y.shape[dim]) + 0.1)
    np.testing.assert_allclose(hp.cumulative_trapezoid(_t(y), dim=dim).numpy(), _cumtrap_ref(y, axis=dim),
                               rtol=1e-12)
    np.testing.assert_allclose(hp.cumulative_trapezoid(_t(y), dx=3.0, dim=dim).numpy(),
                               _cumtrap_ref(y, dx=3.0, axis=dim), rtol=1e-12)
    np.testing.assert_allclose(hp.cumulative_trapezoid(_t(y), _t(x), dim=dim).numpy(),
                               _cumtrap_ref(y, x, axis=dim), rtol=1e-12)
    gradcheck(lambda yy, xx: hp.cumulative_trapezoid(yy, xx, dim=dim), [y.copy(), x.copy()])


def test_trapezoid_edge_cases_and_errors():
    assert hp.trapezoid(hp.tensor([1, 5, 10])).item() == 10.5
    assert hp.trapezoid(hp.tensor([1, 5, 10]), dx=2.5).item() == 26.25
    assert hp.trapezoid(hp.tensor([1, 5, 10]), hp.tensor([1, 3, 6])).item() == 28.5
    np.testing.assert_allclose(hp.cumulative_trapezoid(hp.tensor([1, 5, 10])).numpy(), [3.0, 10.5])
    np.testing.assert_array_equal(hp.trapezoid(hp.ones(3, 3), hp.tensor([[1.0, 3, 6]])).numpy(), [5.0, 5.0, 5.0])
    np.testing.assert_array_equal(hp.trapezoid(hp.ones(3, 0)).numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(hp.trapezoid(hp.ones(3, 1)).numpy(), [0.0, 0.0, 0.0])
    assert hp.cumulative_trapezoid(hp.ones(3, 1)).shape == (3, 0)
    assert hp.cumulative_trapezoid(hp.ones(3, 0)).shape == (3, 0)
    with pytest.raises(RuntimeError, match="one `x` value for each sample point"):
        hp.trapezoid(hp.ones(3, 3), hp.tensor([1.0, 3]))
    with pytest.raises(IndexError, match="no dimensions"):
        hp.trapezoid(hp.tensor(1.0))
    with pytest.raises(TypeError):
        hp.trapezoid(hp.tensor([1.0, 5, 10]), 2)
    with pytest.raises(TypeError):
        hp.trapezoid(hp.tensor([1.0, 5, 10]), hp.tensor([1.0, 3, 6]), dx=1)
    assert not hasattr(hp.Tensor, "trapezoid")  # functions only, as PyTorch


def _nanquantile_ref(a, q, axis, method):
    """np.nanquantile in float64, PyTorch's interpolation names."""
    return np.nanquantile(a.astype(np.float64), q, axis=axis, method=method)


@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_nanquantile_skips_nans_against_numpy(interpolation):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((5, 7))
    a[0, [1, 4]] = np.nan
    a[3, :] = np.nan  # an all-NaN row: NaN
    a[4, 6] = np.nan
    q = np.array([0.0, 0.2, 0.5, 0.95, 1.0])
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        want = _nanquantile_ref(a, q, 1, interpolation)
    got = hp.nanquantile(hp.tensor(a), hp.tensor(q), dim=1, interpolation=interpolation)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, equal_nan=True)
    kept = hp.tensor(a).nanquantile(hp.tensor(q), dim=1, keepdim=True, interpolation=interpolation)
    assert tuple(kept.shape) == (5, 5, 1)
    flat = hp.nanquantile(hp.tensor(a), 0.3, interpolation=interpolation)
    np.testing.assert_allclose(flat.item(), np.nanquantile(a, 0.3, method=interpolation), rtol=1e-12)
    ok = a[[0, 1, 2, 4]]
    np.testing.assert_allclose(hp.nanquantile(hp.tensor(ok[1]), 0.4).item(), np.quantile(ok[1], 0.4), rtol=1e-12)
    gradcheck(lambda x: x.nanquantile(hp.tensor([0.3, 0.7], dtype=hp.float64), dim=1, interpolation=interpolation),
              [ok.copy()])


def test_quantile_and_nanquantile_errors_are_pytorch_s():
    with pytest.raises(RuntimeError, match=r"quantile\(\) input tensor must be either float or double dtype"):
        hp.nanquantile(hp.tensor([1, 2]), 0.5)
    with pytest.raises(RuntimeError, match=r"quantile\(\) q must be in the range \[0, 1\] but got 1.5"):
        hp.tensor([1.0, 2.0]).quantile(1.5)
    with pytest.raises(RuntimeError, match=r"quantile\(\) input tensor must be non-empty"):
        hp.nanquantile(hp.tensor([]), 0.5)
    with pytest.raises(RuntimeError, match="interpolation must be one of linear, lower, higher, midpoint or nearest"):
        hp.quantile(hp.tensor([1.0]), 0.5, interpolation="x")


def test_histogram_against_numpy():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(200)
    w = rng.uniform(0, 2, 200)
    for kw, np_kw in [({}, {"bins": 100}), ({"bins": 7}, {"bins": 7}),
                      ({"bins": 5, "range": (-1.0, 2.0)}, {"bins": 5, "range": (-1.0, 2.0)}),
                      ({"bins": 6, "density": True}, {"bins": 6, "density": True}),
                      ({"bins": 4, "weight": hp.tensor(w)}, {"bins": 4, "weights": w}),
                      ({"bins": hp.tensor([-3.0, -0.5, 0.0, 0.1, 4.0], dtype=hp.float64)}, {"bins": [-3.0, -0.5, 0.0, 0.1, 4.0]})]:
        r = hp.histogram(hp.tensor(x), **kw)
        hist, edges = np.histogram(x, **np_kw)
        assert isinstance(r, tuple) and type(r).__name__ == "histogram"
        np.testing.assert_allclose(r.hist.numpy(), hist, rtol=1e-12)
        np.testing.assert_allclose(r.bin_edges.numpy(), edges, rtol=1e-12)
        assert r.hist.dtype == r.bin_edges.dtype == hp.float64
    h = hp.tensor(x.astype(np.float32)).histogram(3)
    assert h.hist.dtype == hp.float32 and float(h.hist.sum()) == 200  # the last bin holds its right edge
    with pytest.raises(NotImplementedError, match="histogramdd"):
        hp.histogram(hp.tensor([1, 2]), bins=2)
    with pytest.raises(RuntimeError, match="non-decreasing"):
        hp.histogram(hp.tensor([1.0]), bins=hp.tensor([1.0, 0.0]))
    with pytest.raises(RuntimeError, match="same dtype, but got input with dtype double and bins .* float"):
        hp.histogram(hp.tensor(x), bins=hp.tensor([0.0, 1.0]))


def test_unique_consecutive_runs():
    x = hp.tensor([1, 1, 2, 2, 3, 1, 1, 2])
    vals, inv, cnt = hp.unique_consecutive(x, return_inverse=True, return_counts=True)
    assert vals.tolist() == [1, 2, 3, 1, 2] and inv.tolist() == [0, 0, 1, 1, 2, 3, 3, 4]
    assert cnt.tolist() == [2, 2, 1, 2, 1] and inv.dtype == cnt.dtype == hp.int64
    m = hp.tensor([[1, 1], [1, 1], [2, 3], [1, 1]])
    v, i, c = m.unique_consecutive(dim=0, return_inverse=True, return_counts=True)
    assert v.tolist() == [[1, 1], [2, 3], [1, 1]] and i.tolist() == [0, 0, 1, 2] and c.tolist() == [2, 1, 1]
    cols = m.unique_consecutive(dim=1)
    assert cols.tolist() == [[1, 1], [1, 1], [2, 3], [1, 1]]  # columns 0 and 1 differ in row 2
    grid = hp.tensor([[1, 1, 2], [3, 3, 3]])
    g, gi = grid.unique_consecutive(return_inverse=True)  # flattened, the inverse in the input's shape
    assert g.tolist() == [1, 2, 3] and gi.tolist() == [[0, 0, 1], [2, 2, 2]]
    nan = hp.unique_consecutive(hp.tensor([float("nan"), float("nan"), 1.0]))
    assert np.isnan(nan.numpy()[:2]).all() and nan.numpy()[2] == 1.0 and nan.shape == (3,)  # NaN equals nothing
    assert hp.unique_consecutive(hp.tensor([], dtype=hp.int64)).shape == (0,)
