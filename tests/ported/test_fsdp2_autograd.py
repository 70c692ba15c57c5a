"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_autograd.py."""
import collections

import numpy as np
import pytest

from _common import DoubleLinear, assert_close, check_sharded_parity, copy_model, global_sum, local, randn, world
from _framework import fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)

NT = collections.namedtuple("NT", "x y")


def _train(ref, model, loss_of, iters=4, dim=8):
    w, _ = world()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    losses = []
    for it in range(iters):
        x = randn(2 * w, dim, seed=it)
        loss = loss_of(model, local(x), it)
        loss.backward()
        ref_loss = loss_of(ref, x, it)
        (ref_loss / w).backward()
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
        check_sharded_parity(ref, model)
        losses.append(float(ref_loss.item()))
        for o in (optim, ref_optim):
            o.step()
            o.zero_grad(set_to_none=bool(it % 2))
    return losses


@pytest.mark.parametrize("reshard_after_forward", [True, False, 2])
def test_unused_forward_output(reshard_after_forward):
    """Some forward output unused by the loss (from iteration 2 on): gradients still flow where they should."""
    torch.manual_seed(42)
    model = DoubleLinear(8, use_second_linear=True)
    ref = copy_model(model)
    fully_shard(model.lin1, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)

    def loss_of(m, x, it):
        out1, out2 = m(x)
        return (out1 * out2).sum() if it < 2 else out1.sum()

    losses = _train(ref, model, loss_of)
    assert len(losses) == 4 and all(np.isfinite(losses))  # every iteration compared, the unused output included

@pytest.mark.parametrize("reshard_after_forward", [True, False, 2])
def test_unused_forward_module(reshard_after_forward):
    """A sharded module never run in forward: its gradient stays None, the rest trains."""
    torch.manual_seed(42)
    model = DoubleLinear(8, use_second_linear=False)
    ref = copy_model(model)
    fully_shard(model.lin1, reshard_after_forward=reshard_after_forward)
    fully_shard(model.lin2, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    losses = _train(ref, model, lambda m, x, it: m(x).sum())
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert all(p.grad is None for p in model.lin2.parameters())


class Module(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin1 = nn.Linear(dim, dim)
        self.lin2 = nn.Linear(dim, dim)
        self.relu = nn.ReLU()

    def forward(self, inp):
        if isinstance(inp, list):
            return [self._forward(inp[0])]
        if isinstance(inp, NT):
            return NT(self._forward(inp.x), inp.y)
        if isinstance(inp, tuple):
            return (self._forward(inp[0]),)
        return {"x": self._forward(inp["x"])}

    def _forward(self, x):
        return self.relu(self.lin2(self.relu(self.lin1(x))))


class ToContainer(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        return {"list": lambda: [x], "namedtuple": lambda: NT(x, torch.ones_like(x)), "tuple": lambda: (x,),
                "dict": lambda: {"x": x}}[self.kind]()


class FromContainer(nn.Module):
    def forward(self, x):
        return x["x"] if isinstance(x, dict) else x[0]


@pytest.mark.parametrize("container", ["list", "namedtuple", "tuple", "dict"])
def test_nontensor_activations(container):
    """Activations wrapped in lists, namedtuples, tuples and dicts between FSDP modules."""
    torch.manual_seed(42)
    model = nn.Sequential(ToContainer(container), Module(8), Module(8), Module(8), FromContainer())
    ref = copy_model(model)
    for m in model:
        fully_shard(m)
    fully_shard(model)
    losses = _train(ref, model, lambda m, x, it: m(x).sum())
    assert len(losses) == 4 and all(np.isfinite(losses))
