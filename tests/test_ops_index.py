"""Indexing and selection (getitem, where, masked_fill, gather, index_select, nonzero, unique, bincount, searchsorted, masked_select) and bad indices."""

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _np, gradcheck, rand


@pytest.mark.parametrize("idx", [
    (0,), (slice(1, None),), (Ellipsis, 1), (slice(None), None, slice(0, 3, 2)), (-1, slice(None, None, -1)),
])
def test_getitem_basic(rng, idx):
    a = rand(rng, 3, 4, layout="t")
    gradcheck(lambda x: x[idx if len(idx) > 1 else idx[0]], [a])


def test_getitem_advanced(rng):
    a = rng.standard_normal((5, 3))
    idx = hp.tensor([0, 2, 2, 4, 0])  # duplicates accumulate
    gradcheck(lambda x: x[idx], [a])
    gradcheck(lambda x: x[idx, 1:], [a])
    gradcheck(lambda x: x[[1, 3]], [a])
    gradcheck(lambda x: x[hp.tensor([0, 1]), hp.tensor([2, 2])], [a])
    mask = hp.tensor(a > 0)
    gradcheck(lambda x: x[mask], [a])
    gradcheck(lambda x: x[hp.tensor([True, False, True, False, True])], [a])


def test_where_masked_fill(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    cond = hp.tensor(rng.standard_normal((3, 4)) > 0)
    gradcheck(lambda x, y: hp.where(cond, x, y), [a, b])
    gradcheck(lambda x: hp.where(cond, x, 0.0), [a])
    m = hp.tensor(rng.standard_normal((1, 4)) > 0)
    gradcheck(lambda x: x.masked_fill(m, -3.0), [a])


def test_gather(rng):
    a = rng.standard_normal((3, 4))
    idx = np.array([[0, 0, 3], [1, 2, 1]])  # repeated indices accumulate; smaller than a in dim 0
    got = hp.gather(hp.tensor(a), 1, hp.tensor(idx))
    np.testing.assert_array_equal(_np(got), np.take_along_axis(a[:2], idx, axis=1))
    gradcheck(lambda x: hp.gather(x, 1, hp.tensor(idx)), [a])
    idx0 = np.array([[2, 0, 0, 1, 2]]).reshape(5, 1).repeat(4, 1)  # longer than a along dim
    gradcheck(lambda x: x.gather(0, hp.tensor(idx0)), [a])
    assert hp.gather(hp.tensor(a), 1, hp.tensor(idx, dtype=hp.int32)).shape == (2, 3)


def test_index_select(rng):
    a = rng.standard_normal((4, 3))
    idx = [3, 0, 3]
    for dim in (0, 1):
        i = [j % a.shape[dim] for j in idx]
        got = hp.index_select(hp.tensor(a), dim, hp.tensor(i))
        np.testing.assert_array_equal(_np(got), np.take(a, i, axis=dim))
        gradcheck(lambda x: x.index_select(dim, hp.tensor(i)), [a])
    assert hp.index_select(hp.tensor(a), 0, hp.tensor(1)).shape == (1, 3)
    assert hp.index_select(hp.tensor(a), 0, hp.tensor([1], dtype=hp.int32)).shape == (1, 3)


# -- bad input: dims and indices -------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda x: hp.cumsum(x, 2), lambda x: hp.sort(x, 2), lambda x: hp.argsort(x, -3), lambda x: hp.topk(x, 1, 5),
    lambda x: hp.prod(x, 2), lambda x: hp.logsumexp(x, 3), lambda x: hp.narrow(x, 2, 0, 1),
    lambda x: hp.index_select(x, 2, hp.tensor([0])), lambda x: hp.gather(x, 2, hp.zeros(1, 1, dtype=hp.int64)),
    lambda x: hp.count_nonzero(x, 4), lambda x: hp.norm(x, 2, dim=-3), lambda x: hp.tensor_split(x, 2, 2),
    lambda x: hp.linalg.matrix_norm(x, dim=(0, 2)),
], ids=["cumsum", "sort", "argsort", "topk", "prod", "logsumexp", "narrow", "index_select", "gather",
        "count_nonzero", "norm", "tensor_split", "matrix_norm"])
def test_bad_dim_is_an_index_error(call):
    with pytest.raises(IndexError, match="Dimension out of range"):
        call(hp.ones(2, 3))


def test_bad_indices():
    x = hp.ones(3, 4)
    with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 1 with size 4"):
        hp.gather(x, 1, hp.full((3, 1), 4))
    with pytest.raises(RuntimeError, match="index -1 is out of bounds"):
        hp.gather(x, 1, hp.full((3, 1), -1))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        hp.gather(x, 1, hp.tensor([0]))
    with pytest.raises(RuntimeError, match="Size does not match at dimension 0"):
        hp.gather(x, 1, hp.zeros(4, 1, dtype=hp.int64))
    with pytest.raises(RuntimeError, match="int64"):
        hp.gather(x, 1, hp.zeros(3, 1))
    with pytest.raises(IndexError, match="index out of range in self"):
        hp.index_select(x, 0, hp.tensor([3]))
    with pytest.raises(IndexError, match="index out of range in self"):
        hp.index_select(x, 0, hp.tensor([-1]))
    with pytest.raises(RuntimeError, match="int32 or int64"):
        hp.index_select(x, 0, hp.tensor([1.0]))
    with pytest.raises(IndexError, match="supposed to be a vector"):
        hp.index_select(x, 0, hp.tensor([[1]]))
    with pytest.raises(RuntimeError, match=r"start \(3\) \+ length \(2\) exceeds dimension size \(4\)"):
        hp.narrow(x, 1, 3, 2)
    with pytest.raises(IndexError, match="start out of range"):
        hp.narrow(x, 1, -5, 1)
    with pytest.raises(RuntimeError, match="length must be non-negative"):
        hp.narrow(x, 1, 0, -1)
    with pytest.raises(RuntimeError, match="number of sections must be larger than 0"):
        hp.tensor_split(x, 0)


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


# -- scatter, scatter_add, index_add (and in place), against loops in float64 ------------------------------------
def _scatter_ref(a, dim, idx, src, add):
    out = a.copy()
    for pos in np.ndindex(*idx.shape):
        at = list(pos)
        at[dim] = idx[pos]
        v = src[pos] if np.ndim(src) else src
        out[tuple(at)] = out[tuple(at)] + v if add else v
    return out


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add_accumulates_repeated_indices_and_its_gradients_are_exact(dim):
    rng = np.random.default_rng(0)
    a, src = rng.standard_normal((3, 4)), rng.standard_normal((3, 5))
    d = dim % 2
    idx = rng.integers(0, a.shape[d], (2, 3))  # smaller than src: its leading block is used
    got = hp.tensor(a).scatter_add(dim, hp.tensor(idx), hp.tensor(src))
    np.testing.assert_allclose(got.numpy(), _scatter_ref(a, d, idx, src, True), rtol=1e-14)
    gradcheck(lambda x, s: x.scatter_add(dim, hp.tensor(idx), s), [a, src])
    t = hp.tensor(a.copy())
    assert t.scatter_add_(dim, hp.tensor(idx), hp.tensor(src)) is t
    np.testing.assert_allclose(t.numpy(), got.numpy())
    np.testing.assert_allclose(hp.scatter_add(hp.tensor(a), dim, hp.tensor(idx), hp.tensor(src)).numpy(), got.numpy())


def test_scatter_writes_a_tensor_or_a_value_and_passes_no_gradient_through_what_it_overwrote():
    rng = np.random.default_rng(1)
    a, src = rng.standard_normal((3, 4)), rng.standard_normal((2, 4))
    idx = np.array([[0, 1, 2, 0], [2, 0, 1, 1]])  # distinct per column: the result is well defined
    np.testing.assert_allclose(hp.tensor(a).scatter(0, hp.tensor(idx), hp.tensor(src)).numpy(),
                               _scatter_ref(a, 0, idx, src, False))
    np.testing.assert_allclose(hp.tensor(a).scatter(1, hp.tensor(idx[:, :2]), 7.5).numpy(),
                               _scatter_ref(a, 1, idx[:, :2], 7.5, False))
    ga, gs = gradcheck(lambda x, s: x.scatter(0, hp.tensor(idx), s), [a, src])
    assert (ga[idx, np.arange(4)] == 0).all()  # overwritten: no gradient to self there
    t = hp.zeros(3, 4)
    t.scatter_(0, hp.tensor(idx), value=2.0)
    assert t.sum().item() == 2.0 * idx.size


def test_index_add_with_alpha_and_its_gradients():
    rng = np.random.default_rng(2)
    a, src = rng.standard_normal((3, 5)), rng.standard_normal((3, 3))
    idx = np.array([4, 0, 4])
    ref = a.copy()
    for k, i in enumerate(idx):
        ref[:, i] += 2.0 * src[:, k]
    np.testing.assert_allclose(hp.tensor(a).index_add(1, hp.tensor(idx), hp.tensor(src), alpha=2).numpy(), ref)
    gradcheck(lambda x, s: x.index_add(1, hp.tensor(idx), s, alpha=2), [a, src])
    t = hp.tensor(a.copy())
    assert t.index_add_(1, hp.tensor(idx), hp.tensor(src), alpha=2) is t
    np.testing.assert_allclose(t.numpy(), ref)


def test_scatter_and_index_add_refuse_what_pytorch_refuses():
    z = hp.zeros(3, 4)
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 0 with size 3"):
        z.scatter(0, hp.tensor([[3]]), 1.0)
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index"):
        z.scatter_add(0, hp.tensor([[0]], dtype=hp.int32), hp.ones(1, 1))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        z.scatter_add(0, hp.tensor([0]), hp.ones(1))
    with pytest.raises(RuntimeError, match="Expected self.dtype to be equal to src.dtype"):
        z.scatter(0, hp.tensor([[0]]), hp.ones(1, 1, dtype=hp.float64))
    with pytest.raises(RuntimeError, match="must have the same scalar type"):
        z.index_add(0, hp.tensor([0]), hp.ones(1, 4, dtype=hp.float64))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        hp.zeros(3, requires_grad=True).scatter_(0, hp.tensor([0]), value=1.0)


def test_where_method_and_take_along_dim(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    c = a > 0
    np.testing.assert_array_equal(_np(hp.tensor(a).where(hp.tensor(c), hp.tensor(b))), np.where(c, a, b))
    np.testing.assert_array_equal(_np(hp.tensor(a).where(hp.tensor(c), 0.0)), np.where(c, a, 0.0))
    gradcheck(lambda x, y: x.where(hp.tensor(c), y), [a, b])
    idx = rng.integers(0, 4, (3, 2))
    np.testing.assert_array_equal(_np(hp.take_along_dim(hp.tensor(a), hp.tensor(idx), 1)),
                                  np.take_along_axis(a, idx, 1))
    np.testing.assert_array_equal(_np(hp.tensor(a).take_along_dim(hp.tensor([[0, 1]]), dim=-1)),
                                  np.take_along_axis(a, np.array([[0, 1]] * 3), 1))  # broadcast except along dim
    np.testing.assert_array_equal(_np(hp.take_along_dim(hp.tensor(a), hp.tensor([11, 0]))), a.ravel()[[11, 0]])
    gradcheck(lambda x: hp.take_along_dim(x, hp.tensor(idx), 1), [a])
    with pytest.raises(RuntimeError, match="should be Long"):
        hp.take_along_dim(hp.tensor(a), hp.tensor([[0.0]]), 1)
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        hp.take_along_dim(hp.tensor(a), hp.tensor([0]), 1)
    with pytest.raises(RuntimeError, match="must match the size"):
        hp.take_along_dim(hp.tensor(a), hp.tensor([[0], [1]]), 1)
