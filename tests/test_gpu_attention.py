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


_DT = {BF16: hp.bfloat16, np.dtype(np.float32): hp.float32, np.dtype(np.float64): hp.float64}


def _run(dev, q, k, v, dtype, **kw):
    ts = [hp.tensor(a, device=dev).to(_DT[np.dtype(dtype)]).requires_grad_() for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ts, **kw)
    g = hp.tensor(np.cos(np.arange(out.numel(), dtype=np.float32)).reshape(out.shape), device=dev).to(out.dtype)
    (out * g).sum().backward()
    return [t.detach().double().cpu().numpy() for t in [out] + [x.grad for x in ts]]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
@pytest.mark.parametrize("causal,L,S", [(True, 80, 80), (False, 80, 80), (True, 6, 9), (False, 5, 3)])
def test_dense_attention_on_cuda_equals_the_cpu(dtype, causal, L, S):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, n, 16)).astype(dtype).astype(np.float32) for n in (L, S, S))
    gpu = _run("cuda", q, k, v, dtype, is_causal=causal)
    if dtype == np.float32:  # the same float32 arithmetic in another order
        for a, b in zip(gpu, _run("cpu", q, k, v, dtype, is_causal=causal)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        return
    # bfloat16 on the tensor cores: float32 scores, P and dS rounded to bfloat16 for their products (as
    # FlashAttention); each result within 2**-7 of its largest value from the float64 attention of the same inputs
    # (measured at most 5.9e-3 here, the CPU's float32 path 4.7e-3), the scores never rounded to bfloat16
    ref = _run("cpu", q, k, v, np.float64, is_causal=causal)
    for a, r in zip(gpu, ref):
        assert np.abs(a - r).max() <= 2 ** -7 * np.abs(r).max(), np.abs(a - r).max() / np.abs(r).max()


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


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
def test_dense_attention_with_dropout_drops_the_probabilities_with_the_device_s_draw(dtype):
    import cupy
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 2, 12, 8)).astype(dtype).astype(np.float64) for _ in range(3))
    cupy.random.seed(11)
    r = cupy.asnumpy(cupy.random.random_sample((2, 2, 12, 12), dtype=np.float32))  # the draw attention makes
    cupy.random.seed(11)
    gpu = _run("cuda", q, k, v, dtype, is_causal=True, dropout_p=0.3)
    # float64 reference with that mask: softmax(q k^T / sqrt(8), causal) * keep / 0.7, then times v
    keep = (r >= np.float32(0.3)) / 0.7
    qt, kt, vt = (hp.tensor(a, requires_grad=True) for a in (q, k, v))
    s = qt @ kt.transpose(-1, -2) / np.sqrt(8.0)
    s = s.masked_fill(hp.tensor(np.triu(np.ones((12, 12), bool), 1)), float("-inf"))
    out = (s.softmax(-1) * hp.tensor(keep)) @ vt
    g = hp.tensor(np.cos(np.arange(out.numel(), dtype=np.float32)).reshape(out.shape)).double()
    (out * g).sum().backward()
    ref = [out.detach().numpy(), qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()]
    bound = 1e-5 if dtype == np.float32 else 2 ** -6
    for a, b in zip(gpu, ref):
        assert np.abs(a - b).max() <= bound * np.abs(b).max(), np.abs(a - b).max() / np.abs(b).max()
