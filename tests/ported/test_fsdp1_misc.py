"""Re-expresses the CPU-meaningful tests of PyTorch's test/distributed/fsdp/test_fsdp_misc.py on CPU (the
device_id / CUDA-move / FlatParameter-device tests are CUDA-only)."""
import collections
import warnings

import numpy as np
import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_cpu,
    global_sum,
    randn,
    to_np,
    world,
)
from _framework import F, FSDP, ModuleWrapPolicy, ShardingStrategy, always_wrap_policy, dist, nn, torch

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
    assert len(list(fsdp.parameters())) == 0
    assert_close(fsdp(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


@pytest.mark.parametrize("attr", ["use_orig_params", "limit_all_gathers"])
def test_homogeneous_attributes(attr):
    """An inner and the outer instance given different use_orig_params / limit_all_gathers: the first forward
    raises ValueError ("Expects one homogeneous value")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1] = _fsdp(model[1], **{attr: False})
    fsdp = _fsdp(model, **{attr: True})
    with pytest.raises(ValueError, match="homogeneous") as info:
        fsdp(randn(2, 4))
    assert attr in str(info.value)  # the message names the attribute


# ------------------------------------------------ the newest revision's other CPU-meaningful tests (ROCm/pytorch)


class SmallMnist(nn.Module):
    """test_fsdp_zero2_eval_with_prefetch's Mnist, smaller: two convolutions, max-pool, dropout, a LayerNorm
    and two linears; the forward returns the cross-entropy loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(128, 16)
        self.fc2 = nn.Linear(16, 10)
        self.ln = nn.LayerNorm(128)

    def forward(self, x, y):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(self.dropout1(F.max_pool2d(x, 2)), 1)
        x = self.dropout2(F.relu(self.fc1(self.ln(x))))
        return F.cross_entropy(F.log_softmax(self.fc2(x), dim=1), y)


def test_fsdp_zero2_eval_with_prefetch():
    """SHARD_GRAD_OP with forward_prefetch and use_orig_params, every Linear / Conv2d a unit: five training steps,
    five evaluations under no_grad, five more training steps, each equal to DDP (by hand) on the same per-rank
    data and dropout masks: losses, input gradients, and the evaluation losses."""
    from _common import allreduce_avg_grads

    w, rank = world()
    model, ref = SmallMnist(), SmallMnist()
    initial = {n: to_np(p) for n, p in ref.named_parameters()}
    fsdp = _fsdp(model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, forward_prefetch=True, use_orig_params=True,
                 auto_wrap_policy=ModuleWrapPolicy([nn.Linear, nn.Conv2d]))
    opt = torch.optim.SGD(fsdp.parameters(), lr=1e-2)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-2)

    def batch(i):
        x = randn(4, 1, 12, 12, seed=100 * rank + i).requires_grad_()
        y = torch.tensor(np.random.default_rng(100 * rank + i).integers(0, 10, (4,)).astype(np.int64))
        return x, y

    def train(offset):
        for i in range(5):
            x, y = batch(offset + i)
            losses, grads = [], []
            for m, o in ((fsdp, opt), (ref, ref_opt)):
                xi = x.detach().clone().requires_grad_()
                torch.manual_seed(rank + i)  # the same dropout masks for both
                loss = m(xi, y).sum()
                loss.backward()
                if m is ref:
                    allreduce_avg_grads(ref)
                o.step()
                o.zero_grad()
                losses.append(loss)
                grads.append(xi.grad)
            assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6, msg=f"loss {offset + i}")
            assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6, msg=f"input grad {offset + i}")

    train(0)
    fsdp.eval()
    ref.eval()
    with torch.no_grad():
        for i in range(5):
            x, y = batch(10 + i)
            assert_close(fsdp(x, y), ref(x, y), rtol=1e-5, atol=1e-6, msg=f"eval {i}")
    fsdp.train()
    ref.train()
    train(20)
    full = fsdp1_check_params(ref, fsdp, rtol=1e-4, atol=1e-5)
    assert all(not np.allclose(full[n], initial[n]) for n in ("conv1.weight", "fc2.weight"))  # it trained


class AB2(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(42)
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x, y):
        return self.b(self.a(x + y))


@pytest.mark.parametrize("sharding_strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp_cpu_training(sharding_strategy):
    """FSDP on CPU over a new (gloo, for PyTorch) group, every module a unit, trains ten Adam steps as DDP does
    (by hand), on per-rank inputs (upstream loops over strategies without passing them: FULL_SHARD each time;
    here each strategy is used)."""
    from _common import allreduce_avg_grads

    _, rank = world()
    group = dist.new_group()
    ref = AB2()
    fsdp = _fsdp(AB2(), auto_wrap_policy=always_wrap_policy, process_group=group,
                 sharding_strategy=getattr(ShardingStrategy, sharding_strategy))
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    opt = torch.optim.Adam(fsdp.parameters(), lr=1e-2)
    inp = randn(2, 2, seed=42 + rank)
    losses = []
    for _ in range(10):
        ref_loss = ref(inp, inp).sum()
        ref_loss.backward()
        allreduce_avg_grads(ref)
        ref_opt.step()
        ref_opt.zero_grad()
        loss = fsdp(inp, inp).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        losses.append(global_sum(loss))
    assert losses[-1] < losses[0], losses  # it trained
    fsdp1_check_params(ref, fsdp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_init_fn", [False, True])
def test_fsdp_ignored_module_meta(with_init_fn):
    """A meta module with an ignored child: FSDP materializes the rest (default reset, or a param_init_fn that
    to_empty's each module) and leaves the ignored child on the meta device."""
    class TwoLinears(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(1, 1)
            self.b = nn.Linear(1, 1)

    with torch.device("meta"):
        m = TwoLinears()
    kw = dict(param_init_fn=lambda mod: mod.to_empty(device=fsdp1_cpu(), recurse=False)) if with_init_fn else {}
    fsdp = _fsdp(m, ignored_modules=[m.a], use_orig_params=True, **kw)
    assert next(m.a.parameters()).device == torch.device("meta")
    assert all(p.device == torch.device("cpu") for p in m.b.parameters())
    assert fsdp.module is m


def test_fsdp_unsupported_module_cls():
    """FSDP over an nn.ModuleList / nn.ModuleDict (containers without forward): PyTorch warns that it will not
    all-gather their parameters (device_id given: without it PyTorch asks for an accelerator). hpcfsdp differs on
    purpose (docs/coming-from-pytorch.md): the children form one unit that gathers when they run, so there it
    checks the children compute with the full parameters."""
    from _framework import IS_TORCH

    regex = "FSDP will not all-gather parameters for containers that do not implement forward"
    torch.manual_seed(0)
    containers = [nn.ModuleList([nn.Linear(8, 8) for _ in range(3)]),
                  nn.ModuleDict({"1": nn.Linear(8, 8), "2": nn.Linear(8, 8)})]
    for container in containers:
        ref = copy_model(container)
        if IS_TORCH:
            with pytest.warns(UserWarning, match=regex):
                _fsdp(container)
            continue
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            fsdp = _fsdp(container)
        assert not any(regex in str(r.message) for r in rec)
        x = randn(2, 8, seed=5)
        children = list(fsdp.module.children())
        ref_children = list(ref.children())
        assert len(children) == len(ref_children) >= 2
        for child, ref_child in zip(children, ref_children):
            assert_close(child(x), ref_child(x), rtol=1e-6, atol=1e-6)
