"""Determinants, inverses, solves, factorizations and matrix functions, of the linear-algebra family: the bodies of
torch.linalg's det, slogdet, inv, inv_ex, solve, cholesky, cholesky_ex, qr, svd, eigh, matrix_rank, pinv,
matrix_power and matrix_exp (hpcfsdp/linalg.py re-exports them), and the torch-level ops on top of them
(hp.det, hp.logdet, hp.slogdet, hp.inverse, hp.pinverse, hp.matrix_power, hp.matrix_exp, PyTorch's older hp.svd,
hp.qr and hp.cholesky, hp.chain_matmul) with their Tensor methods. det, slogdet, inv, solve and cholesky are
differentiable Functions, matrix_power and matrix_exp compositions of matmuls; the factorizations qr, svd, eigh and
pinv are forward-only (their backward raises). hpcfsdp/_tensor_methods/linalg.py loads this module before it makes
the family's mixin."""
import collections
import operator
import warnings

import numpy as np

from .._array import dtype_category
from .._registry import function_op, op
from ..autograd import ops
from ._common import TensorBase, _tensor_arg, _wrap_array

__all__ = ["LinAlgError", "det", "slogdet", "inv", "inv_ex", "solve", "cholesky", "cholesky_ex", "qr", "svd",
           "eigh", "matrix_rank", "pinv", "matrix_power", "matrix_exp", "Slogdet", "Svd", "Qr", "Eigh", "SvdOld",
           "InvEx", "CholeskyEx"]

# torch.return_types: tuples with named fields
Slogdet = collections.namedtuple("slogdet", ["sign", "logabsdet"])
SvdOld = collections.namedtuple("svd", ["U", "S", "V"])  # torch.svd's (V, not Vh)
Svd = collections.namedtuple("linalg_svd", ["U", "S", "Vh"])
Qr = collections.namedtuple("qr", ["Q", "R"])
Eigh = collections.namedtuple("linalg_eigh", ["eigenvalues", "eigenvectors"])
InvEx = collections.namedtuple("linalg_inv_ex", ["inverse", "info"])
CholeskyEx = collections.namedtuple("linalg_cholesky_ex", ["L", "info"])


class LinAlgError(RuntimeError):
    """A linear-algebra routine failed (a singular or not positive-definite input), as torch.linalg.LinAlgError."""


def _matrices(A, fn, square=True):
    """Check A is a float32/float64 (batch of) matrices (square ones for ``square``)."""
    if not isinstance(A, TensorBase):
        raise TypeError(f"linalg.{fn}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.{fn}: The input tensor A must have at least 2 dimensions.")
    if square and A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"linalg.{fn}: A must be batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")
    if dtype_category(A._data.dtype) != 2:
        raise RuntimeError(f"linalg.{fn}: Expected a floating point or complex tensor as input. Got "
                           f"{_torch_name(A)}")
    if A._data.dtype.itemsize < 4:
        raise RuntimeError(f"linalg.{fn}: Low precision dtypes not supported. Got {A.dtype}")
    return A


_SCALAR_NAMES = {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def _torch_name(t):
    return _SCALAR_NAMES.get(str(t._data.dtype), str(t.dtype))


def _run(fn, op, *args):
    """op.apply(*args), a singular input (NumPy's LinAlgError) raised as LinAlgError naming ``fn``."""
    try:
        return op.apply(*args)
    except np.linalg.LinAlgError as e:
        raise LinAlgError(f"linalg.{fn}: {e}") from None


def det(A):
    """The determinant of each square matrix of A (..., n, n); gradient det(A) A^-T (A invertible)."""
    return _run("det", ops.Det, _matrices(A, "det"))


def slogdet(A):
    """(sign, logabsdet) of each square matrix of A: det(A) = sign * exp(logabsdet), without over- or underflow
    (sign 0 and logabsdet -inf for a singular one); logabsdet's gradient is A^-T."""
    return Slogdet(*_run("slogdet", ops.Slogdet, _matrices(A, "slogdet")))


def inv(A):
    """The inverse of each square matrix of A; LinAlgError for a singular one (NumPy inputs)."""
    return _run("inv", ops.Inv, _matrices(A, "inv"))


def _per_matrix_info(A, ok):
    """An int32 tensor of A's batch shape: ``ok(matrix)`` (0, or LAPACK's positive code) for each matrix of A."""
    a = A._data
    flat = a.reshape((-1,) + a.shape[-2:])
    xp = A._xp()
    info = [ok(flat[i]) for i in range(flat.shape[0])]
    return A._wrap(xp.asarray(np.array(info, dtype=np.int32).reshape(a.shape[:-2])))


def inv_ex(A, *, check_errors=False):
    """(inverse, info): the inverse without raising for a singular matrix; info (int32, per matrix) 0 where it is
    invertible, else positive (hpcfsdp's code is the matrix's rank + 1, LAPACK's the first zero pivot), and that
    matrix's inverse NaN. ``check_errors=True`` raises as inv does."""
    _matrices(A, "inv_ex")
    xp = A._xp()

    def ok(m):
        try:
            xp.linalg.inv(m)
            return 0
        except np.linalg.LinAlgError:
            return int(xp.linalg.matrix_rank(m)) + 1

    info = _per_matrix_info(A, ok)
    if check_errors and bool((info._data != 0).any()):
        raise LinAlgError("linalg.inv_ex: The diagonal element of the factorization is zero, the inversion could "
                          "not be completed because the input matrix is singular.")
    if not bool((info._data != 0).any()):
        return InvEx(inv(A), info)
    bad = (info._data != 0)[..., None, None]
    safe = A._wrap(xp.where(bad, xp.eye(A.shape[-1], dtype=A._data.dtype), A._data))
    out = inv(safe).masked_fill(A._wrap(xp.broadcast_to(bad, A.shape)), float("nan"))
    return InvEx(out, info)


def solve(A, B, *, left=True):
    """X with A X = B (left=True) or X A = B; B a (batch of) matrices or a vector (..., n)."""
    _matrices(A, "solve")
    if not isinstance(B, TensorBase):
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


def cholesky_ex(A, *, upper=False, check_errors=False):
    """(L, info): the Cholesky factor without raising; info (int32, per matrix) 0 where A is positive-definite,
    else the order of its first leading minor that is not (LAPACK's), and that matrix's L zero."""
    _matrices(A, "cholesky_ex")
    xp = A._xp()

    def ok(m):
        for k in range(1, m.shape[-1] + 1):
            try:
                xp.linalg.cholesky(m[:k, :k])
            except np.linalg.LinAlgError:
                return k
        return 0

    info = _per_matrix_info(A, ok)
    bad = info._data != 0
    if check_errors and bool(bad.any()):
        raise LinAlgError("linalg.cholesky_ex: The factorization could not be completed because the input is not "
                          "positive-definite.")
    if not bool(bad.any()):
        return CholeskyEx(cholesky(A, upper=upper), info)
    mask = A._wrap(xp.broadcast_to(bad[..., None, None], A.shape))
    safe = A.masked_fill(mask, 0.0) + A._wrap(xp.where(bad[..., None, None], xp.eye(A.shape[-1], dtype=A._data.dtype),
                                                      0).astype(A._data.dtype))
    return CholeskyEx(cholesky(safe, upper=upper).masked_fill(mask, 0.0), info)


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
        return Qr(_wrap_array(xp.zeros((0,), dtype=A._data.dtype)), r)
    return Qr(*_forward_only("qr", lambda a: tuple(xp.linalg.qr(a, mode=mode)), A))


def svd(A, full_matrices=True, *, driver=None):
    """(U, S, Vh) with A = U diag(S) Vh, S descending; full_matrices=False gives the reduced U and Vh.
    Forward-only (``svdvals`` is differentiable)."""
    _matrices(A, "svd", square=False)
    xp = A._xp()
    return Svd(*_forward_only("svd", lambda a: tuple(xp.linalg.svd(a, full_matrices=full_matrices)), A))


def eigh(A, UPLO="L"):
    """(eigenvalues ascending, eigenvectors as columns) of symmetric A, reading its UPLO triangle. Forward-only."""
    _matrices(A, "eigh")
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    xp = A._xp()
    return Eigh(*_forward_only("eigh", lambda a: tuple(xp.linalg.eigh(a, UPLO=UPLO)), A))


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
    return _wrap_array((s > _tol(s, A, atol, rtol)).sum(axis=-1).astype(np.int64))


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


def _identity_like(A):
    xp = A._xp()
    eye = xp.eye(A.shape[-1], dtype=A._data.dtype)
    return A._wrap(xp.ascontiguousarray(xp.broadcast_to(eye, A.shape)))


def matrix_power(A, n):
    """A to the integer power ``n`` for each square matrix of A (any dtype for n >= 0; the identity for n = 0;
    the inverse's power for n < 0, floating A only); differentiable (repeated squaring by matmul)."""
    if not isinstance(A, TensorBase):
        raise TypeError(f"linalg.matrix_power(): argument 'A' must be Tensor, not {type(A).__name__}")
    n = operator.index(n)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"linalg.matrix_power: A must be batches of square matrices, but they are "
                           f"{'x'.join(str(s) for s in A.shape[-2:])} matrices" if A.ndim >= 2 else
                           "linalg.matrix_power: The input tensor A must have at least 2 dimensions.")
    if n == 0:
        return _identity_like(A)
    if n == 1:
        return A.clone()
    if n < 0:
        A, n = inv(A), -n
    out, base = None, A
    while n:
        if n & 1:
            out = base if out is None else out.matmul(base)
        n >>= 1
        if n:
            base = base.matmul(base)
    return out


def matrix_exp(A):
    """exp(A) = sum A^k / k! for each square matrix of A, by scaling and squaring: A / 2^s (s so its 1-norm is at
    most 1/2) in a degree-18 Taylor polynomial (Horner's scheme), squared s times; differentiable (matmuls)."""
    _matrices(A, "matrix_exp")
    xp = A._xp()
    if A.shape[-1] == 0 or A.numel() == 0:
        return A.clone()
    norm1 = float(xp.abs(A._data).sum(axis=-2).max())
    s = max(0, int(np.ceil(np.log2(norm1 / 0.5)))) if norm1 > 0.5 and np.isfinite(norm1) else 0
    X = A / float(2 ** s) if s else A
    eye = _identity_like(A)
    out = eye
    for k in range(18, 0, -1):
        out = eye + X.matmul(out) / float(k)
    for _ in range(s):
        out = out.matmul(out)
    return out


# -- the torch-level ops and their Tensor methods (the same bodies as torch.linalg's above) ---------------
op("linalg", name="det", function=True, functions=(ops.Det,))(det)
op("linalg", name="slogdet", function=True, functions=(ops.Slogdet,))(slogdet)
op("linalg", name="inverse", function=True, functions=(ops.Inv,))(inv)
op("linalg", name="matrix_power", function=True)(matrix_power)
op("linalg", name="matrix_exp", function=True)(matrix_exp)


@op("linalg", function=True, functions=(ops.Slogdet,))
def logdet(self):
    """log(det(A)) for each square matrix of A: NaN where det < 0, -inf where it is 0; differentiable."""
    sign, logabs = slogdet(self)
    return logabs.masked_fill(sign < 0, float("nan"))  # sign 0: logabs is already -inf


@op("linalg", function=True, functions=(ops.ForwardOnly,))
def pinverse(self, rcond=1e-15):
    """torch.pinverse: linalg.pinv with singular values at or below ``rcond`` times the largest dropped."""
    return pinv(self, rtol=rcond)


@op("linalg", name="cholesky", function=True, functions=(ops.Cholesky,))
def _cholesky(self, upper=False):
    """torch.cholesky (deprecated in PyTorch, warns as it does): linalg.cholesky, U = L^T with ``upper``."""
    warnings.warn("torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in a future "
                  "PyTorch release.", UserWarning, stacklevel=3)
    return cholesky(self, upper=upper)


@op("linalg", name="qr", function=True, functions=(ops.ForwardOnly,))
def _qr(self, some=True):
    """torch.qr (deprecated in PyTorch, warns as it does): linalg.qr, reduced (``some``) or complete."""
    warnings.warn("torch.qr is deprecated in favor of torch.linalg.qr and will be removed in a future PyTorch "
                  "release.", UserWarning, stacklevel=3)
    return qr(self, "reduced" if some else "complete")


@op("linalg", name="svd", function=True, functions=(ops.ForwardOnly,))
def _svd(self, some=True, compute_uv=True):
    """PyTorch's older torch.svd: (U, S, V) with A = U diag(S) V^T (V, not linalg.svd's Vh), reduced with
    ``some``; without ``compute_uv`` U and V are zero-filled (full size). Forward-only."""
    if not compute_uv:
        xp = self._xp()
        s = _forward_only("svd", lambda a: xp.linalg.svd(a, compute_uv=False), self)
        m, n = self.shape[-2:]
        batch = tuple(self.shape[:-2])
        return SvdOld(self._wrap(xp.zeros(batch + (m, m), dtype=self._data.dtype)), s,
                      self._wrap(xp.zeros(batch + (n, n), dtype=self._data.dtype)))
    u, s, vh = svd(self, full_matrices=not some)
    return SvdOld(u, s, vh.mT)


@function_op("linalg")
def chain_matmul(*matrices, out=None):
    """The product of the 2-D matrices in order (deprecated in PyTorch for linalg.multi_dot, warns as it does);
    differentiable."""
    warnings.warn("torch.chain_matmul is deprecated and will be removed in a future PyTorch release. Use "
                  "torch.linalg.multi_dot instead.", UserWarning, stacklevel=3)
    if out is not None:
        raise TypeError("chain_matmul(): out= is not supported by hpcfsdp")
    if not matrices:
        raise RuntimeError("chain_matmul(): Expected one or more matrices")
    for i, m in enumerate(matrices):
        _tensor_arg(m, "chain_matmul", f"matrices[{i}]")
        if m.ndim != 2:
            raise RuntimeError(f"Tensor dimension is {m.ndim}, expected 2 instead.")
    if len(matrices) == 1:
        return matrices[0].clone()
    out = matrices[0]
    for m in matrices[1:]:
        out = out.matmul(m)
    return out
