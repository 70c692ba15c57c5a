"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_state.py."""
import copy

import pytest

from _common import MLP
from _framework import FSDPModule, fully_shard, nn

pytestmark = pytest.mark.mpi(min_size=2)


def test_fully_shard_state():
    """fully_shard.state(module) gives one distinct state object per fully_shard call."""
    model = nn.Sequential(*[MLP(8) for _ in range(3)])
    for mlp in model:
        fully_shard(mlp)
    fully_shard(model)
    root_state = fully_shard.state(model)
    assert root_state is not None
    states = [root_state] + [fully_shard.state(mlp) for mlp in model]
    assert len({id(s) for s in states}) == 4


def test_fully_shard_reapply():
    """A second fully_shard on the same module raises AssertionError (PyTorch's contract decorator)."""
    model = MLP(8)
    fully_shard(model)
    with pytest.raises(AssertionError, match="can only be applied to a module once"):
        fully_shard(model)


def test_fully_shard_cls():
    """Only the module passed to fully_shard changes class (FSDP<name>); slicing a Sequential drops it."""
    model = MLP(8)
    fully_shard(model)
    assert isinstance(model, MLP) and isinstance(model, FSDPModule)
    assert type(model).__name__ == "FSDPMLP"
    assert not any(isinstance(m, FSDPModule) for m in model.modules() if m is not model)
    model = nn.Sequential(*[MLP(8) for _ in range(3)])
    fully_shard(model)
    assert isinstance(model, nn.Sequential) and isinstance(model, FSDPModule)
    assert type(model).__name__ == "FSDPSequential"
    sliced = model[:2]
    assert isinstance(sliced, nn.Sequential) and not isinstance(sliced, FSDPModule)


@pytest.mark.parametrize("container", ["ModuleList", "ModuleDict"])
def test_fully_shard_unsupported_module_cls(container):
    model = nn.ModuleList([MLP(8) for _ in range(3)]) if container == "ModuleList" else \
        nn.ModuleDict({"1": MLP(8), "2": MLP(8)})
    with pytest.raises(ValueError, match="does not support containers that do not implement forward"):
        fully_shard(model)


def test_fully_shard_deepcopy():
    """copy.deepcopy of an FSDP module raises AssertionError ("FSDP does not support deepcopy")."""
    model = MLP(8)
    fully_shard(model)
    with pytest.raises(AssertionError, match="FSDP does not support deepcopy"):
        copy.deepcopy(model)
