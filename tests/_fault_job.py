"""An MPI job that fails on purpose on rank 2, for tests/test_faults.py: `python _fault_job.py MODE DIR`.

Every mode trains a tiny sharded GPT one step, saves a checkpoint to DIR/ckpt (committed), writes the full
model state rank 0 saw to DIR/ref.npz, then injects MODE's fault on rank 2 during the second step:
forward (a forward hook raises), backward (a tensor hook raises), comm (the communication thread raises
inside the all-gather), save (the second checkpoint save raises on rank 2 after writing its shard),
save_crash (rank 2 dies in the middle of the second save, leaving a partial temporary directory), skip
(rank 2 never joins an all-reduce; the others' watchdog fires after HPCFSDP_COMM_TIMEOUT=3 s) and exit
(rank 2 calls os._exit(3)). A job that finishes prints UNREACHABLE.
"""
import os
import sys
import time

import numpy as np

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp.distributed import _buffers
from hpcfsdp.distributed.checkpoint import _format
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.models import GPT, GPTConfig

FAULT_RANK = 2
VOCAB, T, GLOBAL_BATCH = 37, 8, 8
CFG = GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=2, n_embd=16, bias=False)
MODES = ("forward", "backward", "comm", "save", "save_crash", "skip", "exit")


class InjectedFault(RuntimeError):
    pass


def build():
    hp.manual_seed(0)
    model = GPT(CFG)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    return model, hp.optim.AdamW(model.parameters(), lr=1e-2)


def batch(step):
    rng = np.random.default_rng(step)
    w, r = dist.get_world_size(), dist.get_rank()
    n = GLOBAL_BATCH // w
    x, y = rng.integers(0, VOCAB, (2, GLOBAL_BATCH, T))
    return hp.tensor(x[r * n:(r + 1) * n]), hp.tensor(y[r * n:(r + 1) * n])


def train_step(model, opt, step):
    _, loss = model(*batch(step))
    loss.backward()
    opt.step()
    opt.zero_grad()
    t = hp.tensor([loss.item()], dtype=hp.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # the collective rank 2 skips in mode "skip"
    return t.item()


def state(model, step):
    return {"model": dcp.get_model_state_dict(model), "step": step}


def inject(mode, model, rank):
    """Arm MODE's fault (only rank 2 fails)."""
    if mode == "forward":
        def fwd_hook(module, args, out):
            if rank == FAULT_RANK:
                raise InjectedFault(f"forward hook failed on rank {rank}")
        model.blocks[1].mlp.register_forward_hook(fwd_hook)
    elif mode == "backward":
        def grad_hook(grad):
            if rank == FAULT_RANK:
                raise InjectedFault(f"tensor hook failed in backward on rank {rank}")
        def fwd_hook(module, args, out):
            out.register_hook(grad_hook)  # returns a handle: the hook itself must return None
        model.blocks[1].register_forward_hook(fwd_hook)
    elif mode == "comm" and rank == FAULT_RANK:
        def broken_allgather(*args, **kwargs):
            raise InjectedFault(f"MPI all-gather failed on the communication thread of rank {rank}")
        _buffers.allgather_bytes = broken_allgather  # looked up by the comm thread at call time
    elif mode == "exit" and rank == FAULT_RANK:
        model.blocks[0].register_forward_hook(lambda m, a, out: os._exit(3))


def main():
    mode, d = sys.argv[1], sys.argv[2]
    assert mode in MODES, mode
    rank = dist.get_rank()
    model, opt = build()
    train_step(model, opt, 0)
    ckpt = os.path.join(d, "ckpt")
    dcp.save(state(model, 1), checkpoint_id=ckpt)
    full = dcp.get_model_state_dict(model, options=dcp.StateDictOptions(full_state_dict=True))
    if rank == 0:
        np.savez(os.path.join(d, "ref.npz"), **{k: np.asarray(v.numpy()) for k, v in full.items()})
    dist.barrier()

    inject(mode, model, rank)
    if mode == "skip":
        os.environ["HPCFSDP_COMM_TIMEOUT"] = "3"  # only now: startup on a busy machine may be slow
        _, loss = model(*batch(1))
        loss.backward()
        if rank == FAULT_RANK:
            time.sleep(120)  # never joins the all-reduce (a rank stuck elsewhere)
        dist.all_reduce(hp.tensor([loss.item()], dtype=hp.float64))
    elif mode in ("save", "save_crash"):
        train_step(model, opt, 1)

        def fault(stage):
            if stage == "write" and rank == FAULT_RANK:
                if mode == "save":
                    raise InjectedFault(f"disk full while saving on rank {rank}")
                raise _format._SimulatedCrash(f"rank {rank} died while saving")

        _format._fault_hook = fault
        dcp.save(state(model, 2), checkpoint_id=ckpt)
    else:
        train_step(model, opt, 1)
    dist.barrier()
    print("UNREACHABLE", flush=True)


if __name__ == "__main__":
    main()
