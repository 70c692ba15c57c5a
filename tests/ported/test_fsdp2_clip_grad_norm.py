"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_clip_grad_norm_.py (1-D mesh)."""
import numpy as np
import pytest

from _common import Transformer, TransformerBlock, assert_close, copy_model, local, randint, to_np, world
from _framework import DTensor, clip_grad_norm_, fully_shard, torch

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_1d(norm_type):
    """clip_grad_norm_ on sharded gradients: the total norm (a DTensor) equals the unsharded reference's, every
    gradient exceeded max_norm before and is clipped to the reference's values after."""
    w, _ = world()
    max_norm = 0.05
    torch.manual_seed(42)
    model = Transformer(n_layers=2)
    ref = copy_model(model)
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m)
    fully_shard(model)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(2):
        x = randint(17, 2 * w, 8, seed=it)
        for o in (optim, ref_optim):
            o.zero_grad()
        model(local(x)).sum().backward()
        (ref(x).sum() / w).backward()
        ref_grads = [to_np(p.grad) for p in ref.parameters()]
        for g, p in zip(ref_grads, model.parameters()):
            assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
        assert all(np.linalg.norm(g.ravel(), ord=norm_type) > max_norm for g in ref_grads)
        ref_total = clip_grad_norm_(ref.parameters(), max_norm=max_norm, norm_type=norm_type)
        total = clip_grad_norm_(model.parameters(), max_norm=max_norm, norm_type=norm_type, foreach=True)
        assert isinstance(total, DTensor)
        assert_close(total.full_tensor(), ref_total, rtol=1e-5, atol=1e-6)
        expected_total = np.linalg.norm(np.array([np.linalg.norm(g.ravel(), ord=norm_type) for g in ref_grads]),
                                        ord=norm_type)
        assert_close(ref_total, float(expected_total), rtol=1e-5, atol=1e-6)
        for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
            assert_close(p.grad, rp.grad, rtol=1e-4, atol=1e-6, msg=name)
            assert np.linalg.norm(to_np(p.grad).ravel(), ord=norm_type) <= max_norm * (1 + 1e-5)
        for o in (optim, ref_optim):
            o.step()
