"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_clip_grad_norm.py (FSDP1 clip_grad_norm_) on CPU."""
import pytest

from _common import copy_model, fsdp1_cpu, fsdp1_train_parity, local, randn, world
from _framework import FSDP, ModuleWrapPolicy, ShardingStrategy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class Block(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x).relu()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(4, 4))


def test_non_root():
    """clip_grad_norm_ on a non-root FSDP instance raises (test_non_root)."""
    w, _ = world()
    model = _model()
    model[0] = FSDP(model[0], device_id=fsdp1_cpu())
    fsdp = FSDP(model, device_id=fsdp1_cpu())
    fsdp(local(randn(2 * w, 4))).sum().backward()
    with pytest.raises(RuntimeError, match="root"):
        fsdp.module[0].clip_grad_norm_(1.0)


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_ddp_parity(strategy, use_orig_params, norm_type):
    """clip_grad_norm_ gives the unsharded model's total norm and clipped training (test_ddp_parity)."""
    w, _ = world()
    model = _model()
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=fsdp1_cpu(),
                sharding_strategy=getattr(ShardingStrategy, strategy), use_orig_params=use_orig_params)
    norms = _train_clipped(ref, fsdp, w, norm_type)
    assert max(norms) > 0.5, norms  # the norm exceeded max_norm: clipping changed the gradients that trained


def _train_clipped(ref, fsdp, w, norm_type, max_norm=0.5):
    from _common import assert_close, fsdp1_check_params, global_sum, ref_loss_backward
    from _framework import clip_grad_norm_

    optim = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    ref_optim = torch.optim.SGD(ref.parameters(), lr=0.1)
    norms = []
    for it in range(2):
        x = randn(2 * w, 4, seed=it)
        loss = fsdp(local(x)).sum()
        loss.backward()
        ref_loss = ref_loss_backward(ref, x)
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-4, atol=1e-5)
        norm = fsdp.clip_grad_norm_(max_norm, norm_type=norm_type)
        ref_norm = clip_grad_norm_(list(ref.parameters()), max_norm, norm_type=norm_type)
        assert_close(norm, ref_norm, rtol=1e-4, atol=1e-5, msg=f"total norm at iter {it}")
        norms.append(float(ref_norm))
        optim.step()
        ref_optim.step()
        optim.zero_grad()
        ref_optim.zero_grad()
    fsdp1_check_params(ref, fsdp)
    return norms


def test_mixed_sharding_strategies():
    """A model mixing NO_SHARD and FULL_SHARD instances: clip_grad_norm_ counts both kinds of gradients
    once (test_ddp_parity's mixed-strategy case)."""
    w, _ = world()
    model = _model()
    ref = copy_model(model)
    model[0] = FSDP(model[0], device_id=fsdp1_cpu(), sharding_strategy=ShardingStrategy.NO_SHARD)
    fsdp = FSDP(model, device_id=fsdp1_cpu(), sharding_strategy=ShardingStrategy.FULL_SHARD)
    norms = _train_clipped(ref, fsdp, w, 2.0)
    assert max(norms) > 0.5, norms  # clipping engaged across both kinds of instances


def test_no_gradients():
    """clip_grad_norm_ when no parameter has a gradient: total norm 0 (test_no_gradients)."""
    w, _ = world()
    fsdp = FSDP(_model(), device_id=fsdp1_cpu())
    for p in fsdp.parameters():
        p.requires_grad_(False)
    fsdp(local(randn(2 * w, 4)))
    with pytest.warns(UserWarning, match="no gradients"):
        norm = fsdp.clip_grad_norm_(1.0)
    assert float(norm) == 0.0


def test_train_parity_with_clip():
    """fsdp1_train_parity with clipping (Adam), auto-wrapped blocks."""
    w, _ = world()
    model = _model()
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=fsdp1_cpu())
    losses = fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it), iters=2, clip=0.5)
    assert len(losses) == 2 and losses[0] != losses[1]  # clipped steps moved the model
