"""Re-expresses the part of PyTorch's test/distributed/_composable/fsdp/test_fully_shard_grad_dtype.py that torch
2.13's API has: MixedPrecisionPolicy's four positional fields (``grad_dtype`` itself is newer than 2.13)."""
import pytest

from _framework import MixedPrecisionPolicy, torch

pytestmark = pytest.mark.mpi(min_size=2)


def test_positional_compatibility():
    """Positional arguments stay param_dtype, reduce_dtype, output_dtype, cast_forward_inputs."""
    policy = MixedPrecisionPolicy(torch.bfloat16, torch.float32, None, False)
    assert policy.param_dtype == torch.bfloat16
    assert policy.reduce_dtype == torch.float32
    assert policy.output_dtype is None
    assert policy.cast_forward_inputs is False
