"""FSDP training on CUDA (real or simulated) matches the same training on the CPU: precisions, offload, HSDP,
custom collectives, prefetch, and the CUDA-aware and staged MPI paths. One GPU per rank.

On the simulated device (HPCFSDP_CUDA_SIM=1) every kernel, copy and MPI call is checked against CUDA's
ordering and device rules, so a missing synchronisation fails these tests with the stack of the write.
"""
import contextlib

import numpy as np
import pytest
from _fsdp_util import full, global_mean, gpt_batches, local, tiny_gpt, world

import hpcfsdp as hp
from hpcfsdp import _backend
from hpcfsdp.distributed import _c10d_groups, _mpi
from hpcfsdp.distributed.fsdp import AllGather, CPUOffloadPolicy, MixedPrecisionPolicy, ReduceScatter, fully_shard
from hpcfsdp.distributed.fsdp._fully_shard import _fsdp_init

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]


def _mpi_paths():
    """The ways MPI can meet device memory on this machine: staged through pinned host buffers always; the device
    pointer itself ("cuda_aware") only where the MPI library takes device pointers (_mpi.cuda_aware()), or on the
    simulated device, whose memory is host memory that any MPI reads correctly. Handing a device pointer to a
    host-only MPI on a real GPU would read garbage or crash, so that variant does not exist there."""
    if _backend.cuda_simulated() or not _backend.cupy_available():  # (without CuPy the gpu tests do not run)
        return ["staged", "cuda_aware"]
    return ["staged"] + (["cuda_aware"] if _mpi.cuda_aware()[0] else [])


@pytest.fixture(params=_mpi_paths())
def mpi_path(request, monkeypatch):
    """Run the test's device collectives on one MPI path (see _mpi_paths), whatever HPCFSDP_GPU_COMM says: the
    default group and the groups of the cached default meshes (fully_shard's mesh when none is given; an earlier
    test may have put them on NCCL) choose their path again at their next device collective, under this
    setting. New groups choose under it anyway."""
    aware = request.param == "cuda_aware"
    if _backend.cuda_simulated():
        monkeypatch.setattr(_mpi, "_CUDA_AWARE", (aware, "test: simulated device memory is host memory"))
    monkeypatch.setenv("HPCFSDP_GPU_COMM", "mpi" if aware else "staged")
    groups = [_c10d_groups.default_group()]
    groups += [g for mesh in _fsdp_init._default_meshes.values() for g in mesh._groups if g is not None]
    for g in groups:
        monkeypatch.setattr(g, "_gpu", None)
    yield request.param
    want = "mpi" if aware else "staged"
    for g in groups:
        assert g._gpu is None or g._gpu.path == want, (g._gdesc(), g._gpu.path)


@pytest.fixture
def rank_gpu():
    """Select this rank's GPU (local rank modulo the visible GPUs), as a launcher would; restore afterwards."""
    import cupy as cp

    before = cp.cuda.runtime.getDevice()
    _, r = world()
    cp.cuda.Device(r % cp.cuda.runtime.getDeviceCount()).use()
    yield hp.device("cuda", cp.cuda.runtime.getDevice())
    cp.cuda.Device(before).use()


class _RawAllGather(AllGather):
    """A custom all-gather on the process group's raw API (counts its calls)."""

    def __init__(self):
        self.calls = 0

    def allocate(self, size, *, dtype, device):
        return hp.empty(tuple(size), dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        self.calls += 1
        return group.all_gather_into(output_tensor._data, input_tensor._data, async_op)


class _RawReduceScatter(ReduceScatter):
    def __init__(self):
        self.calls = 0

    def allocate(self, size, *, dtype, device):
        return hp.empty(tuple(size), dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.calls += 1
        return group.reduce_scatter_into(output_tensor._data, input_tensor._data, op, async_op)


def _train(dev, steps=3, mp=None, offload=False, mesh=None, custom=None, prefetch=False, reshard=True):
    """Train a 2-block tiny GPT sharded per block; return (losses, full parameters as float32 NumPy)."""
    w, _ = world()
    model = tiny_gpt().to(dev)
    kw = {"mp_policy": mp or MixedPrecisionPolicy()}
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    if mesh is not None:
        kw["mesh"] = mesh
    for b in model.blocks:
        fully_shard(b, reshard_after_forward=reshard, **kw)
    fully_shard(model, reshard_after_forward=reshard, **kw)
    if custom is not None:
        for m in [model, *model.blocks]:
            m.set_custom_all_gather(custom[0])
            m.set_custom_reduce_scatter(custom[1])
    if prefetch:
        blocks = list(model.blocks)
        for a, b in zip(blocks, blocks[1:]):
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i, (x, y) in enumerate(gpt_batches(steps, 4 * w + 1)):
        _, loss = model(hp.tensor(local(x), device=dev), hp.tensor(local(y), device=dev))
        loss.backward()
        if i == 0:
            model.first_grads = {n: full(p.grad).astype(np.float64) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(global_mean(loss.item()))
    params = {n: full(p).astype(np.float32) for n, p in model.named_parameters()}
    return model, losses, params


def _compare(a, b, rtol, atol):
    (_, la, pa), (_, lb, pb) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=atol, err_msg="losses")
    for n in pa:
        np.testing.assert_allclose(pa[n], pb[n], rtol=rtol, atol=atol, err_msg=n)


def _compare_bf16(a, b, rtol, atol, rel):
    """bfloat16 compute: the losses elementwise and the first step's gradients normwise (within ``rel`` of the
    reference's largest), not the parameters after Adam. The GPU attention rounds P and dS to bfloat16 for its
    tensor-core products where the CPU's stays in float32 (See [Note: Dense attention on the GPU]): both are
    bfloat16-accurate, and Adam turns a bfloat16 difference in a near-zero gradient into an update of the other
    sign, a difference of up to 2 lr per step in that one weight that no tolerance can tell from a wrong weight (measured: at most 1.1e-2 here)."""
    (ma, la, _), (mb, lb, _) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol, atol=atol, err_msg="losses")
    for n, gb in mb.first_grads.items():
        err = np.abs(ma.first_grads[n] - gb).max()
        assert err <= rel * np.abs(gb).max(), (n, err / np.abs(gb).max())


PRECISIONS = {
    "fp32": (None, None, 1e-4, 1e-5),
    "bf16_params_fp32_reduce": (hp.bfloat16, hp.float32, 2e-2, 2e-3),
    "bf16_params_bf16_reduce": (hp.bfloat16, hp.bfloat16, 2e-2, 2e-3),
    "fp16_reduce": (None, hp.float16, 1e-2, 1e-3),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_training_on_cuda_matches_cpu(precision, mpi_path, rank_gpu):
    param_dtype, reduce_dtype, rtol, atol = PRECISIONS[precision]
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    cuda = _train(rank_gpu, mp=mp)
    cpu = _train("cpu", mp=mp)
    if param_dtype is hp.bfloat16:
        _compare_bf16(cuda, cpu, rtol, atol, rel=2 ** -5)
    else:
        _compare(cuda, cpu, rtol, atol)
    assert all(p.device == rank_gpu for p in cuda[0].parameters())


@pytest.mark.timeout(300)
def test_cpu_offload_matches_cpu(mpi_path, rank_gpu):
    cuda = _train(rank_gpu, offload=True)
    cpu = _train("cpu")
    _compare(cuda, cpu, 1e-4, 1e-5)
    assert all(p.device.type == "cpu" for p in cuda[0].parameters())


@pytest.mark.timeout(300)
def test_cpu_offload_keeps_shards_in_pinned_memory(rank_gpu):
    model, _, _ = _train(rank_gpu, steps=1, offload=True)
    for p in model.parameters():
        assert _backend.is_pinned(p._data), "CPUOffloadPolicy(pin_memory=True): sharded parameters must be pinned"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("prefetch", [False, True], ids=["no_prefetch", "prefetch"])
def test_custom_collectives_and_prefetch_match_cpu(prefetch, mpi_path, rank_gpu):
    ag, rs = _RawAllGather(), _RawReduceScatter()
    cuda = _train(rank_gpu, custom=(ag, rs), prefetch=prefetch, reshard=True)
    assert ag.calls > 0 and rs.calls > 0
    cpu = _train("cpu", prefetch=prefetch)
    _compare(cuda, cpu, 1e-4, 1e-5)


@pytest.mark.timeout(300)
@pytest.mark.mpi(min_size=4)
def test_hsdp_2x2_matches_cpu(mpi_path, rank_gpu):
    from hpcfsdp.distributed.device_mesh import init_device_mesh

    w, _ = world()
    if w != 4:
        pytest.skip("HSDP 2x2 needs exactly 4 ranks")
    cuda = _train(rank_gpu, mesh=init_device_mesh("cuda", (2, 2), mesh_dim_names=("replicate", "shard")))
    cpu = _train("cpu", mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
    _compare(cuda, cpu, 1e-4, 1e-5)


@pytest.mark.timeout(300)
def test_clip_grad_norm_of_sharded_gradients_equals_cpu_and_syncs_only_where_the_mpi_path_needs(mpi_path, rank_gpu):
    """FSDP2's DTensor gradients: the partial norms are all-reduced as device arrays (DTensor's
    __hp_reduce_norm_device__), never read back by clip_grad_norm_ itself; the clipped gradients equal the CPU's."""
    from hpcfsdp.testing import cuda_sim

    res = {}
    for dev in ("cpu", rank_gpu):
        model = tiny_gpt().to(dev)
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
        (x, y), = gpt_batches(1, 4 * world()[0] + 1)
        _, loss = model(hp.tensor(local(x), device=dev), hp.tensor(local(y), device=dev))
        loss.backward()
        sim = _backend.cuda_simulated() and dev != "cpu"
        with (cuda_sim.counting() if sim else contextlib.nullcontext()) as c:
            norm = hp.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if sim:  # the staged path copies the partial through host memory for MPI: a transfer, never a .item()
            assert not [s for s in c.host_syncs if "clip_grad" in s[1] or "_dtensor" in s[1]], c.host_syncs
        res[str(dev)] = (float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm),
                         {n: full(p.grad).astype(np.float64) for n, p in model.named_parameters()})
    (nc, gc), (ng, gg) = res.values()
    assert ng == pytest.approx(nc, rel=1e-5) and nc > 0.05
    for n in gc:
        np.testing.assert_allclose(gg[n], gc[n], rtol=1e-4, atol=1e-7, err_msg=n)
