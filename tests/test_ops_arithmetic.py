"""Arithmetic ops (add, sub, mul, div, pow, remainder, fused multiply-adds): values and gradients against NumPy in float64, broadcasting, scalar operands."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hpcfsdp as hp
from tests._gradcheck import LAYOUTS, _np, gradcheck, rand



# -- binary element-wise, with broadcasting and non-contiguous operands ---------------------------------
BCAST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((), (2, 3))]


@pytest.mark.parametrize("sa,sb", BCAST)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary(rng, op, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    if op == "pow":
        a = np.abs(a) + 0.5
    if op == "div":
        b = np.sign(b) * (np.abs(b) + 0.5)
    f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
         "div": lambda x, y: x / y, "pow": lambda x, y: x ** y, "maximum": lambda x, y: x.maximum(y),
         "minimum": lambda x, y: x.minimum(y)}[op]
    assert len(gradcheck(f, [a, b])) == 2  # both inputs' gradients checked


@pytest.mark.parametrize("layout", LAYOUTS)
def test_binary_noncontiguous(rng, layout):
    a, b = rand(rng, 3, 4, layout=layout), rand(rng, 3, 4, layout=layout)
    assert len(gradcheck(lambda x, y: (x * y + x) / (y * y + 1.0) - y, [a, b])) == 2


def test_scalar_operands(rng):
    a = rng.standard_normal((2, 3))
    assert len(gradcheck(lambda x: 2.0 * x + 1 - x * 3 + 0.5 / (x * x + 1.0) - (4 - x) + (-x), [a])) == 1
    assert len(gradcheck(lambda x: 2.0 ** x + 1.5 ** x, [a])) == 1


@pytest.mark.parametrize("c", [2, 3, 0.5, -1.5, 1, 0])
def test_pow_scalar(rng, c):
    a = np.abs(rng.standard_normal((3, 2))) + 0.3
    assert len(gradcheck(lambda x: x ** c, [a])) == 1


def test_broadcast_shape_error_names_shapes():
    with pytest.raises(RuntimeError, match=r"\(2, 3\) and \(4,\)"):
        hp.zeros(2, 3) + hp.zeros(4)
    with pytest.raises(RuntimeError, match=r"\(2, 3\) and \(3, 1, 2\)"):
        hp.zeros(2, 3) * hp.zeros(3, 1, 2)


@st.composite
def broadcast_pair(draw):
    nd = draw(st.integers(0, 3))
    full = [draw(st.integers(1, 3)) for _ in range(nd)]
    a = [s if draw(st.booleans()) else 1 for s in full]
    b = [s if draw(st.booleans()) else 1 for s in full]
    a = a[draw(st.integers(0, nd)):]  # drop leading dims: numpy/PyTorch right-aligned broadcasting
    return tuple(a), tuple(b)


@settings(max_examples=20, deadline=None)
@given(shapes=broadcast_pair(), op=st.sampled_from(["add", "sub", "mul", "div", "where"]))
def test_binary_random_broadcast_shapes(shapes, op):
    rng = np.random.default_rng(0)
    sa, sb = shapes
    a, b = rng.standard_normal(sa), rng.standard_normal(sb) + 3.0
    cond = hp.tensor(rng.standard_normal(np.broadcast_shapes(sa, sb)) > 0)
    f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
         "div": lambda x, y: x / y, "where": lambda x, y: hp.where(cond, x, y)}[op]
    assert len(gradcheck(f, [a, b])) == 2


def test_pow_tensor_or_scalar_base(rng):
    a = np.abs(rng.standard_normal(4)) + 0.5
    np.testing.assert_allclose(_np(hp.pow(hp.tensor(a), 3)), a ** 3)
    np.testing.assert_allclose(_np(hp.pow(2.5, hp.tensor(a))), 2.5 ** a)
    r = hp.pow(2, hp.tensor([1, 2]))
    assert r.dtype == hp.int64 and r.tolist() == [2, 4]
    gradcheck(lambda x: hp.pow(1.5, x) + hp.pow(x, 2.5), [a])


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


def test_add_sub_mul_div_functions_and_rounding_modes():
    """torch.add/sub/subtract/mul/multiply/div/divide/true_divide and div's rounding_mode (PyTorch's documented
    results: "trunc" rounds toward zero, "floor" down; integral operands stay integral)."""
    a, i = hp.tensor([7.0, -7.0]), hp.tensor([7, -7])
    assert hp.add(a, a, alpha=2).tolist() == [21.0, -21.0] and hp.sub(a, 1).tolist() == [6.0, -8.0]
    assert hp.subtract(a, a).tolist() == [0.0, 0.0] and a.subtract(a).tolist() == [0.0, 0.0]
    assert hp.mul(a, 3).tolist() == hp.multiply(a, 3).tolist() == [21.0, -21.0]
    assert hp.div(a, 2).tolist() == hp.divide(a, 2).tolist() == hp.true_divide(a, 2).tolist() == [3.5, -3.5]
    assert hp.div(a, 2, rounding_mode="trunc").tolist() == [3.0, -3.0]
    assert a.div(2, rounding_mode="floor").tolist() == [3.0, -4.0]
    t, f = hp.div(i, 2, rounding_mode="trunc"), hp.div(i, 2, rounding_mode="floor")
    assert (t.tolist(), t.dtype, f.tolist(), f.dtype) == ([3, -3], hp.int64, [3, -4], hp.int64)
    assert hp.div(i, 2).dtype == hp.float32
    with pytest.raises(RuntimeError, match="rounding_mode to be one of None, 'trunc', or 'floor'"):
        hp.div(a, 2, rounding_mode="round")


# -- special functions of two operands ---------------------------------------------------------------------
def test_logaddexp_and_logaddexp2(rng):
    a, b = rng.standard_normal((3, 4)) * 30, rng.standard_normal((4,)) * 30
    np.testing.assert_allclose(_np(hp.logaddexp(hp.tensor(a), hp.tensor(b))), np.logaddexp(a, b), rtol=1e-14)
    np.testing.assert_allclose(_np(hp.tensor(a).logaddexp2(hp.tensor(b))), np.logaddexp2(a, b), rtol=1e-14)
    gradcheck(lambda x, y: hp.logaddexp(x, y), [a / 30, b / 30])
    gradcheck(lambda x, y: hp.logaddexp2(x, y), [a / 30, b / 30])
    inf = math.inf
    x, y = hp.tensor([1.0, -inf, inf, -inf]), hp.tensor([1.0, -inf, inf, inf])
    np.testing.assert_allclose(_np(hp.logaddexp(x, y)), [1 + math.log(2), -inf, inf, inf], rtol=1e-6)
    h = hp.logaddexp(hp.tensor([1.0], dtype=hp.float16), hp.tensor([1.0], dtype=hp.bfloat16))
    assert h.dtype == hp.float32 and abs(h.item() - (1 + math.log(2))) < 1e-6
    assert hp.logaddexp(hp.tensor([1.0], dtype=hp.bfloat16), hp.tensor([2.0], dtype=hp.bfloat16)).dtype == hp.bfloat16
    with pytest.raises(NotImplementedError, match="logaddexp"):
        hp.logaddexp(hp.tensor([1]), hp.tensor([2]))
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.tensor([1.0]).logaddexp(1.0)


def test_xlogy(rng):
    x, y = rng.standard_normal((3, 4)), rng.uniform(0.5, 2.0, (4,))
    np.testing.assert_allclose(_np(hp.xlogy(hp.tensor(x), hp.tensor(y))), x * np.log(y), rtol=1e-14)
    gradcheck(lambda p, q: hp.xlogy(p, q), [x, y])
    nan = math.nan
    out = hp.xlogy(hp.tensor([0.0, 1.0, 2.0, 0.0]), hp.tensor([0.0, 0.0, nan, nan])).tolist()
    assert out[:2] == [0.0, -math.inf] and all(math.isnan(v) for v in out[2:])
    i = hp.xlogy(hp.tensor([0, 1, 2]), hp.tensor([3, 4, 5]))
    assert i.dtype == hp.float32
    np.testing.assert_allclose(_np(i), [0.0, math.log(4), 2 * math.log(5)], rtol=1e-6)
    np.testing.assert_allclose(_np(hp.xlogy(2, hp.tensor([3.0]))), [2 * math.log(3)], rtol=1e-6)
    np.testing.assert_allclose(_np(hp.xlogy(hp.tensor([3.0]), 2)), [3 * math.log(2)], rtol=1e-6)
    p, q = hp.tensor([0.0, 0.0, 1.0], requires_grad=True), hp.tensor([0.0, 2.0, 3.0], requires_grad=True)
    hp.xlogy(p, q).sum().backward()  # PyTorch's gradients where x is 0: 0 for x, x / y for y
    np.testing.assert_allclose(_np(p.grad), [0.0, math.log(2), math.log(3)], rtol=1e-6)
    assert math.isnan(q.grad.tolist()[0]) and q.grad.tolist()[1:] == [0.0, pytest.approx(1 / 3)]
    t = hp.tensor([2.0, 3.0])
    assert t.xlogy_(hp.tensor([2.0, 1.0])) is t and t.tolist() == [pytest.approx(2 * math.log(2)), 0.0]
    with pytest.raises(RuntimeError, match="can't be cast"):
        hp.tensor([1, 2]).xlogy_(hp.tensor([2.0, 3.0]))


def test_fmax_fmin(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    a[0, 0], b[1] = math.nan, math.nan
    np.testing.assert_array_equal(_np(hp.fmax(hp.tensor(a), hp.tensor(b))), np.fmax(a, b))
    np.testing.assert_array_equal(_np(hp.tensor(a).fmin(hp.tensor(b))), np.fmin(a, b))
    assert hp.fmax(hp.tensor([1, 2]), hp.tensor([1.5, 0.0])).tolist() == [1.5, 2.0]
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    gradcheck(lambda x, y: hp.fmax(x, y) + hp.fmin(x, y) * 2, [a, b])
    x = hp.tensor([1.0, 2.0, math.nan, 1.0], requires_grad=True)
    y = hp.tensor([1.0, 1.0, 0.0, math.nan], requires_grad=True)
    hp.fmax(x, y).sum().backward()  # ties go to input, NaN loses (PyTorch's)
    assert x.grad.tolist() == [1.0, 1.0, 0.0, 1.0] and y.grad.tolist() == [0.0, 0.0, 1.0, 0.0]
    x.grad = y.grad = None
    hp.fmin(x, y).sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 0.0, 1.0] and y.grad.tolist() == [0.0, 1.0, 1.0, 0.0]
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.fmax(hp.tensor([1]), 1)


def test_float_power(rng):
    a = rng.uniform(0.5, 2.0, (3, 4))
    out = hp.float_power(hp.tensor(a, dtype=hp.float32), 2.5)  # computed in float64, not rounded to float32
    assert out.dtype == hp.float64
    np.testing.assert_allclose(_np(out), a.astype(np.float32).astype(np.float64) ** 2.5, rtol=1e-15)
    assert hp.tensor(a).float_power(2.5).dtype == hp.float64
    np.testing.assert_allclose(_np(hp.float_power(hp.tensor(a), 2.5)), a ** 2.5, rtol=1e-14)
    assert hp.float_power(hp.tensor([2, 3]), 2).tolist() == [4.0, 9.0]
    assert hp.float_power(2, hp.tensor([2, 3])).tolist() == [4.0, 8.0]
    assert hp.float_power(hp.tensor([2.0, 3.0]), hp.tensor([2], dtype=hp.int32)).dtype == hp.float64
    gradcheck(lambda x: hp.float_power(x, 1.5), [a])
    gradcheck(lambda x, e: hp.float_power(x, e), [a, rng.standard_normal((4,))])
    t = hp.tensor([2.0, 3.0], dtype=hp.float64)
    assert t.float_power_(2) is t and t.tolist() == [4.0, 9.0]
    with pytest.raises(RuntimeError, match="requires dtype float64"):
        hp.tensor([2.0, 3.0]).float_power_(2)


def test_copysign_and_heaviside(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    np.testing.assert_array_equal(_np(hp.copysign(hp.tensor(a), hp.tensor(b))), np.copysign(a, b))
    assert hp.copysign(hp.tensor([1, 2]), -1).tolist() == [-1.0, -2.0]
    assert hp.copysign(hp.tensor([1.0, 2.0]), hp.tensor([-0.0, 0.0])).tolist() == [-1.0, 2.0]
    gradcheck(lambda x, y: hp.copysign(x, y), [a, b], check=[0])
    x = hp.tensor([1.0, -2.0, 0.0], requires_grad=True)
    y = hp.tensor([-1.0, -1.0, -1.0], requires_grad=True)
    hp.copysign(x, y).sum().backward()
    assert x.grad.tolist() == [-1.0, 1.0, 0.0] and y.grad.tolist() == [0.0, 0.0, 0.0]
    t = hp.tensor([1.0, -2.0])
    assert t.copysign_(-1.0) is t and t.tolist() == [-1.0, -2.0]
    h = hp.heaviside(hp.tensor([-1.0, 0.0, 2.0]), hp.tensor([0.5]))
    assert h.tolist() == [0.0, 0.5, 1.0] and h.dtype == hp.float32
    np.testing.assert_array_equal(_np(hp.tensor(a).heaviside(hp.tensor(b))), np.heaviside(a, b))
    with pytest.raises(RuntimeError, match="different dtypes"):
        hp.heaviside(hp.tensor([-1.0, 0.0]), hp.tensor([1]))
    with pytest.raises(TypeError, match="must be Tensor"):
        hp.heaviside(hp.tensor([-1.0, 0.0]), 0.5)
    t = hp.tensor([0, 3])
    assert t.heaviside_(hp.tensor([7])).tolist() == [7, 1]


# -- in place ----------------------------------------------------------------------------------------------
def test_more_inplace_binary_ops_check_their_result_dtype():
    t = hp.tensor([5, 7])
    assert t.floor_divide_(2) is t and t.tolist() == [2, 3]
    assert hp.tensor([-5.0, 7.0]).remainder_(3).tolist() == [1.0, 1.0]
    assert hp.tensor([-5.0, 7.0]).fmod_(3).tolist() == [-2.0, 1.0]
    np.testing.assert_allclose(_np(hp.tensor([1.0, 2.0]).atan2_(hp.tensor([1.0, 1.0]))), np.arctan2([1, 2], [1, 1]),
                               rtol=1e-6)
    assert hp.tensor([1.0]).arctan2_(hp.tensor([0.0])).tolist() == [pytest.approx(math.pi / 2)]
    assert hp.tensor([3.0, 2.0]).hypot_(hp.tensor([4.0, 1.0])).tolist() == [5.0, pytest.approx(math.sqrt(5))]
    assert hp.tensor([1.0, 2.0]).true_divide_(2).tolist() == [0.5, 1.0]
    assert hp.tensor([1.0, 3.0]).divide_(2, rounding_mode="floor").tolist() == [0.0, 1.0]
    assert hp.tensor([1, 3]).div_(2, rounding_mode="trunc").tolist() == [0, 1]
    assert hp.tensor([1.0]).multiply_(3).tolist() == [3.0] and hp.tensor([1.0]).subtract_(3).tolist() == [-2.0]
    for bad in (lambda: hp.tensor([1, 2]).true_divide_(2), lambda: hp.tensor([5, 7]).remainder_(1.5),
                lambda: hp.tensor([1, 2]).clamp_max_(1.5), lambda: hp.tensor([1, 2]).clip_(0.5, 1)):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            bad()
    with pytest.raises(NotImplementedError, match="hypot"):
        hp.tensor([3, 2]).hypot_(hp.tensor([4, 1]))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        hp.tensor([1.0, 2.0]).fmod_(hp.tensor([[1.0], [2.0]]))


def test_clip_clamp_min_max_in_place():
    t = hp.tensor([1, 2, 3])
    assert t.clip_(0, 2) is t and t.tolist() == [1, 2, 2]
    assert hp.tensor([1.0, 2.0]).clamp_min_(1.5).tolist() == [1.5, 2.0]
    assert hp.tensor([1.0, 2.0]).clamp_max_(hp.tensor([0.0, 3.0])).tolist() == [0.0, 2.0]
    with pytest.raises(RuntimeError, match="At least one of 'min' or 'max'"):
        hp.tensor([1.0]).clip_()


def test_augmented_pow_mod_floordiv_are_in_place_outside_the_graph():
    t = hp.tensor([2.0, 3.0])
    alias = t
    t **= 2
    assert alias is t and t.tolist() == [4.0, 9.0]
    i = hp.tensor([5, 7])
    alias = i
    i //= 2
    i %= 2
    assert alias is i and i.tolist() == [0, 1]
    x = hp.tensor([1.0, 2.0], requires_grad=True) * 1
    y = x
    x **= 2  # in the graph: rebinds x to the recorded result, as the other augmented operators do here
    assert y.tolist() == [1.0, 2.0] and x.tolist() == [1.0, 4.0] and x.grad_fn is not None
