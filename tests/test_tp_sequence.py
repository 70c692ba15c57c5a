"""SequenceParallel with ColwiseParallel(input_layouts=Shard(1)) / RowwiseParallel(output_layouts=Shard(1)):
forward and gradients against the unsharded module (fp32), on a tensor-parallel mesh of every rank."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard
from hpcfsdp.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

pytestmark = pytest.mark.mpi(min_size=2)
B, T, C, H = 2, 8, 6, 12


class Block(nn.Module):
    def __init__(self, seed):
        super().__init__()
        hp.manual_seed(seed)
        self.norm = nn.LayerNorm(C)
        self.up = nn.Linear(C, H)
        self.act = nn.GELU()
        self.down = nn.Linear(H, C)
        self.drop = nn.Dropout(0.0)
        self.ln_f = nn.LayerNorm(C)
        with hp.no_grad():  # non-trivial norm parameters, so their gradients mean something
            self.norm.weight.add_(hp.randn(C) * 0.3)
            self.ln_f.bias.add_(hp.randn(C) * 0.3)

    def forward(self, x):
        x = x + self.drop(self.down(self.act(self.up(self.norm(x)))))
        return self.ln_f(x)


PLAN = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)), "drop": SequenceParallel(use_local_output=True), "ln_f": SequenceParallel()}
# drop's output meets the plain residual stream (local, as RowwiseParallel's): a local tensor; ln_f's output is
# PyTorch's default, a Shard(1) DTensor


def test_sequence_parallel_matches_unsharded_forward_and_gradients():
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    ref, model = Block(1), Block(1)
    parallelize_module(model, mesh, PLAN)
    assert model.norm.weight.placements == (Replicate(),) and model.up.weight.placements == (Shard(0),)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    g = rng.standard_normal((B, T, C)).astype(np.float32)
    s = slice(r * T // n, (r + 1) * T // n)  # this rank's part of the sequence
    xr = hp.tensor(x, requires_grad=True)
    yr = ref(xr)
    (yr * hp.tensor(g)).sum().backward()
    xs = hp.tensor(np.ascontiguousarray(x[:, s]), requires_grad=True)
    ys = model(xs)
    assert isinstance(ys, DTensor) and ys.placements == (Shard(1),) and tuple(ys.shape) == (B, T, C)
    ys = ys.to_local()
    assert tuple(ys.shape) == (B, T // n, C)
    np.testing.assert_allclose(ys._data, yr._data[:, s], rtol=1e-5, atol=1e-6)
    (ys * hp.tensor(np.ascontiguousarray(g[:, s]))).sum().backward()
    np.testing.assert_allclose(xs.grad._data, xr.grad._data[:, s], rtol=1e-5, atol=1e-5)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        got = p.grad.full_tensor()._data if isinstance(p.grad, DTensor) else None
        if got is None:  # a local gradient of a DTensor parameter: gather it like the parameter
            got = DTensor.from_local(p.grad, p.device_mesh, p.placements, shape=p.shape).full_tensor()._data
        np.testing.assert_allclose(got, refp[name].grad._data, rtol=1e-5, atol=1e-5, err_msg=name)


def test_sequence_parallel_signature_and_bad_input():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    sp = SequenceParallel()
    assert sp.sequence_dim == 1 and sp.use_local_output is False
    with pytest.raises(TypeError):
        SequenceParallel(1)  # keyword-only, as PyTorch
    m = nn.LayerNorm(C)
    parallelize_module(m, mesh, SequenceParallel(sequence_dim=3))
    with pytest.raises(ValueError, match="sequence_dim 3 is out of range"):
        m(hp.randn(B, T // n, C))


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("use_fsdp", [False, True])
def test_gpt_sequence_parallel_parity_dp2_tp2(use_fsdp):
    from hpcfsdp.distributed.fsdp import DataParallelMeshDims, fully_shard
    from hpcfsdp.models import GPT, GPTConfig

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, bias=True)
    hp.manual_seed(0)
    ref = GPT(cfg)
    hp.manual_seed(0)
    model = GPT(cfg)
    parallelize_module(model, mesh["tp"], model.tp_plan(sequence_parallel=True))
    assert model.blocks[0].ln_1.weight.placements == (Replicate(),)
    if use_fsdp:
        dims = DataParallelMeshDims(shard="dp")
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, dp_mesh_dims=dims)
        fully_shard(model, mesh=mesh, dp_mesh_dims=dims)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(11)
    i = mesh.get_local_rank(0)
    for _ in range(10):
        x, y = rng.integers(0, 16, (4, 8)), rng.integers(0, 16, (4, 8))
        _, loss = model(hp.tensor(x[2 * i:2 * i + 2]), hp.tensor(y[2 * i:2 * i + 2]))
        loss.backward()
        if not use_fsdp:
            g = mesh["dp"].get_group(0)
            for p in model.parameters():
                g.all_reduce_(p.grad._data, dist.ReduceOp.SUM)
                p.grad._data[...] /= 2
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        np.testing.assert_allclose(t.item(), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        got = p.full_tensor()._data if isinstance(p, DTensor) else p._data
        np.testing.assert_allclose(got, refp[name]._data, atol=1e-4, err_msg=name)
