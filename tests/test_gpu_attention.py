"""Dense attention on CuPy arrays (See [Note: Dense attention on the GPU]) equals the CPU's block-causal path.

Marked `gpu`: runs on the simulated device (HPCFSDP_CUDA_SIM=1, the system tier's gpu-sim phase) or a real GPU.
"""
import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.nn import functional as F

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)


def _run(dev, q, k, v, dtype, **kw):
    ts = [hp.tensor(a, device=dev).to(hp.bfloat16 if dtype == BF16 else hp.float32).requires_grad_() for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts, **kw)
    g = hp.tensor(np.cos(np.arange(out.numel(), dtype=np.float32)).reshape(out.shape), device=dev).to(out.dtype)
    (out * g).sum().backward()
    return [t.detach().float().cpu().numpy() for t in [out] + [x.grad for x in ts]]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
@pytest.mark.parametrize("causal,L,S", [(True, 80, 80), (False, 80, 80), (True, 6, 9), (False, 5, 3)])
def test_dense_attention_on_cuda_equals_the_cpu(dtype, causal, L, S):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, L, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, S, 16)).astype(np.float32)
    v = rng.standard_normal((2, 3, S, 16)).astype(np.float32)
    cpu = _run("cpu", q, k, v, dtype, is_causal=causal)
    gpu = _run("cuda", q, k, v, dtype, is_causal=causal)
    # both compute bfloat16 inputs in float32 and round the outputs once: at most a bfloat16 ulp apart
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=2 ** -7, atol=1e-3)
    for a, b in zip(gpu, cpu):
        np.testing.assert_allclose(a, b, **tol)


def test_dense_attention_saves_no_block_loop_and_masked_attention_keeps_the_general_path():
    from hpcfsdp.autograd import ops
    q = hp.randn(1, 2, 130, 8, device="cuda", requires_grad=True)
    out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    node = out.grad_fn
    assert node.dense and node.p.shape == (1, 2, 130, 130)  # one dense P, no per-block list
    mask = hp.ones(130, 130, dtype=hp.bool, device="cuda").tril()  # Tensor.tril, as PyTorch
    out2 = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert not out2.grad_fn.dense
    np.testing.assert_allclose(out.detach().cpu().numpy(), out2.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    assert ops.CAUSAL_BLOCK < 130
