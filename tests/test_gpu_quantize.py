"""The fused quantize/dequantize kernels (hpcfsdp/_kernels/quantize.cu) on CuPy arrays: the payloads, residuals and
values of the NumPy path bit for bit, one launch per bucket each way, no host synchronisation.

Marked `gpu`: runs on the simulated device (HPCFSDP_CUDA_SIM=1, the system tier's gpu-sim phase) or a real GPU.
"""
import ml_dtypes
import numpy as np
import pytest

from hpcfsdp._kernels import quantize as Q

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _inputs(n, dtype):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp(rng.standard_normal(n))).astype(np.float32)
    x[: n // 7] = 0.0  # a zero block (block 32) when n >= 224
    if n > 300:
        x[260], x[300] = np.inf, np.nan  # non-finite blocks come back NaN
        x[40:72] = 3.25  # a constant block
    return x.astype(dtype)


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("n", [1000, 333, 64])
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
def test_device_payloads_equal_the_numpy_path_bit_for_bit(kind, n, dtype):
    x = _inputs(n, dtype)
    res_h = np.empty(n, np.float32)
    ref = Q.quantize(x, kind, 32, residual=res_h)
    res_d = cp.empty(n, np.float32)
    got = Q.quantize(cp.asarray(x), kind, 32, residual=res_d)
    np.testing.assert_array_equal(got.get(), ref)
    np.testing.assert_array_equal(res_d.get().view(np.uint32), res_h.view(np.uint32))
    np.testing.assert_array_equal(Q.quantize(cp.asarray(x), kind, 32).get(), ref)
    for out_dt in (np.float32, BF16):
        back_h = Q.dequantize(ref, kind, n, 32, out_dt)
        back_d = Q.dequantize(cp.asarray(ref), kind, n, 32, out_dt)
        assert back_d.dtype == back_h.dtype == np.dtype(out_dt)
        np.testing.assert_array_equal(back_d.get().view(np.uint8), back_h.view(np.uint8))  # NaN where NumPy has
    out = cp.zeros((n,), np.float32)[::1]
    assert Q.dequantize(cp.asarray(ref), kind, n, 32, np.float32, out=out) is out


def test_one_launch_per_bucket_each_way_and_no_host_sync():
    from hpcfsdp.testing import cuda_sim
    x = cp.asarray(_inputs(4096, np.float32))
    out = cp.empty(Q.payload_bytes("int4", 4096, 256), np.uint8)
    res = cp.empty(4096, np.float32)
    y = cp.empty(4096, BF16)
    with cuda_sim.counting() as c:
        Q.quantize(x, "int4", 256, out=out, residual=res)
        Q.dequantize(out, "int4", 4096, 256, BF16, out=y)
    assert c.launches == 2 and dict(c.launches_by_op) == {"kernel quantize_blocks_ef<float>": 1,
                                                          "kernel dequantize_blocks<__nv_bfloat16>": 1}
    assert c.host_syncs == []


@pytest.mark.parametrize("kind", ["int8", "int4", "fp8"])
@pytest.mark.parametrize("n", [1024, 333])
def test_rows_and_their_sum_are_one_launch_each_and_the_numpy_path_bit_for_bit(kind, n):
    from hpcfsdp.testing import cuda_sim
    rows = 4
    x = np.concatenate([_inputs(n, np.float32) * (r + 1) for r in range(rows)])
    res_h = np.empty(rows * n, np.float32)
    ref = Q.quantize(x, kind, 32, residual=res_h, rows=rows)
    xd, res_d = cp.asarray(x), cp.empty(rows * n, np.float32)
    out = cp.empty(ref.size, np.uint8)
    back = cp.empty(rows * n, BF16)
    total = cp.empty(n, np.float32)
    with cuda_sim.counting() as c:
        Q.quantize(xd, kind, 32, out=out, residual=res_d, rows=rows)
        Q.dequantize(out, kind, n, 32, BF16, out=back, rows=rows)
        Q.dequantize_sum(out, kind, n, 32, rows, out=total)
    assert dict(c.launches_by_op) == {"kernel quantize_blocks_ef<float>": 1,
                                      "kernel dequantize_blocks<__nv_bfloat16>": 1,
                                      "kernel dequantize_sum<float>": 1} and c.host_syncs == []
    np.testing.assert_array_equal(out.get(), ref)
    np.testing.assert_array_equal(res_d.get().view(np.uint32), res_h.view(np.uint32))
    np.testing.assert_array_equal(back.get().view(np.uint16),
                                  Q.dequantize(ref, kind, n, 32, BF16, rows=rows).view(np.uint16))
    np.testing.assert_array_equal(total.get().view(np.uint32),
                                  Q.dequantize_sum(ref, kind, n, 32, rows).view(np.uint32))
