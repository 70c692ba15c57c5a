"""Finite-difference gradient checks (float64) of every primitive op in hpcfsdp.autograd.ops."""
import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import gradcheck, rand

LAYOUTS = ["c", "t", "s"]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


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
    gradcheck(f, [a, b])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_binary_noncontiguous(rng, layout):
    a, b = rand(rng, 3, 4, layout=layout), rand(rng, 3, 4, layout=layout)
    gradcheck(lambda x, y: (x * y + x) / (y * y + 1.0) - y, [a, b])


def test_scalar_operands(rng):
    a = rng.standard_normal((2, 3))
    gradcheck(lambda x: 2.0 * x + 1 - x * 3 + 0.5 / (x * x + 1.0) - (4 - x) + (-x), [a])
    gradcheck(lambda x: 2.0 ** x + 1.5 ** x, [a])


@pytest.mark.parametrize("c", [2, 3, 0.5, -1.5, 1, 0])
def test_pow_scalar(rng, c):
    a = np.abs(rng.standard_normal((3, 2))) + 0.3
    gradcheck(lambda x: x ** c, [a])


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


# -- reductions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False), ((0, 2), True),
                                         ((0, 2), False)])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin"])
def test_reductions(rng, name, dim, keepdim):
    a = rand(rng, 3, 4, 5, layout="t")
    if dim is None:
        gradcheck(lambda x: getattr(x, name)(), [a])
    else:
        gradcheck(lambda x: getattr(x, name)(dim, keepdim=keepdim), [a])


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim(rng, name, keepdim):
    a = rng.standard_normal((4, 5))
    gradcheck(lambda x: getattr(x, name)(1, keepdim=keepdim).values, [a])
    gradcheck(lambda x: getattr(x, name)(0, keepdim)[0] * 2, [a])
    gradcheck(lambda x: getattr(x, name)(), [a])


def test_amax_ties_share_gradient():
    x = hp.tensor([1.0, 3.0, 3.0, 2.0], requires_grad=True)
    x.amax().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0.5, 0.5, 0])


@pytest.mark.parametrize("dim,corr,keepdim", [(None, 1, False), (1, 1, False), (0, 0, True), ((0, 1), 1, False)])
def test_var(rng, dim, corr, keepdim):
    a = rand(rng, 4, 3, layout="s")
    gradcheck(lambda x: x.var(dim, correction=corr, keepdim=keepdim), [a])
    ref = np.var(a, axis=dim, ddof=corr, keepdims=keepdim)
    np.testing.assert_allclose(hp.tensor(a).var(dim, correction=corr, keepdim=keepdim).numpy(), ref, rtol=1e-12)


def test_var_unbiased_flag(rng):
    a = rng.standard_normal((6,))
    np.testing.assert_allclose(hp.tensor(a).var(unbiased=False).item(), np.var(a), rtol=1e-12)
    np.testing.assert_allclose(hp.tensor(a).var().item(), np.var(a, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(hp.tensor(a).std(0).item(), np.std(a, ddof=1), rtol=1e-12)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_grad(rng, name, dim):
    a = rand(rng, 3, 5, layout="t")
    gradcheck(lambda x: getattr(x, name)(dim), [a])


# -- shape ops -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_shape_ops(rng, layout):
    a = rand(rng, 2, 3, 4, layout=layout)
    gradcheck(lambda x: x.reshape(4, 6) * 2, [a])
    gradcheck(lambda x: x.flatten(1).unsqueeze(0).squeeze(0), [a])
    gradcheck(lambda x: x.permute(2, 0, 1).reshape(-1), [a])
    gradcheck(lambda x: x.transpose(0, 2), [a])
    gradcheck(lambda x: x.contiguous().view(2, 12), [a])
    gradcheck(lambda x: x.T.clone(), [a])
    gradcheck(lambda x: x.unflatten(2, (2, 2)), [a])


def test_expand(rng):
    a = rng.standard_normal((3, 1))
    gradcheck(lambda x: x.expand(2, 3, 4), [a])
    gradcheck(lambda x: x.expand(-1, 5) * 1.5, [a])


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


def test_split_chunk_unbind(rng):
    a = rand(rng, 5, 4, layout="t")
    gradcheck(lambda x: x.split(2, dim=0), [a])
    gradcheck(lambda x: x.split([1, 3], dim=1), [a])
    gradcheck(lambda x: x.chunk(3, 0)[1], [a])  # unused outputs get no gradient
    gradcheck(lambda x: x.unbind(1), [a])


def test_cat_stack(rng):
    a, b, c = rng.standard_normal((2, 3)), rand(rng, 3, 3, layout="t"), rng.standard_normal((1, 3))
    gradcheck(lambda x, y, z: hp.cat([x, y, z], 0), [a, b, c])
    gradcheck(lambda x, y: hp.cat((x, y), dim=-1), [a, rng.standard_normal((2, 4))])
    gradcheck(lambda x, y: hp.stack([x, y], 1), [a, rng.standard_normal((2, 3))])


def test_where_masked_fill(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4,))
    cond = hp.tensor(rng.standard_normal((3, 4)) > 0)
    gradcheck(lambda x, y: hp.where(cond, x, y), [a, b])
    gradcheck(lambda x: hp.where(cond, x, 0.0), [a])
    m = hp.tensor(rng.standard_normal((1, 4)) > 0)
    gradcheck(lambda x: x.masked_fill(m, -3.0), [a])


def test_cast_and_to(rng):
    a = rng.standard_normal((3, 2))
    gradcheck(lambda x: x.to(hp.float32).to(hp.float64) * 2, [a], eps=1e-2, atol=1e-6)
    x = hp.tensor(a, dtype=hp.float32, requires_grad=True)
    y = x.double()
    y.sum().backward()
    assert x.grad.dtype == hp.float32
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((3, 2), np.float32))


# -- matmul ---------------------------------------------------------------------------------------------
MM = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)),
      ((2, 1, 2, 3), (4, 3, 2)), ((4, 2, 3), (4, 3, 2))]


@pytest.mark.parametrize("sa,sb", MM)
def test_matmul(rng, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    gradcheck(lambda x, y: x @ y, [a, b])
    np.testing.assert_allclose((hp.tensor(a) @ hp.tensor(b)).numpy(), a @ b, rtol=1e-12)


@pytest.mark.parametrize("layout", ["t", "s"])
def test_matmul_noncontiguous(rng, layout):
    gradcheck(lambda x, y: x.matmul(y), [rand(rng, 3, 4, layout=layout), rand(rng, 4, 2, layout=layout)])
    gradcheck(lambda x, y: x @ y, [rand(rng, 2, 3, 4, layout=layout), rand(rng, 4, 5, layout=layout)])


def test_matmul_shape_error_names_shapes():
    with pytest.raises(RuntimeError, match=r"2x3.*4x5"):
        hp.zeros(2, 3) @ hp.zeros(4, 5)
    with pytest.raises(RuntimeError, match="broadcast"):
        hp.zeros(2, 2, 3) @ hp.zeros(3, 3, 4)


@pytest.mark.parametrize("dt", [hp.float16, hp.bfloat16])
def test_matmul_half_accumulates_in_float32(rng, dt):
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((64, 4)).astype(np.float32)
    ta, tb = hp.tensor(a, dtype=dt), hp.tensor(b, dtype=dt)
    out = ta @ tb
    assert out.dtype == dt
    ref = (ta.float().numpy() @ tb.float().numpy()).astype(dt)
    np.testing.assert_array_equal(out.numpy(), ref)


def test_broadcast_shape_error_names_shapes():
    with pytest.raises(RuntimeError, match=r"\(2, 3\) and \(4,\)"):
        hp.zeros(2, 3) + hp.zeros(4)
    with pytest.raises(RuntimeError, match=r"\(2, 3\) and \(3, 1, 2\)"):
        hp.zeros(2, 3) * hp.zeros(3, 1, 2)


# -- random broadcastable shapes (hypothesis) ----------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


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
    gradcheck(f, [a, b])
