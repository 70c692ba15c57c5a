"""`hpcfsdp bench train` (FSDP training steps, measured) and `hpcfsdp bench compare` (A/B against the
unsharded step and PyTorch FSDP2, alternating runs in one invocation).

[Note: Step against its bounds]
Across hosts a step can be no faster than its computation and no faster than the bytes a host must put
on its link. `bench train --link IFACE --link-rate R --compute-only` measures both in the same run:
- bytes sent per host per step: the host link's tx counter (/sys/class/net/IFACE, read by the first rank
  of each host) between two barriers around the measured steps, less a calibrated per-run overhead: the
  same window with empty steps (barriers, the timing reductions, launcher chatter) is subtracted, and the
  rest is divided by the link's bytes per payload byte (frame headers and the acknowledgements of the
  received stream), measured by the host leaders exchanging a known buffer around a ring;
- wire bound: the least payload one host must send per step over the rate R, with H hosts: FULL_SHARD
  (and SHARD_GRAD_OP) (H-1)/H of the parameter bytes per all-gather (each unit in forward, again in
  backward when it reshards; the root once) plus (H-1)/H of the gradient bytes for the reduce-scatter;
  HYBRID_SHARD and NO_SHARD 2(H-1)/H of the gradient bytes for the cross-host all-reduce;
- compute-only: the same steps with FSDP's collectives (ProcessGroup all_gather_into,
  reduce_scatter_into, all_reduce_) replaced by local copies of the same sizes: numbers wrong, times
  right; run after everything else, and refused if FSDP issued any other collective meanwhile;
- ratio: step time / max(compute-only, wire bound).
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from ._stepmodel import quantized_itemsize, wire_min_bytes  # one definition for the model and the bench

__all__ = ["add_parser", "add_compare_parser", "add_checkpoint_parser", "bench_train", "run_compare", "peer_script"]

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
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks per data-parallel rank (FSDP over the rest, as `hpcfsdp train --tp`)")
    p.add_argument("--mixed-precision", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no-prefetch", action="store_true", help="disable forward and backward prefetching")
    p.add_argument("--reshard-after-forward", choices=["auto", "true", "false"], default="auto",
                   help="auto: by strategy, and the root and the last block keep their parameters between forward and "
                        "backward; "
                   "true/false: every unit, the root included")
    p.add_argument("--meta-init", action="store_true",
                   help="build the model on the meta device and materialise only each rank's shards (no rank ever "
                   "holds the full model: what peak-memory measurements need)")
    p.add_argument("--fsdp-units", choices=["block", "sublayer"], default="block",
                   help="one FSDP unit per block, or also one per block's MLP (see `hpcfsdp train --fsdp-units`)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block's forward in backward instead of keeping its activations")
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: known GPUs)")
    p.add_argument("--quantize-weights", choices=["none", "int8", "fp8"], default="none",
                   help="all-gather block-quantized weights (QuantizedAllGather on every FSDP unit)")
    p.add_argument("--quantize-grads", choices=["none", "int8", "int4"], default="none",
                   help="quantize the gradient reduction's cross-host hop (QuantizedReduceScatter, error feedback)")
    p.add_argument("--quantize-block", type=int, default=256, help="elements per quantization scale")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--link", default=None, metavar="IFACE",
                   help="count the bytes each host sends per step on this network interface (e.g. eth0)")
    p.add_argument("--link-rate", default=None, metavar="RATE",
                   help="nominal link rate per host (e.g. 200mbit, 1gbit, 25gbit) for the wire bound")
    p.add_argument("--profile-kernels", action="store_true",
                   help="with --device cuda: count the kernels of one more step (the simulator's counters, or on a GPU "
                   "PyTorch's CUPTI profiler, which must be installed): kernel_launches_per_step and its source")
    p.add_argument("--compute-only", action="store_true",
                   help="also time the same steps with FSDP's collectives replaced by local copies (numbers wrong, "
                   "times right)")
    p.add_argument("--json", default=None, help="append the result as one JSON line to this file ('-' = stdout)")
    p.set_defaults(func=_run_train)


def parse_rate(text: str) -> float:
    """Bits per second of a tc-style rate: 200mbit, 1gbit, 1.5Gbit, 100kbit, 1000000 (bit/s)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(bit)?\s*", str(text).lower())
    if not m or (m.group(2) and not m.group(3)):
        raise ValueError(f"link rate {text!r}: expected e.g. 200mbit, 1gbit or a number of bit/s")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    if value <= 0:
        raise ValueError(f"link rate {text!r} must be positive")
    return value


def _config(args):
    from .config import TrainConfig, parse_mesh

    return TrainConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, batch_size=args.batch_size, seed=args.seed,
                       strategy=args.strategy if args.strategy != "none" else "FULL_SHARD",
                       mesh=parse_mesh(args.mesh) if args.mesh else None, mixed_precision=args.mixed_precision,
                       device=args.device, tie_weights=args.tie_weights, dropout=0.0, weight_decay=0.1,
                       reshard_after_forward={"auto": None, "true": True, "false": False}[args.reshard_after_forward],
                       fsdp_units=args.fsdp_units, tp=args.tp, quantize_weights=args.quantize_weights,
                       quantize_grads=args.quantize_grads, quantize_block=args.quantize_block)


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


def _unit_numels(model, cfg):
    """Parameter counts of the FSDP units shard_gpt makes: (gathered once per step, gathered twice)."""
    total = sum(p.numel() for p in model.parameters())
    units = [*model.blocks] + ([] if model.config.tie_weights else [model.lm_head])
    inner = sum(p.numel() for u in units for p in u.parameters())
    reshard = cfg.effective_reshard_after_forward()
    root_twice = cfg.reshard_after_forward is True  # the root keeps its parameters unless told otherwise
    auto = cfg.reshard_after_forward is None  # and so does the last block (shard_gpt)
    last = sum(p.numel() for p in model.blocks[-1].parameters()) if auto and len(model.blocks) else 0
    once = (last if reshard else inner) + (0 if root_twice else total - inner)
    return once, total - once


def _link_tx(iface: str) -> int:
    with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
        return int(f.read())


def _link_factor(comm, layout, iface, nbytes=4 << 20, rounds=3) -> float:
    """Link bytes per payload byte: the host leaders send ``nbytes`` each around a ring, ``rounds`` times, and the
    least ratio counts (collective): a round's retransmissions or stray packets only add bytes, and one such
    round had put 9% on the factor and taken 9% off every count. 1.0 on one host, where nothing crosses a link."""
    import numpy as np

    if layout["num_nodes"] == 1:
        return 1.0
    leaders = comm.Split(0 if layout["local_rank"] == 0 else 1, comm.Get_rank())
    try:
        n, r = leaders.Get_size(), leaders.Get_rank()
        buf, out = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        least = float("inf")
        for _ in range(rounds):
            comm.Barrier()
            t0 = _link_tx(iface)
            if layout["local_rank"] == 0:
                leaders.Sendrecv(buf, (r + 1) % n, 11, out, (r - 1) % n, 11)
            comm.Barrier()
            least = min(least, _link_tx(iface) - t0)
    finally:
        leaders.Free()
    ratios = comm.allgather(least / nbytes if layout["local_rank"] == 0 else None)
    ratios = [x for x in ratios if x is not None]
    return statistics.median(ratios)


@contextlib.contextmanager
def local_collectives():
    """FSDP's collectives become local copies of the same sizes (numbers wrong, times right); any other
    collective issued meanwhile is an error."""
    from hpcfsdp.distributed import process_group as pgm
    from hpcfsdp.distributed._comm_thread import Work

    def all_gather_into(self, out_flat, in_flat, async_op=False):
        out_flat.reshape(self.size(), -1)[...] = in_flat.reshape(1, -1)
        return Work._completed("local all_gather_into") if async_op else None

    def reduce_scatter_into(self, out_flat, in_flat, op=None, async_op=False):
        out_flat.reshape(-1)[...] = in_flat.reshape(self.size(), -1).sum(axis=0)
        return Work._completed("local reduce_scatter_into") if async_op else None

    def all_reduce_(self, arr, op=None, async_op=False):
        a = arr.reshape(-1)
        a[...] = a.copy()
        return Work._completed("local all_reduce_") if async_op else None

    def all_to_all_into(self, out_flat, in_flat, out_counts=None, in_counts=None, async_op=False):
        out_flat.reshape(-1)[...] = in_flat.reshape(-1)  # equal pieces (the quantized reduction's hop)
        return Work._completed("local all_to_all_into") if async_op else None

    fakes = {"all_gather_into": all_gather_into, "reduce_scatter_into": reduce_scatter_into, "all_reduce_": all_reduce_,
             "all_to_all_into": all_to_all_into}
    classes, todo = [], [pgm.ProcessGroup]
    while todo:
        c = todo.pop()
        classes.append(c)
        todo.extend(c.__subclasses__())
    saved = [(c, name, c.__dict__[name]) for c in classes for name in fakes if name in c.__dict__]
    inherited = [name for name in fakes if not any(name == n for _, n, _ in saved)]
    saved += [(pgm.ProcessGroup, name, None) for name in inherited]  # defined on a mixin: shadowed, then removed
    before = pgm.collective_counts()
    for c, name, _ in saved:
        setattr(c, name, fakes[name])
    try:
        yield
    finally:
        for c, name, fn in saved:
            if fn is None:
                delattr(c, name)
            else:
                setattr(c, name, fn)
    after = pgm.collective_counts()
    if after != before:
        extra = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        raise RuntimeError(f"compute-only steps still issued collectives {extra}: the switch replaces only "
                           f"{sorted(fakes)}; the compute-only time would include communication")


def _fsdp_states(model):
    from hpcfsdp.distributed.fsdp import FSDPModule

    return [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]


def _prefetches(model) -> bool:
    """Whether any FSDP unit of ``model`` prefetches: read back from the units (None = the default next-unit
    prefetch, [] = none), so the result reports what ran, not what was asked."""
    return any(st._states_to_forward_prefetch != [] or st._states_to_backward_prefetch != []
               for st in _fsdp_states(model))


def _timed_steps(n, step, comm, device):
    """Per-step seconds (max over ranks) of ``n`` calls of ``step``, each between a barrier and a reduction."""
    import hpcfsdp as hp

    times = []
    for _ in range(n):
        if comm is not None:
            comm.Barrier()
        hp._backend.synchronize(device)
        t0 = time.perf_counter()
        step()
        hp._backend.synchronize(device)
        dt = time.perf_counter() - t0
        times.append(comm.allreduce(dt, op=_max()) if comm is not None else dt)
    return times


def _check_bound_options(args):
    """The nominal link rate (bit/s) or None; ValueError for options that cannot work together."""
    if (args.link or args.link_rate or args.compute_only) and args.strategy == "none":
        raise ValueError("--link, --link-rate and --compute-only measure FSDP across ranks: not with --strategy none")
    if args.tp != 1 and (args.strategy == "none" or args.compute_only or args.link_rate):
        raise ValueError(f"--tp {args.tp}: needs a sharded strategy, and is not measured with --compute-only or "
                         "--link-rate (their bounds count FSDP's traffic only)")
    if args.link and not os.path.exists(f"/sys/class/net/{args.link}/statistics/tx_bytes"):
        raise ValueError(f"--link {args.link}: no such network interface here (/sys/class/net/{args.link})")
    return parse_rate(args.link_rate) if args.link_rate else None


def bench_train(args) -> dict:
    import numpy as np

    import hpcfsdp as hp
    from hpcfsdp.distributed.fsdp import exposed_comm_seconds

    from ._common import StepCounts, build_gpt, compute_device, make_optimizer, peak_memory_bytes, shard_gpt

    cfg = _config(args)
    unsharded = args.strategy == "none"
    rate = _check_bound_options(args)
    if unsharded:
        comm, rank, world = None, 0, 1
    else:
        import hpcfsdp.distributed as dist

        dist.init_process_group()
        comm = dist.group.WORLD.comm
        rank, world = dist.get_rank(), dist.get_world_size()
        cfg.validate(world)
    device = compute_device(cfg.device)
    if args.meta_init:
        with hp.device("meta"):
            model = build_gpt(cfg, "meta")
    else:
        model = build_gpt(cfg, device)
    n_params = sum(p.numel() for p in model.parameters())
    once, twice = _unit_numels(model, cfg)
    if args.activation_checkpointing:
        from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_block_checkpointing

        apply_block_checkpointing(model)
    if not unsharded:
        shard_gpt(model, cfg, "cuda" if device.startswith("cuda") else "cpu")
    if args.meta_init:
        model.to_empty(device=device)
        hp.manual_seed(cfg.seed)
        model.init_weights()
    if args.no_prefetch and not unsharded:
        for st in _fsdp_states(model):
            st._states_to_forward_prefetch = []
            st._states_to_backward_prefetch = []
    optim = make_optimizer(cfg, model.parameters())
    rng = np.random.default_rng(args.seed + rank // cfg.tp)  # the tp ranks of a data-parallel rank share its batch
    times, exposed, cpu = [], [], []
    counts = StepCounts(device)  # launches and host syncs of the measured steps (the simulated device)
    link0 = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup and args.link:
            comm.Barrier()
            link0 = _link_tx(args.link)
        x = hp.tensor(rng.integers(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size)), device=device)
        y = hp.tensor(rng.integers(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size)), device=device)
        if comm is not None:
            comm.Barrier()
        hp._backend.synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        exposed_comm_seconds(reset=True)
        with counts.step() if i >= args.warmup else contextlib.nullcontext():
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
    net = {}
    if args.link:
        comm.Barrier()
        raw = _link_tx(args.link) - link0
        net = _net_metrics(args, comm, device, raw)
    med = statistics.median(times)
    profiled = _profile_kernels(args, device, model, optim, x, y) if args.profile_kernels else None
    peak = peak_memory_bytes(device)
    peaks = comm.allgather(peak) if comm is not None else [peak]
    # state bytes with gradients present: run one more backward without stepping
    _, loss = model(x, y)
    loss.backward()
    sbytes = _state_bytes(model, optim)
    sbytes_all = comm.allgather(sbytes) if comm is not None else [sbytes]
    tokens = world // cfg.tp * cfg.batch_size * cfg.block_size
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    res = {
        "strategy": args.strategy, "world_size": world, "tp": cfg.tp, "mesh": args.mesh,
        "quantize_weights": args.quantize_weights, "quantize_grads": args.quantize_grads,
        "quantize_block": args.quantize_block, "mixed_precision": args.mixed_precision,
        "device": cfg.device, "prefetch": _prefetches(model),
        "activation_checkpointing": args.activation_checkpointing, "fsdp_units": args.fsdp_units, "model": {
            "vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "n_layer": cfg.n_layer,
            "n_head": cfg.n_head, "n_embd": cfg.n_embd, "batch_size": cfg.batch_size, "params": n_params},
        "step_time_s": med, "step_times_s": times, "step_cpu_s": statistics.median(cpu), "tokens_per_s": tokens / med,
        "exposed_comm_s": statistics.median(exposed), "exposed_comm_frac": statistics.median(exposed) / med,
        "peak_mem_bytes": peaks, "sharded_state_bytes": sbytes_all,
    }
    if not unsharded:
        from hpcfsdp.distributed import _mpi

        hosts = _mpi.node_layout(comm)["num_nodes"]
        res["hosts"] = hosts
        if rate:
            mp = args.mixed_precision in ("bf16", "fp16")
            wire = wire_min_bytes(args.strategy, hosts, once, twice,
                                  quantized_itemsize(args.quantize_weights, args.quantize_block, 2 if mp else 4),
                                  quantized_itemsize(args.quantize_grads, args.quantize_block, 4))
            res.update(link_rate_bps=rate, wire_min_bytes_per_host=wire, wire_bound_s=wire * 8 / rate)
    res.update(net)
    if device.startswith("cuda"):  # this rank's counts; the peak of the ranks' pools
        res.update(counts.report(), peak_device_bytes=max(peaks))
        res["kernel_count_source"] = "simulator" if counts.on else None
    if profiled is not None:  # a GPU's own count (See [Note: Counting kernels on a GPU])
        res.update(kernel_launches_per_step=profiled["launches"], kernel_launches_by_kind=profiled["by_kind"],
                   kernel_count_source="cupti (torch.profiler), one step after the timed ones")
    if args.compute_only:
        def fake_step():
            _, loss = model(x, y)
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)

        optim.zero_grad(set_to_none=True)
        with local_collectives():
            fake_step()  # warm-up
            res["compute_only_s"] = statistics.median(_timed_steps(args.steps, fake_step, comm, device))
    if "compute_only_s" in res and "wire_bound_s" in res:
        res["step_over_bound"] = med / max(res["compute_only_s"], res["wire_bound_s"])
    peak_flops = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak_flops is None and device.startswith("cuda"):
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        peak_flops = next((v for (k, mp), v in _PEAK_FLOPS.items() if k in name and mp == args.mixed_precision), None)
    if peak_flops:
        res["mfu"] = flops_per_token * tokens / med / (peak_flops * world)
    return res


def _profile_kernels(args, device, model, optim, x, y):
    """One more step under PyTorch's CUPTI profiler on a real GPU (None elsewhere: the simulator counts itself)."""
    import hpcfsdp as hp

    if not device.startswith("cuda"):
        raise SystemExit("hpcfsdp bench train --profile-kernels: counts a GPU's kernels; use it with --device cuda")
    if hp._backend.cuda_simulated():
        return None

    from ._kernel_profile import profile_step

    def step():
        _, loss = model(x, y)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    return profile_step(step, lambda: hp._backend.synchronize(device))


def _net_metrics(args, comm, device, raw):
    """Bytes each host sent per measured step, corrected for the per-run overhead (collective)."""
    from hpcfsdp.distributed import _mpi

    layout = _mpi.node_layout(comm)
    # the same window with empty steps: barriers, timing reductions, whatever else talks meanwhile
    comm.Barrier()
    t0 = _link_tx(args.link)
    _timed_steps(args.steps, lambda: None, comm, device)
    comm.Barrier()
    const = _link_tx(args.link) - t0
    factor = _link_factor(comm, layout, args.link)
    mine = (layout["node_index"], raw, const) if layout["local_rank"] == 0 else None
    per_host = sorted(x for x in comm.allgather(mine) if x is not None)
    sent = [max(0.0, (r - c) / factor) / args.steps for _, r, c in per_host]
    return {"link": args.link, "link_bytes_per_payload_byte": factor,
            "link_raw_bytes_per_host": [r for _, r, _ in per_host],
            "link_overhead_bytes_per_host": [c for _, _, c in per_host],
            "bytes_sent_per_host_per_step": sent}


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _run_train(args) -> int:
    try:
        _check_bound_options(args)
    except ValueError as err:  # checked before any communication, the same on every rank
        print(f"hpcfsdp bench train: {err}", file=sys.stderr)
        return 2
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
            tp = f" tp={res['tp']}" if res["tp"] > 1 else ""
            print(f"{res['strategy']} x{res['world_size']}{tp} {res['mixed_precision']}: step {res['step_time_s']:.3f} s, "
                  f"{res['tokens_per_s']:.0f} tok/s, exposed comm {100 * res['exposed_comm_frac']:.1f}%, "
                  f"peak RSS/rank {max(mib):.0f} MiB, sharded state/rank {max(st):.0f} MiB"
                  + (f", MFU {100 * res['mfu']:.1f}%" if "mfu" in res else ""), flush=True)
            extra = []
            if "bytes_sent_per_host_per_step" in res:
                extra.append(f"sent/host/step {max(res['bytes_sent_per_host_per_step']) / 2**20:.2f} MiB")
            if "wire_bound_s" in res:
                extra.append(f"wire bound {res['wire_bound_s']:.3f} s "
                             f"({res['wire_min_bytes_per_host'] / 2**20:.2f} MiB/host at {res['link_rate_bps'] / 1e6:g} Mbit/s)")
            if "compute_only_s" in res:
                extra.append(f"compute-only {res['compute_only_s']:.3f} s")
            if "step_over_bound" in res:
                extra.append(f"step/max(compute, wire) {res['step_over_bound']:.2f}")
            if extra:
                print(f"  {res.get('hosts', 1)} host(s): " + ", ".join(extra), flush=True)
    return 0


# -- compare ----------------------------------------------------------------------------------------------------
def add_compare_parser(subparsers):
    p = subparsers.add_parser(
        "compare",
        help="A/B: FSDP at N ranks vs the unsharded step (and PyTorch FSDP2 when available)",
        description="In one invocation, alternating A B A B, measure (a) hpcfsdp FULL_SHARD at N ranks, (b) hpcfsdp "
        "unsharded in one process with the same per-rank batch, and (c)/(d) PyTorch FSDP2 with gloo at N ranks and "
        "PyTorch single-process (when --torch-python names a Python with torch, using the repository's "
        "benchmarks/peer/torch_fsdp2_bench.py, requirements in benchmarks/peer/requirements.txt), and (e) N unsharded "
        "hpcfsdp processes at once, no communication between them: what the machine gives N busy processes (shared "
        "cores, memory bandwidth, neighbours). Prints the ratios FSDP/unsharded for both (medians), and hpcfsdp's best "
        "FSDP round over the best round of (e), the cost of sharding itself; --quick checks that one against "
        "--max-ratio.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _model_args(p)
    p.add_argument("-n", "--nprocs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2, help="A/B rounds")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--torch-python", default=None, help="a python with torch installed (never a dependency)")
    p.add_argument("--peer-script", default=None,
                   help="path of torch_fsdp2_bench.py (default: benchmarks/peer/ of the source tree)")
    p.add_argument("--quick", action="store_true",
                   help="small model, three A/B rounds of 6 steps (CI regression check: fails if the FSDP step over N "
                   "concurrent unsharded processes exceeds --max-ratio)")
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


def peer_script() -> str:
    """The PyTorch peer in the source tree: <repository>/benchmarks/peer/torch_fsdp2_bench.py."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "benchmarks", "peer", "torch_fsdp2_bench.py")


def _torch_cmd(args, mode, out_json):
    script = args.peer_script or peer_script()
    flags = ["--tie"] if args.tie_weights else []
    flags += ["--vocab", str(args.vocab_size), "--seq", str(args.block_size), "--layers", str(args.n_layer),
              "--heads", str(args.n_head), "--d-model", str(args.n_embd), "--batch", str(args.batch_size),
              "--warmup", str(args.warmup), "--steps", str(args.steps), "--json", out_json]
    if mode == "single":
        return [args.torch_python, script, "--mode", "single", "--threads", "1", *flags]
    torchrun = os.path.join(os.path.dirname(args.torch_python), "torchrun")
    return [torchrun, "--standalone", "--nproc-per-node", str(args.nprocs), script, "--mode", "fsdp", *flags]


def _run_concurrent(cmd, n, env) -> float:
    """Run ``n`` copies of ``cmd`` at once; the mean of their step times."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    times = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
        times.append(_last_json(out)["step_time_s"])
    return statistics.fmean(times)


def run_compare(args) -> int:
    if args.quick:
        args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd = 1024, 64, 4, 4, 128
        args.batch_size, args.repeats, args.warmup, args.steps = 4, 3, 2, 6
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HPCFSDP_PROGRESS="0")
    launch = [sys.executable, "-m", "hpcfsdp.cli.main", "launch", "-n", str(args.nprocs), "--"]
    have_torch = bool(args.torch_python)
    if have_torch:
        script = args.peer_script or peer_script()
        if not os.path.isfile(script):
            raise SystemExit(f"hpcfsdp bench compare: no PyTorch peer script at {script}: pass --peer-script, or run "
                             "from a source checkout (benchmarks/peer/torch_fsdp2_bench.py)")
    runs = {"hp_fsdp": [], "hp_single": [], "hp_single_concurrent": [], "torch_fsdp": [], "torch_single": []}
    tmp = tempfile.mkdtemp(prefix="hpcfsdp-compare-")
    try:
        for r in range(args.repeats):
            runs["hp_fsdp"].append(_run(launch + _bench_cmd(args, "FULL_SHARD"), env)["step_time_s"])
            runs["hp_single"].append(_run(_bench_cmd(args, "none"), env)["step_time_s"])
            runs["hp_single_concurrent"].append(_run_concurrent(_bench_cmd(args, "none"), args.nprocs, env))
            if have_torch:
                for mode, key in (("fsdp", "torch_fsdp"), ("single", "torch_single")):
                    out = os.path.join(tmp, f"{mode}{r}.jsonl")
                    subprocess.run(_torch_cmd(args, mode, out), env=env, check=True, capture_output=True, timeout=3600)
                    runs[key].append(_last_json(open(out).read())["median_step_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    summary = {"nprocs": args.nprocs, "runs": runs, "median_step_s": med,
               "hp_ratio": med["hp_fsdp"] / med["hp_single"],
               # the check: each side's best round (a neighbour only ever adds time)
               "hp_ratio_vs_concurrent": min(runs["hp_fsdp"]) / min(runs["hp_single_concurrent"])}
    if have_torch:
        summary["torch_ratio"] = med["torch_fsdp"] / med["torch_single"]
        summary["hp_single_vs_torch_single"] = med["hp_single"] / med["torch_single"]
    print(json.dumps(summary, indent=2))
    print(f"hpcfsdp FULL_SHARD x{args.nprocs} / unsharded: {summary['hp_ratio']:.3f} "
          f"(/ {args.nprocs} unsharded at once: {summary['hp_ratio_vs_concurrent']:.3f})"
          + (f"; PyTorch FSDP2 / single: {summary['torch_ratio']:.3f}" if have_torch else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    if args.quick and summary["hp_ratio_vs_concurrent"] > args.max_ratio:
        print(f"hpcfsdp bench compare: FSDP overhead ratio {summary['hp_ratio_vs_concurrent']:.3f} (FULL_SHARD x"
              f"{args.nprocs} over {args.nprocs} unsharded processes at once) exceeds {args.max_ratio}", file=sys.stderr)
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
