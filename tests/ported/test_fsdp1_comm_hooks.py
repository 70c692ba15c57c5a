"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_comm_hooks.py on CPU: FSDP1 register_comm_hook with the
default hook (torch.distributed.algorithms._comm_hooks) and its checks. The low-precision hooks need CUDA streams in
PyTorch (their decompression records the stream), so they are tested on hpcfsdp alone: tests/test_fsdp_comm_hooks.py."""
import copy

import pytest

from _common import assert_close, fsdp1_cpu, local, randn, to_np, world
from _framework import FSDP, IS_TORCH, ShardingStrategy, dist, nn, torch

if IS_TORCH:
    from torch.distributed.algorithms._comm_hooks import default_hooks
else:
    from hpcfsdp.distributed.algorithms._comm_hooks import default_hooks

pytestmark = pytest.mark.mpi(min_size=2)


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


def _nested(model, **kw):
    model[0] = FSDP(model[0], device_id=fsdp1_cpu(), **kw)
    return FSDP(model, device_id=fsdp1_cpu(), **kw)


def _grads_after_step(fsdp, x):
    fsdp(local(x)).sum().backward()
    with FSDP.summon_full_params(fsdp, with_grads=True):
        return {n: to_np(p.grad) for n, p in fsdp.named_parameters()}


@pytest.mark.parametrize("strategy", [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP])
def test_default_reduce_scatter_hook_equals_no_hook(strategy):
    """test_default_communication_hook_behavior: the default reduce-scatter hook with DefaultState gives the
    gradients FSDP gives without a hook (the average over the ranks)."""
    w, _ = world()
    x = randn(2 * w, 6, seed=1)
    plain = _nested(_model(), sharding_strategy=strategy, use_orig_params=True)
    hooked = _nested(_model(), sharding_strategy=strategy, use_orig_params=True)
    calls = []

    def counted(state, grad, output):
        calls.append(tuple(output.shape))
        default_hooks.reduce_scatter_hook(state, grad, output)

    hooked.register_comm_hook(default_hooks.DefaultState(dist.group.WORLD), counted)
    expected, got = _grads_after_step(plain, x), _grads_after_step(hooked, x)
    assert len(calls) == 2, calls  # one reduction per instance holding parameters: the hook did it
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_registering_hook_non_root_or_twice_raises():
    """test_registering_hook_non_root / test_registering_hook_submodules: only the root registers, only once."""
    model = _model()
    fsdp = _nested(model)
    fsdp(randn(2, 6))  # the root is known after the first forward
    state = default_hooks.DefaultState(dist.group.WORLD)
    with pytest.raises(AssertionError, match="register_comm_hook can only be called on a root instance"):
        model[0].register_comm_hook(state, default_hooks.reduce_scatter_hook)
    fsdp.register_comm_hook(state, default_hooks.reduce_scatter_hook)
    with pytest.raises(AssertionError, match="A communication hook is already registered"):
        fsdp.register_comm_hook(state, default_hooks.reduce_scatter_hook)
    assert fsdp.check_is_root() and not model[0].check_is_root()


def test_default_state_needs_a_group():
    with pytest.raises(ValueError, match="Expected to pass in an explicit ProcessGroup"):
        default_hooks.DefaultState(None)
    state = default_hooks.DefaultState(dist.group.WORLD)
    w, _ = world()
    assert state.world_size == w
    assert state.gradient_predivide_factor * state.gradient_postdivide_factor == pytest.approx(w)


def test_training_with_the_hook_matches_the_reference():
    """A few Adam steps with the default hook registered train as the unsharded reference does."""
    from _common import fsdp1_train_parity

    w, _ = world()
    ref = _model()
    fsdp = _nested(copy.deepcopy(ref))
    fsdp.register_comm_hook(default_hooks.DefaultState(dist.group.WORLD), default_hooks.reduce_scatter_hook)
    losses = fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 6, seed=10 + it), iters=2)
    assert losses[0] != losses[1]  # the hook-reduced gradients moved the model


@pytest.mark.parametrize("hook_kind", ["allreduce_hook", "noisy_hook"])
def test_no_shard_communication_hook(hook_kind):
    """NO_SHARD: the hook is called as ``hook(state, grad)`` with each instance's whole (flat) gradient and
    all-reduces it in place (test_default_communication_hook_behavior / _initialization's NO_SHARD cases and
    DummyHook.dummy_hook_for_no_shard_fsdp): the default all-reduce hook gives the no-hook gradients; a hook
    adding noise then summing gives W * (average + noise)."""
    w, _ = world()
    x = randn(2 * w, 6, seed=1)
    kw = dict(sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True)
    plain, hooked = _nested(_model(), **kw), _nested(_model(), **kw)
    calls, noise = [], 0.5

    def noisy(state, grad):
        calls.append(tuple(grad.shape))
        grad.add_(noise)
        dist.all_reduce(grad, group=state.process_group)

    def counted(state, grad):
        calls.append(tuple(grad.shape))
        default_hooks.allreduce_hook(state, grad)

    hook = counted if hook_kind == "allreduce_hook" else noisy
    hooked.register_comm_hook(default_hooks.DefaultState(dist.group.WORLD), hook)
    expected, got = _grads_after_step(plain, x), _grads_after_step(hooked, x)
    sizes = sorted(n for shape in calls for n in shape)
    assert len(calls) == 2 and sizes == sorted([6 * 8 + 8, 8 * 4 + 4]), calls  # one flat gradient per instance
    assert sorted(got) == sorted(expected)
    for name in expected:
        want = expected[name] if hook_kind == "allreduce_hook" else w * (expected[name] + noise)
        assert_close(got[name], want, rtol=1e-5, atol=1e-5, msg=name)
