"""The simulated ``cupy.cuda.cublas``: the cuBLAS calls hpcfsdp makes directly, from cuBLAS's column-major definition."""
from __future__ import annotations

import ctypes
import types

import ml_dtypes
import numpy as np

from . import _sim_runtime as _rt
from ._sim_buffers import _fail
from ._sim_nccl import _memory

__all__ = ["cublas", "CublasError", "device_handle", "signature"]

# [Note: Simulated cuBLAS]
# hpcfsdp calls one cuBLAS function itself, cublasGemmStridedBatchedEx (hpcfsdp/_kernels/gemm.py: bfloat16 inputs
# with a float32 output, which CuPy's matmul cannot ask for). The simulation computes it from cuBLAS's own
# definition, not from the caller's intent: column-major matrices at raw device pointers with leading
# dimensions and batch strides, op(A) m x k, op(B) k x n, C m x n, C = alpha op(A) op(B) + beta C, so a row-major
# caller that swaps an operand or a transposition computes a wrong product here too. It checks what cuBLAS
# checks (CUBLAS_STATUS_INVALID_VALUE: a leading dimension below the rows it must hold, a negative size; the
# type combinations cublasGemmEx supports with CUBLAS_COMPUTE_32F: NOT_SUPPORTED otherwise) and what cuBLAS
# would not (every byte it reads or writes inside one live device array). The call is one kernel on the
# current stream, ordered like any other (reads and writes recorded, a read of an unordered write fails);
# alpha and beta are read from host memory at the call (CUBLAS_POINTER_MODE_HOST). Computed in float64,
# rounded once to C's type. The module exposes what the installed CuPy's cublas extension has (its names are
# read from the compiled file, See BINARY_MODULES in _cupy_surface.py); what is simulated is below.

_CONST = {"CUBLAS_OP_N": 0, "CUBLAS_OP_T": 1, "CUBLAS_OP_C": 2, "CUBLAS_COMPUTE_32F": 68,
          "CUBLAS_GEMM_DEFAULT": -1, "CUBLAS_GEMM_DEFAULT_TENSOR_OP": 99, "CUBLAS_POINTER_MODE_HOST": 0,
          "CUBLAS_POINTER_MODE_DEVICE": 1}  # cublas_api.h
_TYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float64), 2: np.dtype(np.float16),
          14: np.dtype(ml_dtypes.bfloat16)}  # library_types.h: CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF
# cublasGemmEx's table for CUBLAS_COMPUTE_32F (A/B type, C type), as the cuBLAS documentation lists it
_COMPUTE_32F = {(14, 14), (14, 0), (2, 2), (2, 0), (0, 0)}
_rt.SIM_FILES.add(__file__)


class CublasError(RuntimeError):
    def __init__(self, status: str, why: str):
        super().__init__(f"{status}: {why}")
        self.status = status


def device_handle() -> int:
    """cupy.cuda.get_cublas_handle(): a handle per device (an opaque number; the simulation keeps no state in it)."""
    return 0xB1A5 + _rt._cur_dev()


def _host_float(ptr: int) -> float:
    return float(ctypes.c_float.from_address(int(ptr)).value)


def _matrix(ptr, dt, rows, cols, ld, stride, batch, what, name):
    """The column-major ``rows x cols`` matrices (leading dimension ``ld``) at ``ptr``, ``batch`` of them ``stride``
    elements apart, as a (batch, rows, cols) NumPy view, with their simulated buffer."""
    if ld < max(1, rows):
        raise CublasError("CUBLAS_STATUS_INVALID_VALUE", f"{what}: ld{name}={ld} < max(1, {rows})")
    item = dt.itemsize
    extent = ((batch - 1) * stride + (cols - 1) * ld + rows) * item
    mem, buf = _memory(ptr, extent, what)
    base = mem.view(dt) if mem.size % item == 0 else mem[:extent - extent % item].view(dt)
    view = np.lib.stride_tricks.as_strided(base, (batch, rows, cols), (stride * item, item, ld * item),
                                           writeable=True)
    return view, buf


def gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,  # noqa: N802
                         strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    what = "cublasGemmStridedBatchedEx"
    if handle != device_handle():
        raise CublasError("CUBLAS_STATUS_NOT_INITIALIZED", f"{what}: {handle:#x} is not this device's handle")
    if min(m, n, k, batchCount) < 0 or transa not in (0, 1) or transb not in (0, 1):
        raise CublasError("CUBLAS_STATUS_INVALID_VALUE", f"{what}: m={m} n={n} k={k} batchCount={batchCount} "
                                                         f"transa={transa} transb={transb}")
    if computeType != _CONST["CUBLAS_COMPUTE_32F"] or Atype != Btype or (Atype, Ctype) not in _COMPUTE_32F:
        raise CublasError("CUBLAS_STATUS_NOT_SUPPORTED", f"{what}: Atype={Atype} Btype={Btype} Ctype={Ctype} "
                                                         f"computeType={computeType}")
    if m == 0 or n == 0 or batchCount == 0:
        return
    ta, tc = _TYPES[Atype], _TYPES[Ctype]
    a_rows, a_cols = (m, k) if transa == 0 else (k, m)
    b_rows, b_cols = (k, n) if transb == 0 else (n, k)
    al, be = _host_float(alpha), _host_float(beta)
    a, abuf = _matrix(A, ta, a_rows, a_cols, lda, strideA, batchCount, what, "a") if k else (None, None)
    b, bbuf = _matrix(B, ta, b_rows, b_cols, ldb, strideB, batchCount, what, "b") if k else (None, None)
    c, cbuf = _matrix(C, tc, m, n, ldc, strideC, batchCount, what, "c")
    s = _rt.get_current_stream()
    ins = [x for x in (abuf, bbuf) if x is not None] + ([cbuf] if be != 0 else [])
    for buf in ins + [cbuf]:
        if buf.dev != _rt._cur_dev():
            raise _rt.CudaSimError(f"{what}: a buffer on cuda:{buf.dev} used on cuda:{_rt._cur_dev()}")
    for buf in ins:
        hit = buf.unordered(s)
        if hit is not None:
            _fail(what, f"a cuBLAS operand on cuda:{buf.dev}", hit, f"{what} on stream {s.id}")
    seq = s._enqueue(what)  # one launch
    for buf in ins:
        buf.read(s, seq, what)
    cbuf.write(s, seq, what)
    acc = np.zeros((batchCount, m, n)) if k == 0 else np.matmul(
        a.astype(np.float64).swapaxes(1, 2) if transa else a.astype(np.float64),
        b.astype(np.float64).swapaxes(1, 2) if transb else b.astype(np.float64))
    res = al * acc + (be * c.astype(np.float64) if be != 0 else 0.0)
    c[...] = res.astype(tc)


cublas = types.SimpleNamespace(gemmStridedBatchedEx=gemmStridedBatchedEx, **_CONST)


def signature(name: str) -> tuple:
    """The parameter names of the simulated cublas function ``name`` (tests hold them to the installed CuPy's)."""
    code = getattr(cublas, name).__code__
    return code.co_varnames[:code.co_argcount]
