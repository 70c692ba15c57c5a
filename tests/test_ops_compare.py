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
