"""GPT attention split by heads: the fused q/k/v projection split per q, k and v (_InterleavedShard), its
layout (full_tensor, redistribute, checkpoints, state dicts, HF files) and training parity at (dp=2, tp=2)."""
import os
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.distributed.checkpoint as dcp
from hpcfsdp import nn
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import DataParallelMeshDims, fully_shard
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from hpcfsdp.distributed.tensor.parallel import parallelize_module
from hpcfsdp.distributed.tensor.placement_types import _InterleavedShard, _StridedShard
from hpcfsdp.models import GPT, GPTConfig


def _chunk(n, world, r):
    c = -(-n // world)
    return min(r * c, n), min((r + 1) * c, n)


def _interleaved_rows(rows, blocks, world, r):
    """Global row indices of rank r's piece: its torch.chunk piece of each of ``blocks`` equal blocks."""
    blk = rows // blocks
    a, b = _chunk(blk, world, r)
    return np.concatenate([np.arange(k * blk + a, k * blk + b) for k in range(blocks)])


def _tmpdir():
    import tempfile

    d = tempfile.mkdtemp(prefix="hpcfsdp-heads-") if dist.get_rank() == 0 else None
    box = [d]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _rmtree(d):
    dist.barrier()
    if dist.get_rank() == 0:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("k", [4, 5])  # rows per block: even and uneven over the ranks
def test_interleaved_shard_layout_and_redistribute(k):
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    g = np.arange(3 * k * 5, dtype=np.float32).reshape(3 * k, 5)
    d = distribute_tensor(hp.tensor(g), mesh, [_InterleavedShard(0, 3)])
    rows = _interleaved_rows(3 * k, 3, n, r)
    np.testing.assert_array_equal(d.to_local()._data, g[rows])
    assert tuple(d.shape) == g.shape
    np.testing.assert_array_equal(d.full_tensor()._data, g)
    rep = d.redistribute(mesh, [Replicate()])
    np.testing.assert_array_equal(rep.to_local()._data, g)
    sh = d.redistribute(mesh, [Shard(0)])
    a, b = _chunk(3 * k, n, r)
    np.testing.assert_array_equal(sh.to_local()._data, g[a:b])
    back = sh.redistribute(mesh, [_InterleavedShard(0, 3)])
    np.testing.assert_array_equal(back.to_local()._data, g[rows])
    # the same layout on dim 1 of a transposed weight, and a 1-D bias
    dt = distribute_tensor(hp.tensor(np.ascontiguousarray(g.T)), mesh, [_InterleavedShard(1, 3)])
    np.testing.assert_array_equal(dt.to_local()._data, g.T[:, rows])
    np.testing.assert_array_equal(dt.full_tensor()._data, g.T)
    with pytest.raises(ValueError, match="3 equal blocks"):
        distribute_tensor(hp.tensor(np.zeros((3 * k + 1, 2), np.float32)), mesh, [_InterleavedShard(0, 3)])


@pytest.mark.mpi(min_size=4)
def test_interleaved_under_fsdp_strided_shard_and_checkpoint_across_layouts():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    i, j = mesh.get_coordinate()
    g = np.random.default_rng(0).standard_normal((30, 3)).astype(np.float32)  # 3 blocks of 10 rows
    d = distribute_tensor(hp.tensor(g), mesh, [_StridedShard(0, 2), _InterleavedShard(0, 3)])
    tp_rows = _interleaved_rows(30, 3, 2, j)  # tp first: q, k, v rows of its half, then dp chunks them
    a, b = _chunk(len(tp_rows), 2, i)
    np.testing.assert_array_equal(d.to_local()._data, g[tp_rows[a:b]])
    np.testing.assert_array_equal(d.full_tensor()._data, g)
    d2 = d.redistribute(mesh, [Replicate(), Shard(1)])
    np.testing.assert_array_equal(d2.full_tensor()._data, g)
    root = _tmpdir()
    try:
        dcp.save({"w": d}, checkpoint_id=f"{root}/c")
        plain = hp.zeros(30, 3)
        other = distribute_tensor(hp.zeros(30, 3), mesh, [Shard(0), Replicate()])
        same = distribute_tensor(hp.zeros(30, 3), mesh, [_StridedShard(0, 2), _InterleavedShard(0, 3)])
        for t in (plain, other, same):
            dcp.load({"w": t}, checkpoint_id=f"{root}/c")
        np.testing.assert_array_equal(plain._data, g)
        np.testing.assert_array_equal(other.full_tensor()._data, g)
        np.testing.assert_array_equal(same.to_local()._data, d.to_local()._data)
        # and the other way: saved as Shard(0), loaded into the interleaved layout
        dcp.save({"w": other}, checkpoint_id=f"{root}/d")
        fresh = distribute_tensor(hp.zeros(30, 3), mesh, [_StridedShard(0, 2), _InterleavedShard(0, 3)])
        dcp.load({"w": fresh}, checkpoint_id=f"{root}/d")
        np.testing.assert_array_equal(fresh.to_local()._data, d.to_local()._data)
    finally:
        _rmtree(root)


CFG = dict(vocab_size=16, block_size=8, n_layer=2, n_head=4, n_embd=16, bias=True)


def _gpt(seed=0, **kw):
    hp.manual_seed(seed)
    return GPT(GPTConfig(**{**CFG, **kw}))


def _tp_fsdp(model, mesh, use_fsdp=True):
    parallelize_module(model, mesh["tp"], model.tp_plan())
    if use_fsdp:
        dims = DataParallelMeshDims(shard="dp")
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, dp_mesh_dims=dims)
        fully_shard(model, mesh=mesh, dp_mesh_dims=dims)
    return model


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("use_fsdp", [False, True])
def test_gpt_attention_holds_its_heads_qkv_rows(use_fsdp):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    i, j = mesh.get_coordinate()
    ref, model = _gpt(), _tp_fsdp(_gpt(), mesh, use_fsdp)
    C, H = CFG["n_embd"], CFG["n_head"]
    hs = C // H
    heads = range(j * H // 2, (j + 1) * H // 2)  # tp rank j's heads
    mine = np.concatenate([np.arange(part * C + h * hs, part * C + (h + 1) * hs) for part in range(3) for h in heads])
    cols = np.concatenate([np.arange(h * hs, (h + 1) * hs) for h in heads])
    for li in range(CFG["n_layer"]):
        a, ra = model.blocks[li].attn, ref.blocks[li].attn
        w, bias, proj = ra.c_attn.weight._data, ra.c_attn.bias._data, ra.c_proj.weight._data
        want_w, want_b, want_p = w[mine], bias[mine], proj[:, cols]
        if use_fsdp:  # FSDP chunks dim 0 of the tp piece over dp
            a0, b0 = _chunk(want_w.shape[0], 2, i)
            want_w, want_b = want_w[a0:b0], want_b[a0:b0]
            a1, b1 = _chunk(want_p.shape[0], 2, i)
            want_p = want_p[a1:b1]
        np.testing.assert_array_equal(a.c_attn.weight._data, want_w)
        np.testing.assert_array_equal(a.c_attn.bias._data, want_b)
        np.testing.assert_array_equal(a.c_proj.weight._data, want_p)
        np.testing.assert_array_equal(a.c_attn.weight.full_tensor()._data, w)


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
@pytest.mark.parametrize("use_fsdp", [False, True])
def test_gpt_heads_split_parity_10_steps_with_bias_and_clipping(use_fsdp):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = 2, 2
    ref, model = _gpt(), _tp_fsdp(_gpt(), mesh, use_fsdp)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(5)
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
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        if use_fsdp:  # the norm over both dims, every parameter counted once
            total = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            rtotal = nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            got = total.full_tensor().item() if isinstance(total, DTensor) else total.item()
            np.testing.assert_allclose(got, rtotal.item(), rtol=1e-5)
        opt.step()
        opt.zero_grad()
        ropt.step()
        ropt.zero_grad()
        t = hp.tensor([loss.item()], dtype=hp.float64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        np.testing.assert_allclose(t.item(), rl.item(), rtol=1e-5, atol=1e-6)
    refp = dict(ref.named_parameters())
    tp_split = ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight")
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.full_tensor()._data if isinstance(p, DTensor) else p._data, refp[name]._data,
                                   atol=1e-4, err_msg=name)
        if use_fsdp:  # bytes: tp-split parameters / (dp*tp), the rest / dp (these dims divide evenly)
            split = dp * tp if name.endswith(tp_split) else dp
            assert p._data.nbytes * split == 4 * int(np.prod(p.shape)), name


@pytest.mark.mpi(min_size=2)
def test_n_head_not_divisible_by_tp_is_named():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    model = _gpt(n_head=3, n_embd=12)
    with pytest.raises(ValueError, match=rf"n_head \(3\) is not divisible by the tensor-parallel size \({n}\)"):
        parallelize_module(model, mesh, model.tp_plan())
    from hpcfsdp.distributed.tensor.parallel.style import _PackedColwiseParallel

    with pytest.raises(NotImplementedError, match="output_layouts must be Shard"):
        _PackedColwiseParallel(3, 4, output_layouts=Replicate())


@pytest.mark.mpi(min_size=4)
def test_state_dicts_and_hf_round_trip_with_heads_split():
    from hpcfsdp.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    ref, model = _gpt(seed=4), _tp_fsdp(_gpt(seed=4), mesh)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(full[k]._data, v._data, err_msg=k)
    other = _tp_fsdp(_gpt(seed=9), mesh)
    set_model_state_dict(other, full, options=StateDictOptions(full_state_dict=True))
    for (k, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        assert p.placements == q.placements
        np.testing.assert_array_equal(p._data, q._data, err_msg=k)
    # sharded state dict through a checkpoint into a tp-only layout (replicated over dp) and a plain model
    root = _tmpdir()
    try:
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=f"{root}/ck")
        tp_only = _tp_fsdp(_gpt(seed=9), mesh, use_fsdp=False)
        plain = _gpt(seed=9)
        for m in (tp_only, plain):
            sd = {"model": get_model_state_dict(m)}
            dcp.load(sd, checkpoint_id=f"{root}/ck")
            set_model_state_dict(m, sd["model"])
            for k, v in ref.state_dict().items():
                got = m.state_dict()[k]
                np.testing.assert_array_equal(got.full_tensor()._data if isinstance(got, DTensor) else got._data,
                                              v._data, err_msg=k)
        # Hugging Face files: export from the sharded model, import unsharded and straight into the shards
        model.save_pretrained(f"{root}/hf")
        dist.barrier()
        back = GPT.from_pretrained(f"{root}/hf")
        for k, v in ref.state_dict().items():
            np.testing.assert_array_equal(back.state_dict()[k]._data, v._data, err_msg=k)
        sharded = GPT.from_pretrained(f"{root}/hf", shard_fn=lambda m: _tp_fsdp(m, mesh))
        for (k, p), (_, q) in zip(model.named_parameters(), sharded.named_parameters()):
            assert p.placements == q.placements, k
            np.testing.assert_array_equal(p._data, q._data, err_msg=k)
    finally:
        _rmtree(root)


@pytest.mark.mpi(min_size=4)
def test_async_save_of_heads_split_model_is_saved_and_loads():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    ref, model = _gpt(seed=6), _tp_fsdp(_gpt(seed=6), mesh)
    root = _tmpdir()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # written in the background like any other state dict
            fut = dcp.async_save({"model": dcp.get_model_state_dict(model)}, checkpoint_id=f"{root}/a")
        assert fut.result() is None
        dcp.save({"model": dcp.get_model_state_dict(model)}, checkpoint_id=f"{root}/s")
        for name in sorted(os.listdir(f"{root}/s")):  # the same files as a synchronous save's
            with open(f"{root}/s/{name}", "rb") as f, open(f"{root}/a/{name}", "rb") as g:
                assert f.read() == g.read(), name
        plain = _gpt(seed=1)
        sd = {"model": dcp.get_model_state_dict(plain)}
        dcp.load(sd, checkpoint_id=f"{root}/a")
        dcp.set_model_state_dict(plain, sd["model"])
        for k, v in ref.state_dict().items():
            np.testing.assert_array_equal(plain.state_dict()[k]._data, v._data, err_msg=k)
    finally:
        _rmtree(root)


@pytest.mark.mpi(min_size=4)
@pytest.mark.timeout(240)
def test_gpt_heads_split_with_uneven_fsdp_pieces():
    """n_embd=10, 2 heads of 5: each tp rank's c_attn piece has 15 rows, 8 and 7 over dp=2 (pieces cross the
    q/k/v boundaries); training matches the unsharded GPT and the pieces are what FSDP's chunking says."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    i, j = mesh.get_coordinate()
    kw = dict(n_embd=10, n_head=2)
    ref, model = _gpt(seed=2, **kw), _tp_fsdp(_gpt(seed=2, **kw), mesh)
    rows = _interleaved_rows(30, 3, 2, j)
    a, b = _chunk(len(rows), 2, i)
    np.testing.assert_array_equal(model.blocks[0].attn.c_attn.weight._data,
                                  ref.blocks[0].attn.c_attn.weight._data[rows[a:b]])
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    rng = np.random.default_rng(8)
    for _ in range(4):
        x, y = rng.integers(0, 16, (4, 8)), rng.integers(0, 16, (4, 8))
        _, loss = model(hp.tensor(x[2 * i:2 * i + 2]), hp.tensor(y[2 * i:2 * i + 2]))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        _, rl = ref(hp.tensor(x), hp.tensor(y))
        rl.backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ropt.step()
        ropt.zero_grad()
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.full_tensor()._data, refp[name]._data, atol=1e-4, err_msg=name)
