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

    import hpcfsdp.distributed as dist

    pg = dist.distributed_c10d._default_group()
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
