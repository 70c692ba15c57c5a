"""Llama with its attention split by heads for tensor parallelism (q, k, v and the grouped k/v heads), under
FSDP on a (dp=2, tp=2) mesh: training parity with the single-process model, and a sharded checkpoint that
loads at another tensor-parallel degree (tp=4, and no tp at all). tp=4 alone is in test_tp_dtensor.py."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp import nn
from hpcfsdp.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import DataParallelMeshDims, fully_shard
from hpcfsdp.distributed.tensor import DTensor, Shard
from hpcfsdp.distributed.tensor.parallel import parallelize_module
from hpcfsdp.distributed.tensor.placement_types import _StridedShard
from hpcfsdp.models import Llama, LlamaConfig
from test_tp_heads import _rmtree, _tmpdir

pytestmark = pytest.mark.mpi(min_size=4)
CFG = dict(vocab_size=16, block_size=8, n_layer=2, n_head=8, n_kv_head=4, n_embd=32, intermediate_size=48)


def _llama(seed):
    hp.manual_seed(seed)
    return Llama(LlamaConfig(**CFG))


def _dp_tp(model, mesh):
    parallelize_module(model, mesh["tp"], model.tp_plan())
    dims = DataParallelMeshDims(shard="dp")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, dp_mesh_dims=dims)
    fully_shard(model, mesh=mesh, dp_mesh_dims=dims)
    return model


def _full(t):
    return t.full_tensor()._data if isinstance(t, DTensor) else t._data


@pytest.mark.timeout(300)
def test_llama_dp2_tp2_heads_split_matches_the_unsharded_model_and_reshards_to_tp4():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    i = mesh.get_local_rank(0)
    ref, model = _llama(3), _dp_tp(_llama(3), mesh)
    q = model.model.layers[0].self_attn.q_proj.weight
    k = model.model.layers[0].self_attn.k_proj.weight
    fsdp_over_tp = (_StridedShard(0, split_factor=2), Shard(0))  # PyTorch's placements for FSDP over TP on dim 0
    assert q.placements == fsdp_over_tp and k.placements == fsdp_over_tp
    assert q.full_tensor().shape == (32, 32) and k.full_tensor().shape == (16, 32)  # 4 kv heads of 4
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(7)
    for _ in range(4):
        x, y = rng.integers(0, 16, (4, 8)), rng.integers(0, 16, (4, 8))
        _, loss = model(hp.tensor(x[2 * i:2 * i + 2]), hp.tensor(y[2 * i:2 * i + 2]))
        loss.backward()
        _, rloss = ref(hp.tensor(x), hp.tensor(y))
        rloss.backward()
        total = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        rtotal = nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        np.testing.assert_allclose(_full(total), rtotal.item(), rtol=1e-5)
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
        mean = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        np.testing.assert_allclose(mean.item(), rloss.item(), rtol=1e-5)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p), refp[name]._data, rtol=1e-4, atol=1e-5, err_msg=name)

    root = _tmpdir()
    try:
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=f"{root}/ck")
        tp4 = _llama(11)
        parallelize_module(tp4, init_device_mesh("cpu", (4,), mesh_dim_names=("tp",)), tp4.tp_plan())
        assert tp4.model.layers[0].self_attn.k_proj.weight.to_local().shape == (4, 32)  # one kv head per rank
        plain = _llama(11)
        for m in (tp4, plain):
            sd = {"model": get_model_state_dict(m)}
            dcp.load(sd, checkpoint_id=f"{root}/ck")
            set_model_state_dict(m, sd["model"])
            for name, p in m.named_parameters():
                np.testing.assert_allclose(_full(p), refp[name]._data, rtol=1e-4, atol=1e-5, err_msg=name)
        x = hp.tensor(rng.integers(0, 16, (2, 8)))
        np.testing.assert_allclose(tp4(x)[0]._data, ref(x)[0]._data, rtol=1e-4, atol=1e-5)
    finally:
        _rmtree(root)
