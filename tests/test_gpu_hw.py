"""Real-GPU checks (marker `gpu_hw`: skipped on the simulated device): CuPy's bfloat16 kernels and asynchronous
copies from pinned memory, which only hardware can show."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import _backend

pytestmark = pytest.mark.gpu_hw


def test_installed_cupy_has_bfloat16():
    ok, why = _backend.cupy_bfloat16()
    assert ok, why


def test_bf16_matmul_kernel_matches_float64_reference():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 384)).astype(hp.bfloat16)
    b = rng.standard_normal((384, 256)).astype(hp.bfloat16)
    ref = a.astype(np.float64) @ b.astype(np.float64)  # exact products of the rounded inputs
    got = (hp.tensor(a, device="cuda") @ hp.tensor(b, device="cuda")).cpu().numpy().astype(np.float64)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 1e-2, f"bf16 matmul relative error {rel:.2e}"


def test_pinned_host_copy_round_trips_on_a_side_stream():
    import cupy as cp

    host = _backend.pinned_empty((1 << 20,), np.float32)
    assert _backend.is_pinned(host)
    src = cp.arange(1 << 20, dtype=cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.get_current_stream().synchronize()
    src.get(stream=s, out=host)
    s.synchronize()
    np.testing.assert_array_equal(host, np.arange(1 << 20, dtype=np.float32))
    dst = cp.empty_like(src)
    dst.set(host, stream=s)
    s.synchronize()
    assert bool((dst == src).all())
