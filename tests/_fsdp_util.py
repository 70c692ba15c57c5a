"""Helpers for FSDP tests: reference models trained unsharded on the global batch, parity checks."""
import numpy as np

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.tensor import DTensor
from hpcfsdp.models import GPT, GPTConfig


def world():
    return dist.get_world_size(), dist.get_rank()


def full(t):
    """Host array of a (possibly sharded) tensor; collective for DTensors."""
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return np.asarray(hp._backend.to_numpy(t._data))


def tiny_gpt(seed=0, tie=True, vocab=None, n_layer=2):
    w, _ = world()
    hp.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab or 4 * w + 1, block_size=8, n_layer=n_layer, n_head=2, n_embd=16,
                    tie_weights=tie, bias=False)  # no key bias: its true gradient is 0, Adam amplifies noise
    return GPT(cfg)


def gpt_batches(steps, vocab, B_per_rank=2, T=8, seed=123):
    """Global batches (same on every rank): list of (x, y) int64 arrays of shape (W*B, T)."""
    w, _ = world()
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, (w * B_per_rank, T)), rng.integers(0, vocab, (w * B_per_rank, T)))
            for _ in range(steps)]


def local(arr):
    if arr is None:
        return None
    w, r = world()
    n = arr.shape[0] // w
    return arr[r * n:(r + 1) * n]


class Blocks(nn.Module):
    """Uneven shapes: 7x15, 15x3 blocks and a vocabulary of 4*world+1; blocks are fully_shard units."""

    def __init__(self, vocab, n_blocks=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, 7)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(7, 15), nn.GELU(), nn.Linear(15, 7))
                                     for _ in range(n_blocks)])
        self.head = nn.Linear(7, 3)

    def forward(self, idx):
        h = self.emb(idx)  # (B, T, 7)
        for b in self.blocks:
            h = h + b(h)
        return self.head(h).pow(2).mean()


def train_parity(make_model, shard_fn, steps=10, lr=1e-2, batches=None, loss_fn=None, atol=2e-5, rtol=2e-4,
                 micro_batches=1):
    """Train a sharded model on each rank's slice and an unsharded reference on the global batch (same init);
    assert equal losses every step and equal parameters at the end. Returns (sharded model, ref model)."""
    ref = make_model()
    model = make_model()
    shard_fn(model)
    opt = hp.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.1)
    loss_fn = loss_fn or (lambda m, x, y: m(hp.tensor(x), hp.tensor(y))[1])
    for step, (x, y) in enumerate(batches):
        xl, yl = local(x), local(y)
        losses = []
        mb = micro_batches
        n = xl.shape[0] // mb
        for i in range(mb):
            if mb > 1:
                model.set_requires_gradient_sync(i == mb - 1)
            loss = loss_fn(model, xl[i * n:(i + 1) * n], None if yl is None else yl[i * n:(i + 1) * n])
            (loss / mb).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
        rl = loss_fn(ref, x, y)
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(np.mean(losses)), rl.item(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"loss at step {step}")
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(full(p), ref_params[name].detach().numpy(), atol=atol, rtol=rtol, err_msg=name)
    return model, ref


def global_mean(value):
    """Mean of a Python float over all ranks (the global-batch loss from per-rank losses)."""
    t = hp.tensor([float(value)], dtype=hp.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return t.item()


def rounded_reference_step(ref, ropt, x, y, dtype, keep_full=lambda name: False):
    """One step of the unsharded reference computing with parameters rounded to ``dtype`` (the casts mixed
    precision applies; ``keep_full(name)`` parameters stay float32) on float32 master weights. Returns the loss."""
    master = {n: p._data.copy() for n, p in ref.named_parameters()}
    with hp.no_grad():
        for n, p in ref.named_parameters():
            if not keep_full(n):
                p._data[...] = p._data.astype(dtype).astype(np.float32)
    _, loss = ref(hp.tensor(x), hp.tensor(y))
    loss.backward()
    with hp.no_grad():
        for n, p in ref.named_parameters():
            p._data[...] = master[n]
    ropt.step()
    ropt.zero_grad()
    return loss.item()
