"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_freezing_weights.py and test_fsdp_fine_tune.py
(frozen parameters under FSDP1) on CPU, against DDP by hand."""
import pytest

from _common import (
    allreduce_avg_grads,
    assert_close,
    copy_model,
    fsdp1_cpu,
    fsdp1_full_params,
    global_sum,
    local,
    randn,
    to_np,
    world,
)
from _framework import FSDP, ModuleWrapPolicy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class Trunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(4, 8)
        self.lin2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin2(self.lin1(x).relu()).relu()


class Model(nn.Module):
    def __init__(self, disable_autograd=False):
        super().__init__()
        self.trunk = Trunk()
        self.head = nn.Linear(8, 4)
        self.disable_autograd = disable_autograd

    def forward(self, x):
        if self.disable_autograd:
            with torch.no_grad():
                h = self.trunk(x)
        else:
            h = self.trunk(x)
        return self.head(h)


def _freeze_trunk(model):
    for p in model.trunk.parameters():
        p.requires_grad = False  # as PyTorch's test: attribute assignment


@pytest.mark.parametrize("disable_autograd", [False, True])
@pytest.mark.parametrize("freeze_when", ["before_wrap", "after_wrap", "after_first_step"])
@pytest.mark.parametrize("use_orig_params,nested_trunk", [(False, True), (True, False), (True, True)])
def test_freezing_weights(use_orig_params, nested_trunk, freeze_when, disable_autograd):
    """The trunk frozen (before or after wrapping, as PyTorch's freeze_after_wrap_fsdp, or after a first
    step; by requires_grad or under no_grad): FSDP trains as DDP, the trunk never moves once frozen
    (test_freezing_weights). use_orig_params=False needs the trunk in its own unit
    (PyTorch refuses one FlatParameter of mixed requires_grad)."""
    w, _ = world()
    torch.manual_seed(0)
    model = Model(disable_autograd)
    ddp = copy_model(model)
    if freeze_when == "before_wrap":
        _freeze_trunk(model)
    policy = ModuleWrapPolicy({Trunk}) if nested_trunk else None
    fsdp = FSDP(model, auto_wrap_policy=policy, device_id=fsdp1_cpu(), use_orig_params=use_orig_params)
    if freeze_when == "after_wrap":
        _freeze_trunk(fsdp)
    if freeze_when != "after_first_step":
        _freeze_trunk(ddp)
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1, momentum=0.9)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    trunk_before = {}
    for it in range(4):
        if freeze_when == "after_first_step" and it == 1:
            _freeze_trunk(fsdp)
            _freeze_trunk(ddp)
        if not trunk_before and not next(fsdp.module.trunk.parameters()).requires_grad:
            trunk_before = {n: v for n, v in fsdp1_full_params(fsdp).items() if n.startswith("trunk")}
        x = randn(2 * w, 4, seed=it)
        loss = fsdp(local(x)).sum()
        loss.backward()
        ddp_loss = ddp(local(x)).sum()
        ddp_loss.backward()
        allreduce_avg_grads(ddp)
        assert_close(global_sum(loss), global_sum(ddp_loss), rtol=1e-4, atol=1e-5, msg=f"loss {it}")
        opt.step()
        ddp_opt.step()
        opt.zero_grad()
        ddp_opt.zero_grad()
    full = fsdp1_full_params(fsdp)
    for n, p in ddp.named_parameters():
        assert_close(full[n], p, rtol=1e-4, atol=1e-5, msg=n)
    assert trunk_before
    for n, v in trunk_before.items():
        assert_close(full[n], v, rtol=0, atol=0, msg=f"frozen {n} moved")


@pytest.mark.parametrize("freezing_method", ["requires_grad", "grad_to_none"])
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_freeze_between_inner_and_root_wrap(use_orig_params, freezing_method):
    """PyTorch's freeze_after_wrap_fsdp exactly: trunk and head wrapped by hand, the trunk's (wrapped)
    parameters frozen (requires_grad = False, or their gradients set to None after every backward), then
    the root wrapped: FSDP trains as DDP and the trunk never moves (test_freezing_weights)."""
    w, _ = world()
    torch.manual_seed(0)
    model = Model()
    ddp = copy_model(model)
    model.trunk = FSDP(model.trunk, device_id=fsdp1_cpu(), use_orig_params=use_orig_params)
    model.head = FSDP(model.head, device_id=fsdp1_cpu(), use_orig_params=use_orig_params)
    if freezing_method == "requires_grad":
        _freeze_trunk(model)
        _freeze_trunk(ddp)
    fsdp = FSDP(model, device_id=fsdp1_cpu(), use_orig_params=use_orig_params)
    trunk_before = {n: v for n, v in fsdp1_full_params(fsdp).items() if n.startswith("trunk")}
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1, momentum=0.9)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for it in range(3):
        x = randn(2 * w, 4, seed=it)
        opt.zero_grad()
        ddp_opt.zero_grad()
        fsdp(local(x)).sum().backward()
        ddp(local(x)).sum().backward()
        allreduce_avg_grads(ddp)
        if freezing_method == "grad_to_none":
            for m in (model.trunk, ddp.trunk):
                for p in m.parameters():
                    p.grad = None
        opt.step()
        ddp_opt.step()
    full = fsdp1_full_params(fsdp)
    for n, p in ddp.named_parameters():
        assert_close(full[n], p, rtol=1e-4, atol=1e-5, msg=n)
    for n, v in trunk_before.items():
        assert_close(full[n], v, rtol=0, atol=0, msg=f"frozen {n} moved")


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_parity_with_non_frozen_fsdp(use_orig_params):
    """Fine-tuning: the trunk's units frozen, the head trained (test_fsdp_fine_tune's
    test_parity_with_non_frozen_fsdp / test_parity_with_ddp): parity with DDP, gradients None on frozen ones."""
    w, _ = world()
    torch.manual_seed(0)
    model = Model()
    _freeze_trunk(model)
    ddp = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Trunk, nn.Linear}), device_id=fsdp1_cpu(),
                use_orig_params=use_orig_params)
    opt = torch.optim.Adam([p for p in fsdp.parameters() if p.requires_grad], lr=1e-2)
    ddp_opt = torch.optim.Adam([p for p in ddp.parameters() if p.requires_grad], lr=1e-2)
    for it in range(3):
        x = randn(2 * w, 4, seed=it)
        fsdp(local(x)).sum().backward()
        ddp(local(x)).sum().backward()
        allreduce_avg_grads(ddp)
        for p in fsdp.parameters():
            assert p.requires_grad or p.grad is None
        opt.step()
        ddp_opt.step()
        opt.zero_grad()
        ddp_opt.zero_grad()
    full = fsdp1_full_params(fsdp)
    for n, p in ddp.named_parameters():
        assert_close(full[n], to_np(p), rtol=1e-4, atol=1e-5, msg=n)
