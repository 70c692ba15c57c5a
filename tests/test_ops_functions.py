"""The hpcfsdp.* function forms of the ops: every name exists, needs a Tensor, and matches the method."""

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _np

# -- the names exist, and delegate to the methods ---------------------------------------------------------
NAMES = ["isfinite", "isnan", "isinf", "logical_not", "logical_and", "logical_or", "cumsum", "sort", "argsort", "topk",
         "multinomial", "chunk", "split", "squeeze", "unsqueeze", "flatten", "reshape", "transpose", "permute",
         "narrow", "gather", "index_select", "masked_fill", "norm", "dot", "mm", "bmm", "einsum", "outer", "square",
         "pow", "neg", "cos", "sin", "erf", "clone", "ones_like", "zeros_like", "tensor_split", "sign", "round",
         "floor", "ceil", "exp2", "logsumexp", "prod", "std", "count_nonzero", "all", "any", "numel", "full"]


@pytest.mark.parametrize("name", NAMES)
def test_top_level_name_exists(name):
    assert callable(getattr(hp, name))


def test_top_level_functions_need_a_tensor():
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.cumsum([1, 2], 0)
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.logical_and(hp.ones(2), 1)


def test_delegates_match_methods(rng):
    a = rng.standard_normal((2, 1, 3))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.squeeze(x, 1)), a.squeeze(1))
    np.testing.assert_array_equal(_np(hp.unsqueeze(x, 0)), a[None])
    np.testing.assert_array_equal(_np(hp.flatten(x, 1)), a.reshape(2, 3))
    np.testing.assert_array_equal(_np(hp.reshape(x, (3, 2))), a.reshape(3, 2))
    np.testing.assert_array_equal(_np(hp.transpose(x, 0, 2)), a.transpose(2, 1, 0))
    np.testing.assert_array_equal(_np(hp.permute(x, (2, 0, 1))), a.transpose(2, 0, 1))
    assert [p.shape for p in hp.chunk(x, 2, dim=2)] == [(2, 1, 2), (2, 1, 1)]
    assert [p.shape for p in hp.split(x, [1, 2], dim=2)] == [(2, 1, 1), (2, 1, 2)]
    np.testing.assert_array_equal(_np(hp.square(x)), a * a)
    np.testing.assert_array_equal(_np(hp.neg(x)), -a)
    np.testing.assert_array_equal(_np(hp.masked_fill(x, x > 0, 0.0)), np.where(a > 0, 0, a))
    np.testing.assert_allclose(_np(hp.std(x, dim=2)), a.std(axis=2, ddof=1))
    assert hp.all(x == x).item() is True and hp.any(x > 100).item() is False
    c = hp.clone(x)
    assert c is not x and np.array_equal(_np(c), a)


def test_top_level_functions_need_a_tensor_for_more_ops():
    for f in (hp.roll, hp.nonzero, hp.median, hp.lerp):
        with pytest.raises(TypeError, match="must be Tensor"):
            f([1.0, 2.0], 1)
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.remainder(1, 2)
