"""torch.linalg: norms (vector_norm, matrix_norm, norm, svdvals), cross, vander, det, inv, solve and cholesky (differentiable) and
the factorizations qr, svd, eigh, matrix_rank and pinv (forward-only: their backward raises)."""
import numpy as np

from ._array import dtype_category
from ._tensor import Tensor
from ._tensor_methods.linalg import matrix_norm, svdvals, vector_norm
from ._tensor_methods.products import linalg_cross as cross
from .autograd import ops

__all__ = ["vector_norm", "matrix_norm", "norm", "svdvals", "cross", "vander", "det", "inv", "solve", "cholesky", "qr", "svd", "eigh",
           "matrix_rank", "pinv", "LinAlgError"]


class LinAlgError(RuntimeError):
    """A linear-algebra routine failed (a singular or not positive-definite input), as torch.linalg.LinAlgError."""


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.norm: a vector norm for an int ``dim`` (or no ord and no dim: A flattened), a matrix norm for
    a 2-tuple ``dim``, a string ``ord`` or a 2-D ``A`` with ``ord`` given."""
    dims = None
    if dim is not None:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        if len(dims) not in (1, 2):
            raise RuntimeError(f"linalg.norm: If dim is specified, it must be of length 1 or 2. Got {list(dims)}")
    elif ord is not None and A.ndim not in (1, 2):
        raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. "
                           f"Got {A.ndim}D.")
    if isinstance(ord, str) or (dims is not None and len(dims) == 2) or (dims is None and ord is not None
                                                                         and A.ndim == 2):
        return matrix_norm(A, "fro" if ord is None else ord, (-2, -1) if dims is None else dims, keepdim,
                           dtype=dtype)
    return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)


def _matrices(A, fn, square=True):
    """Check A is a float32/float64 (batch of) matrices (square ones for ``square``)."""
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg.{fn}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.{fn}: The input tensor A must have at least 2 dimensions.")
    if square and A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"linalg.{fn}: A must be batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")
    if dtype_category(A._data.dtype) != 2:
        raise RuntimeError(f"linalg.{fn}: Expected a floating point or complex tensor as input. Got {A.dtype}")
    if A._data.dtype.itemsize < 4:
        raise RuntimeError(f"linalg.{fn}: Low precision dtypes not supported. Got {A.dtype}")
    return A


def _run(fn, op, *args):
    """op.apply(*args), a singular input (NumPy's LinAlgError) raised as LinAlgError naming ``fn``."""
    try:
        return op.apply(*args)
    except np.linalg.LinAlgError as e:
        raise LinAlgError(f"linalg.{fn}: {e}") from None


def det(A):
    """The determinant of each square matrix of A (..., n, n); gradient det(A) A^-T (A invertible)."""
    return _run("det", ops.Det, _matrices(A, "det"))


def inv(A):
    """The inverse of each square matrix of A; LinAlgError for a singular one (NumPy inputs)."""
    return _run("inv", ops.Inv, _matrices(A, "inv"))


def solve(A, B, *, left=True):
    """X with A X = B (left=True) or X A = B; B a (batch of) matrices or a vector (..., n)."""
    _matrices(A, "solve")
    if not isinstance(B, Tensor):
        raise TypeError(f"linalg.solve(): argument 'B' must be Tensor, not {type(B).__name__}")
    if B.dtype != A.dtype:
        raise RuntimeError(f"linalg.solve: Expected A and B to have the same dtype, but found A of type {A.dtype} "
                           f"and B of type {B.dtype} instead")
    if not left:
        return solve(A.mT, B.mT).mT
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and tuple(B.shape) == tuple(A.shape[:-1]))
    Bm = B.unsqueeze(-1) if vector else B
    if Bm.shape[-2] != A.shape[-1]:
        raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation AX = B "
                           f"({A.shape[-2]}x{A.shape[-1]} and {Bm.shape[-2]}x{Bm.shape[-1]})")
    X = _run("solve", ops.Solve, A, Bm)
    return X.squeeze(-1) if vector else X


def cholesky(A, *, upper=False):
    """L with A = L L^T (or U = L^T with upper=True) for symmetric positive-definite A (its lower triangle is
    read); differentiable."""
    _matrices(A, "cholesky")
    try:
        return ops.Cholesky.apply(A, upper)
    except RuntimeError as e:
        raise LinAlgError(str(e)) from None


def _forward_only(name, fn, A):
    return _run(name, ops.ForwardOnly, A, f"linalg.{name}", fn)


def qr(A, mode="reduced"):
    """(Q, R) of A (..., m, n); mode 'reduced' or 'complete' ('r': Q is empty). Forward-only."""
    _matrices(A, "qr", square=False)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', "
                           f"or 'complete'")
    xp = A._xp()
    if mode == "r":
        r = _forward_only("qr", lambda a: xp.linalg.qr(a, mode="r"), A)
        return Tensor._wrap(xp.zeros((0,), dtype=A._data.dtype)), r
    return _forward_only("qr", lambda a: tuple(xp.linalg.qr(a, mode=mode)), A)


def svd(A, full_matrices=True, *, driver=None):
    """(U, S, Vh) with A = U diag(S) Vh, S descending; full_matrices=False gives the reduced U and Vh.
    Forward-only (``svdvals`` is differentiable)."""
    _matrices(A, "svd", square=False)
    xp = A._xp()
    return _forward_only("svd", lambda a: tuple(xp.linalg.svd(a, full_matrices=full_matrices)), A)


def eigh(A, UPLO="L"):
    """(eigenvalues ascending, eigenvectors as columns) of symmetric A, reading its UPLO triangle. Forward-only."""
    _matrices(A, "eigh")
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    xp = A._xp()
    return _forward_only("eigh", lambda a: tuple(xp.linalg.eigh(a, UPLO=UPLO)), A)


def _tol(s, A, atol, rtol):
    """The singular-value threshold max(atol, rtol * s_max), rtol defaulting to eps * max(m, n) without atol."""
    eps = np.finfo(A._data.dtype).eps
    if rtol is None:
        rtol = eps * max(A.shape[-2:]) if atol is None or atol == 0 else 0.0
    smax = s.max(axis=-1, keepdims=True) if s.shape[-1] else s.sum(axis=-1, keepdims=True)
    return s.dtype.type(max(float(atol or 0.0), 0.0)) if rtol == 0 else A._xp().maximum(atol or 0.0, rtol * smax)


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    """The number of singular values above max(atol, rtol * largest) for each matrix of A (int64)."""
    _matrices(A, "matrix_rank", square=hermitian)
    xp = A._xp()
    a = A._data
    s = xp.abs(xp.linalg.eigvalsh(a)) if hermitian else xp.linalg.svd(a, compute_uv=False)
    return Tensor._wrap((s > _tol(s, A, atol, rtol)).sum(axis=-1).astype(np.int64))


def pinv(A, *, atol=None, rtol=None, hermitian=False):
    """The Moore-Penrose pseudo-inverse of each matrix of A (..., m, n) -> (..., n, m), singular values at or
    below max(atol, rtol * largest) dropped. Forward-only."""
    _matrices(A, "pinv", square=hermitian)
    xp = A._xp()

    def fn(a):
        u, s, vh = xp.linalg.svd(a, full_matrices=False)
        keep = s > _tol(s, A, atol, rtol)
        s_inv = xp.where(keep, 1 / xp.where(keep, s, 1), 0)
        return xp.swapaxes(vh, -1, -2) @ (s_inv[..., :, None] * xp.swapaxes(u, -1, -2))

    return _forward_only("pinv", fn, A)


def vander(x, *, N=None):  # noqa: N803
    """torch.linalg.vander: the Vandermonde matrix of ``x`` (..., n) in increasing powers, (..., n, N), N = n by
    default (N > 1); differentiable (products of x)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.vander(): argument 'x' must be Tensor, not {type(x).__name__}")
    if x._data.dtype == np.bool_:
        raise RuntimeError("linalg.vander supports floating point, complex, and integer tensors, but got Bool")
    n = (x.shape[-1] if x.ndim else 1) if N is None else int(N)
    if n <= 1:
        raise RuntimeError("N must be greater than 1.")
    if dtype_category(x._data.dtype) < 2:
        x = x.to(np.int64)
    cols = [x.new_ones(x.shape)]
    for _ in range(n - 1):
        cols.append(cols[-1] * x)
    return ops.Stack.apply(x.ndim, *cols)
