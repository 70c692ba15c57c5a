"""Tensor parallelism with DTensors as PyTorch's: gradients of TP parameters are DTensors of the parameters'
layouts, TP-only gradient norms are global, DTensor outputs (use_local_output=False), PrepareModuleInput /
PrepareModuleOutput, loss_parallel, and random init of sharded parameters; each against the unsharded model
on a tensor-parallel mesh of every rank (run at 2 and at 4 ranks)."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from hpcfsdp.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                 RowwiseParallel, SequenceParallel, parallelize_module)

pytestmark = pytest.mark.mpi(min_size=2)
B, T, C, H, V = 2, 8, 8, 16, 12


class Net(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        hp.manual_seed(seed)
        self.tok = nn.Embedding(V, C)
        self.norm = nn.LayerNorm(C)
        self.up = nn.Linear(C, H)
        self.act = nn.GELU()
        self.down = nn.Linear(H, C)
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        with hp.no_grad():  # non-trivial norm parameters, so their gradients mean something
            self.norm.weight.add_(hp.randn(C) * 0.3)
            self.ln_f.bias.add_(hp.randn(C) * 0.3)

    def forward(self, idx):
        x = self.tok(idx)
        x = x + self.down(self.act(self.up(self.norm(x))))
        return self.head(self.ln_f(x))


def _mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))


def _data():
    rng = np.random.default_rng(3)
    idx = rng.integers(0, V, (B, T))
    tgt = rng.integers(0, V, (B, T))
    return idx, tgt


def _ref_loss(ref, idx, tgt):
    logits = ref(hp.tensor(idx))
    return nn.functional.cross_entropy(logits.reshape(-1, V), hp.tensor(tgt).reshape(-1))


PLANS = {
    "tensor": lambda: {"tok": RowwiseParallel(input_layouts=Replicate()), "up": ColwiseParallel(), "down": RowwiseParallel(),
                       "head": ColwiseParallel(output_layouts=Replicate())},
    "sequence": lambda: {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)), "norm": SequenceParallel(),
                         "up": ColwiseParallel(input_layouts=Shard(1)), "down": RowwiseParallel(output_layouts=Shard(1)),
                         "ln_f": SequenceParallel(), "head": ColwiseParallel(input_layouts=Shard(1),
                                                                             output_layouts=Replicate())},
}
PLACEMENTS = {"tok.weight": Shard(0), "up.weight": Shard(0), "up.bias": Shard(0), "down.weight": Shard(1),
              "down.bias": Replicate(), "head.weight": Shard(0)}


def _full(t):
    return t.full_tensor()._data if isinstance(t, DTensor) else t._data


def _slice(full, placement, n, r):
    if isinstance(placement, Shard):
        c = full.shape[placement.dim] // n
        return np.take(full, range(r * c, (r + 1) * c), axis=placement.dim)
    return full


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_tp_gradients_are_dtensors_of_the_parameters_layout(plan):
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = _mesh()
    ref, model = Net(1), Net(1)
    parallelize_module(model, mesh, PLANS[plan]())
    idx, tgt = _data()
    loss = _ref_loss(ref, idx, tgt)
    loss.backward()
    mine = hp.tensor(idx)
    logits = model(mine)
    tl = nn.functional.cross_entropy(logits.reshape(-1, V), hp.tensor(tgt).reshape(-1))
    np.testing.assert_allclose(tl.item(), loss.item(), rtol=1e-5)
    tl.backward()
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g = refp[name].grad._data
        if plan == "tensor" and name.split(".")[0] in ("norm", "ln_f"):  # not parallelized: plain, as PyTorch
            assert not isinstance(p, DTensor) and not isinstance(p.grad, DTensor), name
            np.testing.assert_allclose(p.grad._data, g, rtol=1e-4, atol=1e-5, err_msg=name)
            continue
        assert isinstance(p, DTensor), name
        assert isinstance(p.grad, DTensor), name
        want = PLACEMENTS.get(name, Replicate())
        assert p.placements == (want,) and p.grad.placements == (want,), (name, p.grad.placements)
        assert p.grad.shape == p.shape and p.grad.device_mesh is p.device_mesh
        np.testing.assert_allclose(p.grad._data, _slice(g, want, n, r), rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(p.grad.full_tensor()._data, g, rtol=1e-4, atol=1e-5, err_msg=name)
    # the global norms, as the unsharded model's (not this rank's pieces)
    want = nn.utils.get_total_norm([p.grad for p in ref.parameters()]).item()
    got = nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert isinstance(got, DTensor) and got.placements == (Replicate(),)
    np.testing.assert_allclose(got.full_tensor().item(), want, rtol=1e-5)
    inf = nn.utils.get_total_norm([p.grad for p in model.parameters()], math.inf).full_tensor().item()
    np.testing.assert_allclose(inf, nn.utils.get_total_norm([p.grad for p in ref.parameters()], math.inf).item(),
                               rtol=1e-6)
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    rtotal = nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    np.testing.assert_allclose(total.full_tensor().item(), rtotal.item(), rtol=1e-5)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p.grad), refp[name].grad._data, rtol=1e-4, atol=1e-6,
                                   err_msg=name)
