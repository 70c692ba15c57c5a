"""Re-expresses the CPU-meaningful cases of PyTorch's test/distributed/_composable/fsdp/test_fully_shard_comm.py
after test_set_reshard_after_forward: a mistargeted backward prefetch, async unshard inside a forward, and
unshard() on a module without parameters or before lazy init."""
import pytest

from _common import (MLP, allreduce_avg_grads, assert_close, broadcast_params, check_sharded_parity, copy_model,
                     randn, world)
from _framework import DTensor, F, FSDPModule, dist, fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def test_backward_misprefetch():
    """in_proj prefetches out_proj in backward although out_proj's backward already ran: the extra unshard is
    harmless and training matches DDP."""
    torch.manual_seed(42)
    model = MLP(8)
    ref = copy_model(model)
    fully_shard(model.in_proj)
    fully_shard(model.out_proj)
    fully_shard(model)
    model.in_proj.set_modules_to_backward_prefetch([model.out_proj])
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    _, r = world()
    inp = randn(2, 8, seed=r + 1)  # each rank its own batch, as DDP
    for _ in range(3):
        ref_optim.zero_grad()
        ref_loss = ref(inp).sum()
        ref_loss.backward()
        allreduce_avg_grads(ref)
        ref_optim.step()
        optim.zero_grad()
        loss = model(inp).sum()
        loss.backward()
        optim.step()
        assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    check_sharded_parity(ref, model, check_grads=False)


class ReduceModule(nn.Module):
    """relu(x @ W), then a non-differentiable async all-reduce of the result (overlapped with FSDP's unshards)."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x):
        y = F.relu(x @ self.weight)  # (B, dim)
        work = dist.all_reduce(y.detach(), async_op=True)
        return y, work


class MLPs(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.mlp1 = MLP(dim)
        self.mlp2 = MLP(dim)
        self.mlp3 = MLP(dim)

    def forward(self, ys, works):
        out = 0
        for y, work, mlp in zip(ys, works, (self.mlp1, self.mlp2, self.mlp3)):
            work.wait()
            out = out + mlp(y)
        return out


class ReduceModel(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.reduce_modules = nn.ModuleList([ReduceModule(dim) for _ in range(3)])
        self.mlps = MLPs(dim)

    def forward(self, x):
        ys, works = [], []
        for rm, mlp in zip(self.reduce_modules, (self.mlps.mlp1, self.mlps.mlp2, self.mlps.mlp3)):
            y, work = rm(x)
            ys.append(y)
            works.append(work)
            if isinstance(mlp, FSDPModule):
                mlp.unshard(async_op=True)  # issued while the all-reduce is in flight
        return self.mlps(ys, works)


def test_unshard_async():
    """Each MLP's unshard(async_op=True) is issued during the forward of a module that runs its own async
    all-reduce; losses and parameters match an unsharded replica with gradients averaged by hand."""
    torch.manual_seed(42)
    model = ReduceModel(8)
    broadcast_params(model)
    ref = copy_model(model)
    for mlp in (model.mlps.mlp1, model.mlps.mlp2, model.mlps.mlp3):
        fully_shard(mlp, reshard_after_forward=False)
    fully_shard(model.mlps)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    _, r = world()
    inp = randn(2, 8, seed=r + 1)
    for _ in range(3):
        losses = []
        for m, o in ((ref, ref_optim), (model, optim)):
            loss = m(inp).sum()
            loss.backward()
            allreduce_avg_grads(m if m is ref else m.reduce_modules)  # DDP by hand where FSDP does not reduce
            o.step()
            o.zero_grad()
            losses.append(loss)
        assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    ref_mlps = ref.mlps
    for name, p in model.mlps.named_parameters():
        assert_close(p, dict(ref_mlps.named_parameters())[name], rtol=1e-4, atol=1e-5, msg=name)
    for p, rp in zip(model.reduce_modules.parameters(), ref.reduce_modules.parameters()):
        assert_close(p, rp, rtol=1e-4, atol=1e-5)


def test_unshard_no_param_group():
    """unshard(async_op=True) on a root that manages no parameters returns a handle whose wait() works."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    for lin in model:
        fully_shard(lin)
    fully_shard(model)
    handle = model.unshard(async_op=True)
    assert handle is not None  # a handle even with nothing to gather
    assert handle.wait() is None
    assert all(isinstance(p, DTensor) for p in model.parameters())  # the children stay sharded


def test_unshard_without_lazy_init():
    """unshard() before any forward (no lazy init yet) registers the full, unsharded parameters."""
    torch.manual_seed(42)
    model = MLP(4)
    broadcast_params(model)
    ref = copy_model(model)
    fully_shard(model)
    model.unshard()
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        assert not isinstance(p, DTensor), f"{name} is still sharded after unshard()"
        assert tuple(p.shape) == tuple(rp.shape), name
        assert_close(p, rp, rtol=0, atol=0, msg=name)
