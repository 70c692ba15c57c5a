"""hpcfsdp._ops_more, hpcfsdp._dtype_info, hpcfsdp.linalg's solvers and the Tensor methods behind them: values
against NumPy in float64, PyTorch's result dtypes, finite-difference gradients (autograd/ops/) and errors."""
import math

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import gradcheck, rand


@pytest.fixture
def rng():
    return np.random.default_rng(97)


def _np(t):
    return t.detach().cpu().numpy()


# -- constants, finfo, iinfo -------------------------------------------------------------------------------
def test_constants():
    assert hp.inf == math.inf and math.isnan(hp.nan) and hp.pi == math.pi and hp.e == math.e
    assert hp.newaxis is None and hp.ones(2, 3)[:, hp.newaxis].shape == (2, 1, 3)


@pytest.mark.parametrize("dt,bits,eps,res", [(hp.float32, 32, 2.0 ** -23, 1e-6), (hp.float64, 64, 2.0 ** -52, 1e-15),
                                             (hp.float16, 16, 2.0 ** -10, 1e-3), (hp.bfloat16, 16, 2.0 ** -7, 0.01)])
def test_finfo(dt, bits, eps, res):
    f = hp.finfo(dt)
    ref = ml_dtypes.finfo(dt) if dt == hp.bfloat16 else np.finfo(dt)
    assert (f.bits, f.eps, f.resolution) == (bits, eps, res)
    assert f.max == float(ref.max) and f.min == -f.max and f.tiny == f.smallest_normal == float(ref.smallest_normal)
    assert f.dtype == ("bfloat16" if dt == hp.bfloat16 else str(dt)) and "finfo(" in repr(f)
    x = hp.zeros(2, dtype=dt).masked_fill(hp.tensor([True, False]), f.min)  # an attention mask's fill value
    assert x.dtype == dt and float(x[0]) == f.min


def test_finfo_default_and_iinfo():
    assert hp.finfo() == hp.finfo(hp.float32) and hp.finfo("float16").bits == 16
    for dt in (hp.int8, hp.int16, hp.int32, hp.int64, hp.uint8):
        i = hp.iinfo(dt)
        assert (i.min, i.max, i.bits, i.dtype) == (np.iinfo(dt).min, np.iinfo(dt).max, np.iinfo(dt).bits, str(dt))
    with pytest.raises(TypeError, match="requires a floating point"):
        hp.finfo(hp.int32)
    with pytest.raises(TypeError, match="requires an integer"):
        hp.iinfo(hp.float32)
    with pytest.raises(TypeError, match="requires an integer"):
        hp.iinfo(hp.bool)


# -- shape ops ---------------------------------------------------------------------------------------------
def test_roll_flip_values_and_grad(rng):
    a = rand(rng, 3, 4, layout="t")
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.roll(x, 1)), np.roll(a, 1))
    np.testing.assert_array_equal(_np(hp.roll(x, (1, -2), (0, 1))), np.roll(a, (1, -2), (0, 1)))
    np.testing.assert_array_equal(_np(x.roll(-1, 1)), np.roll(a, -1, 1))
    np.testing.assert_array_equal(_np(hp.flip(x, [0, 1])), a[::-1, ::-1])
    np.testing.assert_array_equal(_np(x.flip(1)), a[:, ::-1])
    np.testing.assert_array_equal(_np(hp.fliplr(x)), np.fliplr(a))
    np.testing.assert_array_equal(_np(hp.flipud(x)), np.flipud(a))
    gradcheck(lambda t: hp.roll(t, (1, 2), (0, 1)) * t, [a])
    gradcheck(lambda t: hp.roll(t, 5) * t, [a])
    gradcheck(lambda t: hp.flip(t, (0,)) * t, [a])
    f = hp.flip(x, [0])
    f[0, 0] = 100.0  # a copy, as PyTorch's
    assert x[2, 0].item() == a[2, 0]
    with pytest.raises(RuntimeError, match="shifts and dimensions must align"):
        hp.roll(x, (1, 2), 0)
    with pytest.raises(RuntimeError, match=">= 2-d"):
        hp.fliplr(hp.ones(3))
    with pytest.raises(RuntimeError, match="repeated dim"):
        hp.flip(x, (0, -2))


def test_repeat_tile_repeat_interleave(rng):
    a = rng.standard_normal((2, 3))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(x.repeat(2, 1, 2)), np.tile(a, (2, 1, 2)))
    np.testing.assert_array_equal(_np(hp.tile(x, (2,))), np.tile(a, (1, 2)))
    np.testing.assert_array_equal(_np(hp.repeat_interleave(x, 2)), np.repeat(a.ravel(), 2))
    np.testing.assert_array_equal(_np(hp.repeat_interleave(x, hp.tensor([1, 0, 3]), dim=1)),
                                  np.repeat(a, [1, 0, 3], axis=1))
    np.testing.assert_array_equal(_np(x.repeat_interleave(2, dim=0)), np.repeat(a, 2, axis=0))
    r = hp.repeat_interleave(hp.tensor([2, 0, 1]))
    assert r.dtype == hp.int64 and r.tolist() == [0, 0, 2]
    gradcheck(lambda t: t.repeat(2, 1, 3), [a])
    gradcheck(lambda t: hp.tile(t, (3, 1)), [a])
    gradcheck(lambda t: hp.repeat_interleave(t, hp.tensor([2, 1, 3]), dim=1), [a])
    with pytest.raises(RuntimeError, match="can not be smaller"):
        x.repeat(2)
    with pytest.raises(RuntimeError, match="same size as input along dim"):
        hp.repeat_interleave(x, hp.tensor([1, 2]), dim=1)
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        hp.repeat_interleave(x, -1)


def test_diag_diagonal_trace(rng):
    a = rng.standard_normal((3, 4))
    v = rng.standard_normal(3)
    x = hp.tensor(a)
    for k in (-1, 0, 2, 5):
        np.testing.assert_array_equal(_np(hp.diag(x, k)), np.diag(a, k))
        np.testing.assert_array_equal(_np(hp.diag(hp.tensor(v), k)), np.diag(v, k))
        gradcheck(lambda t, k=k: hp.diag(t, k), [a])
        gradcheck(lambda t, k=k: hp.diag(t, k), [v])
    b = rng.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(_np(hp.diagonal(hp.tensor(b), 1, 0, 2)), np.diagonal(b, 1, 0, 2))
    np.testing.assert_array_equal(_np(hp.tensor(b).diagonal(0, -1, -2)), np.diagonal(b, 0, 2, 1))
    gradcheck(lambda t: t.diagonal(-1, 2, 1), [b])
    np.testing.assert_allclose(_np(hp.trace(x)), np.trace(a))
    gradcheck(hp.trace, [a])
    t = hp.trace(hp.arange(6, dtype=hp.int32).reshape(2, 3))
    assert t.dtype == hp.int64 and t.item() == 4
    with pytest.raises(RuntimeError, match="Supports 1D or 2D"):
        hp.diag(hp.ones(2, 2, 2))
    with pytest.raises(RuntimeError, match="expected a matrix"):
        hp.trace(hp.ones(2))
    with pytest.raises(RuntimeError, match="cannot be identical"):
        hp.diagonal(x, 0, 1, -1)


def test_tril_triu_indices():
    for args in ((3, 3), (3, 4, 1), (4, 3, -1), (2, 5, -3)):
        r, c, *k = args
        for kind in ("tril", "triu"):
            got = getattr(hp, f"{kind}_indices")(*args)
            assert got.dtype == hp.int64
            np.testing.assert_array_equal(_np(got), np.stack(getattr(np, f"{kind}_indices")(r, k[0] if k else 0, c)))
    assert hp.tril_indices(3, 3, dtype=hp.int32).dtype == hp.int32


def test_meshgrid_broadcast_atleast(rng):
    a, b = rng.standard_normal(2), rng.standard_normal(3)
    for indexing in ("ij", "xy"):
        got = hp.meshgrid(hp.tensor(a), hp.tensor(b), indexing=indexing)
        ref = np.meshgrid(a, b, indexing=indexing)
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(_np(g), r)
    gradcheck(lambda s, t: [g * g for g in hp.meshgrid([s, t], indexing="xy")], [a, b])
    assert [g.shape for g in hp.meshgrid(hp.ones(2), hp.ones(3), hp.ones(4))] == [(2, 3, 4)] * 3
    x, y = hp.broadcast_tensors(hp.ones(2, 1), hp.ones(3))
    assert x.shape == y.shape == (2, 3) and hp.broadcast_shapes((2, 1), (3,), 1) == (2, 3)
    assert hp.broadcast_to(hp.ones(3), (2, 3)).shape == (2, 3)
    gradcheck(lambda s, t: [u * 2 for u in hp.broadcast_tensors(s, t)], [a[:, None], b])
    assert hp.atleast_1d(hp.tensor(1.0)).shape == (1,) and hp.atleast_2d(hp.tensor(1.0)).shape == (1, 1)
    assert hp.atleast_2d(hp.ones(3)).shape == (1, 3) and hp.atleast_3d(hp.ones(2, 3)).shape == (2, 3, 1)
    assert hp.atleast_3d(hp.ones(2)).shape == (1, 2, 1) and hp.atleast_3d(hp.ones(1, 2, 3, 4)).shape == (1, 2, 3, 4)
    pair = hp.atleast_1d(hp.tensor(1.0), hp.tensor(2.0))
    assert isinstance(pair, tuple) and [p.shape for p in pair] == [(1,), (1,)]
    with pytest.raises(RuntimeError, match="Expected 0D or 1D"):
        hp.meshgrid(hp.ones(2, 2))
    with pytest.raises(ValueError, match="indexing must be"):
        hp.meshgrid(hp.ones(2), indexing="ji")
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        hp.broadcast_tensors(hp.ones(2), hp.ones(3))


def test_movedim(rng):
    a = rng.standard_normal((2, 3, 4))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.movedim(x, 0, -1)), np.moveaxis(a, 0, -1))
    np.testing.assert_array_equal(_np(x.moveaxis((0, 1), (2, 0))), np.moveaxis(a, (0, 1), (2, 0)))


# -- index results -----------------------------------------------------------------------------------------
def test_nonzero_argwhere():
    a = np.array([[0, 1, 0], [2, 0, 3]])
    x = hp.tensor(a)
    n = hp.nonzero(x)
    assert n.dtype == hp.int64 and n.tolist() == np.argwhere(a).tolist()
    assert hp.argwhere(x).tolist() == n.tolist()
    t = hp.nonzero(x, as_tuple=True)
    assert len(t) == 2 and [i.tolist() for i in t] == [i.tolist() for i in np.nonzero(a)]
    assert hp.nonzero(hp.tensor(5)).shape == (1, 0) and hp.nonzero(hp.tensor(0)).shape == (0, 0)
    assert [i.tolist() for i in hp.nonzero(hp.tensor(5), as_tuple=True)] == [[0]]
    assert hp.nonzero(hp.tensor([0.0, 0.5])).tolist() == [[1]]


def test_unique():
    x = hp.tensor([3, 1, 2, 1, 3])
    u, inv, cnt = hp.unique(x, return_inverse=True, return_counts=True)
    assert u.tolist() == [1, 2, 3] and inv.tolist() == [2, 0, 1, 0, 2] and cnt.tolist() == [2, 1, 2]
    assert inv.dtype == cnt.dtype == hp.int64 and u.dtype == hp.int64
    assert hp.unique(x, sorted=False).tolist() == [1, 2, 3]
    m = hp.tensor([[1, 2], [1, 2], [0, 5]])
    u, inv, cnt = m.unique(dim=0, return_inverse=True, return_counts=True)
    assert u.tolist() == [[0, 5], [1, 2]] and inv.tolist() == [1, 1, 0] and cnt.tolist() == [1, 2]
    u, inv = hp.unique(hp.tensor([[2.0, 1.0], [1.0, 2.0]]), return_inverse=True)
    assert u.tolist() == [1.0, 2.0] and inv.shape == (2, 2) and inv.tolist() == [[1, 0], [0, 1]]


def test_bincount():
    r = hp.bincount(hp.tensor([0, 1, 1, 3]))
    assert r.dtype == hp.int64 and r.tolist() == [1, 2, 0, 1]
    assert hp.bincount(hp.tensor([1]), minlength=3).tolist() == [0, 1, 0]
    w = hp.bincount(hp.tensor([0, 1, 1]), weights=hp.tensor([1.0, 2.0, 3.0]))
    assert w.dtype == hp.float32 and w.tolist() == [1.0, 5.0]
    assert hp.bincount(hp.tensor([0, 1]), weights=hp.tensor([1, 2])).dtype == hp.float64
    assert hp.bincount(hp.tensor([0, 1]), weights=hp.tensor([1.0, 2.0], dtype=hp.float16)).dtype == hp.float64
    assert hp.bincount(hp.tensor([], dtype=hp.int64)).tolist() == []
    for bad in ([-1], [[1]]):
        with pytest.raises(RuntimeError, match="1-d non-negative integral"):
            hp.bincount(hp.tensor(bad))
    with pytest.raises(NotImplementedError):
        hp.bincount(hp.tensor([1.0]))
    with pytest.raises(RuntimeError, match="same length"):
        hp.bincount(hp.tensor([0, 1]), weights=hp.tensor([1.0]))


def test_searchsorted_bucketize(rng):
    s = np.array([1, 3, 5, 7])
    v = np.array([[3, 6], [9, 0]])
    for right in (False, True):
        got = hp.searchsorted(hp.tensor(s), hp.tensor(v), right=right)
        assert got.dtype == hp.int64
        np.testing.assert_array_equal(_np(got), np.searchsorted(s, v, side="right" if right else "left"))
        np.testing.assert_array_equal(_np(hp.bucketize(hp.tensor(v), hp.tensor(s), right=right)), _np(got))
    assert hp.searchsorted(hp.tensor(s), 3, side="right").item() == 2
    assert hp.searchsorted(hp.tensor(s), hp.tensor([3]), out_int32=True).dtype == hp.int32
    s2 = np.sort(rng.standard_normal((3, 5)), axis=1)
    v2 = rng.standard_normal((3, 4))
    got = hp.searchsorted(hp.tensor(s2), hp.tensor(v2))
    np.testing.assert_array_equal(_np(got), [np.searchsorted(s2[i], v2[i]) for i in range(3)])
    perm = np.array([2, 0, 3, 1])
    assert hp.searchsorted(hp.tensor(s[perm]), hp.tensor([4]), sorter=hp.tensor(np.argsort(perm))).tolist() == [2]
    with pytest.raises(RuntimeError, match="can't be set to opposites"):
        hp.searchsorted(hp.tensor(s), hp.tensor([1]), right=True, side="left")
    with pytest.raises(RuntimeError, match="first N-1 dimensions"):
        hp.searchsorted(hp.tensor(s2), hp.tensor([1.0]))
    with pytest.raises(RuntimeError, match="must be 1 dimension"):
        hp.bucketize(hp.tensor([1]), hp.tensor(s2))


def test_masked_select_take(rng):
    a = rng.standard_normal((2, 3))
    m = np.array([True, False, True])
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.masked_select(x, hp.tensor(m))), a[np.broadcast_to(m, a.shape)])
    gradcheck(lambda t: hp.masked_select(t, hp.tensor(m)), [a])
    gradcheck(lambda t: hp.masked_select(t, hp.tensor(a > 0)) ** 2, [a])
    idx = np.array([[0, 5], [-1, 2]])
    np.testing.assert_array_equal(_np(hp.take(x, hp.tensor(idx))), np.take(a, idx))
    gradcheck(lambda t: hp.take(t, hp.tensor([[0, 5], [5, 2]])), [a])
    with pytest.raises(RuntimeError, match="BoolTensor"):
        hp.masked_select(x, hp.tensor([1, 0, 1]))
    with pytest.raises(IndexError, match="out of range"):
        hp.take(x, hp.tensor([6]))


# -- element-wise ------------------------------------------------------------------------------------------
UNARY = {"log1p": np.log1p, "expm1": np.expm1, "log2": np.log2, "log10": np.log10, "sinh": np.sinh, "cosh": np.cosh,
         "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "reciprocal": np.reciprocal,
         "arcsin": np.arcsin, "arccos": np.arccos, "arctan": np.arctan}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_values_grad_and_dtype(rng, name):
    a = rng.uniform(0.1, 0.9, (3, 4)) * (1 if name in ("log2", "log10", "log1p", "reciprocal") else
                                         np.sign(rng.standard_normal((3, 4))))
    np.testing.assert_allclose(_np(getattr(hp, name)(hp.tensor(a))), UNARY[name](a), rtol=1e-12)
    np.testing.assert_allclose(_np(getattr(hp.tensor(a), name)()), UNARY[name](a), rtol=1e-12)
    gradcheck(lambda x: getattr(hp, name)(x), [a.T], atol=1e-5)
    i = getattr(hp, name)(hp.tensor([1, 2], dtype=hp.int32))
    assert i.dtype == hp.float32
    h = getattr(hp, name)(hp.tensor(a, dtype=hp.bfloat16))
    assert h.dtype == hp.bfloat16


@pytest.mark.parametrize("name,ref", [("atan2", np.arctan2), ("hypot", np.hypot)])
def test_binary_values_and_grad(rng, name, ref):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    np.testing.assert_allclose(_np(getattr(hp, name)(hp.tensor(a), hp.tensor(b))), ref(a, b), rtol=1e-12)
    gradcheck(lambda x, y: getattr(hp, name)(x, y), [a, b])
    assert getattr(hp, name)(hp.tensor([1]), hp.tensor([1])).dtype == hp.float32
    np.testing.assert_allclose(_np(getattr(hp.tensor(a), name)(2.0)), ref(a, 2.0))


def test_remainder_fmod_floor_divide(rng):
    a, b = rng.standard_normal((3, 4)) * 5, rng.uniform(0.5, 2, (4,)) * np.sign(rng.standard_normal(4))
    x, y = hp.tensor(a), hp.tensor(b)
    np.testing.assert_allclose(_np(hp.remainder(x, y)), np.remainder(a, b), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.fmod(x, y)), np.fmod(a, b), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.floor_divide(x, y)), np.floor_divide(a, b))
    gradcheck(lambda s, t: hp.remainder(s, t), [a, b])
    gradcheck(lambda s, t: hp.fmod(s, t), [a, b])
    gradcheck(lambda s: hp.remainder(s, 1.5) + hp.floor_divide(s, 0.7) * s, [a])
    i = hp.tensor([-3, 3])
    assert hp.remainder(i, 2).tolist() == [1, 1] and hp.fmod(i, 2).tolist() == [-1, 1]
    assert hp.floor_divide(i, 2).tolist() == [-2, 1] and hp.floor_divide(i, 2).dtype == hp.int64
    assert hp.remainder(-3, hp.tensor([2])).tolist() == [1] and hp.fmod(-3.0, hp.tensor([2.0])).tolist() == [-1.0]
    assert hp.remainder(hp.tensor([1.0]), 0).isnan().all()
    for f in (hp.remainder, hp.fmod, hp.floor_divide):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            f(i, 0)


def test_reciprocal_trunc_frac_clamp(rng):
    a = rng.standard_normal((3, 4)) * 3
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.trunc(x)), np.trunc(a))
    np.testing.assert_array_equal(_np(hp.fix(x)), np.trunc(a))
    np.testing.assert_allclose(_np(hp.frac(x)), a - np.trunc(a))
    gradcheck(lambda t: hp.frac(t) + hp.trunc(t) * t, [a])
    assert hp.reciprocal(hp.tensor([2])).tolist() == [0.5] and hp.trunc(hp.tensor([3])).dtype == hp.int64
    np.testing.assert_array_equal(_np(hp.clamp_min(x, 0.5)), np.maximum(a, 0.5))
    np.testing.assert_array_equal(_np(x.clamp_max(0.5)), np.minimum(a, 0.5))
    gradcheck(lambda t: hp.clamp_min(t, 0.5) + hp.clamp_max(t, -0.5), [a])
    assert hp.clamp_min(hp.tensor([1, 5]), 3).tolist() == [3, 5]
    with pytest.raises(RuntimeError, match="frac"):
        hp.frac(hp.tensor([1]))


def test_isclose():
    a = hp.tensor([1.0, math.nan, 1.0, math.inf])
    b = hp.tensor([1.0 + 1e-9, math.nan, 1.1, math.inf])
    assert hp.isclose(a, b).tolist() == [True, False, False, True]
    assert hp.isclose(a, b, equal_nan=True).tolist() == [True, True, False, True]
    assert a.isclose(b, rtol=0.2).dtype == hp.bool and a.isclose(b, rtol=0.2).tolist()[2] is True
    assert hp.isclose(hp.tensor([1, 2]), hp.tensor([1, 3])).tolist() == [True, False]
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.isclose(hp.tensor([1.0]), hp.tensor([1]))


# -- fused multiply-adds -------------------------------------------------------------------------------------
def test_lerp_addmm_baddbmm_addcmul_addcdiv(rng):
    s, e, w = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.random((3,))
    np.testing.assert_allclose(_np(hp.lerp(hp.tensor(s), hp.tensor(e), 0.3)), s + 0.3 * (e - s))
    gradcheck(lambda a, b, c: hp.lerp(a, b, c), [s, e, w])
    gradcheck(lambda a, b: a.lerp(b, 0.7), [s, e])
    i, m1, m2 = rng.standard_normal((3,)), rng.standard_normal((2, 4)), rng.standard_normal((4, 3))
    np.testing.assert_allclose(_np(hp.addmm(hp.tensor(i), hp.tensor(m1), hp.tensor(m2), beta=0.5, alpha=2)),
                               0.5 * i + 2 * m1 @ m2, rtol=1e-12)
    gradcheck(lambda a, b, c: hp.addmm(a, b, c, beta=0.5, alpha=-2), [i, m1, m2])
    g = gradcheck(lambda a, b, c: hp.addmm(a, b, c, beta=0), [i, m1, m2])
    assert not g[0].any()
    nan_in = hp.addmm(hp.full((3,), math.nan, dtype=hp.float64), hp.tensor(m1), hp.tensor(m2), beta=0)
    assert not nan_in.isnan().any()
    bi, b1, b2 = rng.standard_normal((2, 1, 3)), rng.standard_normal((2, 2, 4)), rng.standard_normal((2, 4, 3))
    np.testing.assert_allclose(_np(hp.baddbmm(hp.tensor(bi), hp.tensor(b1), hp.tensor(b2), alpha=3)),
                               bi + 3 * b1 @ b2, rtol=1e-12)
    gradcheck(lambda a, b, c: hp.baddbmm(a, b, c, beta=2), [bi, b1, b2])
    t1, t2 = rng.standard_normal((2, 3)), rng.uniform(1, 2, (3,))
    np.testing.assert_allclose(_np(hp.addcmul(hp.tensor(s), hp.tensor(t1), hp.tensor(t2), value=0.5)),
                               s + 0.5 * t1 * t2)
    np.testing.assert_allclose(_np(hp.addcdiv(hp.tensor(s), hp.tensor(t1), hp.tensor(t2), value=-2)),
                               s - 2 * t1 / t2)
    gradcheck(lambda a, b, c: hp.addcmul(a, b, c, value=0.5) + hp.addcdiv(a, b, c, value=3), [s, t1, t2])
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.lerp(hp.ones(2), hp.ones(2, dtype=hp.float64), 0.5)
    with pytest.raises(RuntimeError, match="must be matrices"):
        hp.addmm(hp.ones(2), hp.ones(2), hp.ones(2, 2))
    with pytest.raises(RuntimeError, match="Integer division"):
        hp.addcdiv(hp.ones(2), hp.tensor([1, 2]), hp.tensor([1, 2]))


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
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.quantile(hp.tensor([1, 2]), 0.5)
    with pytest.raises(ValueError, match="interpolation"):
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


def test_cdist(rng):
    x1, x2 = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3))
    ref = np.sqrt(((x1[:, :, None] - x2[:, None]) ** 2).sum(-1))
    np.testing.assert_allclose(_np(hp.cdist(hp.tensor(x1), hp.tensor(x2))), ref, rtol=1e-12)
    np.testing.assert_allclose(_np(hp.cdist(hp.tensor(x1[0]), hp.tensor(x2[0]), p=1)),
                               np.abs(x1[0][:, None] - x2[0][None]).sum(-1), rtol=1e-12)
    gradcheck(hp.cdist, [x1, x2])
    same = hp.tensor(x1[0], requires_grad=True)
    hp.cdist(same, same.detach()).sum().backward()  # zero distances on the diagonal: a finite gradient
    assert same.grad.isfinite().all()
    with pytest.raises(RuntimeError, match="same number of columns"):
        hp.cdist(hp.ones(2, 3), hp.ones(2, 4))
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.cdist(hp.ones(2, 3, dtype=hp.int64), hp.ones(2, 3, dtype=hp.int64))


# -- sampling ----------------------------------------------------------------------------------------------------
def test_normal_overloads():
    hp.manual_seed(0)
    s = hp.normal(2.0, 3.0, size=(20000,))
    assert s.dtype == hp.float32 and abs(s.mean().item() - 2.0) < 0.1 and abs(s.std().item() - 3.0) < 0.1
    assert hp.normal(0.0, 1.0, (2, 3), dtype=hp.float64).dtype == hp.float64
    mean = hp.tensor([0.0, 100.0], dtype=hp.float64, requires_grad=True)
    std = hp.tensor([1.0, 0.0], dtype=hp.float64, requires_grad=True)
    r = hp.normal(mean, std)
    assert r.dtype == hp.float64 and r[1].item() == 100.0
    r.sum().backward()  # PyTorch's gradients for mean and std are zero
    assert mean.grad.tolist() == [0.0, 0.0] and std.grad.tolist() == [0.0, 0.0]
    assert hp.normal(hp.zeros(3, 1), 2.0).shape == (3, 1) and hp.normal(1.0, hp.ones(2, 2)).shape == (2, 2)
    g1, g2 = hp.Generator().manual_seed(5), hp.Generator().manual_seed(5)
    assert hp.normal(hp.zeros(4), 1.0, generator=g1).tolist() == hp.normal(hp.zeros(4), 1.0, generator=g2).tolist()
    with pytest.raises(TypeError, match="size"):
        hp.normal(0.0, 1.0)
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        hp.normal(hp.zeros(2), hp.tensor([1.0, -1.0]))


def test_bernoulli():
    hp.manual_seed(0)
    p = hp.tensor([0.0, 1.0, 0.3]).repeat(4000, 1)
    s = hp.bernoulli(p)
    assert s.dtype == hp.float32 and set(np.unique(_np(s))) <= {0.0, 1.0}
    m = s.mean(0).tolist()
    assert m[0] == 0.0 and m[1] == 1.0 and abs(m[2] - 0.3) < 0.03
    assert abs(hp.ones(10000, dtype=hp.float64).bernoulli(0.25).mean().item() - 0.25) < 0.02
    with pytest.raises(RuntimeError, match="p_in >= 0"):
        hp.bernoulli(hp.tensor([1.5]))


# -- linalg --------------------------------------------------------------------------------------------------------
def _spd(rng, *shape):
    b = rng.standard_normal(shape)
    return b @ np.swapaxes(b, -1, -2) + shape[-1] * np.eye(shape[-1])


def test_det_inv_solve_values_and_grad(rng):
    a = rng.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    b = rng.standard_normal((2, 3, 2))
    A = hp.tensor(a)
    np.testing.assert_allclose(_np(hp.linalg.det(A)), np.linalg.det(a), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.inv(A)), np.linalg.inv(a), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.solve(A, hp.tensor(b))), np.linalg.solve(a, b), rtol=1e-10)
    v = rng.standard_normal((2, 3))
    np.testing.assert_allclose(_np(hp.linalg.solve(A, hp.tensor(v))), np.linalg.solve(a, v[..., None])[..., 0])
    np.testing.assert_allclose(_np(hp.linalg.solve(A, hp.tensor(b.swapaxes(1, 2)), left=False)),
                               np.linalg.solve(a.swapaxes(1, 2), b).swapaxes(1, 2), rtol=1e-10)
    gradcheck(hp.linalg.det, [a])
    gradcheck(hp.linalg.inv, [a])
    gradcheck(hp.linalg.solve, [a, b])
    gradcheck(hp.linalg.solve, [a[0], b])  # A broadcast over B's batch
    gradcheck(hp.linalg.solve, [a, v])


def test_cholesky(rng):
    s = _spd(rng, 2, 3, 3)
    np.testing.assert_allclose(_np(hp.linalg.cholesky(hp.tensor(s))), np.linalg.cholesky(s), rtol=1e-12)
    u = hp.linalg.cholesky(hp.tensor(s), upper=True)
    np.testing.assert_allclose(_np(u), np.linalg.cholesky(s).swapaxes(1, 2), rtol=1e-12)
    sym = lambda b: b @ b.mT + 3 * hp.eye(3, dtype=hp.float64)  # noqa: E731
    b = rng.standard_normal((2, 3, 3))
    gradcheck(lambda t: hp.linalg.cholesky(sym(t)), [b])
    gradcheck(lambda t: hp.linalg.cholesky(sym(t), upper=True), [b])
    with pytest.raises(hp.linalg.LinAlgError, match="positive-definite"):
        hp.linalg.cholesky(-hp.eye(3))


def test_factorizations_forward_only(rng):
    a = rng.standard_normal((4, 3))
    A = hp.tensor(a)
    q, r = hp.linalg.qr(A)
    np.testing.assert_allclose(_np(q @ r), a, atol=1e-12)
    assert q.shape == (4, 3) and hp.linalg.qr(A, mode="complete")[0].shape == (4, 4)
    u, s, vh = hp.linalg.svd(A)
    assert u.shape == (4, 4) and vh.shape == (3, 3)
    u, s, vh = hp.linalg.svd(A, full_matrices=False)
    np.testing.assert_allclose(_np((u * s) @ vh), a, atol=1e-12)
    sp = _spd(rng, 3, 3)
    w, v = hp.linalg.eigh(hp.tensor(sp))
    np.testing.assert_allclose(_np(v @ hp.diag(w) @ v.mT), sp, atol=1e-10)
    assert hp.linalg.matrix_rank(hp.ones(3, 3)).item() == 1 and hp.linalg.matrix_rank(A).dtype == hp.int64
    assert hp.linalg.matrix_rank(hp.tensor(sp), hermitian=True).item() == 3
    np.testing.assert_allclose(_np(hp.linalg.pinv(A)), np.linalg.pinv(a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.pinv(hp.ones(2, 3))), np.linalg.pinv(np.ones((2, 3))), atol=1e-7)
    x = hp.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not implement the derivative of linalg.svd"):
        hp.linalg.svd(x)[1].sum().backward()


def test_linalg_errors():
    with pytest.raises(RuntimeError, match="square matrices"):
        hp.linalg.inv(hp.ones(2, 3))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        hp.linalg.det(hp.ones(3))
    with pytest.raises(RuntimeError, match="Low precision"):
        hp.linalg.inv(hp.eye(2, dtype=hp.float16))
    with pytest.raises(RuntimeError, match="floating point"):
        hp.linalg.inv(hp.eye(2, dtype=hp.int64))
    with pytest.raises(hp.linalg.LinAlgError):
        hp.linalg.inv(hp.zeros(2, 2))
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        hp.linalg.solve(hp.eye(2), hp.ones(3, 1))
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.linalg.solve(hp.eye(2), hp.ones(2, dtype=hp.float64))


def test_top_level_functions_need_a_tensor():
    for f in (hp.roll, hp.nonzero, hp.median, hp.lerp):
        with pytest.raises(TypeError, match="must be Tensor"):
            f([1.0, 2.0], 1)
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.remainder(1, 2)


# -- the same ops on every array backend (the simulated CUDA device under HPCFSDP_CUDA_SIM=1) ------------------
DEVICE_CASES = {
    "shape": lambda x: hp.roll(x, 1, 0) * hp.flip(x, [1]) + hp.tile(x, (1, 1)) + x.repeat_interleave(1, 0),
    "diag": lambda x: hp.diagonal(x, 1).sum() + hp.trace(x[:, :3]) + hp.diag(x[0]).sum(),
    "unary": lambda x: hp.log1p(x.abs()) + hp.expm1(x) + hp.atan2(x, x + 3) + hp.sinh(x) + hp.remainder(x, 0.7),
    "scans": lambda x: hp.cumprod(x, 1) + hp.cummax(x, 0).values + hp.median(x, 1, keepdim=True).values,
    "quantile": lambda x: hp.quantile(x, hp.tensor([0.2, 0.9], device=x.device), dim=1) + hp.nansum(x),
    "fma": lambda x: hp.addmm(x[:, :3], x, x.mT[:, :3]) + hp.lerp(x[:, :3], x[:, 1:], 0.3),
    "linalg": lambda x: hp.linalg.inv(x[:, :3] + 4 * hp.eye(3, device=x.device)) + hp.linalg.det(x[:, 1:] + 4 * hp.eye(
        3, device=x.device)),
    "cdist": lambda x: hp.cdist(x, x * 2),
}


@pytest.mark.parametrize("case", sorted(DEVICE_CASES))
def test_ops_on_device_match_cpu(device, case):
    a = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    fn = DEVICE_CASES[case]
    res = []
    for dev in ("cpu", device):
        x = hp.tensor(a, device=dev, requires_grad=True)
        out = fn(x)
        out.sum().backward()
        assert out.device.type == x.grad.device.type == dev
        res.append((_np(out), _np(x.grad)))
    np.testing.assert_allclose(res[1][0], res[0][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res[1][1], res[0][1], rtol=1e-4, atol=1e-5)


def test_index_results_on_device(device):
    x = hp.tensor([[0, 3, 1], [3, 0, 2]], device=device)
    assert hp.nonzero(x).device.type == device and hp.nonzero(x).cpu().tolist() == [[0, 1], [0, 2], [1, 0], [1, 2]]
    u, c = hp.unique(x, return_counts=True)
    assert u.cpu().tolist() == [0, 1, 2, 3] and c.cpu().tolist() == [2, 1, 1, 2]
    assert hp.bincount(x.flatten()).cpu().tolist() == [2, 1, 1, 2]
    s = hp.tensor([1.0, 3.0, 5.0], device=device)
    assert hp.searchsorted(s, hp.tensor([2.0, 5.0], device=device)).cpu().tolist() == [1, 2]
    assert hp.tril_indices(2, 2, device=device).device.type == device
    hp.manual_seed(0)
    assert hp.normal(hp.zeros(3, device=device), 1.0).device.type == device
    assert hp.bernoulli(hp.full((3,), 0.5, device=device)).device.type == device
