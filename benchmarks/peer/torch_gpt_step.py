#!/usr/bin/env python3
"""One-process PyTorch training step of hpcfsdp's GPT, on CPU or CUDA, fp32 or bf16: the ceiling beside
`hpcfsdp bench train` (scripts/device_check.sh runs both on the GPU machine and puts them side by side).

    python torch_gpt_step.py --tie                                        # CPU, fp32, BENCHMARKS.md's default GPT
    python torch_gpt_step.py --device cuda --dtype bf16 --tie --vocab 32768 --seq 1024 --layers 12 --heads 16 \
        --d-model 1024 --batch 8 --json -                                 # gpt-medium on a GPU

[Note: The PyTorch ceiling]
The model is torch_fsdp2_bench.py's GPT, hpcfsdp's architecture (pre-LayerNorm blocks, one fused q/k/v projection
with biases, exact GELU MLP of width 4d, causal scaled_dot_product_attention, learned positions, head tied to the
token embedding with --tie as hpcfsdp's default), initialised as hpcfsdp's [Note: GPT initialisation] says
(N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases, unit norms). It is built on
--device and trained in eager mode (no torch.compile) with AdamW (weight decay 0.1, foreach). --dtype bf16 is
PyTorch's usual mixed precision: fp32 parameters, gradients and AdamW state, the forward and the loss under
torch.autocast(bfloat16), which is what hpcfsdp's bf16 policy (MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32): fp32 shards, bf16 compute) amounts to on one rank. A step is forward, loss, backward, AdamW
step and zero_grad, between two device synchronisations; the result is the median over the measured steps.
MFU is hpcfsdp bench train's formula: FLOPs per step = tokens x (6 x params + 12 x n_layer x d_model x seq), over
step time x peak (--peak-tflops, or the dense peak of a known GPU: 989 TFLOP/s bf16 on an H100/H200, as
hpcfsdp/cli/bench_train.py's table); without a peak, MFU is null.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_fsdp2_bench import GPT  # noqa: E402  (the same model as the distributed peer)

# dense peak FLOP/s by (device name contains, dtype): hpcfsdp/cli/bench_train.py's _PEAK_FLOPS
PEAK_FLOPS = {("H200", "bf16"): 989e12, ("H200", "fp32"): 67e12, ("H100", "bf16"): 989e12, ("H100", "fp32"): 67e12}


def init_like_hpcfsdp_(model, layers, gen):
    """hpcfsdp's [Note: GPT initialisation] on this model (its parameter names)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                p.normal_(0.0, 0.02 / math.sqrt(2 * layers), generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def flops_per_token(n_params, layers, d_model, seq):
    """hpcfsdp bench train's count: 6 x params (forward + backward matmuls) + the attention-score term."""
    return 6 * n_params + 12 * layers * d_model * seq


def peak_flops(device, dtype, override_tflops=None):
    if override_tflops:
        return override_tflops * 1e12
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for (k, dt), v in PEAK_FLOPS.items() if k in name and dt == dtype), None)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: autocast(bfloat16) over fp32 parameters and AdamW state")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tie", action="store_true", help="tie the head to the token embedding (hpcfsdp's default)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (CPU)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: known GPUs)")
    ap.add_argument("--json", default=None, help="append the result as one JSON line to this file ('-' = stdout)")
    a = ap.parse_args(argv)
    if a.warmup < 0 or a.steps < 1:
        ap.error(f"--warmup must be >= 0 and --steps >= 1, got {a.warmup} and {a.steps}")
    if a.d_model % a.heads:
        ap.error(f"--d-model {a.d_model} is not divisible by --heads {a.heads}")
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"torch_gpt_step.py: --device cuda, but torch {torch.__version__} sees no CUDA GPU")
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    with dev:
        model = GPT(a.vocab, a.d_model, a.layers, a.heads, a.seq, a.tie)
    init_like_hpcfsdp_(model, a.layers, torch.Generator(device=dev).manual_seed(a.seed))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, foreach=True)
    gen = torch.Generator(device=dev).manual_seed(a.seed + 1)
    amp = torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    times, losses = [], []
    for i in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen, device=dev)
        sync()
        t0 = time.perf_counter()
        with amp:
            logits = model(tokens[:, :-1])                                           # (B, T, vocab)
            loss = F.cross_entropy(logits.reshape(-1, a.vocab).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    tokens_per_step = a.batch * a.seq
    fpt = flops_per_token(n_params, a.layers, a.d_model, a.seq)
    peak = peak_flops(a.device, a.dtype, a.peak_tflops)
    res = {"peer": "torch", "torch": torch.__version__, "mode": "single", "world_size": 1, "device": a.device,
           "device_name": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu", "dtype": a.dtype,
           "eager": True, "params": n_params,
           "model": {"vocab": a.vocab, "d_model": a.d_model, "layers": a.layers, "heads": a.heads, "seq": a.seq,
                     "batch": a.batch, "tie": a.tie},
           "median_step_s": med, "step_time_s": med, "step_times_s": times,
           "tokens_per_s": tokens_per_step / med, "flops_per_token": fpt, "peak_flops": peak,
           "mfu": fpt * tokens_per_step / med / peak if peak else None,
           "loss_first": losses[0], "loss_last": losses[-1],
           "peak_mem_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None}
    mfu = f", MFU {100 * res['mfu']:.1f}%" if res["mfu"] is not None else ""
    print(f"[torch {a.device} {a.dtype} eager] {n_params / 1e6:.1f}M params: median step {med:.4f} s, "
          f"{res['tokens_per_s']:.0f} tokens/s{mfu}, loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if a.json == "-":
        print(json.dumps(res), flush=True)
    elif a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    return res


if __name__ == "__main__":
    main()
