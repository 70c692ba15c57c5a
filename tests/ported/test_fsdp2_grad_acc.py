"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_grad_acc.py and the gradient
accumulation class of test_fully_shard_training.py (set_requires_gradient_sync, set_reshard_after_backward)."""
import pytest

from _common import MLP, assert_close, check_sharded_parity, copy_model, global_sum, local, randn, world
from _framework import CPUOffloadPolicy, OffloadPolicy, fully_shard, init_device_mesh, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _run_micro_batches(ref, model, optim, ref_optim, set_flags, iters=2, num_micro=3, dim=8):
    """Micro-batches of a global batch; the reference accumulates the global-batch gradients (over world) and
    both step after the last micro-batch. Losses compared per micro-batch, gradients before each step."""
    w, _ = world()
    compared = 0
    for it in range(iters):
        for mb in range(num_micro):
            set_flags(mb == num_micro - 1)
            x = randn(2 * w, dim, seed=100 * it + mb)
            loss = model(local(x)).sum()
            loss.backward()
            ref_loss = ref(x).sum()
            (ref_loss / w).backward()
            assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
        check_sharded_parity(ref, model)
        compared += 1
        for o in (optim, ref_optim):
            o.step()
            o.zero_grad(set_to_none=bool(it % 2))  # set_to_none=False: accumulation onto zeros
    return compared


@pytest.mark.parametrize("recurse", [True, False])
@pytest.mark.parametrize("offload", ["none", "cpu"])
@pytest.mark.parametrize("reshard_after_forward", [True, False, 2])
def test_requires_gradient_sync(reshard_after_forward, offload, recurse):
    """set_requires_gradient_sync(False) for all MLPs (recurse=True) or for two of three (recurse=False,
    each with recurse=False): accumulated gradients equal the reference's after the synced micro-batch."""
    torch.manual_seed(42)
    model = nn.Sequential(*[MLP(8) for _ in range(3)])
    ref = copy_model(model)
    policy = CPUOffloadPolicy(pin_memory=False) if offload == "cpu" else OffloadPolicy()
    for mlp in model:
        fully_shard(mlp, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    fully_shard(model, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)

    def set_flags(last):
        if recurse:
            model.set_requires_gradient_sync(last)
        else:
            for mlp in model[:2]:
                mlp.set_requires_gradient_sync(last, recurse=False)

    assert _run_micro_batches(ref, model, optim, ref_optim, set_flags) == 2  # accumulated gradients compared per step


@pytest.mark.parametrize("mode,reshard_after_forward,reshard_after_backward,hsdp", [
    ("all", True, True, False), ("all", False, False, False), ("root_only", 2, True, False),
    ("root_only", False, False, False), ("some_mlps", True, True, False), ("all", True, True, True),
    ("some_mlps", False, True, True),
])
def test_gradient_accumulation(mode, reshard_after_forward, reshard_after_backward, hsdp):
    """Accumulation with gradient sync disabled for all modules, the root's own linear only, or some MLPs,
    with and without resharding after backward (FSDP and HSDP)."""
    w, _ = world()
    mesh = init_device_mesh("cpu", (w // 2, 2), mesh_dim_names=("dp_replicate", "dp_shard")) if hsdp else \
        init_device_mesh("cpu", (w,))
    torch.manual_seed(42)
    model = nn.Sequential(nn.Linear(8, 8), *[MLP(8) for _ in range(3)])
    ref = copy_model(model)
    for mlp in model[1:]:
        fully_shard(mlp, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)  # the root gets the 1st linear
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)

    def set_flags(last):
        if mode == "all":
            model.set_requires_gradient_sync(last)
            if not reshard_after_backward:
                model.set_reshard_after_backward(last)
        elif mode == "some_mlps":
            for mlp in model[1:3]:
                mlp.set_requires_gradient_sync(last)
                if not reshard_after_backward:
                    mlp.set_reshard_after_backward(last)
        else:
            model.set_requires_gradient_sync(last, recurse=False)
            if not reshard_after_backward:
                model.set_reshard_after_backward(last, recurse=False)

    assert _run_micro_batches(ref, model, optim, ref_optim, set_flags) == 2  # accumulated gradients compared per step
