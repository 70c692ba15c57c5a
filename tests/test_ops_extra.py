"""hpcfsdp._ops_extra, hpcfsdp.linalg and the Tensor methods behind them: values against NumPy in float64,
PyTorch's result dtypes, finite-difference gradients (autograd/ops/) and errors for bad input."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import gradcheck, rand


@pytest.fixture
def rng():
    return np.random.default_rng(4321)


def _np(t):
    return t.detach().cpu().numpy()


def _distinct(rng, *shape):
    """float64 values with no ties and no element near 0 (sort/topk/norm gradients are smooth there)."""
    n = math.prod(shape)
    return ((rng.permutation(n) + 1.0) * np.sign(rng.standard_normal(n)) / n + 0.01 * rng.random(n)).reshape(shape)


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


def test_pow_tensor_or_scalar_base(rng):
    a = np.abs(rng.standard_normal(4)) + 0.5
    np.testing.assert_allclose(_np(hp.pow(hp.tensor(a), 3)), a ** 3)
    np.testing.assert_allclose(_np(hp.pow(2.5, hp.tensor(a))), 2.5 ** a)
    r = hp.pow(2, hp.tensor([1, 2]))
    assert r.dtype == hp.int64 and r.tolist() == [2, 4]
    gradcheck(lambda x: hp.pow(1.5, x) + hp.pow(x, 2.5), [a])


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


# -- scans and reductions ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum(rng, dim):
    a = rand(rng, 3, 4, layout="s")
    np.testing.assert_allclose(_np(hp.cumsum(hp.tensor(a), dim)), np.cumsum(a, axis=dim), rtol=1e-12)
    gradcheck(lambda x: hp.cumsum(x, dim), [a])
    gradcheck(lambda x: x.cumsum(dim=dim) ** 2, [a])


def test_cumsum_dtypes():
    assert hp.cumsum(hp.tensor([1, 2, 3], dtype=hp.int32), 0).dtype == hp.int64
    b = hp.cumsum(hp.tensor([True, False, True]), 0)
    assert b.dtype == hp.int64 and b.tolist() == [1, 1, 2]
    f = hp.cumsum(hp.tensor([1, 2, 3], dtype=hp.int32), 0, dtype=hp.float32)
    assert f.dtype == hp.float32 and f.tolist() == [1.0, 3.0, 6.0]
    assert hp.cumsum(hp.ones(4, dtype=hp.float16), 0).dtype == hp.float16
    assert hp.cumsum(hp.tensor(2.0), 0).item() == 2.0


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False)])
def test_prod(rng, dim, keepdim):
    a = rng.standard_normal((3, 4))
    ref = np.prod(a, axis=dim, keepdims=keepdim) if dim is not None else np.prod(a)
    np.testing.assert_allclose(_np(hp.prod(hp.tensor(a), dim, keepdim) if dim is not None else hp.prod(hp.tensor(a))),
                               ref, rtol=1e-12)
    gradcheck(lambda x: x.prod(dim, keepdim) if dim is not None else x.prod(), [a])
    z = a.copy()
    z[1, 2] = 0.0  # one zero, then two zeros in one row: the gradient is still the product of the others
    gradcheck(lambda x: x.prod(dim, keepdim) if dim is not None else x.prod(), [z])
    z[1, 0] = 0.0
    gradcheck(lambda x: x.prod(dim, keepdim) if dim is not None else x.prod(), [z])


def test_prod_dtypes():
    assert hp.prod(hp.tensor([1, 2, 3], dtype=hp.int32)).dtype == hp.int64
    assert hp.prod(hp.tensor([True, True])).dtype == hp.int64
    assert hp.prod(hp.tensor([1, 2, 3], dtype=hp.int32), 0, dtype=hp.float64).dtype == hp.float64


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), ((0, 1), False), (-1, False)])
def test_logsumexp(rng, dim, keepdim):
    a = rand(rng, 3, 4, layout="t") * 10
    axes = dim if isinstance(dim, tuple) else (dim,)
    m = a.max(axis=axes, keepdims=True)
    ref = np.log(np.exp(a - m).sum(axis=axes, keepdims=True)) + m
    ref = ref if keepdim else ref.squeeze(axes)
    np.testing.assert_allclose(_np(hp.logsumexp(hp.tensor(a), dim, keepdim)), ref, rtol=1e-12)
    gradcheck(lambda x: hp.logsumexp(x, dim, keepdim), [a])


def test_logsumexp_extremes_and_dtypes():
    inf = math.inf
    assert hp.logsumexp(hp.tensor([-inf, -inf]), 0).item() == -inf
    assert hp.logsumexp(hp.tensor([inf, 1.0]), 0).item() == inf
    assert hp.logsumexp(hp.tensor([1000.0, 1000.0]), 0).item() == pytest.approx(1000 + math.log(2))
    r = hp.logsumexp(hp.tensor([1, 2, 3], dtype=hp.int32), 0)
    assert r.dtype == hp.float32 and r.item() == pytest.approx(math.log(math.e + math.e ** 2 + math.e ** 3), rel=1e-6)


def test_count_nonzero():
    x = hp.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])
    r = hp.count_nonzero(x)
    assert r.dtype == hp.int64 and r.item() == 3
    assert hp.count_nonzero(x, dim=0).tolist() == [0, 1, 2] and hp.count_nonzero(x, dim=(0, 1)).item() == 3
    assert hp.count_nonzero(hp.tensor([True, False, True])).item() == 2


# -- norms -----------------------------------------------------------------------------------------------
ORDS = [2, 1, math.inf, -math.inf, 0, 3, 0.5, 1.5, -1]


@pytest.mark.parametrize("ord", ORDS)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (1, False), ((0, 2), True), (-1, True)])
def test_vector_norm(rng, ord, dim, keepdim):
    a = _distinct(rng, 2, 3, 4)
    axis = tuple(range(3)) if dim is None else (dim if isinstance(dim, tuple) else (dim,))
    ax = np.abs(a)
    if ord == 0:
        ref = (a != 0).sum(axis=axis, keepdims=True).astype(float)
    elif math.isinf(ord):
        ref = ax.max(axis=axis, keepdims=True) if ord > 0 else ax.min(axis=axis, keepdims=True)
    else:
        ref = (ax ** ord).sum(axis=axis, keepdims=True) ** (1 / ord)
    ref = ref if keepdim else ref.squeeze(axis)
    got = hp.linalg.vector_norm(hp.tensor(a), ord, dim, keepdim)
    assert got.dtype == hp.float64
    np.testing.assert_allclose(_np(got), ref, rtol=1e-12)
    if ord != 0:
        gradcheck(lambda x: hp.linalg.vector_norm(x, ord, dim, keepdim), [a], atol=1e-5)


def test_vector_norm_gradient_at_zero_and_ties():
    x = hp.zeros(3, dtype=hp.float64, requires_grad=True)
    hp.linalg.vector_norm(x).backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]  # PyTorch's subgradient 0 at the 2-norm's kink
    y = hp.tensor([1.0, -3.0, 3.0, 2.0], dtype=hp.float64, requires_grad=True)
    hp.linalg.vector_norm(y, math.inf).backward()
    assert y.grad.tolist() == [0.0, -0.5, 0.5, 0.0]  # ties share the gradient


def test_vector_norm_dtypes():
    x = hp.randn(5)
    assert hp.linalg.vector_norm(x, dtype=hp.float64).dtype == hp.float64
    h = hp.linalg.vector_norm(hp.tensor([3.0, 4.0], dtype=hp.float16))
    assert h.dtype == hp.float16 and h.item() == 5.0
    b = hp.linalg.vector_norm(hp.tensor([3.0, 4.0], dtype=hp.bfloat16))
    assert b.dtype == hp.bfloat16 and b.item() == 5.0
    assert hp.linalg.vector_norm(hp.ones(0)).item() == 0.0


@pytest.mark.parametrize("ord", ["fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf])
@pytest.mark.parametrize("dim", [(-2, -1), (0, 2), (2, 0)])
def test_matrix_norm(rng, ord, dim):
    a = rng.standard_normal((3, 2, 4))
    moved = np.moveaxis(a, dim, (-2, -1))
    ref = np.linalg.norm(moved, ord=ord, axis=(-2, -1))
    got = hp.linalg.matrix_norm(hp.tensor(a), ord, dim)
    np.testing.assert_allclose(_np(got), ref, rtol=1e-10)
    kept = hp.linalg.matrix_norm(hp.tensor(a), ord, dim, keepdim=True)
    np.testing.assert_allclose(_np(kept), np.expand_dims(ref, tuple(sorted(d % 3 for d in dim))), rtol=1e-10)
    gradcheck(lambda x: hp.linalg.matrix_norm(x, ord, dim), [a], atol=1e-5)


def test_svdvals(rng):
    a = rng.standard_normal((2, 4, 3))
    np.testing.assert_allclose(_np(hp.linalg.svdvals(hp.tensor(a))), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    gradcheck(lambda x: hp.linalg.svdvals(x), [a], atol=1e-5)


def test_linalg_norm_dispatch(rng):
    a = rng.standard_normal((3, 4))
    x = hp.tensor(a)
    np.testing.assert_allclose(hp.linalg.norm(x).item(), np.linalg.norm(a), rtol=1e-12)
    np.testing.assert_allclose(hp.linalg.norm(x, 2).item(), np.linalg.norm(a, 2), rtol=1e-12)  # 2-D: matrix norm
    np.testing.assert_allclose(_np(hp.linalg.norm(x, 1, dim=1)), np.abs(a).sum(1), rtol=1e-12)
    np.testing.assert_allclose(hp.linalg.norm(x, "nuc").item(), np.linalg.norm(a, "nuc"), rtol=1e-12)
    np.testing.assert_allclose(hp.linalg.norm(hp.tensor(a[None]), None).item(), np.linalg.norm(a), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.norm(x, math.inf, dim=(1, 0))), np.linalg.norm(a.T, np.inf), rtol=1e-12)
    with pytest.raises(RuntimeError, match="must be 1D or 2D"):
        hp.linalg.norm(hp.ones(2, 2, 2), ord=2)
    with pytest.raises(RuntimeError, match="length 1 or 2"):
        hp.linalg.norm(hp.ones(2, 2, 2), dim=(0, 1, 2))


def test_torch_norm(rng):
    a = rng.standard_normal((2, 3, 4))
    x = hp.tensor(a)
    np.testing.assert_allclose(hp.norm(x).item(), np.sqrt((a * a).sum()), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.norm(x, dim=(1, 2))), np.sqrt((a * a).sum((1, 2))), rtol=1e-12)
    np.testing.assert_allclose(_np(x.norm(1, dim=-1, keepdim=True)), np.abs(a).sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.norm(x, math.inf, 0)), np.abs(a).max(0), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.norm(x, "nuc", dim=(1, 2))), np.linalg.norm(a, "nuc", axis=(1, 2)), rtol=1e-12)
    assert x.float().norm().dtype == hp.float32 and hp.norm(x.float(), dtype=hp.float64).dtype == hp.float64
    gradcheck(lambda t: t.norm(), [a])
    gradcheck(lambda t: hp.norm(t, 3, dim=1), [a], atol=1e-5)
    with pytest.raises(RuntimeError, match="dim must be a 2-tuple"):
        hp.norm(x, "nuc")  # 3-D without dim, as PyTorch
    with pytest.raises(RuntimeError, match="Order abc not supported"):
        hp.norm(x[0], "abc")


def test_norm_errors():
    with pytest.raises(RuntimeError, match="floating point"):
        hp.linalg.vector_norm(hp.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="floating point"):
        hp.norm(hp.tensor([1, 2]))
    with pytest.raises(TypeError, match="'ord' must be a number"):
        hp.linalg.vector_norm(hp.ones(2), "fro")
    with pytest.raises(RuntimeError, match="without narrowing"):
        hp.linalg.vector_norm(hp.ones(2), dtype=hp.float16)
    with pytest.raises(RuntimeError, match="empty tensor"):
        hp.linalg.vector_norm(hp.ones(0), math.inf)
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        hp.linalg.matrix_norm(hp.ones(3))
    with pytest.raises(RuntimeError, match="Order 3 not supported"):
        hp.linalg.matrix_norm(hp.ones(2, 2), 3)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        hp.linalg.vector_norm(hp.ones(2, 2), dim=(0, -2))
    with pytest.raises(IndexError, match="Dimension out of range"):
        hp.linalg.vector_norm(hp.ones(2, 2), dim=2)


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


def test_narrow_and_tensor_split(rng):
    a = rng.standard_normal((3, 7))
    x = hp.tensor(a)
    np.testing.assert_array_equal(_np(hp.narrow(x, 1, 2, 3)), a[:, 2:5])
    np.testing.assert_array_equal(_np(hp.narrow(x, -1, -2, 2)), a[:, 5:])
    np.testing.assert_array_equal(_np(x.narrow(0, hp.tensor(1), 2)), a[1:3])
    gradcheck(lambda t: t.narrow(1, 1, 4), [a])
    assert [p.shape[1] for p in hp.tensor_split(x, 3, dim=1)] == [3, 2, 2]
    assert [p.shape[1] for p in hp.tensor_split(x, [1, 5, 9], dim=1)] == [1, 4, 2, 0]
    assert [p.shape[1] for p in hp.tensor_split(x, [5, 1], dim=1)] == [5, 0, 6]
    assert [p.shape[1] for p in hp.tensor_split(x, hp.tensor([2, 3]), dim=1)] == [2, 1, 4]
    assert [p.shape[0] for p in hp.tensor_split(x, hp.tensor(2))] == [2, 1]
    pieces = hp.tensor_split(x, [2, 4], dim=1)
    for p, r in zip(pieces, np.split(a, [2, 4], axis=1)):
        np.testing.assert_array_equal(_np(p), r)
    gradcheck(lambda t: hp.tensor_split(t, 3, dim=1), [a])
    gradcheck(lambda t: hp.tensor_split(t, [1, 5], dim=1), [a])


# -- products --------------------------------------------------------------------------------------------
def test_dot_mm_bmm_outer(rng):
    v, w = rng.standard_normal(4), rng.standard_normal(4)
    m, n = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    b, c = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))
    np.testing.assert_allclose(hp.dot(hp.tensor(v), hp.tensor(w)).item(), v @ w, rtol=1e-12)
    np.testing.assert_allclose(_np(hp.mm(hp.tensor(m), hp.tensor(n))), m @ n, rtol=1e-12)
    np.testing.assert_allclose(_np(hp.bmm(hp.tensor(b), hp.tensor(c))), b @ c, rtol=1e-12)
    np.testing.assert_allclose(_np(hp.outer(hp.tensor(v), hp.tensor(m[0]))), np.outer(v, m[0]), rtol=1e-12)
    assert hp.outer(hp.ones(2), hp.ones(3, dtype=hp.int64)).dtype == hp.float32  # outer promotes, as PyTorch
    gradcheck(lambda x, y: hp.dot(x, y), [v, w])
    gradcheck(lambda x, y: x.mm(y), [m, n])
    gradcheck(lambda x, y: hp.bmm(x, y), [b, c])
    gradcheck(lambda x, y: hp.outer(x, y), [v, m[0]])


def test_product_errors():
    with pytest.raises(RuntimeError, match="1D tensors expected"):
        hp.dot(hp.ones(2, 2), hp.ones(2, 2))
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.dot(hp.ones(2), hp.ones(2, dtype=hp.float64))
    with pytest.raises(RuntimeError, match="inconsistent tensor size"):
        hp.dot(hp.ones(2), hp.ones(3))
    with pytest.raises(RuntimeError, match="mat2 must be a matrix"):
        hp.mm(hp.ones(2, 2), hp.ones(2))
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.mm(hp.ones(2, 2), hp.ones(2, 2, dtype=hp.float64))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        hp.mm(hp.ones(3, 4), hp.ones(3, 4))
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        hp.bmm(hp.ones(2, 2), hp.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"batch2 tensor to be: \[1, 4\] but got: \[1, 3\]"):
        hp.bmm(hp.ones(1, 3, 4), hp.ones(1, 3, 4))
    with pytest.raises(RuntimeError, match="Expected 1-D argument self"):
        hp.outer(hp.ones(2, 2), hp.ones(2))


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 2)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (1, 4, 5)]),  # a size-1 labelled dim broadcasts
    ("ij,kj", [(3, 4), (2, 4)]),  # implicit output: 'ik'
    ("ii->", [(3, 3)]),  # trace
    ("ii->i", [(3, 3)]),  # diagonal
    ("iij->ji", [(2, 2, 3)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(4,), (4,)]),
    ("ij,j,jk->ik", [(2, 3), (3,), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # ellipsis dims broadcast, aligned from the right
    ("b h i d, b h j d -> b h i j", [(2, 2, 3, 4), (2, 2, 5, 4)]),  # spaces, attention scores
    ("...d,d->...", [(2, 3, 4), (4,)]),
    ("ab,cd->", [(2, 3), (4, 5)]),  # letters only one operand has
    ("bi,bj->bij", [(3, 1), (1, 4)]),
]


@pytest.mark.parametrize("eq,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum(rng, eq, shapes):
    arrays = [rng.standard_normal(s) for s in shapes]
    got = hp.einsum(eq, *[hp.tensor(a) for a in arrays])
    np.testing.assert_allclose(_np(got), np.einsum(eq, *arrays), rtol=1e-10, atol=1e-12)
    gradcheck(lambda *xs: hp.einsum(eq, *xs), arrays)


def test_einsum_list_form_dtypes_and_errors(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    np.testing.assert_allclose(_np(hp.einsum("ij,jk->ik", [hp.tensor(a), hp.tensor(b)])), a @ b, rtol=1e-12)
    i = hp.einsum("i,i->", hp.tensor([1, 2, 3], dtype=hp.int32), hp.tensor([4, 5, 6], dtype=hp.int32))
    assert i.dtype == hp.int32 and i.item() == 32
    h = hp.einsum("ij,jk->ik", hp.tensor(a, dtype=hp.bfloat16), hp.tensor(b, dtype=hp.bfloat16))
    assert h.dtype == hp.bfloat16
    with pytest.raises(RuntimeError, match="subscript j has size 3 for operand 1"):
        hp.einsum("ij,jk->ik", hp.ones(3, 4), hp.ones(3, 4))
    with pytest.raises(RuntimeError, match="expected scalar type"):
        hp.einsum("ij,jk->ik", hp.ones(3, 4), hp.ones(4, 2, dtype=hp.float64))
    with pytest.raises(RuntimeError, match="operand"):
        hp.einsum("ij,jk->ik", hp.ones(3, 4))
    with pytest.raises(RuntimeError, match="number of subscripts"):
        hp.einsum("ij->i", hp.ones(3, 4, 5))
    with pytest.raises(RuntimeError, match="invalid subscript"):
        hp.einsum("i1->i", hp.ones(3, 4))
    with pytest.raises(RuntimeError, match="output subscript k"):
        hp.einsum("ij->k", hp.ones(3, 4))
    with pytest.raises(TypeError, match="equation"):
        hp.einsum(hp.ones(2), [0])


# -- multinomial -----------------------------------------------------------------------------------------
def test_multinomial_with_replacement_frequencies():
    hp.manual_seed(0)
    w = hp.tensor([[1.0, 0.0, 3.0, 6.0], [0.0, 0.0, 0.0, 2.0]])
    s = hp.multinomial(w, 20000, replacement=True)
    assert s.dtype == hp.int64 and s.shape == (2, 20000)
    freq = np.bincount(s[0].numpy(), minlength=4) / 20000
    np.testing.assert_allclose(freq, [0.1, 0.0, 0.3, 0.6], atol=0.015)
    assert (s[1].numpy() == 3).all()
    one = hp.multinomial(hp.tensor([0.5, 0.5]), 7, True)
    assert one.shape == (7,) and set(one.tolist()) <= {0, 1}


def test_multinomial_without_replacement():
    hp.manual_seed(1)
    w = hp.tensor([0.05, 0.0, 0.15, 0.8])
    draws = np.stack([hp.multinomial(w, 3).numpy() for _ in range(3000)])
    assert all(len(set(r)) == 3 and 1 not in r for r in draws.tolist())  # distinct, zero weight never drawn
    np.testing.assert_allclose(np.bincount(draws[:, 0], minlength=4) / 3000, [0.05, 0.0, 0.15, 0.8], atol=0.03)
    assert sorted(hp.multinomial(w, 4).tolist()) == [0, 1, 2, 3]  # a zero weight is drawn only when it must be
    rows = hp.multinomial(hp.rand(5, 6) + 0.1, 6)
    assert rows.shape == (5, 6) and all(sorted(r) == list(range(6)) for r in rows.tolist())
    hp.manual_seed(3)
    a = hp.multinomial(hp.rand(4, 10), 2)
    hp.manual_seed(3)
    assert hp.multinomial(hp.rand(4, 10), 2).tolist() == a.tolist()  # hp.manual_seed makes it reproducible
    g = hp.Generator().manual_seed(5)
    first = hp.multinomial(w, 2, generator=g).tolist()
    assert hp.multinomial(w, 2, generator=g.manual_seed(5)).tolist() == first  # an hp.Generator of its own


def test_multinomial_errors():
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.multinomial(hp.tensor([1, 2]), 1)
    with pytest.raises(RuntimeError, match="element < 0"):
        hp.multinomial(hp.tensor([1.0, -2.0]), 1)
    with pytest.raises(RuntimeError, match="element < 0"):
        hp.multinomial(hp.tensor([1.0, math.nan]), 1)
    with pytest.raises(RuntimeError, match="element < 0"):
        hp.multinomial(hp.tensor([1.0, math.inf]), 1)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        hp.multinomial(hp.tensor([[1.0, 1.0], [0.0, 0.0]]), 1)
    with pytest.raises(RuntimeError, match="1 or 2 dim"):
        hp.multinomial(hp.ones(2, 2, 2), 1)
    with pytest.raises(RuntimeError, match="without replacement"):
        hp.multinomial(hp.ones(2), 3)
    with pytest.raises(RuntimeError, match="n_sample <= 0"):
        hp.multinomial(hp.ones(2), 0)


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


# -- the same ops on every array backend (the simulated CUDA device under HPCFSDP_CUDA_SIM=1) ----------------
DEVICE_CASES = {
    "sort": lambda x: hp.sort(x, 1, descending=True).values * hp.sort(x, 0).indices.float(),
    "topk": lambda x: hp.topk(x, 2).values,
    "cumsum_prod": lambda x: hp.cumsum(x, 1) * hp.prod(x, 0),
    "logsumexp": lambda x: hp.logsumexp(x, 1),
    "norms": lambda x: hp.linalg.vector_norm(x, 3, 1) + hp.linalg.matrix_norm(x, "nuc") + x.norm(),
    "gather": lambda x: x.gather(1, hp.tensor([[0, 0], [2, 1], [3, 3]], device=x.device))
    + x.index_select(1, hp.tensor([1, 1], device=x.device)),
    "einsum": lambda x: hp.einsum("ij,kj->ik", x, x) + hp.einsum("ij->i", x) + hp.einsum("ii->i", x[:, :3]),
    "elementwise": lambda x: hp.cos(x) * hp.sin(x) + hp.erf(x) + hp.exp2(x) + hp.floor(x) * hp.sign(x),
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
    np.testing.assert_allclose(res[1][0], res[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res[1][1], res[0][1], rtol=1e-5, atol=1e-6)


def test_multinomial_and_predicates_on_device(device):
    hp.manual_seed(0)
    w = hp.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]], device=device)
    s = hp.multinomial(w, 50, replacement=True)
    assert s.device.type == device and s.dtype == hp.int64
    assert set(s[0].cpu().tolist()) <= {1, 2} and set(s[1].cpu().tolist()) == {0}
    n = hp.multinomial(w[:1], 2)
    assert sorted(n.cpu().tolist()[0]) == [1, 2]
    x = hp.tensor([1.0, math.inf, math.nan], device=device)
    assert hp.isinf(x).cpu().tolist() == [False, True, False] and hp.count_nonzero(x).item() == 3


def test_amax_amin_over_dim_0():
    # amax(0) once reduced every dim (dim 0 read as "no dims"); the inf matrix norms reduce over dim 0
    x = hp.tensor([[1.0, 5.0], [3.0, 2.0], [0.0, 4.0]])
    assert x.amax(0).tolist() == [3.0, 5.0] and x.amin(0, keepdim=True).tolist() == [[0.0, 2.0]]
    assert x.amax().item() == 5.0 and x.amin(()).item() == 0.0
