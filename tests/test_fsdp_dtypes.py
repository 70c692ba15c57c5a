"""fully_shard and dtypes: output_dtype on a non-root unit, module.to(dtype) after sharding."""
import copy

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from _fsdp_util import full

pytestmark = pytest.mark.mpi(min_size=2)


def test_output_dtype_of_a_child_unit_casts_its_output():
    """A float16 child with output_dtype=float32 hands float32 to its float32 neighbour (PyTorch casts every
    unit's output, not only the root's)."""
    hp.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    ref = copy.deepcopy(model)
    seen = []
    model[1].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    fully_shard(model[0], mp_policy=MixedPrecisionPolicy(param_dtype=hp.float16, output_dtype=hp.float32))
    fully_shard(model)
    x = hp.randn(4, 8)
    out = model(x)
    assert seen == [hp.float32] and out.dtype == hp.float32
    hidden = ref[0].half()(x.half()).float()  # what the child computes: float16, then cast
    np.testing.assert_allclose(out.detach().numpy(), ref[1](hidden).detach().numpy(), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert model[0].weight.grad.dtype == hp.float32 and model[1].weight.grad.dtype == hp.float32


def test_to_float64_after_fully_shard_computes_in_float64():
    """model.to(float64) after fully_shard: shards, all-gathered parameters, compute and gradients in float64
    (every rank runs the same input, so the averaged gradient is the unsharded one)."""
    hp.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    ref = copy.deepcopy(model).to(hp.float64)
    fully_shard(model[0])
    fully_shard(model)
    model.to(hp.float64)
    assert all(p.dtype == hp.float64 and p.to_local().dtype == hp.float64 for p in model.parameters())
    dtypes = []
    model[2].register_forward_pre_hook(lambda m, args: dtypes.append((m.weight.dtype, args[0].dtype)))
    x = hp.randn(4, 8, dtype=hp.float64)
    out = model(x)
    assert dtypes == [(hp.float64, hp.float64)] and out.dtype == hp.float64
    expected = ref(x)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-13)
    out.sum().backward()
    expected.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.dtype == hp.float64
        np.testing.assert_allclose(full(p.grad), q.grad.numpy(), rtol=1e-12, atol=1e-13)
