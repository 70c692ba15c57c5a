"""Re-expresses the CPU-meaningful tests of PyTorch's test/distributed/fsdp/test_fsdp_misc.py on CPU (the
device_id / CUDA-move / FlatParameter-device tests are CUDA-only)."""
import collections

import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_cpu,
    randn,
    to_np,
)
from _framework import FSDP, ShardingStrategy, always_wrap_policy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _fsdp(module, **kwargs):
    return FSDP(module, device_id=fsdp1_cpu(), **kwargs)


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin1 = nn.Linear(4, 4)
        self.lin2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin1(x), self.lin2(x)


@pytest.mark.parametrize("sharding_strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp_not_all_outputs_used_in_loss(sharding_strategy):
    """Both outputs in the loss for two steps, then only the first: a nested instance over lin1 and the root
    train as the local model (same input on every rank), and the parameters keep changing."""
    strategy = getattr(ShardingStrategy, sharding_strategy)
    model = TwoOutputs()
    local_model = copy_model(model)
    model.lin1 = _fsdp(model.lin1, sharding_strategy=strategy)
    fsdp = _fsdp(model, sharding_strategy=strategy)
    fsdp1_check_params(local_model, fsdp)
    opt = torch.optim.SGD(fsdp.parameters(), lr=1e-2)
    opt_local = torch.optim.SGD(local_model.parameters(), lr=1e-2)
    prev = [to_np(p) for p in local_model.parameters()]
    for i in range(4):
        t = torch.ones(4)
        a, b = fsdp(t)
        la, lb = local_model(t)
        loss = (a @ b).sum() if i < 2 else a.sum()
        loss_local = (la @ lb).sum() if i < 2 else la.sum()
        loss.backward()
        loss_local.backward()
        opt.step()
        opt_local.step()
        fsdp1_check_params(local_model, fsdp)
        now = [to_np(p) for p in local_model.parameters()]
        assert any((abs(p - q) > 0).any() for p, q in zip(prev, now))
        prev = now
        opt.zero_grad()
        opt_local.zero_grad()


class AB(nn.Module):
    def __init__(self, use_second_layer):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.use_second_layer = use_second_layer

    def forward(self, x, y):
        out1 = self.a(x)
        return (out1, self.b(y)) if self.use_second_layer else out1


@pytest.mark.parametrize("use_second_layer", [True, False])
@pytest.mark.parametrize("sharding_strategy", ["NO_SHARD", "FULL_SHARD"])
def test_fsdp_module_no_compute_grad(use_second_layer, sharding_strategy):
    """A unit whose output is unused in the loss (or that does not run) gets no gradient; the used one does
    (checked through summon_full_params(with_grads=True) instead of the FlatParameter)."""
    fsdp = _fsdp(AB(use_second_layer), auto_wrap_policy=always_wrap_policy, use_orig_params=True,
                 sharding_strategy=getattr(ShardingStrategy, sharding_strategy))
    x, y = randn(3, 4, seed=1), randn(3, 4, seed=2)
    for _ in range(3):
        out = fsdp(x, y)
        a = out[0] if use_second_layer else out
        a.sum().backward()
        with FSDP.summon_full_params(fsdp, with_grads=True):
            grads = {n: p.grad for n, p in fsdp.named_parameters()}
        assert all(grads[n] is not None for n in grads if n.replace("_fsdp_wrapped_module.", "").startswith("a."))
        assert all(grads[n] is None for n in grads if n.replace("_fsdp_wrapped_module.", "").startswith("b."))


def test_fsdp_namedtuple():
    """A namedtuple input passes through the root forward unchanged (its fields keep requiring grad)."""

    class Identity(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return x

    fsdp = _fsdp(Identity())
    t = torch.ones(1, requires_grad=True)
    Out = collections.namedtuple("Out", ["a", "b", "c", "d"], defaults=(t, t, t, t))
    out = fsdp(Out())
    assert type(out).__name__ == "Out" and len(out) == 4
    assert all(x.requires_grad for x in out)


def test_no_params():
    """FSDP over a module without parameters constructs and runs (CPU with device_id; without device_id
    PyTorch asks for an accelerator)."""
    fsdp = _fsdp(nn.ReLU())
    assert_close(fsdp(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


@pytest.mark.parametrize("attr", ["use_orig_params", "limit_all_gathers"])
def test_homogeneous_attributes(attr):
    """An inner and the outer instance given different use_orig_params / limit_all_gathers: the first forward
    raises ValueError ("Expects one homogeneous value")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1] = _fsdp(model[1], **{attr: False})
    fsdp = _fsdp(model, **{attr: True})
    with pytest.raises(ValueError, match="homogeneous"):
        fsdp(randn(2, 4))
