"""CuPy (GPU) counterparts of the core checks: the same code on "cuda" agrees with the CPU reference.

Marked `gpu`: skipped where CuPy sees no GPU (conftest). `scripts/device_check.sh` runs them on a GPU machine.
"""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.nn import functional as F

pytestmark = pytest.mark.gpu


def _both(fn, *arrays):
    """fn on CPU tensors and on CUDA tensors (inputs require grad): outputs and input gradients, as NumPy."""
    res = []
    for dev in ("cpu", "cuda"):
        ts = [hp.tensor(a, device=dev, requires_grad=a.dtype.kind == "f") for a in arrays]
        out = fn(*ts)
        out.sum().backward() if out.ndim else out.backward()
        res.append((out.detach().cpu().numpy(), [t.grad.cpu().numpy() for t in ts if t.requires_grad]))
    return res


@pytest.mark.parametrize("op", ["matmul", "softmax", "layer_norm", "gelu", "cross_entropy", "sdpa"])
def test_ops_match_cpu(op):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    fns = {
        "matmul": (lambda x, y: x @ y, (a, b)),
        "softmax": (lambda x: F.softmax(x, dim=-1), (a,)),
        "layer_norm": (lambda x: F.layer_norm(x, (16,)), (a,)),
        "gelu": (lambda x: F.gelu(x), (a,)),
        "cross_entropy": (lambda x, t: F.cross_entropy(x.reshape(-1, 16), t), (a, rng.integers(0, 16, 32))),
        "sdpa": (lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True), (a,)),
    }
    fn, args = fns[op]
    (oc, gc), (og, gg) = _both(fn, *args)
    np.testing.assert_allclose(og, oc, rtol=1e-4, atol=1e-5)
    for x, y in zip(gg, gc):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_gpt_training_step_matches_cpu():
    from hpcfsdp.models import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    x = np.random.default_rng(1).integers(0, 64, (4, 16))
    losses = []
    for dev in ("cpu", "cuda"):
        hp.manual_seed(0)
        model = GPT(cfg).to(dev)
        opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
        run = []
        for _ in range(3):
            _, loss = model(hp.tensor(x, device=dev), hp.tensor(x, device=dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            run.append(loss.item())
        losses.append(run)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)


@pytest.mark.mpi(min_size=2)
def test_collectives_on_device_arrays():
    import cupy as cp

    from hpcfsdp.distributed import _c10d_groups

    pg = _c10d_groups.default_group()
    w, r = pg.size(), pg.rank()
    for dtype in (np.float32, np.float16):
        inp = cp.arange(5, dtype=dtype) + r
        out = cp.empty(5 * w, dtype=dtype)
        pg.all_gather_into(out, inp)
        want = np.concatenate([np.arange(5, dtype=dtype) + k for k in range(w)])
        np.testing.assert_array_equal(cp.asnumpy(out), want)
        big = cp.ones(3 * w, dtype=dtype) * (r + 1)
        res = cp.empty(3, dtype=dtype)
        pg.reduce_scatter_into(res, big)
        np.testing.assert_allclose(cp.asnumpy(res), np.full(3, w * (w + 1) / 2, dtype=dtype))


@pytest.mark.mpi(min_size=2)
def test_fully_shard_on_cuda_matches_cpu_reference():
    from hpcfsdp.distributed.fsdp import fully_shard

    from _fsdp_util import full, global_mean, gpt_batches, local, tiny_gpt, world

    import cupy as cp

    w, r = world()
    cp.cuda.Device(r % cp.cuda.runtime.getDeviceCount()).use()  # the rank's GPU first, as fully_shard will use it
    ref = tiny_gpt()
    model = tiny_gpt().to("cuda")
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    for x, y in gpt_batches(3, 4 * w + 1):
        _, loss = model(hp.tensor(local(x), device="cuda"), hp.tensor(local(y), device="cuda"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(loss.item()), rl.item(), rtol=1e-4)
    refp = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        np.testing.assert_allclose(full(p), refp[n].detach().numpy(), rtol=1e-3, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# what CuPy's surface refuses (the simulated device holds to it, see hpcfsdp/testing/_cupy_surface.py)

def test_device_arrays_pass_the_mpi_buffer_check():
    import cupy as cp

    from hpcfsdp.distributed import _buffers as B

    B.check_buffer(cp.ones(3, dtype=np.float32), "out", writable=True)  # CuPy's flags have no `writeable`
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="expected a writable array"):
        B.check_buffer(ro, "out", writable=True)
    with pytest.raises(ValueError, match="C-contiguous"):
        B.check_buffer(cp.ones((3, 2))[:, 0], "out", writable=True)


def test_gradients_accumulate_over_backward_passes_on_cuda():
    x = hp.ones(3, device="cuda", requires_grad=True)
    (x * 2).sum().backward()
    first = x.grad
    (x * 3).sum().backward()  # accumulates into the .grad the engine owns
    assert x.grad is first
    np.testing.assert_array_equal(x.grad.cpu().numpy(), np.full(3, 5, np.float32))


def test_bfloat16_embedding_backward_on_cuda_matches_cpu():
    rng = np.random.default_rng(3)
    idx = np.array([[1, 3, 3], [0, 1, 3]])  # repeated rows accumulate
    up = rng.standard_normal((2, 3, 4)).astype(np.float32)
    grads = []
    for dev in ("cpu", "cuda"):
        hp.manual_seed(0)
        emb = hp.nn.Embedding(5, 4).to(dev).bfloat16()
        out = emb(hp.tensor(idx, device=dev))
        assert out.dtype == hp.bfloat16
        (out * hp.tensor(up, device=dev).to(hp.bfloat16)).sum().backward()
        assert emb.weight.grad.dtype == hp.bfloat16
        grads.append(emb.weight.grad.float().cpu().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-2, atol=1e-2)
    assert np.any(grads[1][3] != 0) and np.all(grads[1][[2, 4]] == 0)


def test_bfloat16_probe_runs_every_op_the_engine_uses(monkeypatch):
    import cupy as cp

    from hpcfsdp import _backend as B

    monkeypatch.setattr(B, "_BF16_PROBED", {})
    assert B.cupy_bfloat16() == (True, "")
    assert hp.cuda.is_bf16_supported()

    def no_bf16_loop(a):
        raise TypeError("Wrong type ((dtype(bfloat16),)) of arguments for cupy_expm1")

    monkeypatch.setattr(B, "_BF16_PROBED", {})
    monkeypatch.setattr(cp, "expm1", no_bf16_loop)  # a CuPy whose expm1 has no bfloat16 loop
    ok, why = B.cupy_bfloat16()
    assert not ok and "lacks bfloat16 expm1" in why and "cupy_expm1" in why
    assert not hp.cuda.is_bf16_supported()


def test_pinned_memory_is_found_through_cupys_runtime():
    from hpcfsdp import _backend

    host = _backend.pinned_empty(8, np.float32)
    assert _backend.is_pinned(host) and _backend.is_pinned(host[2:])
    assert not _backend.is_pinned(np.zeros(8, np.float32))
