"""An MPI job for the FSDP x TP checkpoint test: `save DIR` trains a GPT at (dp=2, tp=2) and saves model and
optimizer; `load DIR` loads at this world size (1 rank: unsharded; 4 ranks: dp=4, tp=1) and writes the
losses of the next steps."""
import json
import os
import sys

import numpy as np

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import DataParallelMeshDims, fully_shard
from hpcfsdp.distributed.tensor.parallel import parallelize_module
from hpcfsdp.models import GPT, GPTConfig

B, T, V = 8, 8, 16
CFG = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16, bias=False)


def batches(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))) for _ in range(n)]


def train(model, opt, data, dp, i):
    out = []
    n = B // dp
    for x, y in data:
        _, loss = model(hp.tensor(x[i * n:(i + 1) * n]), hp.tensor(y[i * n:(i + 1) * n]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out.append(t.item())
    return out


def main():
    mode, d = sys.argv[1], sys.argv[2]
    w = dist.get_world_size()
    ckpt = os.path.join(d, "ckpt")
    hp.manual_seed(0 if mode == "save" else 99)
    model = GPT(CFG)
    if mode == "save":
        mesh = init_device_mesh("cpu", (w // 2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], model.tp_plan())
        dims = DataParallelMeshDims(shard="dp")
        for b in model.blocks:
            fully_shard(b, mesh=mesh, dp_mesh_dims=dims)
        fully_shard(model, mesh=mesh, dp_mesh_dims=dims)
        dp, i = w // 2, mesh.get_local_rank(0)
    else:
        if w > 1:
            for b in model.blocks:
                fully_shard(b)
            fully_shard(model)
        dp, i = w, dist.get_rank()
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    if mode == "save":
        train(model, opt, batches(3, 1), dp, i)
        dcp.save({"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt)},
                 checkpoint_id=ckpt)
    else:
        state = {"model": dcp.get_model_state_dict(model), "optim": dcp.get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=ckpt)
        dcp.set_model_state_dict(model, state["model"])
        dcp.set_optimizer_state_dict(model, opt, state["optim"])
    cont = train(model, opt, batches(3, 2), dp, i)
    if dist.get_rank() == 0:
        json.dump(cont, open(os.path.join(d, f"cont_{mode}_{w}.json"), "w"))


if __name__ == "__main__":
    main()
