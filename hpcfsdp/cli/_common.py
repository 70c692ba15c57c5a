"""What the trainer, the demo and the benchmarks share: building and sharding the GPT, memory readings."""

import collections
import contextlib
import os
import resource
import sys
import threading

import hpcfsdp as hp
from hpcfsdp import _backend
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy, fully_shard
from hpcfsdp.distributed.fsdp._strategy import strategy_mesh
from hpcfsdp.models import GPT, GPTConfig

__all__ = ["mp_policy_for", "build_gpt", "shard_gpt", "peak_memory_bytes", "make_optimizer", "compute_device",
           "track_device_peak", "StepCounts"]


def mp_policy_for(name: str):
    if name in (None, "none", "fp32"):
        return None
    dt = {"bf16": hp.bfloat16, "fp16": hp.float16}.get(name)
    if dt is None:
        raise ValueError(f"mixed precision {name!r}: expected bf16, fp16 or none")
    return MixedPrecisionPolicy(param_dtype=dt, reduce_dtype=hp.float32)


def compute_device(kind: str) -> str:
    """cpu, or cuda:<node-local rank> (one GPU per rank). The local rank comes from MPI's node split
    (collective when kind is cuda), never from a launcher's variable: under mpiexec inside a Slurm job
    every rank inherits the batch step's SLURM_LOCALID=0."""
    if kind != "cuda":
        return kind
    from hpcfsdp.distributed import _mpi

    local = _mpi.node_layout()["local_rank"]
    cp = _backend._need_cupy()
    dev = f"cuda:{local % max(1, cp.cuda.runtime.getDeviceCount())}"
    track_device_peak(dev)
    return dev


def build_gpt(cfg, device: str = "cpu") -> GPT:
    """The same GPT on every rank: initialised from ``cfg.seed``."""
    hp.manual_seed(cfg.seed)
    model = GPT(GPTConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                          n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout,
                          bias=True if cfg.bias is None else cfg.bias,  # None: the model's default
                          tie_weights=True if cfg.tie_weights is None else cfg.tie_weights))
    return model.to(device) if device != "cpu" else model


def shard_gpt(model: GPT, cfg, device_type: str = "cpu"):
    """fully_shard every block, then the root, as ``cfg.strategy`` says. Returns the mesh."""
    strategy = ShardingStrategy[cfg.strategy]
    if getattr(cfg, "tp", 1) > 1:
        return _shard_gpt_tp(model, cfg, device_type)
    user_mesh = None
    if cfg.mesh is not None and len(cfg.mesh) == 2:
        user_mesh = init_device_mesh(device_type, tuple(cfg.mesh), mesh_dim_names=("replicate", "shard"))
    elif cfg.mesh is not None:
        user_mesh = init_device_mesh(device_type, tuple(cfg.mesh),
                                     mesh_dim_names=("replicate",) if strategy == ShardingStrategy.NO_SHARD
                                     else ("shard",))
    mesh, dims = strategy_mesh(strategy, device_type, user_mesh)
    _fully_shard_units(model, cfg, mesh, dims)
    quantize_units(model, getattr(cfg, "quantize_weights", "none"), getattr(cfg, "quantize_grads", "none"),
                   getattr(cfg, "quantize_block", 256), getattr(cfg, "quantize_error_feedback", True))
    return mesh


def quantize_units(model, weights: str, grads: str, block: int, error_feedback: bool = True) -> None:
    """Give every FSDP unit of ``model`` the quantized all-gather / reduce-scatter asked for ("none": keep)."""
    from hpcfsdp.distributed.fsdp import FSDPModule, QuantizedAllGather, QuantizedReduceScatter

    for m in model.modules():
        if isinstance(m, FSDPModule):
            if weights != "none":
                m.set_custom_all_gather(QuantizedAllGather(weights, block_size=block))
            if grads != "none":
                m.set_custom_reduce_scatter(QuantizedReduceScatter(grads, block_size=block,
                                                                   error_feedback=error_feedback))


def _fully_shard_units(model: GPT, cfg, mesh, dims):
    """fully_shard every block, the untied head, then the root, over ``mesh``'s data-parallel ``dims``."""
    reshard = cfg.effective_reshard_after_forward()
    kw = dict(mesh=mesh, dp_mesh_dims=dims, mp_policy=mp_policy_for(cfg.mixed_precision),
              offload_policy=CPUOffloadPolicy() if cfg.cpu_offload else None)
    for block in model.blocks:
        # Left to the strategy, the last block keeps its parameters from forward to backward, as torchtitan's:
        # backward starts right where forward ends, so resharding it would all-gather it again at once (one block's
        # gather fewer per step: 15% of a step on the 2 x 2 cluster at 200 Mbit/s, BENCHMARKS.md).
        r = False if block is model.blocks[-1] and cfg.reshard_after_forward is None else reshard
        if cfg.fsdp_units == "sublayer":  # the MLP's gradients reduce while the block's attention runs backward
            fully_shard(block.mlp, reshard_after_forward=r, **kw)
        fully_shard(block, reshard_after_forward=r, **kw)
    if not model.config.tie_weights:
        # An untied head is a unit of its own: its input requires grad, so its gradient is reduce-scattered
        # (and freed) as soon as its backward is done instead of at the end of backward with the root's.
        fully_shard(model.lm_head, reshard_after_forward=reshard, **kw)
    # The root keeps its parameters from forward to backward unless resharding was asked for explicitly.
    root = reshard if cfg.reshard_after_forward is not None else (None if reshard else False)
    fully_shard(model, reshard_after_forward=root, **kw)


def make_optimizer(cfg, params):
    params = list(params)
    if cfg.optimizer == "adamw":
        return hp.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return hp.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return hp.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


# [Note: Peak device memory]
# CuPy's MemoryPool tells the bytes in use and held now (used_bytes, total_bytes), not their peak. The bytes
# in use rise only at an allocation, so reading used_bytes() right after each one finds the peak exactly:
# track_device_peak wraps the current allocator with cupy.cuda.set_allocator, which sets it for every thread
# (a cupy.cuda.MemoryHook, and cupy.cuda.using_allocator, hold for the calling thread only, and FSDP also
# allocates on its communication thread). The simulated device keeps its pool's high-water mark itself
# (hpcfsdp.testing.cuda_sim.device_peak_bytes).

_PEAKS: dict = {}  # device index -> the most bytes the default pool had in use since track_device_peak
_PEAK_LOCK = threading.Lock()
_WRAPPED = []  # the tracking allocator, once installed


def _index(device: str) -> int:
    if ":" in device:
        return int(device.split(":", 1)[1])
    return _backend._need_cupy().cuda.runtime.getDevice()


def track_device_peak(device: str) -> None:
    """Measure the peak of the CuPy pool's bytes in use on ``device`` (cuda[:i]) from now on (see [Note: Peak
    device memory]); compute_device calls it."""
    idx = _index(device)
    if _backend.cuda_simulated():
        from hpcfsdp.testing import cuda_sim

        cuda_sim.reset_device_peak(idx)
        return
    cp = _backend._need_cupy()
    pool = cp.get_default_memory_pool()
    with cp.cuda.Device(idx):
        used = int(pool.used_bytes())
    with _PEAK_LOCK:
        _PEAKS[idx] = used
        if _WRAPPED:
            return
        inner = cp.cuda.get_allocator()

        def malloc(size):
            mem = inner(size)
            used = pool.used_bytes()  # of the current device: the one that allocated
            if used > _PEAKS.get(mem.device_id, 0):
                with _PEAK_LOCK:
                    _PEAKS[mem.device_id] = max(used, _PEAKS.get(mem.device_id, 0))
            return mem

        cp.cuda.set_allocator(malloc)
        _WRAPPED.append(malloc)


def peak_memory_bytes(device: str = "cpu") -> int:
    """Peak resident memory of this process (CPU), or the peak of the CuPy pool's bytes in use (GPU) since
    track_device_peak (see [Note: Peak device memory]; untracked: the bytes the pool holds now)."""
    if device.startswith("cuda"):
        idx = _index(device)
        if _backend.cuda_simulated():
            from hpcfsdp.testing import cuda_sim

            return int(cuda_sim.device_peak_bytes(idx))
        if _WRAPPED and idx in _PEAKS:
            return int(_PEAKS[idx])
        cp = _backend._need_cupy()
        with cp.cuda.Device(idx):
            return int(cp.get_default_memory_pool().total_bytes())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class StepCounts:
    """Kernel launches and host syncs of the steps run inside ``step()``, on the simulated device (its counters,
    see [Note: Simulated device counts] in hpcfsdp/testing/_sim_counters.py); elsewhere there is no counter
    without a profiler, and ``report()`` gives None for them."""

    def __init__(self, device: str):
        self.on = device.startswith("cuda") and _backend.cuda_simulated()
        self.steps = []

    @contextlib.contextmanager
    def step(self):
        if not self.on:
            yield None
            return
        from hpcfsdp.testing.cuda_sim import counting

        with counting() as c:
            yield c
        self.steps.append(c)

    def report(self, top: int = 10) -> dict:
        """Means per step: kernel_launches_per_step, host_syncs_per_step, host_sync_sites ({site: syncs}, the
        ``top`` most frequent)."""
        n = len(self.steps)
        if not n:
            return {"kernel_launches_per_step": None, "host_syncs_per_step": None, "host_sync_sites": None}
        sites = collections.Counter()
        for c in self.steps:
            sites.update(c.sites())
        return {"kernel_launches_per_step": sum(c.launches for c in self.steps) / n,
                "host_syncs_per_step": sum(len(c.host_syncs) for c in self.steps) / n,
                "host_sync_sites": {s: k / n for s, k in sites.most_common(top)}}


def current_rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_memory_bytes()


def _shard_gpt_tp(model: GPT, cfg, device_type: str):
    """FSDP x TP: each block's attention (by heads) and MLP split over the last mesh dim ("tp", consecutive
    ranks), then fully_shard over the data-parallel dims (("replicate", "shard") for HYBRID_SHARD, else "shard")."""
    from hpcfsdp import distributed as dist
    from hpcfsdp.distributed.fsdp import DataParallelMeshDims
    from hpcfsdp.distributed.tensor.parallel import parallelize_module

    dp = dist.get_world_size() // cfg.tp
    if cfg.strategy == "HYBRID_SHARD":
        mesh = init_device_mesh(device_type, tuple(cfg.mesh) + (cfg.tp,), mesh_dim_names=("replicate", "shard", "tp"))
        dims = DataParallelMeshDims(shard="shard", replicate="replicate")
    else:
        mesh = init_device_mesh(device_type, (dp, cfg.tp), mesh_dim_names=("shard", "tp"))
        dims = DataParallelMeshDims(shard="shard")
    # the plan's modules under any wrapper (activation checkpointing adds a path segment)
    import fnmatch

    styles = model.tp_plan(sequence_parallel=cfg.sequence_parallel)
    plan = {}
    for n, _ in model.named_modules():
        parts = [p for p in n.split(".") if p != "_checkpoint_wrapped_module"]
        for key, v in styles.items():
            pat = key.split(".")
            if n and len(pat) == len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pat)):
                plan[n] = v
    parallelize_module(model, mesh["tp"], plan)
    _fully_shard_units(model, cfg, mesh, dims)
    return mesh
