"""The kernels around Linear layers (hpcfsdp/_kernels/linear.cu): the bias gradient's column sum and the bias plus
residual add; each twin equals NumPy in float64 and rounds as the unfused ops in bfloat16 (the launchers' counts:
tests/test_gpu_gpt_fused.py)."""
import ml_dtypes
import numpy as np
import pytest

from hpcfsdp import _kernels as K
from hpcfsdp._kernels import linear
from hpcfsdp.testing import cuda_sim as cs

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), BF16])
@pytest.mark.parametrize("rows,c", [(7, 33), (1, 1), (300, 5)])
def test_col_sum_twin_sums_every_row_in_the_accumulation_type(dtype, rows, c):
    g = np.random.default_rng(0).standard_normal((rows, c)).astype(dtype)
    out = np.empty(c, dtype)
    K.KERNELS["col_sum"].twin([g, out, np.int64(rows), np.int64(c)], dtype)
    want = g.astype(np.float64).sum(0)
    if dtype == np.float64:
        np.testing.assert_allclose(out, want, rtol=1e-13, atol=1e-13)
    else:  # float32 accumulation, one rounding to bfloat16
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=2 ** -8, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.dtype(np.float64), BF16])
def test_bias_residual_twin_rounds_as_the_bias_add_then_the_residual_add(dtype):
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal((4, 9)).astype(dtype) for _ in range(2))
    b = rng.standard_normal(9).astype(dtype)
    out = np.empty_like(x)
    K.KERNELS["bias_residual_fwd"].twin([x, y, b, out, np.int64(x.size), np.int64(9)], dtype)
    np.testing.assert_array_equal(out, x + (y + b))  # NumPy's bfloat16 adds round each sum, as the unfused ops


def test_the_simulated_launch_holds_col_sum_to_its_fixed_tile():
    g = cs.asarray(np.random.default_rng(2).standard_normal((6, 70)).astype(np.float32))
    s = cs.empty(70, dtype=np.float32)
    mod = cs.RawModule(code=K.source("linear"), options=K._registry.OPTIONS,
                       name_expressions=K.name_expressions("linear"))
    mod.get_function("col_sum<float>")((3,), (linear.SUM_BLOCK,), (g, s, np.int64(6), np.int64(70)))
    np.testing.assert_allclose(s.get(), g.get().sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(cs.CudaSimError, match="512 threads per block; at most 256"):
        mod.get_function("col_sum<float>")((1,), (512,), (g, s, np.int64(6), np.int64(70)))
