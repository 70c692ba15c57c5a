"""GPT's fused block on the GPU (See [Note: The fused GPT block] in hpcfsdp/models/_gpt_fused.py) computes what its
modules compute: the output and every gradient equal the module-by-module path on the same device, and, in bfloat16,
stay within bfloat16's rounding of the float64 block on the CPU. Marked `gpu`: the simulated device or a real GPU."""
import copy

import ml_dtypes
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.models import _gpt_fused
from hpcfsdp.models.gpt import GPT, MLP, CausalSelfAttention, GPTConfig, _Linear

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)
_DT = {BF16: hp.bfloat16, np.dtype(np.float32): hp.float32, np.dtype(np.float64): hp.float64}


def _fusable(blk, x):
    return _gpt_fused.fusable(blk, x, _Linear, CausalSelfAttention, MLP)


def _block(seed=0, approximate="none", **kw):
    hp.manual_seed(seed)
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=4, n_embd=32, dropout=0.0,
                    gelu_approximate=approximate, **kw)
    blk = GPT(cfg).transformer.h[0]
    with hp.no_grad():  # non-zero biases and norm affines, so that every fused bias path is exercised
        for p in blk.parameters():
            p.add_(hp.randn(*p.shape) * 0.1)
    return blk


def _run(blk, x, dtype, device, modules=False):
    blk = copy.deepcopy(blk).to(device=device, dtype=_DT[np.dtype(dtype)])
    xt = hp.tensor(x, device=device).to(_DT[np.dtype(dtype)]).requires_grad_()
    handle = blk.mlp.c_fc.register_forward_hook(lambda m, a, o: None) if modules else None
    assert _fusable(blk, xt) == (device == "cuda" and not modules)
    out = blk(xt)
    g = hp.tensor(np.sin(np.arange(out.numel(), dtype=np.float64)).reshape(out.shape), device=device).to(out.dtype)
    (out * g).sum().backward()
    if handle is not None:
        handle.remove()
    res = {"out": out, "x.grad": xt.grad}
    res.update({n + ".grad": p.grad for n, p in blk.named_parameters()})
    return {k: v.detach().double().cpu().numpy() for k, v in res.items()}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_fused_block_equals_its_modules_in_float32(approximate):
    blk = _block(approximate=approximate)
    x = np.random.default_rng(1).standard_normal((2, 16, 32))
    fused, mods = _run(blk, x, np.float32, "cuda"), _run(blk, x, np.float32, "cuda", modules=True)
    assert fused.keys() == mods.keys() and len(fused) == 14  # the output, x's gradient and 12 parameters'
    for k in fused:
        np.testing.assert_allclose(fused[k], mods[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_the_fused_block_in_bfloat16_keeps_the_modules_residual_stream_and_the_float64_block_s_values():
    blk = _block()
    x = np.random.default_rng(2).standard_normal((2, 16, 32)).astype(BF16).astype(np.float64)
    fused, mods = _run(blk, x, BF16, "cuda"), _run(blk, x, BF16, "cuda", modules=True)
    ref = _run(blk, x, np.float64, "cpu", modules=True)
    for k in fused:  # as close to the float64 block as the modules are (measured: closer or equal everywhere)
        scale = np.abs(ref[k]).max()
        err, err_mods = np.abs(fused[k] - ref[k]).max() / scale, np.abs(mods[k] - ref[k]).max() / scale
        assert err <= 1.25 * err_mods + 2 ** -8 and err <= 2 ** -4, (k, err, err_mods)
    # the fused adds round as the modules' (x + (y + b) in bfloat16), so their outputs rarely differ
    assert np.mean(fused["out"] != mods["out"]) < 0.05


def test_the_block_runs_its_modules_where_the_fused_path_could_be_told_apart():
    blk = _block().to("cuda")
    x = hp.randn(2, 8, 32, device="cuda")
    assert _fusable(blk, x)
    assert not _fusable(blk, x.cpu())  # NumPy arrays
    h = blk.attn.c_proj.register_forward_pre_hook(lambda m, a: None)
    assert not _fusable(blk, x)  # a hook must see its module called
    h.remove()
    blk.mlp.dropout.p = 0.1
    assert not _fusable(blk, x)  # dropout in training
    blk.eval()
    assert _fusable(blk, x)  # (dropout is the identity in eval)
    blk.train()
    blk.mlp.dropout.p = 0.0
    blk.mlp.gelu = hp.nn.ReLU()
    assert not _fusable(blk, x)  # a replaced submodule
    nb = _block(bias=False).to("cuda")
    assert not _fusable(nb, x)  # no biases to fuse
    assert _fusable(_block().to("cuda"), x.to(hp.bfloat16)) is False  # parameters of another dtype
    with hp.autocast("cuda", dtype=hp.bfloat16):
        assert not _fusable(blk, x)  # autocast casts per op


def test_the_fused_block_runs_13_launches_forward_and_23_backward_with_no_host_sync():
    from hpcfsdp.testing.cuda_sim import counting
    if not hp.cuda.is_available() or "sim" not in getattr(__import__("cupy"), "__version__", ""):
        pytest.skip("counts launches on the simulated device")
    blk = _block().to(device="cuda", dtype=hp.bfloat16)
    x = hp.randn(2, 16, 32, device="cuda").to(hp.bfloat16).requires_grad_()
    out = blk(x)  # warm: tables and caches
    out.sum().backward()
    blk.zero_grad(set_to_none=True)  # (else each gradient would accumulate into the last: a launch each)
    x.grad = None
    with counting() as fwd:
        out = blk(x)
    g = hp.ones(*out.shape, device="cuda").to(hp.bfloat16)
    with counting() as bwd:
        out.backward(g)
    # (under FSDP its copies and collectives add 3: 39 per block in scripts/gpu_counts.py, tests/test_gpu_budget.py)
    assert (fwd.launches, bwd.launches) == (13, 23), (fwd.launches_by_op, bwd.launches_by_op)
    assert not fwd.host_syncs and not bwd.host_syncs
