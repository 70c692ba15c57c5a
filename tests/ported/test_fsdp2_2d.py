"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_2d.py::test_train_parity_2d: FSDP over
the dp dim of a (dp, tp) mesh on top of Colwise/Rowwise tensor parallelism (uneven dims included), with and
without activation checkpointing, against an unsharded replica on each dp group's global batch."""
import pytest

from _common import MLP, CheckpointedSequential, assert_close, copy_model, randn, world
from _framework import ColwiseParallel, RowwiseParallel, dist, fully_shard, init_device_mesh, nn, parallelize_module, torch

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("reshard_after_forward,use_ac,mlp_dim,dtensor_activations", [
    (False, False, 3, True), (True, True, 17, True), (True, False, 16, True), (True, False, 16, False)])
def test_train_parity_2d(reshard_after_forward, use_ac, mlp_dim, dtensor_activations):
    """Three MLPs (hidden 3x or 4x dim) column/row-parallel over tp, each fully_shard over dp (4 ranks: 2x2;
    2 ranks: dp 1, tp 2). Loss summed over dp equals the replica's on the dp ranks' concatenated batches;
    parameters (gathered over both dims) match after each Adam step. As PyTorch's test, activations between the
    TP linears stay DTensors (``use_local_output=False``, which keeps uneven dims); the last case uses the
    default local outputs (even dims)."""
    w, _ = world()
    dp_size = 2 if w > 2 else 1
    mesh = init_device_mesh("cpu", (dp_size, w // dp_size), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(42)
    seq = CheckpointedSequential if use_ac else nn.Sequential
    model = seq(MLP(mlp_dim, dim_multiplier=3), MLP(mlp_dim), MLP(mlp_dim, dim_multiplier=3))
    ref = copy_model(model)
    plan = {}
    for i in range(3):
        if dtensor_activations:
            plan[f"{i}.in_proj"] = ColwiseParallel(use_local_output=False)
            plan[f"{i}.out_proj"] = RowwiseParallel(use_local_output=i == 2)
        else:
            plan[f"{i}.in_proj"] = ColwiseParallel()
            plan[f"{i}.out_proj"] = RowwiseParallel()
    model = parallelize_module(model, mesh["tp"], plan)
    for mlp in model:
        fully_shard(mlp, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    dp_group, dp_rank = mesh["dp"].get_group(), mesh.get_local_rank("dp")
    for it in range(3):
        global_inp = randn(4 * dp_size, mlp_dim, seed=it)
        for o in (optim, ref_optim):
            o.zero_grad(set_to_none=(it % 2 == 0))
        loss = model(global_inp[4 * dp_rank:4 * (dp_rank + 1)]).sum()
        loss.backward()
        ref_loss = ref(global_inp).sum()
        (ref_loss / dp_size).backward()
        total = loss.detach().to(torch.float64).reshape(1).clone()
        dist.all_reduce(total, group=dp_group)
        assert_close(float(total.item()), float(ref_loss.item()), rtol=1e-4, atol=1e-4, msg=f"loss at iter {it}")
        optim.step()
        ref_optim.step()
        for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
            assert_close(p, rp, rtol=1e-4, atol=1e-5, msg=f"{name} after iter {it}")
