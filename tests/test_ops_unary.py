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


# -- hyperbolic inverses, angles, sinc, logit, nan_to_num --------------------------------------------------
@pytest.mark.parametrize("name,ref,lo,hi", [("asinh", np.arcsinh, -2, 2), ("acosh", np.arccosh, 1.2, 3),
                                            ("atanh", np.arctanh, -0.8, 0.8), ("arcsinh", np.arcsinh, -2, 2),
                                            ("arccosh", np.arccosh, 1.2, 3), ("arctanh", np.arctanh, -0.8, 0.8),
                                            ("deg2rad", np.deg2rad, -200, 200), ("rad2deg", np.rad2deg, -4, 4),
                                            ("sinc", np.sinc, -3, 3)])
def test_more_unary_values_and_grad(rng, name, ref, lo, hi):
    a = rng.uniform(lo, hi, (3, 4))
    np.testing.assert_allclose(_np(getattr(hp, name)(hp.tensor(a))), ref(a), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_np(getattr(hp.tensor(a), name)()), ref(a), rtol=1e-12, atol=1e-15)
    gradcheck(lambda x: getattr(x, name)(), [a.T], atol=1e-5)
    assert getattr(hp, name)(hp.tensor([1, 2], dtype=hp.int32)).dtype == hp.float32


def test_sinc_at_zero_and_sgn_positive_absolute():
    x = hp.tensor([0.0, 0.5], requires_grad=True)
    y = hp.sinc(x)
    assert y.tolist() == [1.0, pytest.approx(2 / math.pi)]
    y.sum().backward()
    assert x.grad.tolist()[0] == 0.0  # no 0/0 in the gradient at 0
    assert hp.sgn(hp.tensor([-2, 0, 3])).tolist() == [-1, 0, 1] and hp.tensor([-0.5]).sgn().tolist() == [-1.0]
    t = hp.tensor([1.0, -2.0])
    assert hp.positive(t) is t and +t is t
    with pytest.raises(RuntimeError, match="bool tensor is not supported"):
        hp.positive(hp.tensor([True]))
    assert hp.absolute(t).tolist() == [1.0, 2.0] and t.absolute_() is t and t.tolist() == [1.0, 2.0]


def test_logit(rng):
    p = rng.uniform(0.05, 0.95, (3, 4))
    np.testing.assert_allclose(_np(hp.logit(hp.tensor(p))), np.log(p / (1 - p)), rtol=1e-12)
    gradcheck(lambda x: x.logit(), [p])
    gradcheck(lambda x: x.logit(eps=0.01), [p])
    out = hp.logit(hp.tensor([0.0, 0.25, 1.0, 1.5])).tolist()
    assert out[0] == -math.inf and out[2] == math.inf and math.isnan(out[3])
    np.testing.assert_allclose(_np(hp.logit(hp.tensor([0.0, 0.25, 1.0, 1.5]), eps=0.1)),
                               [math.log(1 / 9), math.log(1 / 3), math.log(9), math.log(9)], rtol=1e-6)
    x = hp.tensor([0.05, 0.5, 0.95, 0.1], requires_grad=True)
    hp.logit(x, 0.1).sum().backward()  # 0 where clamped; the bounds themselves pass the gradient (PyTorch's)
    np.testing.assert_allclose(_np(x.grad), [0.0, 4.0, 0.0, 1 / 0.09], rtol=1e-5)
    assert hp.logit(hp.tensor([0, 1])).tolist() == [-math.inf, math.inf]
    t = hp.tensor([0.5, 0.0])
    assert t.logit_(0.25) is t and t.tolist() == [0.0, pytest.approx(math.log(1 / 3))]


def test_nan_to_num(rng):
    a = rng.standard_normal((3, 4))
    a[0, 0], a[1, 1], a[2, 2] = math.nan, math.inf, -math.inf
    np.testing.assert_array_equal(_np(hp.nan_to_num(hp.tensor(a))), np.nan_to_num(a))
    np.testing.assert_array_equal(_np(hp.tensor(a).nan_to_num(1.5, 2.0, -3.0)),
                                  np.nan_to_num(a, nan=1.5, posinf=2.0, neginf=-3.0))
    gradcheck(lambda x: x.nan_to_num(), [rng.standard_normal((3, 4))])
    x = hp.tensor([math.nan, math.inf, -math.inf, 1.0], requires_grad=True)
    hp.nan_to_num(x).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0, 1.0]
    for dt in (hp.float32, hp.float16, hp.bfloat16):
        info = hp.finfo(dt)
        out = hp.nan_to_num(hp.tensor([math.nan, math.inf, -math.inf], dtype=dt))
        assert out.dtype == dt and out.float().tolist() == [0.0, float(info.max), float(info.min)]
    assert hp.nan_to_num(hp.tensor([math.inf]), posinf=1e39).tolist() == [math.inf]  # rounds to float32's inf
    i = hp.tensor([1, 2])
    assert hp.nan_to_num(i, nan=1.5).tolist() == [1, 2] and hp.nan_to_num(i) is not i
    t = hp.tensor([math.nan, 1.0])
    assert t.nan_to_num_(0.5) is t and t.tolist() == [0.5, 1.0]


# -- in place through the out-of-place op ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["square", "sign", "sgn", "floor", "ceil", "trunc", "fix", "frac", "log", "log1p",
                                  "log2", "log10", "expm1", "exp2", "reciprocal", "rsqrt", "sin", "cos", "tan",
                                  "sinh", "cosh", "asin", "arcsin", "acos", "arccos", "atan", "arctan", "asinh",
                                  "arcsinh", "atanh", "arctanh", "erf", "deg2rad", "rad2deg", "sinc", "absolute",
                                  "negative"])
def test_inplace_unary_matches_out_of_place(rng, name):
    a = rng.uniform(0.1, 0.9, (3, 4))
    t = hp.tensor(a)
    ref = getattr(hp.tensor(a), name)()
    assert getattr(t, name + "_")() is t
    np.testing.assert_array_equal(_np(t), _np(ref))
    with pytest.raises(RuntimeError, match="leaf Variable"):
        getattr(hp.tensor(a, requires_grad=True), name + "_")()


def test_inplace_unary_refuses_a_float_result_in_an_integer_tensor():
    assert hp.tensor([4]).square_().tolist() == [16] and hp.tensor([-4]).sign_().tolist() == [-1]
    assert hp.tensor([-4.55]).round_(decimals=1).tolist() == [pytest.approx(-4.6)]
    assert hp.tensor([-4.5]).round_().tolist() == [-4.0]
    for name in ("log_", "sin_", "deg2rad_", "reciprocal_", "rsqrt_"):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            getattr(hp.tensor([4]), name)()
