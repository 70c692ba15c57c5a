"""Re-expresses the public point of PyTorch's test/distributed/_composable/fsdp/test_fully_shard_unsharded_views.py:
weights loaded through load_state_dict after a reshard (in place, or with assign=True replacing the storage) are
what the next forward computes with, for a frozen module (built on the meta device or not). PyTorch checks it
on a one-rank mesh through private storage pointers; here it runs on the default mesh and checks the outputs."""
import pytest

from _common import assert_close
from _framework import fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _frozen_linear(meta, reshard_after_forward):
    with torch.device("meta" if meta else "cpu"):
        model = nn.Linear(8, 4)
    model.requires_grad_(False)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    if meta:
        model.to_empty(device="cpu")
    state = model.state_dict()
    for t in state.values():
        t.fill_(0.5)
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("reshard_after_forward", [False, True])
@pytest.mark.parametrize("meta", [False, True])
def test_views_survive_reshard_and_weight_loading(meta, reshard_after_forward):
    """Weights and bias set to v through the sharded state dict after reshard(): the output of ones(2, 8) is
    8 v + v = 9 v, three times in a row."""
    model = _frozen_linear(meta, reshard_after_forward)
    inp = torch.ones(2, 8)
    with torch.no_grad():
        assert_close(model(inp), torch.full((2, 4), 4.5), rtol=0, atol=0)
        for version in range(1, 4):
            model.reshard()
            update = {name: torch.full_like(t, float(version)) for name, t in model.state_dict().items()}
            model.load_state_dict(update)
            assert_close(model(inp), torch.full((2, 4), 9.0 * version), rtol=0, atol=0, msg=f"version {version}")


def test_replaced_storage_recreates_view():
    """load_state_dict(assign=True) replaces the sharded parameters; the next forward uses the new values."""
    model = _frozen_linear(False, False)
    inp = torch.ones(2, 8)
    with torch.no_grad():
        model(inp)
        old_weight = model.weight
        state = {name: torch.full_like(t, 2.0) for name, t in model.state_dict().items()}
        model.load_state_dict(state, assign=True)
        assert model.weight is not old_weight
        assert_close(model(inp), torch.full((2, 4), 18.0), rtol=0, atol=0)
