"""An MPI job for checkpoint tests: `save DIR` trains and saves; `load DIR [hsdp]` loads at this world size,
checks parameters and optimizer state exactly against what the saving job recorded, and trains on."""
import json
import os
import sys

import numpy as np

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.models import GPT, GPTConfig

GLOBAL_BATCH, T, VOCAB = 8, 8, 37
CFG = GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=2, n_embd=16, bias=False)


def batches(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, VOCAB, (GLOBAL_BATCH, T)), rng.integers(0, VOCAB, (GLOBAL_BATCH, T))) for _ in range(n)]


def build(seed, hsdp=False):
    hp.manual_seed(seed)
    model = GPT(CFG)
    kw = {}
    if hsdp:
        kw["mesh"] = dist.init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("replicate", "shard"))
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    return model, hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train(model, opt, data):
    w, r = dist.get_world_size(), dist.get_rank()
    n = GLOBAL_BATCH // w
    losses = []
    for x, y in data:
        _, loss = model(hp.tensor(x[r * n:(r + 1) * n]), hp.tensor(y[r * n:(r + 1) * n]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
    return losses


def full_state(model, opt):
    opts = dcp.StateDictOptions(full_state_dict=True)
    msd = dcp.get_model_state_dict(model, options=opts)
    osd = dcp.get_optimizer_state_dict(model, opt, options=opts)
    out = {f"model/{k}": np.array(v.numpy(), copy=True) for k, v in msd.items()}
    for name, st in osd["state"].items():
        for k, v in st.items():
            out[f"optim/{name}/{k}"] = np.array(v.numpy(), copy=True)  # state dicts share live tensors
    return out


def main():
    mode, d = sys.argv[1], sys.argv[2]
    hsdp = "hsdp" in sys.argv[3:]
    rank = dist.get_rank()
    ckpt = os.path.join(d, "ckpt")
    if mode == "save":
        model, opt = build(0)
        train(model, opt, batches(4, 1))
        state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt),
                 "step": 4, "note": "saved at world size %d" % dist.get_world_size()}
        dcp.save(state, checkpoint_id=ckpt)
        ref = full_state(model, opt)
        cont = train(model, opt, batches(4, 2))
        if rank == 0:
            np.savez(os.path.join(d, "ref.npz"), **ref)
            json.dump(cont, open(os.path.join(d, "cont.json"), "w"))
        return
    model, opt = build(99, hsdp)  # a different init: everything must come from the checkpoint
    state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt),
             "step": 0, "note": ""}
    dcp.load(state, checkpoint_id=ckpt)
    dcp.set_model_state_dict(model, state["model"])
    dcp.set_optimizer_state_dict(model, opt, state["optim"])
    assert state["step"] == 4 and state["note"].startswith("saved at world size"), state
    got = full_state(model, opt)
    ref = np.load(os.path.join(d, "ref.npz"))
    assert set(got) == set(ref.files), sorted(set(got) ^ set(ref.files))
    for k in ref.files:
        assert np.array_equal(got[k], ref[k]), f"{k} differs after load: {got[k].ravel()[:4]} vs {ref[k].ravel()[:4]}"
    cont = train(model, opt, batches(4, 2))
    if rank == 0:
        json.dump(cont, open(os.path.join(d, f"cont_loaded_{dist.get_world_size()}{'_hsdp' if hsdp else ''}.json"), "w"))


if __name__ == "__main__":
    main()
