"""torch.linalg: norms (vector_norm, matrix_norm, norm, svdvals), cross, vander, det, slogdet, inv, solve, cholesky,
matrix_power and matrix_exp (differentiable), inv_ex and cholesky_ex, and the factorizations qr, svd, eigh,
matrix_rank and pinv (forward-only: their backward raises). The bodies but norm's are the linear-algebra
family's (hpcfsdp/_tensor_methods/linalg.py, products.py and matrix_functions.py)."""
import numpy as _np

from ._tensor_methods.linalg import matrix_norm, svdvals, vector_norm
from ._tensor_methods.matrix_functions import (LinAlgError, cholesky, cholesky_ex, det, eigh, inv, inv_ex, matrix_exp,
                                               matrix_power, matrix_rank, pinv, qr, slogdet, solve, svd)
from ._tensor_methods.products import linalg_cross as cross
from ._tensor_methods.products import linalg_vander as vander

__all__ = ["vector_norm", "matrix_norm", "norm", "svdvals", "cross", "vander", "det", "slogdet", "inv", "inv_ex",
           "solve", "cholesky", "cholesky_ex", "qr", "svd", "eigh", "matrix_rank", "pinv", "matrix_power",
           "matrix_exp", "LinAlgError"]


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """torch.linalg.norm: a vector norm for an int ``dim`` (or no ord and no dim: A flattened), a matrix norm for
    a 2-tuple ``dim``, a string ``ord`` or a 2-D ``A`` with ``ord`` given."""
    dims = None
    if dim is not None:
        dims = (dim,) if isinstance(dim, (int, _np.integer)) else tuple(dim)
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
