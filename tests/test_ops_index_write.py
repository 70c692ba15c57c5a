"""Indexed writes: index_fill, index_copy, index_put, put, masked_scatter, scatter_reduce and index_reduce (and their
in-place forms) against float64 loops, finite differences and PyTorch's errors."""
import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _np, gradcheck

L = lambda v: hp.tensor(v, dtype=hp.int64)  # noqa: E731


def test_index_fill(rng):
    a = rng.standard_normal((3, 4))
    ref = a.copy()
    ref[:, [0, 3]] = 5.0
    np.testing.assert_array_equal(_np(hp.tensor(a).index_fill(1, L([0, -1]), 5)), ref)  # -1: the last entry
    last = a.copy()
    last[:, 3] = 5.0
    np.testing.assert_array_equal(_np(hp.index_fill(hp.tensor(a), 1, L(3), 5.0)), last)  # a 0-d index
    assert hp.tensor([-1, 2]).index_fill(0, L([0]), -2.7).tolist() == [-2, 2]  # cast to self's dtype
    t = hp.tensor(a)
    assert t.index_fill_(0, L([1]), 0.0) is t and (_np(t)[1] == 0).all()
    gradcheck(lambda x, v: x.index_fill(1, L([0, 2]), v), [a, np.array(2.0)])  # a 0-d value tensor gets its grad
    with pytest.raises(IndexError, match="int64"):
        hp.tensor(a).index_fill(1, hp.tensor([0], dtype=hp.int32), 1)
    with pytest.raises(IndexError, match="out of bounds"):
        hp.tensor(a).index_fill(1, L([4]), 1)
    with pytest.raises(RuntimeError, match="vector/scalar"):
        hp.tensor(a).index_fill(1, L([[0]]), 1)
    with pytest.raises(RuntimeError, match="0-dimensional"):
        hp.tensor(a).index_fill(1, L([0]), hp.tensor([1.0]))


def test_index_copy(rng):
    a, s = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    ref = a.copy()
    ref[:, [3, 0]] = s
    np.testing.assert_array_equal(_np(hp.index_copy(hp.tensor(a), 1, L([3, 0]), hp.tensor(s))), ref)
    t = hp.tensor(a)
    assert t.index_copy_(-1, L([3, 0]), hp.tensor(s)) is t
    np.testing.assert_array_equal(_np(t), ref)
    gradcheck(lambda x, y: x.index_copy(1, L([3, 0]), y), [a, s])
    with pytest.raises(IndexError, match="Number of indices"):
        hp.tensor(a).index_copy(1, L([3, 0, 1]), hp.tensor(s))
    with pytest.raises(IndexError, match="out of bounds"):
        hp.tensor(a).index_copy(1, L([-1, 0]), hp.tensor(s))  # no negative indices, as PyTorch's
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.tensor(a).index_copy(1, L([3, 0]), hp.tensor(s, dtype=hp.float32))
    with pytest.raises(RuntimeError, match="long tensor"):
        hp.tensor(a).index_copy(1, hp.tensor([3, 0], dtype=hp.int32), hp.tensor(s))


def test_index_put(rng):
    a = rng.standard_normal((3, 4))
    i, j = L([0, 0, 2]), L([1, 1, -1])
    ref = a.copy()
    np.add.at(ref, ([0, 0, 2], [1, 1, -1]), [1.0, 2.0, 3.0])
    v = hp.tensor([1.0, 2.0, 3.0], dtype=hp.float64)
    np.testing.assert_allclose(_np(hp.tensor(a).index_put((i, j), v, accumulate=True)), ref)
    ref = a.copy()
    ref[a > 0] = -1.0
    np.testing.assert_array_equal(_np(hp.tensor(a).index_put([hp.tensor(a > 0)], hp.tensor(-1.0, dtype=hp.float64))),
                                  ref)
    t = hp.tensor(a)
    assert hp.index_put_(t, (L([1]),), hp.tensor(0.0, dtype=hp.float64)) is t and (_np(t)[1] == 0).all()
    gradcheck(lambda x, y: x.index_put((i, j), y, accumulate=True), [a, rng.standard_normal(3)])
    gradcheck(lambda x, y: x.index_put((L([2, 0]),), y), [a, rng.standard_normal(4)])  # values broadcast
    with pytest.raises(RuntimeError, match="dtypes match"):
        hp.tensor(a).index_put((i,), hp.tensor(1.0))
    with pytest.raises(TypeError, match="tuple of Tensors"):
        hp.tensor(a).index_put(i, hp.tensor(1.0, dtype=hp.float64))
    with pytest.raises(TypeError, match="element 0"):
        hp.tensor(a).index_put((None, i), hp.tensor(1.0, dtype=hp.float64))
    with pytest.raises(IndexError, match="out of bounds for dimension 1"):
        hp.tensor(a).index_put((L([0]), L([-5])), hp.tensor(1.0, dtype=hp.float64))
    with pytest.raises(IndexError, match="long, int, byte or bool"):
        hp.tensor(a).index_put((hp.tensor([0.0]),), hp.tensor(1.0, dtype=hp.float64))


def test_put(rng):
    a, s = rng.standard_normal((3, 4)), rng.standard_normal((2, 1))
    ref = a.copy().ravel()
    ref[[5, -1]] = s.ravel()
    np.testing.assert_array_equal(_np(hp.put(hp.tensor(a), L([5, -1]), hp.tensor(s))), ref.reshape(3, 4))
    ref = a.copy().ravel()
    ref[0] += s.sum()
    np.testing.assert_allclose(_np(hp.tensor(a).put(L([[0], [0]]), hp.tensor(s), accumulate=True)), ref.reshape(3, 4))
    t = hp.tensor(a)
    assert t.put_(L([0]), hp.tensor([7.0], dtype=hp.float64)) is t and _np(t)[0, 0] == 7.0
    gradcheck(lambda x, y: x.put(L([5, 0]), y), [a, s])
    gradcheck(lambda x, y: x.put(L([5, 5]), y, accumulate=True), [a, s])
    with pytest.raises(IndexError, match="tried to access index 12"):
        hp.tensor(a).put(L([0, 12]), hp.tensor(s))
    with pytest.raises(IndexError, match="same number of elements"):
        hp.tensor(a).put(L([0]), hp.tensor(s))
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.tensor(a).put(L([0, 1]), L([1, 2]))


def test_masked_scatter(rng):
    a = rng.standard_normal((3, 4))
    m = np.array([True, False, True, False])
    src = np.arange(12.0)
    ref = a.copy()
    ref[np.broadcast_to(m, a.shape)] = src[:6]
    np.testing.assert_array_equal(_np(hp.masked_scatter(hp.tensor(a), hp.tensor(m), hp.tensor(src))), ref)
    full = hp.tensor(a[0]).masked_scatter(hp.ones(3, 4, dtype=hp.bool), hp.tensor(src))  # self broadcast
    np.testing.assert_array_equal(_np(full), src.reshape(3, 4))
    t = hp.tensor(a)
    assert t.masked_scatter_(hp.tensor(m), hp.tensor(src)) is t
    np.testing.assert_array_equal(_np(t), ref)
    gradcheck(lambda x, y: x.masked_scatter(hp.tensor(m), y), [a, rng.standard_normal(7)])
    with pytest.raises(RuntimeError, match="number of ones in mask"):
        hp.tensor(a).masked_scatter(hp.tensor(m), hp.tensor(src[:5]))
    with pytest.raises(RuntimeError, match="boolean masks"):
        hp.tensor(a).masked_scatter(hp.tensor(m).int(), hp.tensor(src))
    with pytest.raises(RuntimeError, match="same dtypes"):
        hp.tensor(a).masked_scatter(hp.tensor(m), hp.arange(12))
    with pytest.raises(RuntimeError, match="does not broadcast to"):
        hp.tensor(a[0]).masked_scatter_(hp.ones(3, 4, dtype=hp.bool), hp.tensor(src))


def _scatter_reduce_ref(a, dim, index, src, reduce, include_self):
    """A float64 loop over the index (the definition)."""
    out = a.astype(np.float64).copy()
    hits = {}
    for pos in np.ndindex(*index.shape):
        dst = list(pos)
        dst[dim] = index[pos]
        hits.setdefault(tuple(dst), []).append(float(src[pos]))
    for dst, vals in hits.items():
        vals = ([float(a[dst])] if include_self else []) + vals
        out[dst] = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}[reduce](vals)
    return out


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(rng, reduce, include_self):
    a, src = rng.standard_normal((3, 4)), rng.standard_normal((3, 5))
    index = np.array([[0, 0, 3, 1, 0], [2, 2, 2, 2, 1], [3, 0, 3, 0, 3]])
    for dim, idx in ((1, index), (0, index[:2, :4] % 3)):
        out = hp.tensor(a).scatter_reduce(dim, L(idx), hp.tensor(src), reduce, include_self=include_self)
        np.testing.assert_allclose(_np(out), _scatter_reduce_ref(a, dim, idx, src, reduce, include_self), rtol=1e-12)
    gradcheck(lambda x, y: hp.scatter_reduce(x, 1, L(index), y, reduce, include_self=include_self), [a, src])
    t = hp.tensor(a)
    assert t.scatter_reduce_(1, L(index), hp.tensor(src), reduce, include_self=include_self) is t
    np.testing.assert_allclose(_np(t), _scatter_reduce_ref(a, 1, index, src, reduce, include_self), rtol=1e-12)


def test_scatter_reduce_ties_zeros_integers_and_errors():
    a = hp.tensor([1.0, 0.0, 3.0, 2.0], dtype=hp.float64, requires_grad=True)
    b = hp.tensor([2.0, 0.0, 3.0, 3.0, 1.0, 0.0], dtype=hp.float64, requires_grad=True)
    i, g = L([0, 1, 0, 1, 2, 1]), hp.arange(1.0, 5.0, dtype=hp.float64)
    a.scatter_reduce(0, i, b, "prod").backward(g)  # zeros: the product of the others, PyTorch's values
    assert a.grad.tolist() == [6.0, 0.0, 3.0, 4.0] and b.grad.tolist() == [3.0, 0.0, 2.0, 0.0, 9.0, 0.0]
    a.grad = b.grad = None
    a.scatter_reduce(0, i, b, "amin", include_self=False).backward(g)  # ties share; self counts as PyTorch's
    np.testing.assert_allclose(b.grad.numpy(), [1.0, 2 / 3, 0.0, 0.0, 3.0, 2 / 3])
    assert a.grad.tolist() == [0.0, 0.0, 0.0, 4.0]
    ints = L([-1, 2, 3, 4]).scatter_reduce(0, L([0, 0, 1]), L([-1, -4, 7]), "mean", include_self=False)
    assert ints.tolist() == [-3, 7, 3, 4] and ints.dtype == hp.int64  # floor division
    nan = hp.tensor([1.0, 2.0]).scatter_reduce(0, L([0, 0]), hp.tensor([float("nan"), 0.0]), "amin")
    assert np.isnan(nan[0].item()) and nan[1].item() == 2.0
    x = hp.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="sum, prod, mean, amax or amin, got foo"):
        x.scatter_reduce(0, L([0]), x, "foo")
    with pytest.raises(RuntimeError, match="self.dtype to be equal to src.dtype"):
        x.scatter_reduce(0, L([0]), x.double(), "sum")
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.scatter_reduce(0, L([2]), x, "sum")
    with pytest.raises(TypeError, match="must be Tensor"):
        x.scatter_reduce(0, L([0]), 1.0, "sum")


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(rng, reduce):
    a, src = rng.standard_normal((3, 4)), rng.standard_normal((3, 5))
    idx = np.array([0, 0, 3, 1, 0])
    full = np.broadcast_to(idx, src.shape)
    for include_self in (True, False):
        out = hp.index_reduce(hp.tensor(a), 1, L(idx), hp.tensor(src), reduce, include_self=include_self)
        np.testing.assert_allclose(_np(out), _scatter_reduce_ref(a, 1, full, src, reduce, include_self), rtol=1e-12)
    gradcheck(lambda x, y: x.index_reduce(1, L(idx), y, reduce), [a, src])
    t = hp.tensor(a)
    assert t.index_reduce_(1, L(idx), hp.tensor(src), reduce) is t
    with pytest.raises(RuntimeError, match="one of prod, mean, amax or amin but got sum"):
        t.index_reduce(1, L(idx), hp.tensor(src), "sum")
    with pytest.raises(RuntimeError, match="Number of indices"):
        t.index_reduce(1, L(idx[:4]), hp.tensor(src), reduce)
    with pytest.raises(IndexError, match="index out of range"):
        t.index_reduce(1, L(idx + 1), hp.tensor(src), reduce)
