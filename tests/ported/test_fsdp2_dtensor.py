"""Re-expresses PyTorch's test/distributed/_composable/fsdp/test_fully_shard_dtensor.py: fully_shard over
parameters that already are DTensors on a full SPMD mesh (``dp_mesh_dims``), its placements, training parity
(FSDP, DDP-only, HSDP, FSDP x TP), reduce-scatter of an unused DTensor parameter, and the argument checks."""
import pytest

from _common import MLP, assert_close, copy_model, randn, world
from _framework import (IS_TORCH, DataParallelMeshDims, DTensor, Replicate, Shard, dist, distribute_module,
                        distribute_tensor, fully_shard, init_device_mesh, nn, torch)

pytestmark = pytest.mark.mpi(min_size=2)


def _tp_partition_fn(name, module, mesh):
    """Column-shard in_proj's weight and row-shard out_proj's on the last mesh dim; replicate the rest."""
    if not isinstance(module, nn.Linear):
        return
    prefix = [Replicate()] * (mesh.ndim - 1)
    for pname, p in list(module.named_parameters(recurse=False)):
        if pname == "weight":
            last = Shard(0) if "in_proj" in name else Shard(1)
        else:
            last = Replicate()
        module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, prefix + [last]),
                                                      requires_grad=p.requires_grad))


def _avoid_tp_dim(param):
    """FSDP shards dim 1 where TP already shards dim 0."""
    return Shard(1) if any(isinstance(p, Shard) and p.dim == 0 for p in param.placements) else Shard(0)


def _group_avg(t, group):
    dist.all_reduce(t, group=group)
    t.div_(dist.get_world_size(group))


# (mesh shape as a function of the world size, names, dp dims, TP?, reshard_after_forward, dp dims for the
# reference's gradient average)
CASES = {
    "fsdp": (lambda w: (w,), ("fsdp",), dict(shard="fsdp"), False, True, ("fsdp",)),
    "fsdp_no_reshard": (lambda w: (w,), ("fsdp0",), dict(shard="fsdp0"), False, False, ("fsdp0",)),
    "ddp": (lambda w: (w,), ("ddp",), dict(replicate="ddp"), False, True, ("ddp",)),
    "hsdp": (lambda w: (2, w // 2), ("rep", "shard"), dict(shard="shard", replicate="rep"), False, True,
             ("rep", "shard")),
    "fsdp_tp": (lambda w: (2, w // 2), ("fsdp1", "tp"), dict(shard="fsdp1"), True, True, ("fsdp1",)),
}


# FSDP x TP computes F.linear on DTensors (Replicate input, Shard weights): the functional sharding rules
@pytest.mark.parametrize("case", list(CASES))
def test_dtensor_train_parity(case):
    """MLP whose parameters are DTensors on the full mesh (replicated, or TP-sharded on the last dim), sharded
    by fully_shard along the named DP dims; the input is replicated on every dim. Losses and parameters match
    an unsharded replica whose gradients are averaged over the DP ranks by hand."""
    shape_of, names, dims, use_tp, reshard, dp_names = CASES[case]
    w, _ = world()
    mesh = init_device_mesh("cpu", shape_of(w), mesh_dim_names=names)
    torch.manual_seed(42)
    model = MLP(8)
    ref = copy_model(model)
    distribute_module(model, mesh, _tp_partition_fn if use_tp else None)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, shard_placement_fn=_avoid_tp_dim if use_tp else None,
                dp_mesh_dims=DataParallelMeshDims(**dims))
    for p in model.parameters():
        assert isinstance(p, DTensor) and p.device_mesh == mesh and len(p.placements) == mesh.ndim
    dp_group = dist.group.WORLD if len(dp_names) == mesh.ndim else mesh[dp_names[0]].get_group()
    dp_rank = dist.get_rank(dp_group)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(3):
        inp = randn(2, 8, seed=100 * it + dp_rank)
        ref_optim.zero_grad(set_to_none=(it % 2 == 0))
        ref_loss = ref(inp).sum()
        ref_loss.backward()
        for p in ref.parameters():
            _group_avg(p.grad, dp_group)
        ref_optim.step()
        optim.zero_grad(set_to_none=(it % 2 == 0))
        loss = model(DTensor.from_local(inp, mesh, [Replicate()] * mesh.ndim, run_check=False)).sum()
        loss.backward()
        optim.step()
        assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5, msg=f"loss at iter {it}")
    for (name, p), rp in zip(model.named_parameters(), ref.parameters()):
        assert_close(p, rp, rtol=1e-4, atol=1e-5, msg=name)


def test_sharded_param_correctness_1d():
    """On a 1D mesh every parameter ends as a DTensor on that mesh with one Shard placement."""
    w, _ = world()
    mesh = init_device_mesh("cpu", (w,), mesh_dim_names=("fsdp",))
    model = MLP(16)
    distribute_module(model, mesh)
    fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
    for p in model.parameters():
        assert isinstance(p, DTensor)
        assert p.device_mesh == mesh
        assert len(p.placements) == 1 and isinstance(p.placements[0], Shard)


def test_fsdp_tp_dtensor_sharded_params():
    """FSDP x TP on a (2, w/2) mesh: in_proj.weight FSDP-sharded on dim 1 (TP holds dim 0), out_proj.weight
    on dim 0 (TP holds dim 1), biases FSDP on dim 0 and replicated over TP."""
    w, _ = world()
    mesh = init_device_mesh("cpu", (2, w // 2), mesh_dim_names=("fsdp", "tp"))
    model = MLP(16)
    distribute_module(model, mesh, _tp_partition_fn)
    fully_shard(model, mesh=mesh, shard_placement_fn=_avoid_tp_dim, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
    expected = {"in_proj.weight": (Shard(1), Shard(0)), "out_proj.weight": (Shard(0), Shard(1)),
                "in_proj.bias": (Shard(0), Replicate()), "out_proj.bias": (Shard(0), Replicate())}
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.device_mesh == mesh, name
        assert tuple(p.placements) == expected[name], (name, p.placements)


class TwoExpertParams(nn.Module):
    def __init__(self, ep_mesh):
        super().__init__()
        self.used = nn.Parameter(distribute_tensor(randn(8, 4, seed=1), ep_mesh, [Shard(0)]))
        self.unused = nn.Parameter(distribute_tensor(randn(8, 4, seed=2), ep_mesh, [Shard(0)]))

    def forward(self, x):
        return self.used.to_local().float().sum() + x.float().sum() * 0


def test_reduce_scatter_unused_dtensor_param():
    """set_reduce_scatter_unused_params(True): an expert-sharded DTensor parameter that got no gradient still
    takes part in the reduce-scatter and ends with a zero DTensor gradient."""
    w, _ = world()
    mesh = init_device_mesh("cpu", (w // 2, 2), mesh_dim_names=("dp", "ep"))
    model = TwoExpertParams(mesh["ep"])
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=True)
    model.set_reduce_scatter_unused_params(True)
    model(torch.ones(1)).backward()
    grad = model.unused.grad
    assert grad is not None and isinstance(grad, DTensor)
    assert_close(grad.to_local(), torch.zeros_like(grad.to_local()), rtol=0, atol=0)
    assert model.used.grad is not None


def _fsdp_mesh():
    w, _ = world()
    return init_device_mesh("cpu", (w,), mesh_dim_names=("fsdp",))


def test_validation_non_replicate_dp_placement():
    mesh = _fsdp_mesh()
    model = nn.Linear(16, 32)
    model.weight = nn.Parameter(distribute_tensor(model.weight.data, mesh, [Shard(0)]))
    model.bias = nn.Parameter(distribute_tensor(model.bias.data, mesh, [Replicate()]))
    with pytest.raises(ValueError, match="dim 'fsdp'"):
        fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))


def test_validation_invalid_dim_names():
    mesh = _fsdp_mesh()
    model = MLP(16)
    distribute_module(model, mesh)
    with pytest.raises(ValueError, match="'nonexistent'"):
        fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="nonexistent"))


def test_validation_mesh_mismatch():
    mesh1, mesh2 = _fsdp_mesh(), _fsdp_mesh()
    model = nn.Linear(16, 32)
    model.weight = nn.Parameter(distribute_tensor(model.weight.data, mesh1, [Replicate()]))
    model.bias = nn.Parameter(distribute_tensor(model.bias.data, mesh1, [Replicate()]))
    with pytest.raises(ValueError, match="same mesh|not a slice of the mesh"):
        fully_shard(model, mesh=mesh2, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))


def test_validation_at_least_one_required():
    with pytest.raises(ValueError, match="(?i)at least one"):
        DataParallelMeshDims()


def _check_sharded_over_fsdp_and_trains(model, ref, mesh):
    """hpcfsdp's extension: Shard(0) DTensors over the named dim, and one step's gradients as the replica's."""
    for p in model.parameters():
        assert isinstance(p, DTensor) and p.device_mesh == mesh and p.placements == (Shard(0),)
    x = randn(4, 16, seed=3)  # the same batch on every rank: the averaged gradient is the replica's
    model(x).sum().backward()
    ref(x).sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, msg=name)


def test_validation_spmd_mesh_non_dtensor_params():
    """PyTorch refuses plain parameters with dp_mesh_dims (ValueError); hpcfsdp shards them over the named
    dims, as FSDP1 relies on (a deliberate extension, docs/coming-from-pytorch.md)."""
    mesh = _fsdp_mesh()
    torch.manual_seed(0)
    model = MLP(16)
    ref = copy_model(model)
    if IS_TORCH:
        with pytest.raises(ValueError, match="must be DTensors"):
            fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
        return
    fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
    _check_sharded_over_fsdp_and_trains(model, ref, mesh)


def test_validation_reshard_after_forward_int_spmd():
    """PyTorch refuses an int reshard_after_forward with dp_mesh_dims (NotImplementedError); hpcfsdp reshards
    onto the smaller group as without dp_mesh_dims (a deliberate extension)."""
    mesh = _fsdp_mesh()
    torch.manual_seed(0)
    model = MLP(16)
    ref = copy_model(model)
    distribute_module(model, mesh)
    if IS_TORCH:
        with pytest.raises(NotImplementedError, match="reshard_after_forward as int"):
            fully_shard(model, mesh=mesh, reshard_after_forward=2, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
        return
    fully_shard(model, mesh=mesh, reshard_after_forward=2, dp_mesh_dims=DataParallelMeshDims(shard="fsdp"))
    _check_sharded_over_fsdp_and_trains(model, ref, mesh)
