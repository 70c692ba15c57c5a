"""FSDP2 training with meta-device init, per-block fully_shard, mixed precision, explicit prefetch and
full and sharded checkpoints reloaded into fresh models; asserts exact reload parity.

Run on 2 ranks (README.md beside this file): train.py --ckpt-dir DIR [--mixed-precision] [--prefetch]
"""
import argparse
import os

import hpcfsdp as torch
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
import hpcfsdp.nn as nn
import hpcfsdp.nn.functional as F
from hpcfsdp.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from hpcfsdp.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab, dim, n_layers, n_heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))  # (B, T, C)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))  # (B, T, vocab)


def build(args, device):
    """A model built on the meta device (no memory), then sharded block by block."""
    with torch.device("meta"):
        model = Transformer(args.vocab, args.dim, args.layers, args.heads, args.seq)
    mp = MixedPrecisionPolicy()
    if args.mixed_precision:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    assert isinstance(model, FSDPModule)
    if args.prefetch:
        layers = list(model.layers)
        for i, layer in enumerate(layers):
            layer.set_modules_to_forward_prefetch(layers[i + 1:i + 2])
            layer.set_modules_to_backward_prefetch(layers[max(i - 1, 0):i])
    model.to_empty(device=device)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optim


def train(model, optim, args, first_step, steps):
    losses = []
    for step in range(first_step, first_step + steps):
        torch.manual_seed(1000 + step * dist.get_world_size() + dist.get_rank())
        batch = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
        if args.prefetch:
            model.unshard()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), batch[:, 1:].reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


def full_state(model, optim):
    """Full (unsharded) copies of the model and optimizer state, detached from the live tensors."""
    options = StateDictOptions(full_state_dict=True)
    return copy(get_model_state_dict(model, options=options)), copy(get_optimizer_state_dict(model, optim, options=options))


def copy(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {key: copy(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(copy(value) for value in tree)
    return tree


def assert_equal(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert sorted(a) == sorted(b), (where, sorted(a), sorted(b))
        for key in a:
            assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--prefetch", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.accelerator.is_available() else torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device))
    rank = dist.get_rank()

    # Initial weights: made on rank 0 only, broadcast into the sharded meta-built model.
    torch.manual_seed(0)
    initial = Transformer(args.vocab, args.dim, args.layers, args.heads, args.seq).state_dict() if rank == 0 else {}
    model, optim = build(args, device)
    set_model_state_dict(model, initial, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    train(model, optim, args, 0, args.steps)

    # Sharded checkpoint (every rank writes its shards) and full checkpoint (rank 0 writes one file).
    sharded_dir = os.path.join(args.ckpt_dir, "sharded")
    full_path = os.path.join(args.ckpt_dir, "full.pt")
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)},
             checkpoint_id=sharded_dir)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_model = get_model_state_dict(model, options=options)
    full_optim = get_optimizer_state_dict(model, optim, options=options)
    if rank == 0:
        torch.save({"model": full_model, "optim": full_optim}, full_path)
    dist.barrier()
    saved_model, saved_optim = full_state(model, optim)
    expected = train(model, optim, args, args.steps, args.steps)

    # Reload 1: the sharded checkpoint into a fresh meta-built model.
    model2, optim2 = build(args, device)
    state = {"model": get_model_state_dict(model2), "optim": get_optimizer_state_dict(model2, optim2)}
    dcp.load(state, checkpoint_id=sharded_dir)
    set_model_state_dict(model2, state["model"])
    set_optimizer_state_dict(model2, optim2, state["optim"])

    # Reload 2: the full checkpoint, read on rank 0 and broadcast.
    model3, optim3 = build(args, device)
    full = torch.load(full_path, weights_only=True) if rank == 0 else {"model": {}, "optim": {}}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model3, full["model"], options=options)
    set_optimizer_state_dict(model3, optim3, full["optim"], options=options)

    for name, (m, o) in {"sharded": (model2, optim2), "full": (model3, optim3)}.items():
        reloaded_model, reloaded_optim = full_state(m, o)
        assert_equal(saved_model, reloaded_model, f"{name} model")
        assert_equal(saved_optim, reloaded_optim, f"{name} optim")
        losses = train(m, o, args, args.steps, args.steps)
        assert losses == expected, (name, losses, expected)
    if rank == 0:
        print(f"fsdp2 example OK: losses {expected}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
