#!/usr/bin/env python3
"""The PyTorch peer of `hpcfsdp bench train`: one GPT training step under FSDP2, HSDP, DDP or one process (CPU).

    torchrun --standalone --nproc-per-node 2 torch_fsdp2_bench.py --mode fsdp
    torchrun --standalone --nproc-per-node 4 torch_fsdp2_bench.py --mode hsdp --replicate 2
    python torch_fsdp2_bench.py --mode single

Across hosts, one torchrun per host with --nnodes/--node-rank/--master-addr (scripts/cluster_bench.py --peer).

[Note: Same measurement as hpcfsdp]
The model mirrors hpcfsdp's GPT (pre-LayerNorm blocks, GELU MLP of width 4d, causal attention, learned positions,
head tied to the token embedding with --tie, as hpcfsdp's default); each block is one FSDP unit and the root
holds the embeddings, final norm and head, as hpcfsdp's `shard_gpt` wraps it. A step is forward, loss, backward,
AdamW step and zero_grad, timed after a barrier on every rank; the step time is the maximum over ranks, the
result the median over the measured steps. Distributed modes use gloo (CPU); --threads sets torch's intra-op
threads per rank (1 by default, so ranks do not oversubscribe the cores).
"""
import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=2))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, width, layers, heads, seq, tie):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        if tie:
            self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def init_weights_(model, seed):
    """N(0, 0.02) weights, zero biases, unit norms; on FSDP2's DTensors it fills the local shard."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = _local(p)
            if name.endswith("bias"):
                t.zero_()
            elif ".ln" in name or name.startswith("ln_f"):
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02, generator=gen)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--mode", choices=["fsdp", "hsdp", "ddp", "single"], default="fsdp")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank")
    ap.add_argument("--tie", action="store_true", help="tie the head to the token embedding (hpcfsdp's default)")
    ap.add_argument("--replicate", type=int, default=2, help="hsdp: size of the replicate mesh dimension")
    ap.add_argument("--no-reshard-after-forward", action="store_true")
    ap.add_argument("--meta-init", action="store_true",
                    help="fsdp/hsdp: build on the meta device, shard, then fill each rank's shard (no full copy)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--json", default=None, help="append the result as one JSON line ('-' = stdout) on rank 0")
    return ap.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    dist = None
    rank, world = 0, 1
    if a.mode != "single":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    if a.meta_init and a.mode not in ("fsdp", "hsdp"):
        raise ValueError(f"--meta-init needs --mode fsdp or hsdp, got {a.mode}")
    torch.manual_seed(1234)
    with torch.device("meta" if a.meta_init else "cpu"):
        model = GPT(a.vocab, a.d_model, a.layers, a.heads, a.seq, a.tie)
    if not a.meta_init:
        init_weights_(model, 1234)  # the same full model on every rank (FSDP2 does not broadcast)
    n_params = sum(p.numel() for p in model.parameters())
    mesh = None
    if a.mode in ("fsdp", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if a.mode == "hsdp":
            if world % a.replicate:
                raise ValueError(f"--replicate {a.replicate} does not divide the world size {world}")
            mesh = init_device_mesh("cpu", (a.replicate, world // a.replicate),
                                    mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, reshard_after_forward=not a.no_reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=not a.no_reshard_after_forward)
        if a.meta_init:
            model.to_empty(device="cpu")
            init_weights_(model, 1234 + rank)  # shards differ per rank: only the timing and memory matter
    elif a.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, foreach=True)
    gen = torch.Generator().manual_seed(42 + rank)
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        if dist:
            dist.barrier()
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(tokens[:, :-1]).reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(dt)
    t = torch.tensor(times, dtype=torch.float64)
    # per rank: peak RSS (MiB), bytes of its parameter shards and of its optimizer state
    mine = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                         sum(_local(p).numel() * _local(p).element_size() for p in model.parameters()),
                         sum(_local(v).numel() * _local(v).element_size() for st in opt.state.values()
                             for v in st.values() if torch.is_tensor(v))], dtype=torch.float64)
    every = [mine]
    if dist:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
    med = statistics.median(t.tolist())
    res = {"peer": "torch", "torch": torch.__version__, "mode": a.mode, "world_size": world,
           "mesh": None if mesh is None else list(mesh.shape), "params": n_params,
           "model": {"vocab": a.vocab, "d_model": a.d_model, "layers": a.layers, "heads": a.heads, "seq": a.seq,
                     "batch": a.batch, "tie": a.tie},
           "median_step_s": med, "step_times_s": t.tolist(), "tokens_per_s": world * a.batch * a.seq / med,
           "loss_first": losses[0], "loss_last": losses[-1],
           "per_rank": [{"rank": i, "peak_rss_mib": v[0].item(), "local_param_bytes": int(v[1].item()),
                         "local_optim_state_bytes": int(v[2].item())} for i, v in enumerate(every)]}
    if rank == 0:
        print(f"[{a.mode} x{world}] median step {med:.4f} s, {res['tokens_per_s']:.0f} tokens/s, "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
        if a.json == "-":
            print(json.dumps(res), flush=True)
        elif a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(res) + "\n")
    if dist:
        dist.barrier()
        dist.destroy_process_group()
    return res


if __name__ == "__main__":
    main()
