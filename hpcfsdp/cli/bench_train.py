"""`hpcfsdp bench train` (FSDP training steps, measured) and `hpcfsdp bench compare` (A/B against the
unsharded step and PyTorch FSDP2, alternating runs in one invocation)."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["add_parser", "add_compare_parser", "add_checkpoint_parser", "bench_train", "run_compare"]

# Dense peak FLOP/s for MFU, by (device kind, precision). Only what we know; otherwise MFU is omitted.
_PEAK_FLOPS = {("H200", "bf16"): 989e12, ("H200", "fp16"): 989e12, ("H200", "none"): 67e12,
               ("H100", "bf16"): 989e12, ("H100", "fp16"): 989e12, ("H100", "none"): 67e12}


def _model_args(p, quick_defaults=False):
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    p.add_argument("--no-tie", dest="tie_weights", action="store_false",
                   help="untied output head (as the PyTorch peer script)")


def add_parser(subparsers):
    p = subparsers.add_parser(
        "train",
        help="measure FSDP training steps of a GPT",
        description="Run a GPT under a strategy, mesh and precision for warm-up + measured steps on the ranks of "
        "this job; report median step time (max over ranks), tokens/s, peak memory per rank, sharded state bytes "
        "per rank, exposed communication, and MFU where the peak is known.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _model_args(p)
    p.add_argument("--strategy", default="FULL_SHARD",
                   choices=["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "none"],
                   help="'none': the plain model in one process, no FSDP (the unsharded baseline)")
    p.add_argument("--mesh", default=None, help="RxS mesh for HYBRID_SHARD")
    p.add_argument("--mixed-precision", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no-prefetch", action="store_true", help="disable forward and backward prefetching")
    p.add_argument("--reshard-after-forward", choices=["auto", "true", "false"], default="auto",
                   help="auto: by strategy, and the root keeps its parameters between forward and backward; "
                   "true/false: every unit, the root included")
    p.add_argument("--meta-init", action="store_true",
                   help="build the model on the meta device and materialise only each rank's shards (no rank ever "
                   "holds the full model: what peak-memory measurements need)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block's forward in backward instead of keeping its activations")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: known GPUs)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--json", default=None, help="append the result as one JSON line to this file ('-' = stdout)")
    p.set_defaults(func=_run_train)


def _config(args):
    from .config import TrainConfig, parse_mesh

    return TrainConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, batch_size=args.batch_size, seed=args.seed,
                       strategy=args.strategy if args.strategy != "none" else "FULL_SHARD",
                       mesh=parse_mesh(args.mesh) if args.mesh else None, mixed_precision=args.mixed_precision,
                       device=args.device, tie_weights=args.tie_weights, dropout=0.0, weight_decay=0.1,
                       reshard_after_forward={"auto": None, "true": True, "false": False}[args.reshard_after_forward])


def _state_bytes(model, optim) -> int:
    total = 0
    for p in model.parameters():
        total += p._data.nbytes
        if p.grad is not None:
            total += p.grad._data.nbytes
    for st in optim.state.values():
        for v in st.values():
            if hasattr(v, "_data"):
                total += v._data.nbytes
    return total


def bench_train(args) -> dict:
    import numpy as np

    import hpcfsdp as hp
    from hpcfsdp.distributed.fsdp._fully_shard._fsdp_param_group import exposed_comm_seconds

    from ._common import build_gpt, compute_device, make_optimizer, peak_memory_bytes, shard_gpt

    cfg = _config(args)
    unsharded = args.strategy == "none"
    if unsharded:
        comm, rank, world = None, 0, 1
    else:
        import hpcfsdp.distributed as dist

        dist.init_process_group()
        comm = dist.distributed_c10d._default_group().comm
        rank, world = dist.get_rank(), dist.get_world_size()
        cfg.validate(world)
    device = compute_device(cfg.device)
    if args.meta_init:
        with hp.device("meta"):
            model = build_gpt(cfg, "meta")
    else:
        model = build_gpt(cfg, device)
    n_params = sum(p.numel() for p in model.parameters())
    if args.activation_checkpointing:
        from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_block_checkpointing

        apply_block_checkpointing(model)
    if not unsharded:
        shard_gpt(model, cfg, "cuda" if device.startswith("cuda") else "cpu")
    if args.meta_init:
        model.to_empty(device=device)
        hp.manual_seed(cfg.seed)
        model.init_weights()
        if args.no_prefetch:
            from hpcfsdp.distributed.fsdp import FSDPModule

            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_modules_to_forward_prefetch([])
                    m.set_modules_to_backward_prefetch([])
    optim = make_optimizer(cfg, model.parameters())
    rng = np.random.default_rng(args.seed + rank)
    times, exposed, cpu = [], [], []
    for i in range(args.warmup + args.steps):
        x = hp.tensor(rng.integers(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size)), device=device)
        y = hp.tensor(rng.integers(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size)), device=device)
        if comm is not None:
            comm.Barrier()
        hp._backend.synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        exposed_comm_seconds(reset=True)
        _, loss = model(x, y)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        hp._backend.synchronize(device)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        ex = exposed_comm_seconds()
        if comm is not None:
            dt = comm.allreduce(dt, op=_max())
            ex = comm.allreduce(ex, op=_max())
        if i >= args.warmup:
            times.append(dt)
            exposed.append(ex)
            cpu.append(comm.allreduce(dc, op=_max()) if comm is not None else dc)
    med = statistics.median(times)
    peak = peak_memory_bytes(device)
    peaks = comm.allgather(peak) if comm is not None else [peak]
    # state bytes with gradients present: run one more backward without stepping
    _, loss = model(x, y)
    loss.backward()
    sbytes = _state_bytes(model, optim)
    sbytes_all = comm.allgather(sbytes) if comm is not None else [sbytes]
    tokens = world * cfg.batch_size * cfg.block_size
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    res = {
        "strategy": args.strategy, "world_size": world, "mesh": args.mesh, "mixed_precision": args.mixed_precision,
        "device": cfg.device, "prefetch": not args.no_prefetch,
        "activation_checkpointing": args.activation_checkpointing, "model": {
            "vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "n_layer": cfg.n_layer,
            "n_head": cfg.n_head, "n_embd": cfg.n_embd, "batch_size": cfg.batch_size, "params": n_params},
        "step_time_s": med, "step_times_s": times, "step_cpu_s": statistics.median(cpu), "tokens_per_s": tokens / med,
        "exposed_comm_s": statistics.median(exposed), "exposed_comm_frac": statistics.median(exposed) / med,
        "peak_mem_bytes": peaks, "sharded_state_bytes": sbytes_all,
    }
    peak_flops = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak_flops is None and device.startswith("cuda"):
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        peak_flops = next((v for (k, mp), v in _PEAK_FLOPS.items() if k in name and mp == args.mixed_precision), None)
    if peak_flops:
        res["mfu"] = flops_per_token * tokens / med / (peak_flops * world)
    return res


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _run_train(args) -> int:
    res = bench_train(args)
    import hpcfsdp.distributed as dist

    rank = dist.get_rank() if args.strategy != "none" else 0
    if rank == 0:
        line = json.dumps(res)
        if args.json == "-":
            print(line, flush=True)
        else:
            if args.json:
                with open(args.json, "a") as f:
                    f.write(line + "\n")
            mib = [b / 2**20 for b in res["peak_mem_bytes"]]
            st = [b / 2**20 for b in res["sharded_state_bytes"]]
            print(f"{res['strategy']} x{res['world_size']} {res['mixed_precision']}: step {res['step_time_s']:.3f} s, "
                  f"{res['tokens_per_s']:.0f} tok/s, exposed comm {100 * res['exposed_comm_frac']:.1f}%, "
                  f"peak RSS/rank {max(mib):.0f} MiB, sharded state/rank {max(st):.0f} MiB"
                  + (f", MFU {100 * res['mfu']:.1f}%" if "mfu" in res else ""), flush=True)
    return 0


# -- compare ----------------------------------------------------------------------------------------------------
def add_compare_parser(subparsers):
    p = subparsers.add_parser(
        "compare",
        help="A/B: FSDP at N ranks vs the unsharded step (and PyTorch FSDP2 when available)",
        description="In one invocation, alternating A B A B, measure (a) hpcfsdp FULL_SHARD at N ranks, (b) hpcfsdp "
        "unsharded in one process with the same per-rank batch, and (c)/(d) PyTorch FSDP2 with gloo at N ranks and "
        "PyTorch single-process (when --torch-python names a Python with torch, using shared/peer/"
        "torch_fsdp2_bench.py). Prints the ratios FSDP/unsharded for both.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _model_args(p)
    p.add_argument("-n", "--nprocs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="A/B rounds")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--torch-python", default=None, help="a python with torch installed (never a dependency)")
    p.add_argument("--peer-script", default=None, help="path of torch_fsdp2_bench.py")
    p.add_argument("--quick", action="store_true",
                   help="small model, one round (CI regression check: fails if the FSDP overhead exceeds --max-ratio)")
    p.add_argument("--max-ratio", type=float, default=1.5)
    p.add_argument("--json", default=None, help="write the summary JSON here")
    p.set_defaults(func=run_compare)


def _bench_cmd(args, strategy):
    return [sys.executable, "-m", "hpcfsdp.cli.main", "bench", "train", "--strategy", strategy,
            "--vocab-size", str(args.vocab_size), "--block-size", str(args.block_size), "--n-layer", str(args.n_layer),
            "--n-head", str(args.n_head), "--n-embd", str(args.n_embd), "--batch-size", str(args.batch_size),
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--json", "-"] + \
           ([] if args.tie_weights else ["--no-tie"])


def _last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"benchmark printed no JSON result:\n{text[-2000:]}")


def _run(cmd, env):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return _last_json(out.stdout)


def _torch_cmd(args, mode, out_json):
    script = args.peer_script
    flags = ["--vocab", str(args.vocab_size), "--seq", str(args.block_size), "--layers", str(args.n_layer),
             "--heads", str(args.n_head), "--d-model", str(args.n_embd), "--batch", str(args.batch_size),
             "--warmup", str(args.warmup), "--steps", str(args.steps), "--json", out_json]
    if mode == "single":
        return [args.torch_python, script, "--mode", "single", "--threads", "1", *flags]
    torchrun = os.path.join(os.path.dirname(args.torch_python), "torchrun")
    return [torchrun, "--standalone", "--nproc-per-node", str(args.nprocs), script, "--mode", "fsdp", *flags]


def run_compare(args) -> int:
    if args.quick:
        args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd = 1024, 64, 4, 4, 128
        args.batch_size, args.repeats, args.warmup, args.steps = 4, 1, 1, 3
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HPCFSDP_NO_PROGRESS="1")
    launch = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(args.nprocs), "--"]
    have_torch = bool(args.torch_python)
    if have_torch and not args.peer_script:
        raise SystemExit("hpcfsdp bench compare: --torch-python needs --peer-script (shared/peer/torch_fsdp2_bench.py)")
    runs = {"hp_fsdp": [], "hp_single": [], "torch_fsdp": [], "torch_single": []}
    tmp = tempfile.mkdtemp(prefix="hpcfsdp-compare-")
    try:
        for r in range(args.repeats):
            runs["hp_fsdp"].append(_run(launch + _bench_cmd(args, "FULL_SHARD"), env)["step_time_s"])
            runs["hp_single"].append(_run(_bench_cmd(args, "none"), env)["step_time_s"])
            if have_torch:
                for mode, key in (("fsdp", "torch_fsdp"), ("single", "torch_single")):
                    out = os.path.join(tmp, f"{mode}{r}.jsonl")
                    subprocess.run(_torch_cmd(args, mode, out), env=env, check=True, capture_output=True, timeout=3600)
                    runs[key].append(_last_json(open(out).read())["median_step_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    summary = {"nprocs": args.nprocs, "runs": runs, "median_step_s": med,
               "hp_ratio": med["hp_fsdp"] / med["hp_single"]}
    if have_torch:
        summary["torch_ratio"] = med["torch_fsdp"] / med["torch_single"]
        summary["hp_single_vs_torch_single"] = med["hp_single"] / med["torch_single"]
    print(json.dumps(summary, indent=2))
    print(f"hpcfsdp FULL_SHARD x{args.nprocs} / unsharded: {summary['hp_ratio']:.3f}"
          + (f"; PyTorch FSDP2 / single: {summary['torch_ratio']:.3f}" if have_torch else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    if args.quick and summary["hp_ratio"] > args.max_ratio:
        print(f"hpcfsdp bench compare: FSDP overhead ratio {summary['hp_ratio']:.3f} exceeds {args.max_ratio}",
              file=sys.stderr)
        return 1
    return 0




# -- checkpoint I/O ---------------------------------------------------------------------------------------------
def add_checkpoint_parser(subparsers):
    p = subparsers.add_parser(
        "checkpoint",
        help="sharded checkpoint save/load throughput against raw NumPy file I/O",
        description="Save and load a float32 vector of --bytes sharded over the ranks of this job, and write/read "
        "the same bytes per rank with ndarray.tofile/np.fromfile on the same disk; report GB/s of each. Reads may "
        "be served from the page cache; the comparison is like for like.",
    )
    p.add_argument("--bytes", default="1G", help="total checkpoint size (e.g. 256M, 1G)")
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temporary one)")
    p.add_argument("--json", default=None, help="append the result as one JSON line to this file ('-' = stdout)")
    p.set_defaults(func=_run_checkpoint)


def _run_checkpoint(args) -> int:
    from hpcfsdp.distributed import _mpi
    from hpcfsdp.distributed.checkpoint._format import benchmark_io

    from .bench_comm import _parse_bytes

    comm = _mpi.get_mpi().COMM_WORLD
    base = args.dir or (tempfile.mkdtemp(prefix="hpcfsdp-ckpt-bench-") if comm.rank == 0 else None)
    base = comm.bcast(base, root=0)
    try:
        res = benchmark_io(os.path.join(base, "io"), _parse_bytes(args.bytes), comm)
    finally:
        comm.Barrier()
        if comm.rank == 0 and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if comm.rank == 0:
        line = json.dumps(res)
        if args.json == "-":
            print(line)
        elif args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
        print(f"checkpoint {res['bytes'] / 2**30:.2f} GiB on {res['world_size']} ranks: save "
              f"{res['save_GBps']:.2f} GB/s (raw write {res['raw_write_GBps']:.2f}), load {res['load_GBps']:.2f} GB/s "
              f"(raw read {res['raw_read_GBps']:.2f})", flush=True)
    return 0
