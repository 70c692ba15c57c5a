"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_ignore_params.py."""
import pytest

from _common import assert_close, copy_model, global_sum, local, randn, to_np, world
from _framework import DTensor, FSDPModule, fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class C(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin_c = nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin_c(x)


class B(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin_b = nn.Linear(dim, dim)
        self.module_c = C(dim)
        self.subtrahend = nn.Parameter(randn(dim, seed=70))

    def forward(self, x):
        return self.lin_b(self.module_c(x)) - self.subtrahend


class A(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.module_b = B(dim)
        self.addend = nn.Parameter(randn(dim, seed=42))

    def forward(self, x):
        return (self.module_b(x) + self.addend).sum()


def test_ignored_params_stay_local():
    """fully_shard(module_b, ignored_params=module_c's): module_c stays plain, unsharded, and its gradients
    are this rank's own (not reduced; the part PyTorch's test hands to DDP); the managed parameters follow the
    global-batch reference; module_b and module_b.lin_b are the FSDP modules."""
    w, r = world()
    dim = 8
    torch.manual_seed(0)
    model = A(dim)
    ref = copy_model(model)
    ignored = set(model.module_b.module_c.parameters())
    fully_shard(model.module_b.lin_b, ignored_params=ignored)
    fully_shard(model.module_b, ignored_params=ignored)
    fsdp_modules = {n for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    assert fsdp_modules == {"module_b", "module_b.lin_b"}
    for name, p in model.named_parameters():
        managed = name.startswith("module_b.") and not name.startswith("module_b.module_c")
        assert isinstance(p, DTensor) == managed, name
    x = randn(2 * w, dim, seed=84)
    loss = model(local(x))
    loss.backward()
    ref_loss = ref(x)
    (ref_loss / w).backward()
    assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
    local_ref = copy_model(ref)
    local_ref.zero_grad()
    local_ref(local(x)).backward()
    ref_params, local_params = dict(ref.named_parameters()), dict(local_ref.named_parameters())
    for name, p in model.named_parameters():
        if name.startswith("module_b.module_c"):
            assert not isinstance(p.grad, DTensor)
            assert_close(p.grad, local_params[name].grad, rtol=1e-5, atol=1e-6, msg=name)  # unreduced
        elif isinstance(p, DTensor):
            assert_close(p.grad, ref_params[name].grad, rtol=1e-5, atol=1e-6, msg=name)
    sd = model.state_dict()
    assert not isinstance(sd["module_b.module_c.lin_c.weight"], DTensor)
    assert_close(sd["module_b.module_c.lin_c.weight"], to_np(ref.module_b.module_c.lin_c.weight), rtol=0, atol=0)
