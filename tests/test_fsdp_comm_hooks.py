"""FSDP1 register_comm_hook with the low-precision hooks (fp16/bf16 compression), against MixedPrecision's
reduce_dtype: PyTorch's test_fp16_hook / test_bf16_hook, which need CUDA streams there."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.algorithms._comm_hooks import LOW_PRECISION_HOOKS, default_hooks
from hpcfsdp.distributed.fsdp import FSDP, MixedPrecision, ShardingStrategy

from _fsdp_util import local, world

pytestmark = pytest.mark.mpi(min_size=2)


def _nested(**kw):
    hp.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    model[0] = FSDP(model[0], **kw)
    return FSDP(model, **kw)


def _grads(fsdp, x):
    fsdp(hp.tensor(local(x))).sum().backward()
    with FSDP.summon_full_params(fsdp, with_grads=True):
        return {n: p.grad.numpy().astype(np.float64) for n, p in fsdp.named_parameters()}


@pytest.mark.parametrize("hook,dtype", [(default_hooks.fp16_compress_hook, hp.float16),
                                        (default_hooks.bf16_compress_hook, hp.bfloat16)])
def test_low_precision_hook_equals_reduce_dtype(hook, dtype):
    """Compressing the communication in half precision gives MixedPrecision(reduce_dtype=half)'s gradients (the
    same divisions, the same rounding), cast back to float32; and differs from the float32 reduction."""
    w, _ = world()
    x = np.random.default_rng(2).standard_normal((2 * w, 6)).astype(np.float32) * 50
    expected = _grads(_nested(use_orig_params=True, mixed_precision=MixedPrecision(reduce_dtype=dtype)), x)
    plain = _grads(_nested(use_orig_params=True), x)
    hooked = _nested(use_orig_params=True)
    hooked.register_comm_hook(default_hooks.LowPrecisionState(dist.group.WORLD), hook)
    got = _grads(hooked, x)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert any(not np.allclose(got[n], plain[n], rtol=1e-7, atol=0) for n in plain)  # it did compress
    assert all(p.grad.dtype == hp.float32 for p in hooked.parameters())
    assert hook in LOW_PRECISION_HOOKS


def test_no_shard_hook_accepted_and_a_non_callable_hook_refused():
    """NO_SHARD takes ``hook(state, grad)`` (tests/ported/test_fsdp1_comm_hooks.py checks its gradients)."""
    state = default_hooks.DefaultState(dist.group.WORLD)
    no_shard = _nested(sharding_strategy=ShardingStrategy.NO_SHARD)
    no_shard.register_comm_hook(state, default_hooks.allreduce_hook)
    assert no_shard._comm_hook is default_hooks.allreduce_hook
    with pytest.raises(ValueError, match="must be callable"):
        _nested().register_comm_hook(state, 42)
