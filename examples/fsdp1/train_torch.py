"""FSDP1 training with an auto-wrap policy, sync_module_states, MixedPrecision and a FULL_STATE_DICT
checkpoint written by rank 0 and reloaded into a fresh model; asserts exact reload parity.

Run on 2 ranks (README.md beside this file): train.py --ckpt-dir DIR [--mixed-precision] [--prefetch]
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import BackwardPrefetch, FullOptimStateDictConfig, FullStateDictConfig, MixedPrecision
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


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


def build(args, device, state_dict=None):
    """Every rank builds the model with its own seed; sync_module_states makes rank 0's weights everyone's."""
    torch.manual_seed(100 + dist.get_rank())
    model = Transformer(args.vocab, args.dim, args.layers, args.heads, args.seq)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    mixed_precision = None
    if args.mixed_precision:
        mixed_precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                         buffer_dtype=torch.bfloat16)
    model = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        mixed_precision=mixed_precision,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE if args.prefetch else None,
        forward_prefetch=args.prefetch,
        sync_module_states=True,
        device_id=device,
        use_orig_params=True,
    )
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optim


def train(model, optim, args, first_step, steps):
    losses = []
    for step in range(first_step, first_step + steps):
        torch.manual_seed(1000 + step * dist.get_world_size() + dist.get_rank())
        batch = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), batch[:, 1:].reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


def full_state(model, optim, rank0_only):
    """The full model and optimizer state dicts (on rank 0 only when rank0_only), as host copies."""
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=rank0_only),
                              FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=rank0_only)):
        return copy(model.state_dict()), copy(FSDP.optim_state_dict(model, optim))


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

    model, optim = build(args, device)
    train(model, optim, args, 0, args.steps)

    # A full checkpoint: gathered to rank 0, which writes one file.
    path = os.path.join(args.ckpt_dir, "full.pt")
    model_state, optim_state = full_state(model, optim, rank0_only=True)
    if rank == 0:
        torch.save({"model": model_state, "optim": optim_state}, path)
    dist.barrier()
    saved_model, saved_optim = full_state(model, optim, rank0_only=False)
    expected = train(model, optim, args, args.steps, args.steps)

    # Reload: rank 0 reads the file into its unwrapped model; wrapping broadcasts it (sync_module_states).
    checkpoint = torch.load(path, weights_only=True) if rank == 0 else None
    model2, optim2 = build(args, device, checkpoint["model"] if rank == 0 else None)
    objects = [checkpoint["optim"] if rank == 0 else None]
    dist.broadcast_object_list(objects, src=0)
    with FSDP.state_dict_type(model2, StateDictType.FULL_STATE_DICT):
        optim2.load_state_dict(FSDP.optim_state_dict_to_load(model2, optim2, objects[0]))

    reloaded_model, reloaded_optim = full_state(model2, optim2, rank0_only=False)
    assert_equal(saved_model, reloaded_model, "model")
    assert_equal(saved_optim, reloaded_optim, "optim")
    losses = train(model2, optim2, args, args.steps, args.steps)
    assert losses == expected, (losses, expected)
    if rank == 0:
        print(f"fsdp1 example OK: losses {expected}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
