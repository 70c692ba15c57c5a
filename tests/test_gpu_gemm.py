"""The mixed-precision batched GEMM (hpcfsdp/_kernels/gemm.py, [Note: Mixed-precision batched GEMM]) equals NumPy's
matmul in float64 for every transposition, in bfloat16 and float16 with a float32 or an input-dtype output; the
simulated cuBLAS computes it from cuBLAS's column-major definition and has the installed CuPy's signature.
Marked `gpu`: on a real GPU this runs cuBLAS itself."""
import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture()
def cp():
    import cupy  # noqa: PLC0415  (the simulated device under HPCFSDP_CUDA_SIM=1)
    return cupy


def _ref(a, b, ta, tb):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.matmul(a.swapaxes(-1, -2) if ta else a, b.swapaxes(-1, -2) if tb else b)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("out", [None, np.float32])
def test_bmm_equals_numpy_for_every_transposition(cp, dtype, ta, tb, out):
    from hpcfsdp._kernels.gemm import bmm
    rng = np.random.default_rng(0)
    M, K, N = 5, 7, 3
    a = rng.standard_normal((2, 3) + ((K, M) if ta else (M, K))).astype(dtype)
    b = rng.standard_normal((2, 3) + ((N, K) if tb else (K, N))).astype(dtype)
    c = bmm(cp.asarray(a), cp.asarray(b), trans_a=ta, trans_b=tb, out_dtype=out)
    assert c.shape == (2, 3, M, N) and c.dtype == np.dtype(out or dtype) and c.flags.c_contiguous
    want = _ref(a, b, ta, tb)
    got = cp.asnumpy(c).astype(np.float64)
    if out is None:  # rounded once to the input dtype from a float32 accumulation
        np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bmm_copies_strided_operands_and_scales(cp):
    from hpcfsdp._kernels.gemm import bmm
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 6, 5)).astype(BF16)
    b = rng.standard_normal((4, 5, 6)).astype(BF16)
    da = cp.asarray(a).swapaxes(1, 2)  # (4, 5, 6), not contiguous
    c = bmm(da, cp.asarray(b).swapaxes(1, 2), out_dtype=np.float32, alpha=0.5)
    np.testing.assert_allclose(cp.asnumpy(c), 0.5 * _ref(a.swapaxes(1, 2), b.swapaxes(1, 2), False, False),
                               rtol=1e-5, atol=1e-5)
    empty = bmm(cp.asarray(a[:, :, :0]), cp.asarray(b[:, :0]), out_dtype=np.float32)  # K = 0: zeros
    assert empty.shape == (4, 6, 6) and not cp.asnumpy(empty).any()


def test_bmm_refuses_what_it_cannot_compute(cp):
    from hpcfsdp._kernels.gemm import bmm
    f32 = cp.ones((2, 3, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        bmm(f32, f32)
    a = cp.asarray(np.ones((2, 3, 4), BF16))
    with pytest.raises(TypeError, match="batch shape"):
        bmm(a, cp.asarray(np.ones((3, 4, 2), BF16)))
    with pytest.raises(ValueError, match="inner dimensions"):
        bmm(a, cp.asarray(np.ones((2, 5, 2), BF16)))
    with pytest.raises(TypeError, match="float32"):
        bmm(a, cp.asarray(np.ones((2, 4, 2), BF16)), out_dtype=np.float64)


def test_the_simulated_gemm_has_the_installed_cupys_signature():
    from hpcfsdp.testing import _cupy_surface, _sim_cublas
    s = _cupy_surface.surface()
    assert s.signatures["cupy.cuda.cublas.gemmStridedBatchedEx"] == _sim_cublas.signature("gemmStridedBatchedEx")
    assert {"gemmStridedBatchedEx", "setStream", "CUBLAS_OP_N", "CUBLAS_COMPUTE_32F"} <= s.modules["cupy.cuda.cublas"]
    assert "cublas" in s.modules["cupy.cuda"]


@pytest.mark.gpu_sim
def test_the_simulated_gemm_checks_what_cublas_checks_and_orders_its_operands(cp):
    from hpcfsdp.testing import cuda_sim as cs
    from hpcfsdp.testing._sim_cublas import CublasError, gemmStridedBatchedEx
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    a, c = cp.asarray(np.ones((4, 4), BF16)), cp.empty((4, 4), np.float32)
    h = cp.cuda.get_cublas_handle()
    args = dict(handle=h, transa=0, transb=0, m=4, n=4, k=4, alpha=one.ctypes.data, A=a.data.ptr, Atype=14, lda=4,
                strideA=16, B=a.data.ptr, Btype=14, ldb=4, strideB=16, beta=zero.ctypes.data, C=c.data.ptr, Ctype=0,
                ldc=4, strideC=16, batchCount=1, computeType=68, algo=-1)
    gemmStridedBatchedEx(**args)
    assert (cp.asnumpy(c) == 4).all()
    with pytest.raises(CublasError, match="INVALID_VALUE"):
        gemmStridedBatchedEx(**dict(args, lda=3))
    with pytest.raises(CublasError, match="NOT_SUPPORTED"):
        gemmStridedBatchedEx(**dict(args, Ctype=1))  # a float64 output of bfloat16 inputs
    with pytest.raises(cs.CudaSimError, match="run past the end"):
        gemmStridedBatchedEx(**dict(args, batchCount=2))
    s = cp.cuda.Stream(non_blocking=True)
    s.wait_event(cp.cuda.get_current_stream().record())
    with s:
        a2 = a * 2  # written on s
    try:
        with pytest.raises(cs.CudaSimError):  # read on the current stream with no event between: a race
            gemmStridedBatchedEx(**dict(args, A=a2.data.ptr))
    finally:
        s.synchronize()  # (the pool would hand a2's block to the next test with s's write pending)
