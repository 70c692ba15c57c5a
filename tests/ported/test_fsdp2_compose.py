"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_compose.py::test_checkpoint_and_fully_shard:
activation checkpointing around an fp16 fully_shard module keeps the cast of its forward inputs in the
recomputed forward. (test_replicate_and_fully_shard composes with the replicate() DDP API: left out.)"""
import pytest

from _framework import MixedPrecisionPolicy, checkpoint, fully_shard, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class Recording(nn.Module):
    """A linear that records the dtype of each input it receives (the last call wins, recompute included)."""

    def __init__(self, seen, checkpoint_inner=False):
        super().__init__()
        self.seen = seen
        self.lin = nn.Linear(16, 16)
        self.checkpoint_inner = checkpoint_inner

    def forward(self, x):
        self.seen[id(self)] = x.dtype
        return checkpoint(self.lin, x, use_reentrant=False) if self.checkpoint_inner else self.lin(x)


class Root(nn.Module):
    def __init__(self, seen, checkpoint_strict_submodule):
        super().__init__()
        self.seen = seen
        self.c1 = Recording(seen)
        self.c2 = Recording(seen, checkpoint_inner=checkpoint_strict_submodule)
        self.checkpoint_c2 = not checkpoint_strict_submodule

    def forward(self, x):
        self.seen[id(self)] = x.dtype
        h = self.c1(x)  # (B, 16)
        return checkpoint(self.c2, h, use_reentrant=False) if self.checkpoint_c2 else self.c2(h)


@pytest.mark.parametrize("checkpoint_strict_submodule", [False, True])
def test_checkpoint_and_fully_shard(checkpoint_strict_submodule):
    """Checkpoint c2 (or only its inner linear), shard c2 with param_dtype=float16 and the root in float32:
    after backward (and the recompute) the root and c1 saw float32 inputs, c2 float16."""
    seen = {}
    model = Root(seen, checkpoint_strict_submodule)
    fully_shard(model.c2, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
    fully_shard(model)
    x = torch.zeros(2, 16)
    model(x).sum().backward()
    assert seen[id(model)] == torch.float32
    assert seen[id(model.c1)] == torch.float32
    assert seen[id(model.c2)] == torch.float16
    assert all(p.grad is not None for p in model.parameters())
