"""Rotary embedding as one fused kernel each way (hpcfsdp/_kernels/rotary.cu): the twin against the formula in
float64 and finite differences; on the simulated device, Llama on CUDA equals Llama on the CPU and its forward
uploads nothing (the tables are cached) and launches 2 rotary kernels per block.

The twin tests need no GPU; the rest are marked `gpu` (HPCFSDP_CUDA_SIM=1 or a real GPU)."""
import contextlib

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp._kernels import KERNELS
from tests._gradcheck import fd_vjp

BF16 = np.dtype(ml_dtypes.bfloat16)


def _ref(x, cos, sin):
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def _twin(name, x, cos, sin, tdiv, dtype):
    out = np.empty_like(x)
    KERNELS[name].twin([x, cos, sin, out, np.int64(x.size), np.int32(x.shape[-1]), np.int32(cos.shape[0]),
                        np.int64(tdiv)], dtype)
    return out


@pytest.mark.parametrize("layout", ["BHTD", "BTHD"])
def test_rotary_twins_equal_the_formula_and_its_finite_difference_in_float64(layout):
    rng = np.random.default_rng(0)
    B, H, T, D = 2, 3, 5, 8
    ang = rng.uniform(0, 6, (T, D))
    cos, sin = np.cos(ang), np.sin(ang)
    x = rng.standard_normal((B, H, T, D))
    mem = x if layout == "BHTD" else np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # the traversed memory
    tdiv = D if layout == "BHTD" else H * D
    back = (lambda a: a) if layout == "BHTD" else (lambda a: a.transpose(0, 2, 1, 3))
    np.testing.assert_allclose(back(_twin("rotary_fwd", mem, cos, sin, tdiv, np.float64)), _ref(x, cos, sin),
                               rtol=1e-14, atol=1e-14)
    g = rng.standard_normal(x.shape)
    gmem = g if layout == "BHTD" else np.ascontiguousarray(g.transpose(0, 2, 1, 3))
    dx = back(_twin("rotary_bwd", gmem, cos, sin, tdiv, np.float64))
    np.testing.assert_allclose(dx, fd_vjp(lambda a: _ref(a, cos, sin), x, g), rtol=0, atol=1e-8)


def test_rotary_twin_in_bfloat16_rounds_once_from_float():
    rng = np.random.default_rng(1)
    ang = rng.uniform(0, 6, (4, 16))
    cos, sin = np.cos(ang).astype(BF16), np.sin(ang).astype(BF16)
    x = rng.standard_normal((1, 2, 4, 16)).astype(BF16)
    got = _twin("rotary_fwd", x, cos, sin, 16, BF16)
    ref = _ref(*(a.astype(np.float32) for a in (x, cos, sin))).astype(BF16)  # the same math, float32, rounded once
    np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [hp.float32, hp.bfloat16])
def test_llama_on_cuda_equals_llama_on_the_cpu_with_fused_rotary(dtype):
    from hpcfsdp.models import Llama, LlamaConfig
    from hpcfsdp.testing import cuda_sim

    cfg = LlamaConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    res = []
    for dev in ("cpu", "cuda"):
        hp.manual_seed(0)
        model = Llama(cfg).to(dev).to(dtype)
        idx = hp.tensor(np.arange(24).reshape(2, 12) % 64, device=dev)
        model(idx, idx)  # the first forward computes and keeps the rotary tables
        with (cuda_sim.counting() if dev == "cuda" and hp._backend.cuda_simulated() else contextlib.nullcontext()) \
                as c:
            _, loss = model(idx, idx)
        if c is not None:
            assert c.launches_by_op["kernel rotary_fwd<" + ("float" if dtype == hp.float32 else "__nv_bfloat16")
                                     + ">"] == 2 * cfg.n_layer  # q and k of each block
            assert c.host_syncs == []
        loss.backward()
        res.append((loss.item(), {n: p.grad.float().cpu().numpy() for n, p in model.named_parameters()}))
    (lc, gc), (lg, gg) = res
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == hp.float32 else dict(rtol=5e-2, atol=5e-2)
    assert lg == pytest.approx(lc, rel=tol["rtol"])
    for n in gc:
        np.testing.assert_allclose(gg[n], gc[n], err_msg=n, **tol)
