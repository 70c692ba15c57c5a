"""Unary element-wise ops (exp/log families, trigonometric, rounding, clamp): values, gradients and dtypes."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import LAYOUTS, _np, gradcheck, rand


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "abs", "relu", "neg",
                                  "square"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_unary(rng, name, layout):
    a = rand(rng, 3, 4, layout=layout)
    if name in ("log", "sqrt", "rsqrt"):
        a = np.abs(a) + 0.5
    gradcheck(lambda x: getattr(x, name)(), [a])


def test_sigmoid_extreme_values():
    x = hp.tensor([-1000.0, -30.0, 0.0, 30.0, 1000.0], dtype=hp.float32)
    ref = [0.0, 9.357622968840175e-14, 0.5, 1.0, 1.0]  # 1 / (1 + exp(-x)) in exact arithmetic, rounded
    np.testing.assert_allclose(x.sigmoid().numpy(), ref, rtol=1e-6, atol=0)


def test_clamp(rng):
    a = rng.standard_normal((4, 5))
    gradcheck(lambda x: x.clamp(-0.5, 0.7), [a])
    gradcheck(lambda x: x.clamp(min=-0.2), [a])
    gradcheck(lambda x: x.clamp(max=0.1), [a])
    lo, hi = rng.standard_normal((5,)) - 1, rng.standard_normal((4, 1)) + 1
    gradcheck(lambda x, l, h: x.clamp(l, h), [a, lo, hi])


@pytest.mark.parametrize("name", ["cos", "sin", "erf", "exp2"])
def test_unary_values_and_grad(rng, name):
    a = rand(rng, 3, 4, layout="t")
    ref = {"cos": np.cos, "sin": np.sin, "exp2": np.exp2, "erf": np.vectorize(math.erf)}[name]
    np.testing.assert_allclose(_np(getattr(hp, name)(hp.tensor(a))), ref(a), rtol=1e-7, atol=5e-8)
    gradcheck(lambda x: getattr(hp, name)(x), [a], atol=1e-6 if name != "erf" else 1e-5)
    i = getattr(hp, name)(hp.tensor([1, 2], dtype=hp.int32))  # integers compute in the default float dtype
    assert i.dtype == hp.float32
    np.testing.assert_allclose(_np(i), ref(np.array([1.0, 2.0])), rtol=1e-6)


def test_rounding_values_dtypes_and_zero_grad(rng):
    a = np.array([-2.5, -1.5, -0.4, 0.5, 1.5, 2.6, 3.0])
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.round(x)), np.round(a))  # half to even, as PyTorch
    np.testing.assert_array_equal(_np(hp.floor(x)), np.floor(a))
    np.testing.assert_array_equal(_np(hp.ceil(x)), np.ceil(a))
    np.testing.assert_array_equal(_np(hp.sign(x)), np.sign(a))
    np.testing.assert_allclose(_np(hp.round(hp.tensor([1.234, -5.678]), decimals=2)), [1.23, -5.68])
    i = hp.tensor([-3, 0, 4], dtype=hp.int32)
    for f in (hp.round, hp.floor, hp.ceil, hp.sign):
        assert f(i).dtype == hp.int32
    assert hp.sign(i).tolist() == [-1, 0, 1] and hp.floor(i).tolist() == [-3, 0, 4]
    b = hp.tensor([True, False])
    assert hp.sign(b).dtype == hp.bool and hp.sign(b).tolist() == [True, False]
    with pytest.raises(NotImplementedError):
        hp.floor(b)
    a = rng.standard_normal((3, 4)) * 3
    for name in ("round", "floor", "ceil", "sign"):
        gradcheck(lambda x: getattr(hp, name)(x) * x, [a])  # d/dx (r(x) x) = r(x): zero gradient through r


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


def test_tan_against_numpy_and_its_gradient():
    x = np.linspace(-1.3, 1.3, 11)
    np.testing.assert_allclose(hp.tensor(x).tan().numpy(), np.tan(x), rtol=1e-14)
    np.testing.assert_allclose(hp.tan(hp.tensor(x)).numpy(), np.tan(x), rtol=1e-14)
    gradcheck(lambda t: t.tan(), [x])
    assert hp.tensor([1, 2]).tan().dtype == hp.float32  # integers promote, as PyTorch


@pytest.mark.parametrize("name,ref", [("abs_", np.abs), ("tanh_", np.tanh), ("relu_", lambda a: np.maximum(a, 0)),
                                      ("sigmoid_", lambda a: 1 / (1 + np.exp(-a)))])
def test_in_place_activations_write_self_and_refuse_autograd_leaves(name, ref):
    x = np.linspace(-3, 3, 9)
    t = hp.tensor(x)
    assert getattr(t, name)() is t
    np.testing.assert_allclose(t.numpy(), ref(x), rtol=1e-14)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        getattr(hp.tensor(x, requires_grad=True), name)()
