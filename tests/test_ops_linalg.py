"""Linear algebra: matmul and products, einsum, norms, diag/trace, cdist, hpcfsdp.linalg's decompositions and solvers."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _distinct, _np, gradcheck, rand

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


def test_diag_diagonal_trace(rng):
    a = rng.standard_normal((3, 4))
    v = rng.standard_normal(3)
    x = hp.tensor(a)
    for k in (-1, 0, 2, 5):
        np.testing.assert_array_equal(_np(hp.diag(x, k)), np.diag(a, k))
        np.testing.assert_array_equal(_np(hp.diag(hp.tensor(v), k)), np.diag(v, k))
        gradcheck(lambda t, k=k: hp.diag(t, k), [a])
        gradcheck(lambda t, k=k: hp.diag(t, k), [v])
    b = rng.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(_np(hp.diagonal(hp.tensor(b), 1, 0, 2)), np.diagonal(b, 1, 0, 2))
    np.testing.assert_array_equal(_np(hp.tensor(b).diagonal(0, -1, -2)), np.diagonal(b, 0, 2, 1))
    gradcheck(lambda t: t.diagonal(-1, 2, 1), [b])
    np.testing.assert_allclose(_np(hp.trace(x)), np.trace(a))
    gradcheck(hp.trace, [a])
    t = hp.trace(hp.arange(6, dtype=hp.int32).reshape(2, 3))
    assert t.dtype == hp.int64 and t.item() == 4
    with pytest.raises(RuntimeError, match="Supports 1D or 2D"):
        hp.diag(hp.ones(2, 2, 2))
    with pytest.raises(RuntimeError, match="expected a matrix"):
        hp.trace(hp.ones(2))
    with pytest.raises(RuntimeError, match="cannot be identical"):
        hp.diagonal(x, 0, 1, -1)


def test_cdist(rng):
    x1, x2 = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 5, 3))
    ref = np.sqrt(((x1[:, :, None] - x2[:, None]) ** 2).sum(-1))
    np.testing.assert_allclose(_np(hp.cdist(hp.tensor(x1), hp.tensor(x2))), ref, rtol=1e-12)
    np.testing.assert_allclose(_np(hp.cdist(hp.tensor(x1[0]), hp.tensor(x2[0]), p=1)),
                               np.abs(x1[0][:, None] - x2[0][None]).sum(-1), rtol=1e-12)
    gradcheck(hp.cdist, [x1, x2])
    same = hp.tensor(x1[0], requires_grad=True)
    hp.cdist(same, same.detach()).sum().backward()  # zero distances on the diagonal: a finite gradient
    assert same.grad.isfinite().all()
    with pytest.raises(RuntimeError, match="same number of columns"):
        hp.cdist(hp.ones(2, 3), hp.ones(2, 4))
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.cdist(hp.ones(2, 3, dtype=hp.int64), hp.ones(2, 3, dtype=hp.int64))


# -- linalg --------------------------------------------------------------------------------------------------------
def _spd(rng, *shape):
    b = rng.standard_normal(shape)
    return b @ np.swapaxes(b, -1, -2) + shape[-1] * np.eye(shape[-1])


def test_det_inv_solve_values_and_grad(rng):
    a = rng.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    b = rng.standard_normal((2, 3, 2))
    A = hp.tensor(a)
    np.testing.assert_allclose(_np(hp.linalg.det(A)), np.linalg.det(a), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.inv(A)), np.linalg.inv(a), rtol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.solve(A, hp.tensor(b))), np.linalg.solve(a, b), rtol=1e-10)
    v = rng.standard_normal((2, 3))
    np.testing.assert_allclose(_np(hp.linalg.solve(A, hp.tensor(v))), np.linalg.solve(a, v[..., None])[..., 0])
    np.testing.assert_allclose(_np(hp.linalg.solve(A, hp.tensor(b.swapaxes(1, 2)), left=False)),
                               np.linalg.solve(a.swapaxes(1, 2), b).swapaxes(1, 2), rtol=1e-10)
    gradcheck(hp.linalg.det, [a])
    gradcheck(hp.linalg.inv, [a])
    gradcheck(hp.linalg.solve, [a, b])
    gradcheck(hp.linalg.solve, [a[0], b])  # A broadcast over B's batch
    gradcheck(hp.linalg.solve, [a, v])


def test_cholesky(rng):
    s = _spd(rng, 2, 3, 3)
    np.testing.assert_allclose(_np(hp.linalg.cholesky(hp.tensor(s))), np.linalg.cholesky(s), rtol=1e-12)
    u = hp.linalg.cholesky(hp.tensor(s), upper=True)
    np.testing.assert_allclose(_np(u), np.linalg.cholesky(s).swapaxes(1, 2), rtol=1e-12)
    sym = lambda b: b @ b.mT + 3 * hp.eye(3, dtype=hp.float64)  # noqa: E731
    b = rng.standard_normal((2, 3, 3))
    gradcheck(lambda t: hp.linalg.cholesky(sym(t)), [b])
    gradcheck(lambda t: hp.linalg.cholesky(sym(t), upper=True), [b])
    with pytest.raises(hp.linalg.LinAlgError, match="positive-definite"):
        hp.linalg.cholesky(-hp.eye(3))


def test_factorizations_forward_only(rng):
    a = rng.standard_normal((4, 3))
    A = hp.tensor(a)
    q, r = hp.linalg.qr(A)
    np.testing.assert_allclose(_np(q @ r), a, atol=1e-12)
    assert q.shape == (4, 3) and hp.linalg.qr(A, mode="complete")[0].shape == (4, 4)
    u, s, vh = hp.linalg.svd(A)
    assert u.shape == (4, 4) and vh.shape == (3, 3)
    u, s, vh = hp.linalg.svd(A, full_matrices=False)
    np.testing.assert_allclose(_np((u * s) @ vh), a, atol=1e-12)
    sp = _spd(rng, 3, 3)
    w, v = hp.linalg.eigh(hp.tensor(sp))
    np.testing.assert_allclose(_np(v @ hp.diag(w) @ v.mT), sp, atol=1e-10)
    assert hp.linalg.matrix_rank(hp.ones(3, 3)).item() == 1 and hp.linalg.matrix_rank(A).dtype == hp.int64
    assert hp.linalg.matrix_rank(hp.tensor(sp), hermitian=True).item() == 3
    np.testing.assert_allclose(_np(hp.linalg.pinv(A)), np.linalg.pinv(a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(hp.linalg.pinv(hp.ones(2, 3))), np.linalg.pinv(np.ones((2, 3))), atol=1e-7)
    x = hp.tensor(a, requires_grad=True)
    with pytest.raises(RuntimeError, match="does not implement the derivative of linalg.svd"):
        hp.linalg.svd(x)[1].sum().backward()


def test_linalg_errors():
    with pytest.raises(RuntimeError, match="square matrices"):
        hp.linalg.inv(hp.ones(2, 3))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        hp.linalg.det(hp.ones(3))
    with pytest.raises(RuntimeError, match="Low precision"):
        hp.linalg.inv(hp.eye(2, dtype=hp.float16))
    with pytest.raises(RuntimeError, match="floating point"):
        hp.linalg.inv(hp.eye(2, dtype=hp.int64))
    with pytest.raises(hp.linalg.LinAlgError):
        hp.linalg.inv(hp.zeros(2, 2))
    with pytest.raises(RuntimeError, match="Incompatible shapes"):
        hp.linalg.solve(hp.eye(2), hp.ones(3, 1))
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.linalg.solve(hp.eye(2), hp.ones(2, dtype=hp.float64))


def test_linear_embedding_and_batched_matmul_with_zero_width_pieces():
    """A DTensor's local piece may have 0 columns (torch.chunk's split); the ops and their gradients keep the
    shapes (reshape(-1, 0) is ambiguous, so the rows are given explicitly)."""
    x = hp.randn(3, 4, 0, requires_grad=True)
    w = hp.randn(5, 0, requires_grad=True)
    y = hp.nn.functional.linear(x, w, hp.zeros(5, requires_grad=True))
    assert tuple(y.shape) == (3, 4, 5) and float(y.abs().sum()) == 0.0
    y.sum().backward()
    assert tuple(x.grad.shape) == (3, 4, 0) and tuple(w.grad.shape) == (5, 0)
    e = hp.randn(7, 0, requires_grad=True)
    out = hp.nn.functional.embedding(hp.tensor([[1, 2], [3, 6]]), e)
    assert tuple(out.shape) == (2, 2, 0)
    out.sum().backward()
    assert tuple(e.grad.shape) == (7, 0)
    a, b = hp.randn(2, 3, 0, requires_grad=True), hp.randn(0, 4, requires_grad=True)
    (a @ b).sum().backward()
    assert tuple(b.grad.shape) == (0, 4) and tuple(a.grad.shape) == (2, 3, 0)


def test_tril_and_triu_are_tensor_methods_and_in_place_as_pytorch():
    a = np.arange(24.0).reshape(2, 3, 4)
    t = hp.tensor(a, requires_grad=True)
    for d in (-1, 0, 2):
        np.testing.assert_array_equal(t.tril(d).detach().numpy(), np.tril(a, d))
        np.testing.assert_array_equal(t.triu(diagonal=d).detach().numpy(), np.triu(a, d))
        np.testing.assert_array_equal(hp.tril(t, d).detach().numpy(), np.tril(a, d))
    t.tril(1).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.tril(np.ones_like(a), 1))
    b = hp.tensor(a)
    assert b.triu_(1) is b
    np.testing.assert_array_equal(b.numpy(), np.triu(a, 1))
    c = hp.tensor(a)
    c.tril_()
    np.testing.assert_array_equal(c.numpy(), np.tril(a))


def test_mv_addmv_addr_addbmm_inner(rng):
    m, v, w = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal(3)
    np.testing.assert_allclose(_np(hp.mv(hp.tensor(m), hp.tensor(v))), m @ v, rtol=1e-12)
    gradcheck(lambda x, y: x.mv(y), [m, v])
    np.testing.assert_allclose(_np(hp.addmv(hp.tensor(w), hp.tensor(m), hp.tensor(v), beta=2, alpha=3)),
                               2 * w + 3 * (m @ v), rtol=1e-12)
    gradcheck(lambda i, x, y: hp.addmv(i, x, y, beta=0.5), [w, m, v])
    np.testing.assert_allclose(_np(hp.addr(hp.tensor(m), hp.tensor(w), hp.tensor(v), alpha=2)),
                               m + 2 * np.outer(w, v), rtol=1e-12)
    gradcheck(lambda i, x, y: hp.addr(i, x, y), [m, w, v])
    np.testing.assert_array_equal(_np(hp.ger(hp.tensor(w), hp.tensor(v))), np.outer(w, v))
    b1, b2, c = rng.standard_normal((5, 3, 2)), rng.standard_normal((5, 2, 4)), rng.standard_normal((3, 4))
    np.testing.assert_allclose(_np(hp.addbmm(hp.tensor(c), hp.tensor(b1), hp.tensor(b2), beta=0.5)),
                               0.5 * c + np.einsum("bij,bjk->ik", b1, b2), rtol=1e-12)
    gradcheck(lambda i, x, y: hp.addbmm(i, x, y), [c, b1, b2])
    x, y = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4))
    np.testing.assert_allclose(_np(hp.inner(hp.tensor(x), hp.tensor(y))), np.inner(x, y), rtol=1e-12)
    gradcheck(lambda p, q: hp.inner(p, q), [x, y])
    assert hp.inner(hp.ones(3), hp.ones(3)).item() == 3.0 and hp.inner(hp.tensor(2.0), hp.ones(2)).tolist() == [2, 2]
    with pytest.raises(RuntimeError, match="size mismatch"):
        hp.mv(hp.ones(2, 3), hp.ones(2))
    with pytest.raises(RuntimeError, match="vector expected"):
        hp.mv(hp.ones(2, 3), hp.ones(3, 1))
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.addmv(hp.ones(2, dtype=hp.float64), hp.ones(2, 3), hp.ones(3))
    with pytest.raises(RuntimeError, match="last dimension must match"):
        hp.inner(hp.ones(2, 3), hp.ones(2))


def test_inplace_products(rng):
    m, a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 2)), rng.standard_normal((2, 4))
    t = hp.tensor(m)
    assert t.addmm_(hp.tensor(a), hp.tensor(b), alpha=2) is t
    np.testing.assert_allclose(_np(t), m + 2 * a @ b, rtol=1e-12)
    v = hp.tensor([1.0, 2.0])
    v.addmv_(hp.ones(2, 3), hp.ones(3), beta=0)
    assert v.tolist() == [3.0, 3.0]
    z = hp.zeros(2, 3)
    assert z.addr_(hp.ones(2), hp.arange(3.0)).tolist() == [[0.0, 1.0, 2.0]] * 2
    assert hp.zeros(2, 2).addbmm_(hp.ones(4, 2, 3), hp.ones(4, 3, 2)).tolist() == [[12.0, 12.0]] * 2
    assert hp.zeros(4, 2, 2).baddbmm_(hp.ones(4, 2, 3), hp.ones(4, 3, 2)).sum().item() == 4 * 4 * 3
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        hp.zeros(1, 3).addr_(hp.ones(2), hp.ones(3))  # the result (2, 3) does not fit self
