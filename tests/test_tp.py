"""Tensor parallelism (ColwiseParallel / RowwiseParallel) and fully_shard over it on a (dp, tp) mesh."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import DataParallelMeshDims, fully_shard
from hpcfsdp.distributed.sharding_plan import ChunkShardingSpec, FullyShardSpec, ShardingPlan, apply_sharding_plan
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from hpcfsdp.distributed.tensor._dtensor import _chunk_bounds
from hpcfsdp.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from hpcfsdp.distributed.tensor.placement_types import _StridedShard

pytestmark = pytest.mark.mpi(min_size=4)


class MLP(nn.Module):
    def __init__(self, seed=0, C=6, H=12):
        super().__init__()
        hp.manual_seed(seed)
        self.norm = nn.LayerNorm(C)
        self.up = nn.Linear(C, H)
        self.act = nn.GELU()
        self.down = nn.Linear(H, C)
        self.out = nn.Linear(C, 4)

    def forward(self, x):
        h = self.norm(x)
        return self.out(x + self.down(self.act(self.up(h)))).pow(2).mean()


def _mesh():
    n = dist.get_world_size()
    return init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("dp", "tp"))


def _full(p):
    return p.full_tensor()._data if isinstance(p, DTensor) else p._data


def _batches(steps, B, C=6):
    rng = np.random.default_rng(7)
    return [rng.standard_normal((B, 4, C)).astype(np.float32) for _ in range(steps)]


def _train(use_fsdp, steps=10, plan=None):
    mesh = _mesh()
    dp = mesh.size(0)
    ref, model = MLP(), MLP()
    if plan is not None:
        apply_sharding_plan(model, plan, mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    else:
        parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if use_fsdp == "dp-submesh":  # PyTorch's spelling: fully_shard on mesh["dp"], params on mesh["tp"]
        fully_shard(model, mesh=mesh["dp"])
    elif use_fsdp and plan is None:
        fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    i = mesh.get_local_rank(0)
    for x in _batches(steps, 2 * dp):
        loss = model(hp.tensor(x[2 * i:2 * i + 2]))
        loss.backward()
        if not use_fsdp:  # data-parallel gradient mean by hand
            g = mesh["dp"].get_group(0)
            for p in model.parameters():
                g.all_reduce_(p.grad._data, dist.ReduceOp.SUM)
                p.grad._data[...] /= dp
        opt.step()
        opt.zero_grad()
        rl = ref(hp.tensor(x))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        np.testing.assert_allclose(t.item(), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p), refp[name]._data, atol=1e-4, err_msg=name)
    return model, ref, mesh


@pytest.mark.timeout(120)
def test_tp_mlp_parity_without_fsdp():
    model, _, mesh = _train(False)
    assert model.up.weight.placements == (Shard(0),) and model.down.weight.placements == (Shard(1),)
    assert model.down.bias.placements == (Replicate(),)
    assert model.up.weight._data.shape == (6, 6) and model.down.weight._data.shape == (6, 6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", [True, "dp-submesh"])
def test_fsdp_over_tp_mlp_parity_and_layout(how):
    model, ref, mesh = _train(how)
    dp, tp = mesh.size(0), mesh.size(1)
    i, j = mesh.get_coordinate()
    w = model.up.weight  # (12, 6): tp rows first, then each tp piece's rows over dp
    assert w.placements == (_StridedShard(0, 2), Shard(0)) and w.shape == (12, 6)
    a, b = _chunk_bounds(12, tp, j)
    c, d = _chunk_bounds(b - a, dp, i)
    np.testing.assert_allclose(w._data, ref.up.weight._data[a + c:a + d], atol=1e-4)
    v = model.down.weight  # (6, 12): dp rows, tp columns
    assert v.placements == (Shard(0), Shard(1))
    # per-rank parameter bytes: TP params / (dp*tp), replicated-over-tp params / dp (these divide evenly)
    for name, p in model.named_parameters():
        split = dp * tp if name in ("up.weight", "up.bias", "down.weight") else dp
        assert p._data.nbytes * split == 4 * int(np.prod(p.shape)), name
    # full_tensor and the clipped norm over both dims agree with the reference
    x = _batches(1, 2 * dp)[0]
    i0 = mesh.get_local_rank(0)
    model(hp.tensor(x[2 * i0:2 * i0 + 2])).backward()
    ref(hp.tensor(x)).backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    rtotal = nn.utils.clip_grad_norm_(ref.parameters(), 1e9)
    tv = total.full_tensor().item() if isinstance(total, DTensor) else total.item()
    np.testing.assert_allclose(tv, rtotal.item(), rtol=1e-4)


def test_fsdp_rejects_param_sharded_on_a_dp_dim():
    mesh = _mesh()
    m = nn.Linear(4, 4)
    m.weight = nn.Parameter(distribute_tensor(m.weight.detach(), mesh["dp"], [Shard(0)]))
    with pytest.raises(ValueError, match="already sharded .* over mesh dim 'dp'"):
        fully_shard(m, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))


def test_parallelize_module_bad_input():
    mesh = _mesh()
    with pytest.raises(ValueError, match="'nope' matches no submodule"):
        parallelize_module(MLP(), mesh["tp"], {"nope": ColwiseParallel()})
    with pytest.raises(ValueError, match="does not divide evenly over 2"):  # a Linear may split unevenly
        parallelize_module(nn.Embedding(4, 3), mesh["tp"], ColwiseParallel())
    with pytest.raises(ValueError, match="1-D tensor-parallel mesh"):
        parallelize_module(nn.Linear(4, 4), mesh, ColwiseParallel())


@pytest.mark.timeout(120)
def test_checkpoint_saved_at_dp2_tp2_loads_unsharded_and_at_dp4():
    import tempfile

    import hpcfsdp.distributed.checkpoint as dcp

    mesh = _mesh()
    dp = mesh.size(0)
    model = MLP()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    data = _batches(4, 4 * dp)
    i = mesh.get_local_rank(0)
    for x in data[:3]:
        model(hp.tensor(x[4 * i:4 * i + 4])).backward()
        opt.step()
        opt.zero_grad()
    box = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ckpt = box[0] + "/ckpt"
    dcp.save({"model": dcp.get_model_state_dict(model)}, checkpoint_id=ckpt)
    x = data[3]

    def mean_loss(m, xs):
        t = hp.tensor([m(hp.tensor(xs)).item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return t.item()

    want = mean_loss(model, x[4 * i:4 * i + 4])
    # unsharded: every rank reads the full tensors (what a 1-rank job does)
    plain = MLP(seed=99)
    sd = {"model": plain.state_dict()}
    dcp.load(sd, checkpoint_id=ckpt)
    plain.load_state_dict(sd["model"])
    assert plain(hp.tensor(x)).item() == pytest.approx(want, rel=1e-5)
    # (dp=4, tp=1): fully_shard over all ranks, no tensor parallelism
    n = dist.get_world_size()
    m4 = MLP(seed=99)
    fully_shard(m4, mesh=init_device_mesh("cpu", (n,), mesh_dim_names=("dp",)))
    sd = {"model": dcp.get_model_state_dict(m4)}
    dcp.load(sd, checkpoint_id=ckpt)
    dcp.set_model_state_dict(m4, sd["model"])
    r = dist.get_rank()
    assert mean_loss(m4, x[r * (4 * dp // n):(r + 1) * (4 * dp // n)]) == pytest.approx(want, rel=1e-5)
    dist.barrier()
    if dist.get_rank() == 0:
        import shutil

        shutil.rmtree(box[0], ignore_errors=True)


def _tiny_gpt(seed=0):
    from hpcfsdp.models import GPT, GPTConfig

    hp.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=False))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("use_fsdp", [False, True])
def test_gpt_dp2_tp2_parity(use_fsdp):
    mesh = _mesh()
    dp, tp = mesh.size(0), mesh.size(1)
    ref, model = _tiny_gpt(), _tiny_gpt()
    parallelize_module(model, mesh["tp"], model.tp_plan())
    if use_fsdp:
        dims = DataParallelMeshDims(shard="dp")
        for b in model.transformer.h:
            fully_shard(b, mesh=mesh, dp_mesh_dims=dims)
        fully_shard(model, mesh=mesh, dp_mesh_dims=dims)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(3)
    i = mesh.get_local_rank(0)
    for _ in range(10):
        x, y = rng.integers(0, 16, (2 * dp, 8)), rng.integers(0, 16, (2 * dp, 8))
        _, loss = model(hp.tensor(x[2 * i:2 * i + 2]), hp.tensor(y[2 * i:2 * i + 2]))
        loss.backward()
        if not use_fsdp:
            g = mesh["dp"].get_group(0)
            for p in model.parameters():
                g.all_reduce_(p.grad._data, dist.ReduceOp.SUM)
                p.grad._data[...] /= dp
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        np.testing.assert_allclose(t.item(), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p), refp[name]._data, atol=1e-4, err_msg=name)
        if use_fsdp:  # bytes: attention and MLP weights / (dp*tp), the rest / dp (this model's dims divide evenly)
            split = dp * tp if (".mlp." in name or ".attn." in name) else dp
            assert p._data.nbytes * split == 4 * int(np.prod(p.shape)), name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("with_units", [False, True])
def test_sharding_plan_param_specs_parity(with_units):
    plan = {"up.weight": ChunkShardingSpec(0, mesh_dim="tp"), "down.weight": ChunkShardingSpec(1, mesh_dim="tp")}
    if with_units:
        plan[""] = FullyShardSpec()
    model, _, mesh = _train(with_units, plan=ShardingPlan(plan, return_local_tensor=[""]))
    assert model.up.weight.placements[-1] == Shard(0) and model.down.weight.placements[-1] == Shard(1)
    assert (len(model.up.weight.placements) == 2) == with_units


def test_sharding_plan_output_plan_and_1d_placements():
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    hp.manual_seed(1)
    ref = nn.Sequential(nn.Linear(4, 2 * n), nn.Linear(2 * n, 3))
    hp.manual_seed(1)
    m = nn.Sequential(nn.Linear(4, 2 * n), nn.Linear(2 * n, 3))
    ranks = [f"rank:{r}/cpu" for r in range(n)]
    plan = ShardingPlan({"0.weight": ChunkShardingSpec(0, ranks), "1.weight": ChunkShardingSpec(1, ranks)},
                        output_plan={"1": ChunkShardingSpec(0, ranks)}, return_local_tensor=["1"])
    apply_sharding_plan(m, plan, mesh)
    x = np.random.default_rng(2).standard_normal((2 * n, 4)).astype(np.float32)
    out = m(hp.tensor(x))  # rows reduce-scattered over the ranks
    want = ref(hp.tensor(x))
    np.testing.assert_allclose(out._data, want._data[2 * me:2 * me + 2], atol=1e-5)
    out.sum().backward()
    want.sum().backward()  # each rank's loss is its rows: the reference sums all rows
    np.testing.assert_allclose(m[0].weight.grad._data, ref[0].weight.grad._data[2 * me:2 * me + 2], atol=1e-5)
    with pytest.raises(ValueError, match="placements name ranks"):
        ChunkShardingSpec(0, list(reversed(ranks))).resolve(mesh, "k")


def test_sharding_plan_bad_input_names_the_key():
    mesh = _mesh()
    cases = [
        ({"up.weight": ChunkShardingSpec(0, mesh_dim="pp")}, None, ValueError, r"'up.weight'.*mesh_dim 'pp'"),
        ({"up.weight": ChunkShardingSpec(0)}, None, ValueError, r"'up.weight'.*mesh_dim is required"),
        ({"up.nope": ChunkShardingSpec(0, mesh_dim="tp")}, None, ValueError, r"parameter 'up.nope'"),
        ({"up.weight": ChunkShardingSpec(0, mesh_dim="tp")}, {"down": ChunkShardingSpec(0, mesh_dim="tp")},
         ValueError, r"output_plan names module 'down'"),
    ]
    for plan, out, exc, pat in cases:
        m = MLP()
        with pytest.raises(exc, match=pat):
            apply_sharding_plan(m, ShardingPlan(plan, output_plan=out), mesh)
        assert not any(isinstance(p, DTensor) for p in m.parameters())
    odd = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"'0.weight'.*does not divide over 2"):
        apply_sharding_plan(odd, ShardingPlan({"0.weight": ChunkShardingSpec(0, mesh_dim="tp")}), mesh)
    m = MLP()
    fully_shard(m, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    with pytest.raises(ValueError, match=r"'up.weight'.*already sharded"):
        apply_sharding_plan(m, ShardingPlan({"up.weight": ChunkShardingSpec(0, mesh_dim="tp")}), mesh)


@pytest.mark.mpi(min_size=8)
@pytest.mark.timeout(300)
def test_gpt_hsdp_x_tp_parity_8_ranks():
    """(replicate=2, shard=2, tp=2): the GPT's attention (by heads) and MLP split over tp, HSDP over the other
    two dims."""
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("replicate", "shard", "tp"))
    ref, model = _tiny_gpt(), _tiny_gpt()
    parallelize_module(model, mesh["tp"], model.tp_plan())
    dims = DataParallelMeshDims(shard="shard", replicate="replicate")
    for b in model.transformer.h:
        fully_shard(b, mesh=mesh, dp_mesh_dims=dims)
    fully_shard(model, mesh=mesh, dp_mesh_dims=dims)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(5)
    r, s, _ = mesh.get_coordinate()
    i = 2 * r + s  # data-parallel index
    for _ in range(10):
        x, y = rng.integers(0, 16, (8, 8)), rng.integers(0, 16, (8, 8))
        _, loss = model(hp.tensor(x[2 * i:2 * i + 2]), hp.tensor(y[2 * i:2 * i + 2]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        np.testing.assert_allclose(t.item(), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p), refp[name]._data, atol=1e-4, err_msg=name)
        split = 4 if (".mlp." in name or ".attn." in name) else 2  # shard x tp, or shard only
        assert p._data.nbytes * split == 4 * int(np.prod(p.shape)), name


def test_fsdp_over_tp_uneven_pieces_round_trip():
    """A tp piece whose rows do not divide over dp: 3 rows per tp rank over dp=2 gives 2 and 1 rows; the
    sharded parameter's full_tensor() and a forward equal the unsharded module's."""
    mesh = _mesh()
    hp.manual_seed(4)
    ref = nn.Linear(5, 6)
    hp.manual_seed(4)
    m = nn.Sequential(nn.Linear(5, 6))
    parallelize_module(m, mesh["tp"], {"0": ColwiseParallel(output_layouts=Replicate())})
    fully_shard(m, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    i, j = mesh.get_coordinate()
    a, b = _chunk_bounds(6, 2, j)
    c, d = _chunk_bounds(b - a, mesh.size(0), i)
    assert m[0].weight._data.shape == (d - c, 5)
    np.testing.assert_array_equal(m[0].weight._data, ref.weight._data[a + c:a + d])
    np.testing.assert_array_equal(m[0].weight.full_tensor()._data, ref.weight._data)
    np.testing.assert_array_equal(m[0].bias.full_tensor()._data, ref.bias._data)
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(m(hp.tensor(x))._data, ref(hp.tensor(x))._data, atol=1e-6)


def test_colwise_sharded_input_gradients():
    """ColwiseParallel(input_layouts=Shard(0)): rows all-gathered forward, input gradient reduce-scattered
    backward; input and weight gradients equal the unsharded module's (every rank computes the same loss)."""
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    hp.manual_seed(2)
    ref = nn.Linear(4, 2 * n)
    hp.manual_seed(2)
    m = nn.Sequential(nn.Linear(4, 2 * n))
    parallelize_module(m, mesh, {"0": ColwiseParallel(input_layouts=Shard(0), output_layouts=Replicate())})
    x = np.random.default_rng(3).standard_normal((2 * n, 4)).astype(np.float32)
    xl = hp.tensor(x[2 * me:2 * me + 2], requires_grad=True)
    xf = hp.tensor(x, requires_grad=True)
    y, yr = m(xl), ref(xf)
    np.testing.assert_allclose(y._data, yr._data, atol=1e-6)
    (y * y).sum().backward()
    (yr * yr).sum().backward()
    np.testing.assert_allclose(xl.grad._data, xf.grad._data[2 * me:2 * me + 2], atol=1e-5)
    np.testing.assert_allclose(m[0].weight._data, ref.weight._data[2 * me:2 * me + 2])
    np.testing.assert_allclose(m[0].weight.grad._data, ref.weight.grad._data[2 * me:2 * me + 2], atol=1e-5)


def test_vocab_parallel_embedding():
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    hp.manual_seed(6)
    ref = nn.Embedding(3 * n, 5)
    hp.manual_seed(6)
    m = nn.Sequential(nn.Embedding(3 * n, 5))
    parallelize_module(m, mesh, {"0": RowwiseParallel(input_layouts=Replicate())})
    assert m[0].weight.placements == (Shard(0),) and m[0].weight._data.shape == (3, 5)
    ids = np.random.default_rng(4).integers(0, 3 * n, (2, 7))
    y, yr = m(hp.tensor(ids)), ref(hp.tensor(ids))
    np.testing.assert_allclose(y._data, yr._data, atol=1e-7)
    (y * y).sum().backward()
    (yr * yr).sum().backward()
    np.testing.assert_allclose(m[0].weight.grad._data, ref.weight.grad._data[3 * me:3 * me + 3], atol=1e-6)


def test_vocab_parallel_cross_entropy_matches_cross_entropy():
    from hpcfsdp.distributed.tensor.parallel import vocab_parallel_cross_entropy
    from hpcfsdp.nn import functional as F

    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    rng = np.random.default_rng(8)
    z = rng.standard_normal((2, 5, 3 * n)).astype(np.float32)
    t = rng.integers(0, 3 * n, (2, 5))
    t[0, 1] = -100  # ignored
    zl = hp.tensor(z[..., 3 * me:3 * me + 3].copy(), requires_grad=True)
    zf = hp.tensor(z, requires_grad=True)
    loss = vocab_parallel_cross_entropy(zl, hp.tensor(t), mesh)
    ref = F.cross_entropy(zf.reshape(-1, 3 * n), hp.tensor(t.reshape(-1)), ignore_index=-100)
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-6)
    loss.backward()
    ref.backward()
    np.testing.assert_allclose(zl.grad._data, zf.grad._data[..., 3 * me:3 * me + 3], atol=1e-6)


def test_full_state_dict_round_trip_with_tp_and_fsdp():
    from hpcfsdp.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                            set_model_state_dict)

    mesh = _mesh()
    dims = DataParallelMeshDims(shard="dp")
    ref = MLP(seed=3)
    a = MLP(seed=3)
    parallelize_module(a, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(a, mesh=mesh, dp_mesh_dims=dims)
    full = get_model_state_dict(a, options=StateDictOptions(full_state_dict=True))
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(full[k]._data, v._data, err_msg=k)
    b = MLP(seed=11)
    parallelize_module(b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(b, mesh=mesh, dp_mesh_dims=dims)
    set_model_state_dict(b, full, options=StateDictOptions(full_state_dict=True))
    for (k, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert p.placements == q.placements
        np.testing.assert_array_equal(p._data, q._data, err_msg=k)
