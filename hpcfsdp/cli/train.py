"""`hpcfsdp train`: train the reference GPT with FSDP on the ranks this job was launched on."""

import argparse
import json
import os
import sys
import time

__all__ = ["add_parser", "run", "train"]


def add_parser(subparsers):
    from .config import add_config_arguments

    p = subparsers.add_parser(
        "train",
        help="train a GPT with FSDP on the ranks of this job",
        description="Train hpcfsdp.models.GPT with fully sharded data parallelism on the MPI ranks this command "
        "runs on (start it with `hpcfsdp launch -n N -- hpcfsdp train ...`, mpiexec or srun). Configuration "
        "comes from --config FILE (TOML or JSON) and flags; flags win.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_config_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from .config import ConfigError, config_from_args, exit_with_config_error

    from hpcfsdp.distributed import _mpi

    world = _mpi.get_mpi().COMM_WORLD.Get_size()
    try:
        cfg = config_from_args(args)
        cfg.validate(world)
    except ConfigError as err:  # every rank validates the same way: all fail, before any collective
        return exit_with_config_error(err)
    return train(cfg)


class _Batches:
    """This rank's batches, epoch after epoch, resumable through the sampler's state."""

    def __init__(self, dataset, sampler, batch_size):
        self.dataset, self.sampler, self.batch_size = dataset, sampler, batch_size
        self._it = iter(sampler)

    def next(self):
        idx = []
        while len(idx) < self.batch_size:
            try:
                idx.append(next(self._it))
            except StopIteration:
                self.sampler.set_epoch(self.sampler.epoch + 1)
                self._it = iter(self.sampler)
        return self.dataset.get_batch(idx)


def _dataset(cfg):
    import numpy as np

    from hpcfsdp.data import TokenDataset, default_corpus

    if cfg.data is None:
        return TokenDataset.from_text(default_corpus(), cfg.block_size, dtype=np.uint16)
    return TokenDataset(cfg.data, cfg.block_size, dtype=np.dtype(cfg.data_dtype))


def _check_data_everywhere(cfg, comm):
    """A missing data file fails on every rank with the same message (no rank left in a collective)."""
    problem = None
    if cfg.data is not None and not os.path.isfile(cfg.data):
        problem = f"--data {cfg.data!r}: no such file on rank {comm.Get_rank()}"
    problems = [p for p in comm.allgather(problem) if p]
    return problems[0] if problems else None


def train(cfg) -> int:
    import numpy as np

    import hpcfsdp as hp
    import hpcfsdp.distributed as dist
    from hpcfsdp.distributed import checkpoint as dcp
    from hpcfsdp.distributed.fsdp._fully_shard._fsdp_param_group import exposed_comm_seconds
    from hpcfsdp.nn.utils import clip_grad_norm_

    from ._common import build_gpt, compute_device, make_optimizer, peak_memory_bytes, shard_gpt

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = dist.distributed_c10d._default_group().comm
    problem = _check_data_everywhere(cfg, comm)
    if problem:
        print(f"hpcfsdp train: error: {problem}", file=sys.stderr)
        return 2
    device = compute_device(cfg.device)
    dataset = _dataset(cfg)
    if cfg.vocab_size < 256 and cfg.data is None:
        print("hpcfsdp train: error: the shipped corpus is byte-level: --vocab-size must be >= 256", file=sys.stderr)
        return 2
    from hpcfsdp.data import DistributedSampler

    sampler = DistributedSampler(len(dataset), num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed)
    model = build_gpt(cfg, device)
    shard_gpt(model, cfg, "cuda" if device.startswith("cuda") else "cpu")
    optim = make_optimizer(cfg, model.parameters())
    start = 0
    ckpt = os.path.join(cfg.checkpoint_dir, "latest") if cfg.checkpoint_dir else None
    if cfg.resume and ckpt and os.path.exists(ckpt):
        state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, optim),
                 "step": 0, "sampler": sampler.state_dict()}
        dcp.load(state, checkpoint_id=ckpt)
        dcp.set_model_state_dict(model, state["model"])
        dcp.set_optimizer_state_dict(model, optim, state["optim"])
        sampler.load_state_dict(state["sampler"])
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from {ckpt} at step {start}", flush=True)
    batches = _Batches(dataset, sampler, cfg.batch_size)
    metrics = None
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(cfg.metrics_file())), exist_ok=True)
        metrics = open(cfg.metrics_file(), "a" if start else "w")
    bar = None
    if rank == 0 and sys.stdout.isatty() and not os.environ.get("HPCFSDP_NO_PROGRESS"):
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", dynamic_ncols=True, file=sys.stdout)
    tokens_per_step = cfg.tokens_per_step(world)
    first_loss = last_loss = None

    def save(step):
        state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, optim),
                 "step": step, "sampler": sampler.state_dict(), "config": cfg.to_dict()}
        dcp.save(state, checkpoint_id=ckpt)

    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        exposed_comm_seconds(reset=True)
        lr = cfg.lr_at(step)
        for g in optim.param_groups:
            g["lr"] = lr
        loss_sum = 0.0
        for micro in range(cfg.grad_accum):
            if cfg.grad_accum > 1:
                model.set_requires_gradient_sync(micro == cfg.grad_accum - 1)
            x, y = batches.next()
            _, loss = model(hp.tensor(x, device=device), hp.tensor(y, device=device))
            (loss / cfg.grad_accum).backward()
            loss_sum += loss.item() / cfg.grad_accum
        norm = clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        optim.step()
        optim.zero_grad()
        loss_t = hp.tensor([loss_sum], dtype=hp.float64)
        dist.all_reduce(loss_t, op=dist.ReduceOp.AVG)
        step_loss = float(loss_t.item())
        dt = time.perf_counter() - t0
        first_loss = step_loss if first_loss is None else first_loss
        last_loss = step_loss
        done = step + 1
        if ckpt and cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0 and done < cfg.steps:
            save(done)
        if done % cfg.log_interval == 0 or done == cfg.steps or step == start:
            peaks = comm.gather(peak_memory_bytes(device), root=0)
            if rank == 0:
                rec = {"step": done, "loss": step_loss, "lr": lr, "grad_norm": float(norm.item()),
                       "tokens_per_s": tokens_per_step / dt, "step_time_s": dt,
                       "comm_time_s": exposed_comm_seconds(), "peak_mem_bytes": peaks}
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
                if bar is None and not os.environ.get("HPCFSDP_NO_PROGRESS"):  # not a terminal: one line per log
                    print(f"step {done}/{cfg.steps}  loss {step_loss:.4f}  lr {lr:.2e}  "
                          f"{tokens_per_step / dt:.0f} tok/s  peak {max(peaks) / 2**20:.0f} MiB/rank", flush=True)
        if bar is not None:
            bar.set_postfix(loss=f"{step_loss:.3f}", tok_s=f"{tokens_per_step / dt:.0f}",
                            mem=f"{peak_memory_bytes(device) / 2**20:.0f}MiB")
            bar.update(1)
    if ckpt:
        save(cfg.steps)
    if bar is not None:
        bar.close()
    if rank == 0:
        metrics.close()
        if first_loss is not None:
            print(f"loss {first_loss:.4f} -> {last_loss:.4f} over steps {start + 1}..{cfg.steps}; "
                  f"metrics: {cfg.metrics_file()}" + (f"; checkpoint: {ckpt}" if ckpt else ""), flush=True)
    return 0
