"""Linear algebra: matmul and its operators, mm/bmm/dot/outer, addmm/baddbmm, einsum, norms (with the vector and
matrix norms and svdvals that hpcfsdp.linalg exposes), cdist, and the matrix structure ops diag, diagonal, trace,
tril and triu; products.py adds kron, cross and vander."""
import math
import operator

import numpy as np

from .. import _backend
from .._array import dtype_category, promote_types, wrap_dim
from .._registry import function_op, mixin, op
from ..autograd import ops
from ..autograd.ops._common import _axes
from ._common import (FP32, LOWER, TensorBase, _as_operand, _assign_result, _integral_to_int64, _promote_operands,
                      _tensor_arg, autocast_op)

__all__ = ["LinalgMixin", "vector_norm", "matrix_norm", "svdvals"]


# -- products ----------------------------------------------------------------------------------------------
@op("linalg", name="matmul", aliases=("__matmul__",), function=True, functions=(ops.Matmul,))
@autocast_op(cpu=LOWER, cuda=LOWER)
def __matmul__(self, other):
    if not isinstance(other, TensorBase):
        other = _as_operand(other, self)
    a, b = _promote_operands(self, other, "matmul")
    return ops.Matmul.apply(a, b)


@op("linalg")
def __rmatmul__(self, other):
    return _as_operand(other, self).__matmul__(self)


@op("linalg", function=True)
def dot(self, other):
    _tensor_arg(other, "dot", "tensor")
    if self.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {self.ndim}D and {other.ndim}D tensors")
    if self.dtype != other.dtype:
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {self.dtype} and "
                           f"{other.dtype}")
    if self.shape[0] != other.shape[0]:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{self.shape[0]}] and src "
                           f"[{other.shape[0]}] to have the same number of elements")
    return self.matmul(other)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def mm(self, mat2):
    _tensor_arg(mat2, "mm", "mat2")
    if self.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"{'self' if self.ndim != 2 else 'mat2'} must be a matrix (got {self.ndim}-D and "
                           f"{mat2.ndim}-D tensors)")
    if self.dtype != mat2.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {self.dtype} != {mat2.dtype}")
    return self.matmul(mat2)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def bmm(self, mat2):
    _tensor_arg(mat2, "bmm", "mat2")
    for name, t in (("batch1", self), ("batch2", mat2)):
        if t.ndim != 3:
            raise RuntimeError(f"{name} must be a 3D tensor, got {t.ndim}-D")
    if self.dtype != mat2.dtype:
        raise RuntimeError(f"expected scalar type {self.dtype} but found {mat2.dtype}")
    (b, _, k), (b2, k2, _) = self.shape, mat2.shape
    if (b2, k2) != (b, k):
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{b}, {k}] but got: "
                           f"[{b2}, {k2}].")
    return self.matmul(mat2)


@op("linalg", aliases=("ger",), function=True, function_aliases=("ger",))
def outer(self, vec2):
    _tensor_arg(vec2, "outer", "vec2")
    for name, t in (("self", self), ("vec2", vec2)):
        if t.ndim != 1:
            raise RuntimeError(f"outer: Expected 1-D argument {name}, but got {t.ndim}-D")
    return self.unsqueeze(1) * vec2.unsqueeze(0)


def _scaled_add(inp, prod, beta, alpha):
    """beta * inp + alpha * prod; beta 0 ignores inp (its NaN and inf do not propagate), as PyTorch."""
    _tensor_arg(inp, "addmm", "input")
    if inp.dtype != prod.dtype:
        raise RuntimeError(f"expected scalar type {prod.dtype} but found {inp.dtype}")
    scaled = prod if alpha == 1 else prod * alpha
    if beta == 0:  # a mask of all True: the value 0 and a zero gradient
        return scaled + inp.masked_fill(inp._wrap(inp._xp().ones(inp._data.shape, dtype=bool)), 0)
    return scaled + (inp if beta == 1 else inp * beta)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    _tensor_arg(mat1, "addmm", "mat1")
    if mat1.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"addmm: mat1 and mat2 must be matrices, got {mat1.ndim}-D and {mat2.ndim}-D")
    return _scaled_add(self, mat1.mm(mat2), beta, alpha)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    _tensor_arg(batch1, "baddbmm", "batch1")
    return _scaled_add(self, batch1.bmm(batch2), beta, alpha)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def mv(self, vec):
    """Matrix (n, m) times vector (m,)."""
    _tensor_arg(vec, "mv", "vec")
    if self.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"vector + matrix @ vector expected, got {self.ndim}, {vec.ndim}")
    if self.shape[1] != vec.shape[0]:
        raise RuntimeError(f"size mismatch, got input ({self.shape[0]}), mat ({self.shape[0]}x{self.shape[1]}), "
                           f"vec ({vec.shape[0]})")
    if self.dtype != vec.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {self.dtype} != {vec.dtype}")
    return self.matmul(vec)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    """beta * self + alpha * (mat @ vec)."""
    _tensor_arg(mat, "addmv", "mat")
    if not (self.dtype == mat.dtype == vec.dtype):
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got {self.dtype}, {mat.dtype}, and "
                           f"{vec.dtype}")
    return _scaled_add(self, mat.mv(vec), beta, alpha)


@op("linalg", function=True)
def addr(self, vec1, vec2, *, beta=1, alpha=1):
    """beta * self + alpha * outer(vec1, vec2)."""
    _tensor_arg(vec1, "addr", "vec1")
    return _scaled_add(self, vec1.outer(vec2), beta, alpha)


@op("linalg", function=True)
@autocast_op(cpu=LOWER, cuda=LOWER)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """beta * self + alpha * sum_i batch1[i] @ batch2[i]."""
    _tensor_arg(batch1, "addbmm", "batch1")
    return _scaled_add(self, batch1.bmm(batch2).sum(0), beta, alpha)


@op("linalg", function=True)
def inner(self, other):
    """The sum over the last dims of self and other of their products: shape self.shape[:-1] + other.shape[:-1]
    (a product for a 0-D operand)."""
    _tensor_arg(other, "inner", "other")
    if self.ndim == 0 or other.ndim == 0:
        return self * other
    if self.shape[-1] != other.shape[-1]:
        raise RuntimeError(f"inner() the last dimension must match on both input tensors but got shapes "
                           f"{list(self.shape)} and {list(other.shape)}")
    return _inner_last(self, other)


def _inner_last(a, b):
    """sum_k a[..., k] b[..., k] over a's and b's leading dims (an outer product over them)."""
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    return a2.matmul(b2.transpose(0, 1)).reshape(tuple(a.shape[:-1]) + tuple(b.shape[:-1]))


def _inplace_product(name):
    def f(self, *args, beta=1, alpha=1):
        return _assign_result(self, getattr(self, name)(*args, beta=beta, alpha=alpha), name + "_")

    f.__name__ = f.__qualname__ = name + "_"
    f.__doc__ = f"In-place {name} (not recorded by autograd); the result must have self's shape."
    return f


for _name in ("addmm", "baddbmm", "addmv", "addr", "addbmm"):
    op("linalg", name=_name + "_")(_inplace_product(_name))


@function_op("linalg", functions=(ops.Einsum,))
@autocast_op(cpu=LOWER, cuda=LOWER)
def einsum(equation, *operands):
    """torch.einsum(equation, *operands) or (equation, [operands]); differentiable in every operand.

    Subscripts are letters, ``...`` broadcasts, size-1 dims broadcast, no '->' sorts the output letters.
    The operands must share one dtype and device, as PyTorch requires.
    """
    if not isinstance(equation, str):
        raise TypeError(f"einsum(): the first argument must be the equation string, got {type(equation).__name__} "
                        f"(the sublist format is not supported)")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    for i, x in enumerate(operands):
        if not isinstance(x, TensorBase):
            raise TypeError(f"einsum(): operand {i} must be a Tensor, not {type(x).__name__}")
        if x.dtype != operands[0].dtype:
            raise RuntimeError(f"einsum(): expected scalar type {operands[0].dtype} but found {x.dtype} (operand {i})")
        if x.device != operands[0].device:
            raise RuntimeError(f"einsum(): expected all operands on one device, found {operands[0].device} and "
                               f"{x.device} (operand {i})")
    return ops.Einsum.apply(equation, *operands)


# -- norms (hpcfsdp.linalg exposes vector_norm, matrix_norm and svdvals) -----------------------------------
def _norm_input(x, dtype, fn):
    if dtype_category(x._data.dtype) != 2:
        raise RuntimeError(f"linalg.{fn}: Expected a floating point or complex tensor as input. Got {x.dtype}")
    if dtype is None:
        return x
    dt = _backend.to_dtype(dtype)
    if dtype_category(dt) != 2 or promote_types(x._data.dtype, dt) != dt:
        raise RuntimeError(f"linalg.{fn}: the dtype of the input ({x.dtype}) should be convertible without "
                           f"narrowing to the specified dtype ({dt})")
    return x.to(dt)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.vector_norm: (sum |x|^ord)^(1/ord) over ``dim`` (None or (): all), inf/-inf/0 included."""
    _tensor_arg(x, "linalg.vector_norm", "x")
    if isinstance(ord, (bool, np.bool_)) or not isinstance(ord, (int, float, np.number)):
        raise TypeError(f"linalg.vector_norm(): argument 'ord' must be a number, not {type(ord).__name__}")
    x = _norm_input(x, dtype, "vector_norm")
    hook = getattr(type(x), "__hp_vector_norm__", None)
    if hook is not None:  # a DTensor: its norm's sharding rule
        return hook(x, float(ord), dim, keepdim)
    axes = _axes(dim, x.ndim)
    ord = float(ord)  # noqa: A001
    if ord < 0 or math.isinf(ord):
        shape = x._data.shape
        n = math.prod(shape) if axes is None else math.prod(shape[a] for a in axes)
        if n == 0:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord:g} norm on an empty tensor because the "
                               f"operation does not have an identity")
    return ops.VectorNorm.apply(x, ord, axes, keepdim)


def svdvals(A, *, driver=None):
    """torch.linalg.svdvals: the singular values of the matrices in the last two dims, descending (``driver``,
    a cuSOLVER choice in PyTorch, is ignored)."""
    _tensor_arg(A, "linalg.svdvals", "A")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.svdvals: The input tensor A must have at least 2 dimensions, got {A.ndim}")
    return ops.Svdvals.apply(_norm_input(A, None, "svdvals"))


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.matrix_norm: 'fro', 'nuc', inf, -inf, 1, -1, 2, -2 over the two dims ``dim``."""
    _tensor_arg(A, "linalg.matrix_norm", "A")
    if A.ndim < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 dimensions.")
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    if len(dims) != 2:
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {' '.join(str(d) for d in dims)}")
    d0, d1 = (wrap_dim(d, A.ndim) for d in dims)
    if d0 == d1:
        raise RuntimeError(f"linalg.matrix_norm: dims must be different. Got ({dims[0]}, {dims[1]})")
    A = _norm_input(A, dtype, "matrix_norm")
    if ord == "fro":
        return vector_norm(A, 2, (d0, d1), keepdim)
    if ord == "nuc" or ord in (2, -2):
        perm = [i for i in range(A.ndim) if i not in (d0, d1)] + [d0, d1]
        s = ops.Svdvals.apply(A.permute(*perm))
        r = s.sum(-1) if ord == "nuc" else (s.amax(-1) if ord == 2 else s.amin(-1))
        if keepdim:
            for d in sorted((d0, d1)):
                r = r.unsqueeze(d)
        return r
    if ord in (1, -1, math.inf, -math.inf):
        summed, reduced = (d0, d1) if abs(ord) == 1 else (d1, d0)  # 1: max column sum; inf: max row sum
        s = A.abs().sum(summed, keepdim=True)
        r = s.amax(reduced, keepdim=True) if ord > 0 else s.amin(reduced, keepdim=True)
        return r if keepdim else r.squeeze((d0, d1))
    raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")


def _norm_function(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):  # noqa: A002
    """torch.norm(input, p='fro', dim=None, keepdim=False, out=None, dtype=None): ``input.norm(p, dim, ...)``."""
    if not isinstance(input, TensorBase):
        raise TypeError(f"norm(): argument 'input' must be Tensor, not {type(input).__name__}")
    if out is not None:
        raise TypeError("norm(): out= is not supported by hpcfsdp; use the returned tensor")
    return input.norm(p, dim, keepdim, dtype=dtype)


_norm_function.__name__ = _norm_function.__qualname__ = "norm"


@op("linalg", function=_norm_function, functions=(ops.VectorNorm, ops.Svdvals))
def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
    """torch.norm: p 'fro' (the 2-norm over ``dim``), 'nuc' or a number (vector norm over ``dim``)."""
    if isinstance(p, str):
        if p == "fro" and (dim is None or isinstance(dim, (int, np.integer)) or len(dim) <= 2):
            return vector_norm(self, 2, dim, keepdim, dtype=dtype)
        return matrix_norm(self, p, tuple(range(self.ndim)) if dim is None else dim, keepdim, dtype=dtype)
    return vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@function_op("linalg")
@autocast_op(cpu=FP32, cuda=FP32)
def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R); differentiable,
    zero gradient where a distance is 0 (as PyTorch's)."""
    _tensor_arg(x1, "cdist", "x1")
    _tensor_arg(x2, "cdist", "x2")
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist only supports at least 2D tensors, X1 got: {x1.ndim}D, X2 got: {x2.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: {x2.shape[-1]}")
    for name, t in (("X1", x1), ("X2", x2)):
        if not t.is_floating_point():
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {t.dtype}")
    if p < 0:
        raise RuntimeError(f"cdist only supports non-negative p values, got {p}")
    return vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, -1)  # (..., P, R, M) -> (..., P, R)


# -- matrix structure --------------------------------------------------------------------------------------
@op("linalg", function=True, functions=(ops.Diagonal,))
def diagonal(self, offset=0, dim1=0, dim2=1):
    d1, d2 = wrap_dim(dim1, self.ndim), wrap_dim(dim2, self.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return ops.Diagonal.apply(self, operator.index(offset), d1, d2)


@op("linalg", function=True, functions=(ops.DiagEmbed,))
def diag(self, diagonal=0):
    if self.ndim == 1:
        return ops.DiagEmbed.apply(self, operator.index(diagonal))
    if self.ndim == 2:
        return self.diagonal(diagonal)
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {self.ndim}D")


@op("linalg", function=True)
def trace(self):
    if self.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {self.ndim}")
    return _integral_to_int64(self.diagonal(), None).sum()


def _outside(xp, tri, shape, diagonal):
    """The mask of what tril/triu zero, broadcast over the batch dims of ``shape``."""
    return xp.broadcast_to(~tri(xp.ones(shape[-2:], dtype=bool), diagonal), shape)


@op("linalg", function=True)
def tril(self, diagonal=0):
    xp = self._xp()
    return self.masked_fill(self._wrap(_outside(xp, xp.tril, self.shape, diagonal)), 0)


@op("linalg")
def tril_(self, diagonal=0):
    xp = self._xp()
    return self.masked_fill_(self._wrap(_outside(xp, xp.tril, self.shape, diagonal)), 0)


@op("linalg", function=True)
def triu(self, diagonal=0):
    xp = self._xp()
    return self.masked_fill(self._wrap(_outside(xp, xp.triu, self.shape, diagonal)), 0)


@op("linalg")
def triu_(self, diagonal=0):
    xp = self._xp()
    return self.masked_fill_(self._wrap(_outside(xp, xp.triu, self.shape, diagonal)), 0)


from . import products  # noqa: E402,F401  (the family's structured products, registered before its mixin is made)
from . import matrix_functions  # noqa: E402,F401  (det, slogdet, inverse, svd, ...: the same)
from . import diagonals  # noqa: E402,F401  (diag_embed, diagflat, fill_diagonal_, renorm, dist, vdot: the same)

LinalgMixin = mixin("linalg")
