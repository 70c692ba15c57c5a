"""Launches, host syncs and device memory of a GPT training step on the simulated device, per block and per step.

    HPCFSDP_CUDA_SIM=1 python scripts/gpu_counts.py --config gpt-medium [--layers 3] [--batch 1] [--json FILE]

The reference configs of issue 28 (bf16 parameters with float32 reduction, dropout 0, one rank, FULL_SHARD units per
block): gpt-medium (24 layers, width 1024, 16 heads, T=1024, batch 8) and gpt-large (36 layers, width 1280, 20
heads). The simulation computes with NumPy, so --layers and --batch shrink the model for time: every block is
the same, so the per-block counts are those of the full model, and ``full_depth_launches`` composes the full
model's step from them (the measured step plus ``n_layer - layers`` blocks and their share of the optimizer's launches
where it launches per tensor). Counts are of the second step
(the first allocates the pool's blocks). HPCFSDP_FUSED_KERNELS=0 gives the unfused ops for a before/after pair.
"""
import argparse
import collections
import json
import sys

import numpy as np

CONFIGS = {"gpt-medium": dict(n_layer=24, n_embd=1024, n_head=16), "gpt-large": dict(n_layer=36, n_embd=1280,
                                                                                    n_head=20)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="gpt-medium")
    p.add_argument("--layers", type=int, default=3, help="blocks simulated (the counts per block are the same)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    import hpcfsdp as hp
    import hpcfsdp.distributed as dist
    from hpcfsdp import _backend, _settings
    from hpcfsdp.cli._common import build_gpt, compute_device, make_optimizer, shard_gpt
    from hpcfsdp.cli.config import TrainConfig
    if not _backend.cuda_simulated():
        raise SystemExit("gpu_counts.py counts on the simulated device: run it with HPCFSDP_CUDA_SIM=1")
    from hpcfsdp.testing.cuda_sim import counting

    shape = CONFIGS[a.config]
    dist.init_process_group()
    cfg = TrainConfig(vocab_size=a.vocab, block_size=a.block_size, n_layer=a.layers, n_head=shape["n_head"],
                      n_embd=shape["n_embd"], batch_size=a.batch, seed=0, strategy="FULL_SHARD",
                      mixed_precision="bf16", device="cuda", dropout=0.0, weight_decay=0.1)
    dev = compute_device("cuda")
    model = build_gpt(cfg, dev)
    shard_gpt(model, cfg, "cuda")
    optim = make_optimizer(cfg, model.parameters())
    groups = sum(1 for m in model.modules() if hasattr(m, "_get_fsdp_state"))
    window = [None]

    def label(name):
        if window[0] is not None:
            window[0].label(name)

    for i, blk in enumerate(model.blocks):
        def pre(m, args, i=i):
            label(f"fwd:block{i}")

        def post(m, args, out, i=i):
            label("fwd:rest")
            out.register_hook(lambda g, i=i: label(f"bwd:block{i}"))
        blk.register_forward_pre_hook(pre)
        blk.register_forward_hook(post)
    def first(m, args):  # the gradient leaving block 0 goes on to the embeddings (returns None: args unchanged)
        if args[0].requires_grad:
            args[0].register_hook(lambda g: label("bwd:rest"))
    model.blocks[0].register_forward_pre_hook(first)

    rng = np.random.default_rng(0)
    for step in range(2):
        x = hp.tensor(rng.integers(0, a.vocab, (a.batch, a.block_size)), device=dev)
        y = hp.tensor(rng.integers(0, a.vocab, (a.batch, a.block_size)), device=dev)
        _backend.synchronize(dev)
        with counting() as c:
            window[0] = c if step == 1 else None
            label("fwd:rest")
            _, loss = model(x, y)
            label("bwd:rest")
            loss.backward()
            label("optim")
            optim.step()
            optim.zero_grad(set_to_none=True)
            label(None)
        window[0] = None
        _backend.synchronize(dev)
        print(f"step {step}: loss {loss.item():.4f}", file=sys.stderr)

    mid = a.layers // 2
    fwd, bwd, opt = (c.per_unit.get(k) for k in (f"fwd:block{mid}", f"bwd:block{mid}", "optim"))
    block = fwd.launches + bwd.launches
    # the optimizer's launches a block adds: its share of the parameter tensors (a per-tensor path launches per
    # tensor; a multi-tensor kernel launches once for all of them, so a block adds nothing)
    per_tensor = opt.launches >= len(list(model.parameters()))
    opt_block = opt.launches * len(list(model.blocks[mid].parameters())) // len(list(model.parameters())) \
        if per_tensor else 0
    res = {"config": a.config, "simulated_layers": a.layers, "n_layer": shape["n_layer"], "batch": a.batch,
           "block_size": a.block_size, "fused_kernels": bool(_settings.get("HPCFSDP_FUSED_KERNELS")),
           "fsdp_groups": groups, "block_forward_launches": fwd.launches, "block_backward_launches": bwd.launches,
           "block_launches": block, "optimizer_launches": opt.launches,
           "optimizer_launches_per_group": opt.launches / groups, "step_launches": c.launches,
           "full_depth_launches": c.launches + (shape["n_layer"] - a.layers) * (block + opt_block),
           "step_host_syncs": len(c.host_syncs), "block_host_syncs": len(fwd.host_syncs) + len(bwd.host_syncs),
           "host_sync_sites": dict(collections.Counter(f"{k} at {s}" for k, s in c.host_syncs)),
           "step_peak_bytes": c.peak_bytes, "block_forward_top_ops": fwd.launches_by_op.most_common(),
           "block_backward_top_ops": bwd.launches_by_op.most_common()}
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
