"""Batched matrix products on cuBLAS's tensor cores: bfloat16 or half inputs, float32 accumulation, and an output in
the input dtype or in float32 (cublasGemmStridedBatchedEx, which CuPy's matmul does not expose)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["bmm", "supports", "CUDA_R", "CUBLAS_COMPUTE_32F"]

# [Note: Mixed-precision batched GEMM]
# Attention's score matrix S = q k^T must not be rounded to bfloat16 (2**-9 of every logit, which the optimizer
# amplifies: See [Note: Dense attention on the GPU]), yet its inputs are bfloat16 and belong on the tensor
# cores. cuBLAS does both in one call: cublasGemmStridedBatchedEx with A and B in bfloat16, C in float32 and
# compute type CUBLAS_COMPUTE_32F. CuPy 14 binds it (cupy.cuda.cublas.gemmStridedBatchedEx, which sets the
# handle's stream to the current stream itself) but never calls it with mixed types, so this module does.
# cuBLAS is column-major: a row-major (M, N) result C = op_a(A) op_b(B) is the column-major C^T = op_b(B)^T
# op_a(A)^T, so B's memory is cuBLAS's first operand and A's its second, each read as stored (a row-major
# (r, c) matrix is a column-major (c, r) one with leading dimension c). The enum values are cuBLAS's and CUDA's
# (cublas_api.h, library_types.h); alpha and beta are host float32 values (CuPy leaves the handle in
# CUBLAS_POINTER_MODE_HOST, the default, restoring it after its own device-scalar calls). The simulated
# device runs the same call on NumPy from cuBLAS's column-major definition (hpcfsdp/testing/_sim_cublas.py),
# so a transposition mistaken here fails the tests against NumPy's matmul.

CUDA_R = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2,
          np.dtype(ml_dtypes.bfloat16): 14}  # cudaDataType: CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_ONE = np.ones(1, np.float32)  # host scalars cuBLAS reads during the call (kept alive here)
_ZERO = np.zeros(1, np.float32)


def supports(*arrays) -> bool:
    """Whether ``bmm`` takes these operands: one half-precision dtype (bfloat16 or float16), the same batch shape."""
    dt = arrays[0].dtype
    return dt in _HALF and all(a.dtype == dt and a.ndim >= 2 and a.shape[:-2] == arrays[0].shape[:-2]
                               for a in arrays)


def bmm(a, b, trans_a: bool = False, trans_b: bool = False, out_dtype=None, alpha: float = 1.0):
    """``alpha * op(a) @ op(b)`` over the leading (batch) dims, for half-precision CuPy arrays ``a`` and ``b`` of the
    same dtype and batch shape (op transposes the last two dims where asked); the result is C-contiguous, in
    ``out_dtype`` (a's dtype by default, or float32), accumulated in float32. One cuBLAS launch; operands that
    are not C-contiguous are copied first."""
    import cupy  # noqa: PLC0415  (the simulated device where it took the name; only CuPy arrays come here)

    if not supports(a, b):
        raise TypeError(f"bmm: needs two bfloat16 or float16 arrays of one dtype and batch shape, got "
                        f"{a.dtype.name}{list(a.shape)} and {b.dtype.name}{list(b.shape)}")
    out_dtype = np.dtype(a.dtype if out_dtype is None else out_dtype)
    if out_dtype not in (a.dtype, np.dtype(np.float32)):
        raise TypeError(f"bmm: the output is in the inputs' dtype or float32, not {out_dtype.name}")
    a, b = cupy.ascontiguousarray(a), cupy.ascontiguousarray(b)
    M, K = (a.shape[-1], a.shape[-2]) if trans_a else (a.shape[-2], a.shape[-1])
    Kb, N = (b.shape[-1], b.shape[-2]) if trans_b else (b.shape[-2], b.shape[-1])
    if K != Kb:
        raise ValueError(f"bmm: inner dimensions differ ({list(a.shape)}{'^T' if trans_a else ''} @ "
                         f"{list(b.shape)}{'^T' if trans_b else ''})")
    batch = int(np.prod(a.shape[:-2], dtype=np.int64))
    c = cupy.empty(a.shape[:-2] + (M, N), out_dtype)
    if c.size == 0:
        return c
    if K == 0:
        c.fill(0)
        return c
    cublas = cupy.cuda.cublas  # CuPy loads it on first use (module __getattr__: libcublas)
    scale = _ONE if alpha == 1.0 else np.array([alpha], np.float32)
    ab = a.dtype
    cublas.gemmStridedBatchedEx(
        cupy.cuda.get_cublas_handle(), CUBLAS_OP_T if trans_b else CUBLAS_OP_N,
        CUBLAS_OP_T if trans_a else CUBLAS_OP_N, N, M, K, scale.ctypes.data,
        b.data.ptr, CUDA_R[ab], b.shape[-1], b.shape[-1] * b.shape[-2],
        a.data.ptr, CUDA_R[ab], a.shape[-1], a.shape[-1] * a.shape[-2],
        _ZERO.ctypes.data, c.data.ptr, CUDA_R[out_dtype], N, M * N, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
    return c
