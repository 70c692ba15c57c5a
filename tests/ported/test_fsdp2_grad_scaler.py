"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_grad_scaler.py: GradScaler over
sharded (DTensor) gradients, 1D FSDP and FSDP x TP, with an inf placed on one rank's shard only."""
import numpy as np
import pytest

from _common import MLP, randn, to_np, world
from _framework import (ColwiseParallel, GradScaler, RowwiseParallel, fully_shard, init_device_mesh, nn,
                        parallelize_module, torch)

pytestmark = pytest.mark.mpi(min_size=2)


def _model(test_2d):
    torch.manual_seed(0)
    if not test_2d:
        model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(2)])
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, randn(4, 4, seed=1)
    w, _ = world()
    mesh = init_device_mesh("cpu", (2, w // 2), mesh_dim_names=("dp", "tp"))
    model = nn.Sequential(MLP(2), MLP(2), MLP(2))
    plan = {}
    for i in range(3):
        plan[f"{i}.in_proj"] = ColwiseParallel()
        plan[f"{i}.out_proj"] = RowwiseParallel()
    model = parallelize_module(model, mesh["tp"], plan)
    for mlp in model:
        fully_shard(mlp, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, randn(2, seed=1)


@pytest.mark.parametrize("test_2d", [False, True])
@pytest.mark.parametrize("has_inf", [True, False])
def test_gradient_scaler(has_inf, test_2d):
    """unscale_ divides every local shard by the scale; an inf on rank 1 only makes every rank skip the step
    (parameters and optimizer state untouched) and back the scale off; without it the step runs and the scale
    stays."""
    _, r = world()
    model, inp = _model(test_2d)
    loss = model(inp).sum()
    scaler = GradScaler("cpu", init_scale=2.0, enabled=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler.scale(loss).backward()
    scale = scaler.get_scale()
    assert scale == 2.0
    grad = opt.param_groups[0]["params"][0].grad
    if has_inf and r == 1:
        grad.to_local()[0, 0] = float("inf")
    initial = grad.to_local().detach().clone().numpy()
    params_before = [to_np(p) for p in model.parameters()]

    scaler.unscale_(opt)
    unscaled = grad.to_local().detach().numpy()
    np.testing.assert_allclose(unscaled, initial / scale, rtol=1e-6)

    scaler.step(opt)
    params_after = [to_np(p) for p in model.parameters()]
    if has_inf:  # every rank skipped the step, not only the one holding the inf
        assert len(opt.state) == 0
        for a, b in zip(params_after, params_before):
            np.testing.assert_array_equal(a, b)
    else:
        assert len(opt.state) == len(params_before)
        assert all(not np.array_equal(a, b) for a, b in zip(params_after, params_before))

    scaler.update()
    expected = scale * scaler.get_backoff_factor() if has_inf else scale
    assert scaler.get_scale() == expected
