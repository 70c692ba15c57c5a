"""Re-expresses the CPU-meaningful tests of PyTorch's test/distributed/fsdp/test_fsdp_use_orig_params.py on
CPU: several parameter groups with different hyperparameters, frozen groups, two optimizers, several forwards
(and a summon between them) before one backward, writeback of parameters and gradients set through the
original parameters, named_parameters in forward, no_sync with parameter mixed precision."""
import numpy as np
import pytest

from _common import (
    TransformerBlock,
    Transformer,
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_clean,
    fsdp1_cpu,
    fsdp1_full_params,
    global_sum,
    local,
    randint,
    randn,
    to_np,
    world,
)
from _framework import FSDP, IS_TORCH, BackwardPrefetch, F, MixedPrecision, ModuleWrapPolicy, ShardingStrategy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)

STRATEGIES = ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"]


def _transformer():
    torch.manual_seed(0)
    return Transformer(weight_tying=True)


def _wrap_transformer(model, sharding_strategy, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, **kwargs):
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), use_orig_params=True,
                sharding_strategy=getattr(ShardingStrategy, sharding_strategy), backward_prefetch=backward_prefetch,
                device_id=fsdp1_cpu(), **kwargs)


def _param_groups(model):
    """Weights, biases, the rest: different weight decay and learning rates (one unit holds several)."""
    groups = [{"params": [], "weight_decay": 0.1, "lr": 1e-2}, {"params": [], "weight_decay": 0.01, "lr": 1e-3},
              {"params": []}]
    for name, p in model.named_parameters():
        groups[0 if "weight" in name else 1 if "bias" in name else 2]["params"].append(p)
    return [g for g in groups if g["params"]]


def _train_parity(ref, ref_optim, model, optim, set_to_none=False, iters=3):
    w, _ = world()
    for it in range(iters):
        gx = randint(17, 2 * w, 6, seed=it)
        if it % 2 == 0:
            optim.zero_grad(set_to_none=set_to_none)
            ref_optim.zero_grad(set_to_none=set_to_none)
        loss = model(local(gx)).sum()
        ref_loss = ref(gx).sum()
        if it % 2 == 1:  # zero_grad between forward and backward
            optim.zero_grad(set_to_none=set_to_none)
            ref_optim.zero_grad(set_to_none=set_to_none)
        loss.backward()
        (ref_loss / w).backward()
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-4, atol=1e-5, msg=f"loss at iter {it}")
        optim.step()
        ref_optim.step()
    return fsdp1_check_params(ref, model)


@pytest.mark.parametrize("sharding_strategy", STRATEGIES)
@pytest.mark.parametrize("init_optim_before_wrap", [False, True])
def test_diff_hyperparams(sharding_strategy, init_optim_before_wrap):
    """AdamW over three parameter groups with different lr / weight decay trains as the reference, the
    optimizer built before or after wrapping; zero_grad before forward / before backward alternating
    (set_to_none and backward prefetch varied with the case)."""
    model = _transformer()
    ref = copy_model(model)
    ref_optim = torch.optim.AdamW(_param_groups(ref), lr=5e-3)
    prefetch = [None, BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST][STRATEGIES.index(sharding_strategy)]
    if init_optim_before_wrap:
        optim = torch.optim.AdamW(_param_groups(model), lr=5e-3)
        fsdp = _wrap_transformer(model, sharding_strategy, prefetch)
        if not IS_TORCH:  # hpcfsdp keeps no original parameter objects: the optimizer refuses to train nothing
            with pytest.raises(RuntimeError, match="build the optimizer after sharding"):
                optim.step()
            return
    else:
        fsdp = _wrap_transformer(model, sharding_strategy, prefetch)
        optim = torch.optim.AdamW(_param_groups(fsdp), lr=5e-3)
    _train_parity(ref, ref_optim, fsdp, optim, set_to_none=init_optim_before_wrap)


@pytest.mark.parametrize("sharding_strategy", STRATEGIES)
def test_diff_trainability(sharding_strategy):
    """Freezing every bias (one parameter group) after wrapping: training equals the reference's."""
    model = _transformer()
    ref = copy_model(model)
    fsdp = _wrap_transformer(model, sharding_strategy)
    for m in (ref, fsdp):
        for name, p in m.named_parameters():
            if "bias" in name:
                p.requires_grad_(False)
    before = {n: to_np(p).copy() for n, p in ref.named_parameters()}
    full = _train_parity(ref, torch.optim.Adam(_param_groups(ref), lr=5e-3), fsdp,
                         torch.optim.Adam(_param_groups(fsdp), lr=5e-3))
    for n, value in full.items():  # the frozen biases kept their values, the rest trained
        assert np.array_equal(value, before[n]) == ("bias" in n), n


@pytest.mark.parametrize("sharding_strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_multiple_optimizers(sharding_strategy):
    """Adam over the weights and AdamW over the biases, only the first zeroing with set_to_none: after the
    next forward the weights have no gradient and the biases keep theirs; training stays at parity (the
    bias correction tells a zero gradient from None)."""
    w, _ = world()
    model = _transformer()
    ref = copy_model(model)
    fsdp = _wrap_transformer(model, sharding_strategy)

    def optims(m):
        groups = _param_groups(m)
        return [torch.optim.Adam(groups[0]["params"], lr=5e-3), torch.optim.AdamW(groups[1]["params"], lr=1e-2)]

    ref_optims, fsdp_optims = optims(ref), optims(fsdp)

    def run_iter(it):
        gx = randint(17, 2 * w, 6, seed=it)
        loss = fsdp(local(gx)).sum()
        loss.backward()
        (ref(gx).sum() / w).backward()
        for o in ref_optims + fsdp_optims:
            o.step()
        fsdp1_check_params(ref, fsdp)

    run_iter(0)
    ref_optims[0].zero_grad(set_to_none=True)
    fsdp_optims[0].zero_grad(set_to_none=True)
    gx = randint(17, 2 * w, 6, seed=1)
    out = fsdp(local(gx))
    ref_out = ref(gx)
    for (n, p), (rn, rp) in zip(fsdp.named_parameters(), ref.named_parameters()):
        assert fsdp1_clean(n) == rn
        if rp.grad is None:
            assert p.grad is None, n
    with FSDP.summon_full_params(fsdp, with_grads=True):
        grads = {fsdp1_clean(n): p.grad for n, p in fsdp.named_parameters()}
    for n, rp in ref.named_parameters():  # a None gradient may be summoned as zeros (PyTorch's flat gradient)
        if rp.grad is None:
            assert grads[n] is None or not bool((grads[n] != 0).any()), n
        else:
            assert_close(grads[n], rp.grad, rtol=1e-4, atol=1e-5, msg=n)
    out.sum().backward()
    (ref_out.sum() / w).backward()
    for o in ref_optims + fsdp_optims:
        o.step()
    fsdp1_check_params(ref, fsdp)
    run_iter(2)


def _flat_and_orig(sharding_strategy):
    models = []
    for use_orig in (False, True):
        torch.manual_seed(0)
        m = Transformer(weight_tying=True)
        models.append(FSDP(m, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), use_orig_params=use_orig,
                           sharding_strategy=getattr(ShardingStrategy, sharding_strategy), device_id=fsdp1_cpu()))
    return models


def _check_same_params(a, b):
    pa, pb = fsdp1_full_params(a), fsdp1_full_params(b)
    assert sorted(pa) == sorted(pb)
    for n in pa:
        assert_close(pa[n], pb[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("sharding_strategy", STRATEGIES)
def test_multiple_forward(sharding_strategy):
    """Two forwards before one backward: use_orig_params=True and False agree in losses and parameters."""
    w, _ = world()
    models = _flat_and_orig(sharding_strategy)
    optims = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in models]
    for it in range(2):
        x1 = local(randint(17, 2 * w, 6, seed=it))
        x2 = local(randint(17, 2 * w, 6, seed=10 + it))
        losses = []
        for m, o in zip(models, optims):
            o.zero_grad()
            loss1, loss2 = m(x1).sum(), m(x2).sum()
            (loss1 + loss2).backward()
            o.step()
            losses.append((float(loss1.item()), float(loss2.item())))
        assert_close(losses[1][0], losses[0][0], rtol=1e-5, atol=1e-5)
        assert_close(losses[1][1], losses[0][1], rtol=1e-5, atol=1e-5)
    _check_same_params(*models)


@pytest.mark.parametrize("sharding_strategy", STRATEGIES)
def test_summon_between_two_forwards(sharding_strategy):
    """forward, summon_full_params, forward, then one backward: both settings agree throughout."""
    w, _ = world()
    models = _flat_and_orig(sharding_strategy)
    optims = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in models]
    for it in range(2):
        for o in optims:
            o.zero_grad()
        x1 = local(randint(17, 2 * w, 6, seed=it))
        first = [m(x1).sum() for m in models]
        assert_close(first[1], first[0], rtol=1e-5, atol=1e-5)
        _check_same_params(*models)  # summons both
        x2 = local(randint(17, 2 * w, 6, seed=20 + it))
        second = [m(x2).sum() for m in models]
        assert_close(second[1], second[0], rtol=1e-5, atol=1e-5)
        for a, b, o in zip(first, second, optims):
            (a + b).backward()
            o.step()
    _check_same_params(*models)


class WritebackModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(42)
        self.lin1 = nn.Linear(5, 5)
        self.lin2 = nn.Linear(5, 7)

    def forward(self, x):
        return self.lin2(F.relu(self.lin1(x)))


@pytest.mark.parametrize("change_first_weight", [True, False])
@pytest.mark.parametrize("change_data", [True, False])
def test_param_writeback(change_first_weight, change_data):
    """Replacing an original parameter (its .data or the attribute) of the wrapped module with 2s, on the
    reference and on FSDP alike: summon_full_params sees the reference's values."""
    ref = WritebackModel()
    fsdp = FSDP(WritebackModel(), use_orig_params=True, device_id=fsdp1_cpu())
    name = "lin1" if change_first_weight else "lin2"
    for mod in (getattr(ref, name), getattr(fsdp.module, name)):
        new = nn.Parameter(torch.full_like(mod.weight, 2.0))
        if change_data:
            mod.weight.data = new
        else:
            mod.weight = new
    full = fsdp1_check_params(ref, fsdp)
    assert np.all(full[f"{name}.weight"] == 2.0)  # the replacement reached the full parameter


@pytest.mark.parametrize("change_first_weight_grad", [False, True])
@pytest.mark.parametrize("how", ["data", "variable", "none"])
def test_grad_writeback(change_first_weight_grad, how):
    """Changing a gradient through the original parameter (.grad.data, .grad, or None) before the optimizer
    step, on the reference and on FSDP alike: the parameters after the steps agree."""
    w, _ = world()
    ref = WritebackModel()
    fsdp = FSDP(WritebackModel(), use_orig_params=True, device_id=fsdp1_cpu())
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    optim = torch.optim.Adam(fsdp.parameters(), lr=1e-2)
    gx = randn(2 * w, 5, seed=3)
    fsdp(local(gx)).sum().backward()
    (ref(gx).sum() / w).backward()
    name = "lin1" if change_first_weight_grad else "lin2"
    start = to_np(getattr(ref, name).weight).copy()
    for mod in (getattr(ref, name), getattr(fsdp.module, name)):
        p = mod.weight
        if how == "none":
            p.grad = None
        elif how == "data":
            if p.grad is not None:
                p.grad.data = torch.full_like(p, 2.0)
        else:
            p.grad = torch.full_like(p, 2.0)
    ref_optim.step()
    optim.step()
    full = fsdp1_check_params(ref, fsdp)
    assert np.array_equal(full[f"{name}.weight"], start) == (how == "none")  # no gradient: Adam skips it
    gx = randn(2 * w, 5, seed=4)  # no zero_grad: the written gradients accumulate
    fsdp(local(gx)).sum().backward()
    (ref(gx).sum() / w).backward()
    ref_optim.step()
    optim.step()
    fsdp1_check_params(ref, fsdp)


def test_named_parameters_in_forward():
    """named_parameters() inside forward gives the original names and the unsharded shapes."""
    seen = []

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(5, 5)

        def forward(self, x):
            seen.append([(fsdp1_clean(n), tuple(p.shape)) for n, p in self.named_parameters()])
            return self.lin(x)

    fsdp = FSDP(Model(), use_orig_params=True, device_id=fsdp1_cpu())
    fsdp(randn(2, 5))
    assert seen == [[("lin.weight", (5, 5)), ("lin.bias", (5,))]]


@pytest.mark.parametrize("sharding_strategy", STRATEGIES)
def test_no_sync_mixed_precision(sharding_strategy):
    """Inside no_sync() the accumulated gradients are in the parameter dtype (float16); the backward outside
    leaves them in full precision for the optimizer."""
    torch.manual_seed(0)
    fsdp = FSDP(nn.Linear(3, 3), sharding_strategy=getattr(ShardingStrategy, sharding_strategy), use_orig_params=True,
                mixed_precision=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32),
                device_id=fsdp1_cpu())
    x = randn(2, 3, seed=1)
    with fsdp.no_sync():
        for _ in range(2):
            fsdp(x).sum().backward()
            for p in fsdp.parameters():
                if p.grad is not None:
                    assert p.grad.dtype == torch.float16
    fsdp(x).sum().backward()
    for p in fsdp.parameters():
        if p.grad is not None:
            assert p.grad.dtype == torch.float32
