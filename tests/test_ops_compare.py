"""Comparisons, predicates and logic (isnan/isinf/isfinite, isclose, logical_*), sorting and top-k."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _distinct, _np, gradcheck


# -- element-wise ----------------------------------------------------------------------------------------
def test_predicates_and_logic():
    x = hp.tensor([1.0, math.inf, -math.inf, math.nan, 0.0])
    assert hp.isnan(x).tolist() == [False, False, False, True, False]
    assert hp.isinf(x).tolist() == [False, True, True, False, False]
    assert hp.isfinite(x).tolist() == [True, False, False, False, True]
    for f in (hp.isnan, hp.isinf, hp.isfinite):
        assert f(x).dtype == hp.bool
    assert hp.isinf(hp.tensor([1, 2], dtype=hp.int32)).tolist() == [False, False]
    a, b = hp.tensor([0.0, 1.0, 2.0, 0.0]), hp.tensor([0, 0, 3, 1])
    assert hp.logical_and(a, b).tolist() == [False, False, True, False]
    assert hp.logical_or(a, b).tolist() == [False, True, True, True]
    assert hp.logical_xor(a, b).tolist() == [False, True, False, True]
    assert hp.logical_not(a).tolist() == [True, False, False, True] and hp.logical_and(a, b).dtype == hp.bool


# -- sorting and selection ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_argsort(rng, dim, descending):
    a = _distinct(rng, 4, 5)
    res = hp.sort(hp.tensor(a), dim=dim, descending=descending)
    assert type(res).__name__ == "sort" and res.indices.dtype == hp.int64
    ref_idx = np.argsort(-a if descending else a, axis=dim)
    np.testing.assert_array_equal(_np(res.indices), ref_idx)
    np.testing.assert_array_equal(_np(res.values), np.take_along_axis(a, ref_idx, axis=dim))
    values, indices = res  # unpacks like torch.return_types.sort
    assert values is res.values and indices is res.indices
    np.testing.assert_array_equal(_np(hp.argsort(hp.tensor(a), dim, descending)), ref_idx)
    gradcheck(lambda x: hp.sort(x, dim, descending).values, [a])


def test_sort_is_stable_both_ways_and_nan_is_largest():
    x = hp.tensor([2.0, 1.0, 2.0, math.nan, 1.0, 2.0])
    assert hp.sort(x).indices.tolist() == [1, 4, 0, 2, 5, 3]
    assert hp.sort(x, descending=True).indices.tolist() == [3, 0, 2, 5, 1, 4]
    assert hp.argsort(hp.tensor([3, 1, 3, 1]), descending=True, stable=True).tolist() == [0, 2, 1, 3]
    b = hp.sort(hp.tensor([True, False, True]))
    assert b.values.tolist() == [False, True, True] and b.indices.tolist() == [1, 0, 2]
    s = hp.sort(hp.tensor(3.0))
    assert s.values.item() == 3.0 and s.indices.item() == 0 and s.indices.ndim == 0


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [1, 0])
def test_topk(rng, k, largest, dim):
    a = _distinct(rng, 5, 6)
    res = hp.topk(hp.tensor(a), k, dim=dim, largest=largest)
    assert type(res).__name__ == "topk" and res.indices.dtype == hp.int64
    order = np.argsort(-a if largest else a, axis=dim)
    ref_idx = np.take(order, np.arange(k), axis=dim)
    np.testing.assert_array_equal(_np(res.indices), ref_idx)
    np.testing.assert_array_equal(_np(res.values), np.take_along_axis(a, ref_idx, axis=dim))
    gradcheck(lambda x: x.topk(k, dim, largest).values, [a])


def test_topk_edge_cases():
    x = hp.tensor([[1.0, math.nan, 3.0]])
    assert hp.topk(x, 1).indices.tolist() == [[1]]  # NaN is the largest, as PyTorch
    e = hp.topk(hp.ones(3, 4), 0)
    assert e.values.shape == (3, 0) and e.indices.dtype == hp.int64
    assert hp.topk(hp.ones(3, 4, dtype=hp.float16), 2).values.dtype == hp.float16
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        hp.topk(hp.ones(3, 4), 5)
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        hp.topk(hp.ones(3, 4), -1)


def test_isclose():
    a = hp.tensor([1.0, math.nan, 1.0, math.inf])
    b = hp.tensor([1.0 + 1e-9, math.nan, 1.1, math.inf])
    assert hp.isclose(a, b).tolist() == [True, False, False, True]
    assert hp.isclose(a, b, equal_nan=True).tolist() == [True, True, False, True]
    assert a.isclose(b, rtol=0.2).dtype == hp.bool and a.isclose(b, rtol=0.2).tolist()[2] is True
    assert hp.isclose(hp.tensor([1, 2]), hp.tensor([1, 3])).tolist() == [True, False]
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.isclose(hp.tensor([1.0]), hp.tensor([1]))


# -- comparison functions, in-place comparisons and logic ---------------------------------------------------
def test_comparison_functions_and_aliases(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    ref = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
           "greater": np.greater, "greater_equal": np.greater_equal}
    b[0] = a[0, 0]  # a tie, where eq/le/ge differ from ne/lt/gt
    for name, f in ref.items():
        out = getattr(hp, name)(hp.tensor(a), hp.tensor(b))
        assert out.dtype == hp.bool
        np.testing.assert_array_equal(_np(out), f(a, b), err_msg=name)
        np.testing.assert_array_equal(_np(getattr(hp.tensor(a), name)(0.1)), f(a, 0.1), err_msg=name)
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.eq(2, hp.tensor(a))


def test_inplace_comparisons_write_one_and_zero_in_self_dtype():
    x = hp.tensor([1.0, 2.0, 3.0])
    assert x.eq_(2) is x and x.dtype == hp.float32 and x.tolist() == [0.0, 1.0, 0.0]
    i = hp.tensor([1, 2, 3])
    assert i.lt_(hp.tensor([1.5, 1.5, 3.5])).tolist() == [1, 0, 1] and i.dtype == hp.int64
    assert hp.tensor([1, 2]).greater_(1).tolist() == [0, 1]
    assert hp.tensor([1.0, 2.0]).not_equal_(1).tolist() == [0.0, 1.0]
    for name in ("ne_", "le_", "ge_", "gt_", "less_", "less_equal_", "greater_equal_"):
        getattr(hp.tensor([1.0]), name)(1.0)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        hp.tensor([1.0, 2.0]).eq_(hp.tensor([[1.0], [2.0]]))
    with pytest.raises(RuntimeError, match="leaf Variable"):
        hp.tensor([1.0], requires_grad=True).eq_(1.0)


def test_inplace_logic():
    assert hp.tensor([1.0, 0.0]).logical_not_().tolist() == [0.0, 1.0]
    u = hp.tensor([1, 0], dtype=hp.uint8).logical_not_()
    assert u.dtype == hp.uint8 and u.tolist() == [0, 1]
    assert hp.tensor([1.0, 0.0]).logical_or_(hp.tensor([0, 0])).tolist() == [1.0, 0.0]
    assert hp.tensor([1.0, 0.0]).logical_xor_(hp.tensor([1, 1])).tolist() == [0.0, 1.0]
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.tensor([1.0]).logical_or_(1)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        hp.tensor([[1.0, 0.0]]).logical_or_(hp.tensor([[0.0], [1.0]]))


# -- bitwise -----------------------------------------------------------------------------------------------
def test_bitwise_ops_against_numpy(rng):
    a, b = rng.integers(-50, 50, (3, 4)), rng.integers(0, 50, (4,))
    for name, f in {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
                    "bitwise_left_shift": np.left_shift, "bitwise_right_shift": np.right_shift}.items():
        s = b % 8
        out = getattr(hp, name)(hp.tensor(a), hp.tensor(s))
        assert out.dtype == hp.int64
        np.testing.assert_array_equal(_np(out), f(a, s), err_msg=name)
    t = hp.tensor(a)
    np.testing.assert_array_equal(_np(t & 6), a & 6)
    np.testing.assert_array_equal(_np(6 | t), a | 6)
    np.testing.assert_array_equal(_np(3 ^ t), a ^ 3)
    np.testing.assert_array_equal(_np(1 << hp.tensor(b % 8)), 1 << (b % 8))
    np.testing.assert_array_equal(_np(~t), ~a)
    np.testing.assert_array_equal(_np(hp.bitwise_not(t)), ~a)
    assert (hp.tensor([3]) >> hp.tensor([70])).tolist() == [0] and (hp.tensor([-8]) >> 70).tolist() == [-1]
    assert (hp.tensor([3]) << 64).tolist() == [0]
    m = hp.tensor([True, False])
    assert (m & hp.tensor([True, True])).dtype == hp.bool and (~m).tolist() == [False, True]
    assert (m ^ 2).tolist() == [3, 2] and (m ^ 2).dtype == hp.int64
    assert hp.tensor([2, 3], dtype=hp.int32).bitwise_and(hp.tensor([3, 3])).dtype == hp.int64


def test_bitwise_in_place_and_errors():
    m = hp.tensor([True, False])
    alias = m
    m |= hp.tensor([False, True])  # in place: the same tensor
    assert m is alias and m.tolist() == [True, True]
    m &= hp.tensor([True, False])
    assert alias.tolist() == [True, False]
    i = hp.tensor([1, 2], dtype=hp.int32)
    assert i.bitwise_xor_(hp.tensor([3, 3])) is i and i.tolist() == [2, 1] and i.dtype == hp.int32
    i <<= 2
    assert i.tolist() == [8, 4]
    assert hp.tensor([12]).bitwise_not_().tolist() == [-13]
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        hp.tensor([True]).bitwise_and_(hp.tensor([3]))
    for bad in (lambda: hp.tensor([3.0]) & 1, lambda: hp.tensor([3]) & 1.5, lambda: ~hp.tensor([1.0]),
                lambda: hp.tensor([1.0]) << 1, lambda: hp.tensor([1.0]).bitwise_not_()):
        with pytest.raises(NotImplementedError, match="not implemented for"):
            bad()
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        hp.tensor([1, 2]).bitwise_or_(hp.tensor([[1], [2]]))


# -- predicates and membership -----------------------------------------------------------------------------
def test_sign_and_infinity_predicates():
    x = hp.tensor([-math.inf, -0.0, 0.0, 2.0, math.inf, math.nan])
    assert hp.isposinf(x).tolist() == [False, False, False, False, True, False]
    assert x.isneginf().tolist() == [True, False, False, False, False, False]
    assert hp.signbit(x).tolist() == [True, True, False, False, False, False]
    assert hp.signbit(hp.tensor([-0.0, 1.0], dtype=hp.bfloat16)).tolist() == [True, False]
    assert hp.signbit(hp.tensor([-1, 1])).tolist() == [True, False]
    assert hp.signbit(hp.tensor([1], dtype=hp.uint8)).tolist() == [False]
    assert hp.isposinf(hp.tensor([1, 2])).tolist() == [False, False] and hp.isreal(x).all().item()
    assert hp.tensor([1.0]).is_signed() and not hp.tensor([1], dtype=hp.uint8).is_signed()
    assert not hp.tensor([True]).is_signed() and not hp.is_complex(x)


def test_is_nonzero_and_is_same_size():
    assert hp.tensor([0.5]).is_nonzero() and not hp.is_nonzero(hp.tensor(0)) and hp.tensor([[True]]).is_nonzero()
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        hp.tensor([0.0, 1.0]).is_nonzero()
    with pytest.raises(RuntimeError, match="no values is ambiguous"):
        hp.tensor([]).is_nonzero()
    assert hp.ones(2, 3).is_same_size(hp.zeros(2, 3)) and not hp.is_same_size(hp.ones(2), hp.ones(3))
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.ones(2).is_same_size(3)


def test_isin_against_numpy(rng):
    e, t = rng.integers(0, 10, (3, 4)), rng.integers(0, 10, (2, 3))
    np.testing.assert_array_equal(_np(hp.isin(hp.tensor(e), hp.tensor(t))), np.isin(e, t))
    np.testing.assert_array_equal(_np(hp.isin(hp.tensor(e), hp.tensor(t), invert=True)), ~np.isin(e, t))
    assert hp.isin(hp.tensor([1, 2, 3]), hp.tensor([2.0, 5.0])).tolist() == [False, True, False]
    assert hp.isin(hp.tensor([1.0, 2.0]), 2.0).tolist() == [False, True]
    r = hp.isin(2, hp.tensor([1, 2]))
    assert r.ndim == 0 and r.item() is True
    assert hp.isin(hp.tensor([math.nan, 1.0]), hp.tensor([math.nan])).tolist() == [False, False]
    with pytest.raises(RuntimeError, match="Bool"):
        hp.isin(hp.tensor([True]), hp.tensor([1]))
    with pytest.raises(TypeError):
        hp.isin([1, 2], hp.tensor([1]))


def test_contains():
    t = hp.tensor([1, 2])
    assert 2 in t and 2.5 not in t and hp.tensor(2) in t and hp.tensor([1, 2]) in t
    with pytest.raises(RuntimeError, match="only supports Tensor or scalar"):
        [2] in t  # noqa: B015
