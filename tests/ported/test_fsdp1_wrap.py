"""Re-expresses PyTorch's test/distributed/fsdp/test_wrap.py (FSDP1 auto-wrap policies, enable_wrap/wrap)."""
import functools

import pytest

from _common import (
    copy_model,
    fsdp1_check_params,
    fsdp1_cpu,
    fsdp1_full_params,
    fsdp1_inner,
    fsdp1_is_unit,
    fsdp1_train_parity,
    fsdp1_units,
    randn,
    to_np,
    world,
)
from _framework import (
    FSDP,
    CustomPolicy,
    ModuleWrapPolicy,
    always_wrap_policy,
    enable_wrap,
    lambda_auto_wrap_policy,
    nn,
    size_based_auto_wrap_policy,
    torch,
    transformer_auto_wrap_policy,
    wrap,
)

pytestmark = pytest.mark.mpi(min_size=2)


class Holder(nn.Module):
    """A module whose child is named ``module`` (PyTorch's common_fsdp.ModuleWithDelay has one)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)


def _holder_model(dim=4):
    torch.manual_seed(0)
    return nn.Sequential(Holder(nn.Linear(dim, dim)), nn.ReLU(), Holder(nn.Sequential(nn.Linear(dim, dim))))


@pytest.mark.parametrize("how", ["lambda_policy", "module_policy", "wrap_by_hand"])
def test_child_named_module_wraps_and_trains(how):
    """A wrapped module holding a child called ``module`` (ModuleWithDelay, NestedWrappedModuleWithDelay):
    nested wrapping, a lambda policy and summon_full_params(with_grads=True) work and train as the reference."""
    w, _ = world()
    model = _holder_model()
    ref = copy_model(model)
    if how == "lambda_policy":
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, Holder))
        fsdp = FSDP(model, auto_wrap_policy=policy, device_id=fsdp1_cpu(), use_orig_params=True)
    elif how == "module_policy":
        fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Holder}), device_id=fsdp1_cpu(),
                    use_orig_params=True)
    else:
        model[0] = FSDP(model[0], device_id=fsdp1_cpu(), use_orig_params=True)
        model[2].module = FSDP(model[2].module, device_id=fsdp1_cpu(), use_orig_params=True)
        fsdp = FSDP(model, device_id=fsdp1_cpu(), use_orig_params=True)
    assert len(fsdp1_units(fsdp)) == 3
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it), iters=2)
    x = randn(2 * w, 4, seed=9)
    fsdp(x[:2]).sum().backward()
    with FSDP.summon_full_params(fsdp, with_grads=True):
        names = [n for n, p in fsdp.named_parameters() if p.grad is not None]
    assert len(names) == 4


def test_wrap_module_list_root():
    """FSDP over an nn.ModuleList (PyTorch's test_wrap / TestAutoWrap build such roots): it wraps and its
    children compute with the full parameters."""
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
    ref = copy_model(layers)
    fsdp = FSDP(layers, device_id=fsdp1_cpu())
    assert len(fsdp1_check_params(ref, fsdp)) == 4  # both layers' weight and bias, full


def test_auto_wrap_preset_force_leaf():
    """size_based_auto_wrap_policy's default FORCE_LEAF_MODULES: nn.MultiheadAttention is a leaf, so its
    out_proj is not wrapped on its own even when large enough; the Linear beside it is."""
    model = nn.Sequential(nn.Linear(10, 10), nn.MultiheadAttention(100, 1))
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=40)
    fsdp = FSDP(model, auto_wrap_policy=policy, device_id=fsdp1_cpu())
    assert fsdp1_is_unit(fsdp1_inner(fsdp)[0])
    assert not fsdp1_is_unit(fsdp1_inner(fsdp)[1])
    assert not fsdp1_is_unit(fsdp1_inner(fsdp)[1].out_proj)


def test_auto_wrap_preset_exclude_wrap():
    """ModuleList / ModuleDict are never wrapped by the size policy (EXCLUDE_WRAP_MODULES), their children are."""
    seq = nn.ModuleList([nn.Linear(5, 5), nn.Linear(5, 5)])
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=1)
    fsdp = FSDP(seq, auto_wrap_policy=policy, device_id=fsdp1_cpu())
    inner = fsdp1_inner(fsdp)
    assert fsdp1_is_unit(inner[0]) and fsdp1_is_unit(inner[1])


def test_error_already_wrapped():
    """Auto-wrapping a model that already holds an FSDP instance raises ValueError."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[0] = FSDP(model[0], device_id=fsdp1_cpu())
    with pytest.raises(ValueError, match="FullyShardedDataParallel"):
        FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=fsdp1_cpu())


def test_wrap_sets_rank_and_world_size():
    """enable_wrap / wrap give an FSDP instance carrying the group's rank and world size (test_wrap)."""
    w, r = world()
    with enable_wrap(wrapper_cls=FSDP, device_id=fsdp1_cpu()):
        layer = wrap(nn.Linear(5, 5))
    assert isinstance(layer, FSDP)
    assert layer.rank == r
    assert layer.world_size == w


def test_wrap_disabled_outside_context():
    """wrap() outside enable_wrap returns the module itself."""
    layer = nn.Linear(5, 5)
    assert wrap(layer) is layer


def test_wrap_override_defaults():
    """wrap(module, **overrides) wins over enable_wrap's arguments (a different sharding strategy)."""
    from _framework import ShardingStrategy

    with enable_wrap(wrapper_cls=FSDP, device_id=fsdp1_cpu(), sharding_strategy=ShardingStrategy.FULL_SHARD):
        layer = wrap(nn.Linear(5, 5), sharding_strategy=ShardingStrategy.NO_SHARD)
    assert isinstance(layer, FSDP)
    assert layer.sharding_strategy == ShardingStrategy.NO_SHARD


def test_enable_wrap_nested_raises():
    with enable_wrap(wrapper_cls=FSDP):
        with pytest.raises(NotImplementedError, match="nested"):
            with enable_wrap(wrapper_cls=FSDP):
                pass


def test_auto_wrap_api_trains_like_reference():
    """size_based_auto_wrap_policy over nested Sequentials: the large inner ones become units, the model
    trains as the unsharded reference (TestAutoWrap.test_auto_wrap_api)."""
    w, _ = world()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5), nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5)))
    ref = copy_model(model)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=40)
    fsdp = FSDP(model, auto_wrap_policy=policy, device_id=fsdp1_cpu())
    inner = fsdp1_inner(fsdp)
    assert fsdp1_is_unit(inner[2])
    assert not fsdp1_is_unit(inner[0]) and not fsdp1_is_unit(inner[1])
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 5, seed=it), iters=2)


@pytest.mark.parametrize("policy", ["always", "transformer", "custom"])
def test_policies_pick_units(policy):
    """always_wrap_policy wraps every submodule with parameters; transformer_auto_wrap_policy and
    CustomPolicy the chosen class (test_transformer_auto_wrap_policy, test_custom_policy)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 4))
    if policy == "always":
        pol = always_wrap_policy
    elif policy == "transformer":
        pol = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Sequential})
    else:
        pol = CustomPolicy(lambda m: isinstance(m, nn.Sequential) and m is not model)
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=pol, device_id=fsdp1_cpu())
    inner = fsdp1_inner(fsdp)
    assert fsdp1_is_unit(inner[0])
    assert fsdp1_is_unit(inner[1]) == (policy == "always")
    full = fsdp1_full_params(fsdp)
    for n, p in ref.named_parameters():
        assert_close_np = to_np(p)
        assert (abs(full[n] - assert_close_np) < 1e-6).all(), n


def _nested_sequential():
    """TestFSDPWrap.NestedSequentialModel: two linears and a Sequential of two linears (5x5 each)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5), nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5)))


def test_auto_wrap_preset_exclude_wrap_include_children():
    """A ModuleList is not wrapped, its large enough child is."""
    seq = nn.ModuleList([nn.Linear(10, 10)])
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=40)
    fsdp = FSDP(seq, auto_wrap_policy=policy, device_id=fsdp1_cpu())
    assert fsdp1_is_unit(fsdp1_inner(fsdp)[0])


def test_auto_wrap_preset_force_leaf_custom():
    """force_leaf_modules extended by nn.Linear: no Linear becomes a unit, only the root is one."""
    policy = functools.partial(
        size_based_auto_wrap_policy, min_num_params=40,
        force_leaf_modules=size_based_auto_wrap_policy.FORCE_LEAF_MODULES.union({nn.Linear}))
    model = nn.Sequential(nn.Linear(10, 10), nn.ModuleList([nn.Linear(10, 10)]))
    fsdp = FSDP(model, auto_wrap_policy=policy, device_id=fsdp1_cpu())
    inner = fsdp1_inner(fsdp)
    assert not fsdp1_is_unit(inner[0]) and not fsdp1_is_unit(inner[1]) and not fsdp1_is_unit(inner[1][0])
    assert len(fsdp1_units(fsdp)) == 1


@pytest.mark.parametrize("wrap_method", ["fsdp_ctor", "wrap_api"])
def test_always_wrap_with_ignored_modules(wrap_method):
    """always_wrap_policy with ignored modules: every other module with parameters is a unit, the ignored
    ones are not; forward and backward run."""
    w, _ = world()
    seq = _nested_sequential()
    kwargs = dict(auto_wrap_policy=always_wrap_policy, ignored_modules=[seq[1], seq[2][0]], device_id=fsdp1_cpu())
    if wrap_method == "fsdp_ctor":
        fsdp = FSDP(seq, **kwargs)
    else:
        with enable_wrap(wrapper_cls=FSDP, **kwargs):
            fsdp = wrap(seq)
    assert isinstance(fsdp, FSDP)
    inner = fsdp1_inner(fsdp)
    assert fsdp1_is_unit(inner[0]) and fsdp1_is_unit(inner[2])
    assert not fsdp1_is_unit(inner[1])
    inner2 = fsdp1_inner(inner[2])
    assert not fsdp1_is_unit(inner2[0]) and fsdp1_is_unit(inner2[1])
    x = randn(2 * w, 5, seed=1)
    fsdp(x[:2]).sum().backward()  # runs (the ignored linears hold local, unsynchronised gradients)


@pytest.mark.parametrize("wrap_method", ["fsdp_ctor", "wrap_api"])
def test_auto_wrap_with_ignored_modules(wrap_method):
    """size_based_auto_wrap_policy(min_num_params=40) with seq[1] and seq[2][0] ignored: the inner Sequential
    no longer reaches the threshold, so only the root is a unit."""
    seq = _nested_sequential()
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=40)
    kwargs = dict(auto_wrap_policy=policy, ignored_modules=[seq[1], seq[2][0]], device_id=fsdp1_cpu())
    if wrap_method == "fsdp_ctor":
        fsdp = FSDP(seq, **kwargs)
    else:
        with enable_wrap(wrapper_cls=FSDP, **kwargs):
            fsdp = wrap(seq)
    assert isinstance(fsdp, FSDP)
    inner = fsdp1_inner(fsdp)
    assert not any(fsdp1_is_unit(m) for m in (inner[0], inner[1], inner[2], inner[2][0], inner[2][1]))
    assert len(fsdp1_units(fsdp)) == 1


def test_main_wrap_api():
    """TestFSDPWrap.test_main_wrap_api: min_num_params=0 wraps every module holding parameters (a nested one
    too); the root carries backward_prefetch / forward_prefetch; six SGD steps train as the reference."""
    from _framework import BackwardPrefetch

    class Nested(nn.Module):
        def __init__(self):
            super().__init__()
            self.nested_lin = nn.Linear(1, 1, bias=False)

        def forward(self, x):
            return self.nested_lin(x)

    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin1 = nn.Linear(1, 1, bias=False)
            self.lin2 = nn.Linear(1, 1, bias=False)
            self.lin3 = nn.Linear(1, 1, bias=False)
            self.lin4 = Nested()

        def forward(self, x):
            return self.lin4(self.lin3(self.lin2(self.lin1(x))))

    w, _ = world()
    model = MyModel()
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=0),
                backward_prefetch=BackwardPrefetch.BACKWARD_POST, forward_prefetch=True, device_id=fsdp1_cpu())
    inner = fsdp1_inner(fsdp)
    for m in (inner.lin1, inner.lin2, inner.lin3, inner.lin4, fsdp1_inner(inner.lin4).nested_lin):
        assert fsdp1_is_unit(m)
    assert fsdp.backward_prefetch == BackwardPrefetch.BACKWARD_POST and fsdp.forward_prefetch
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 1, seed=it), iters=6,
                       optim_cls=lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9))
