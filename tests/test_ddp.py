"""DistributedDataParallel (hpcfsdp.nn.parallel): gradients equal the unsharded model's on the global batch.

Each rank trains its slice of the global batch; an unwrapped reference in the same process trains the whole
batch from the same initial parameters. See [Note: DDP gradient reduction] in hpcfsdp/nn/parallel/distributed.py.
"""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed import process_group as pg
from hpcfsdp.nn.parallel import DistributedDataParallel as DDP
from tests._fsdp_util import Blocks, global_mean, local

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    return dist.get_world_size(), dist.get_rank()


def _batches(steps, vocab, per_rank=2, T=5, seed=7):
    w, _ = _world()
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, (w * per_rank, T)) for _ in range(steps)]


def _make(seed=0):
    w, _ = _world()
    hp.manual_seed(seed)
    return Blocks(4 * w + 1)


def _gathered(a):
    """Every rank's copy of a host array: (world, *shape)."""
    w, _ = _world()
    out = hp.zeros((w,) + a.shape, dtype=hp.float32)
    dist.all_gather_into_tensor(out, hp.tensor(np.ascontiguousarray(a, dtype=np.float32)))
    return out.numpy()


def test_reachable_as_nn_parallel():
    assert hp.nn.parallel.DistributedDataParallel is DDP


@pytest.mark.parametrize("bucket_cap_mb,as_view", [(None, False), (0.0005, False), (0.0005, True)],
                         ids=["one-bucket", "small-buckets", "small-buckets-view"])
def test_training_matches_the_global_batch(bucket_cap_mb, as_view):
    ref, model = _make(), DDP(_make(), bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=as_view)
    if bucket_cap_mb is not None:
        assert len(model._buckets) > 2
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    for x in _batches(5, 4 * _world()[0] + 1):
        loss = model(hp.tensor(local(x)))
        loss.backward()
        rl = ref(hp.tensor(x))
        rl.backward()
        rgrads = {n: p.grad.numpy().copy() for n, p in ref.named_parameters()}
        for n, p in model.module.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), rgrads[n], rtol=1e-5, atol=1e-7, err_msg=n)
        np.testing.assert_allclose(global_mean(loss.item()), rl.item(), rtol=1e-5)
        opt.step()
        opt.zero_grad()
        ropt.step()
        ropt.zero_grad()
    rp = dict(ref.named_parameters())
    for n, p in model.module.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), rp[n].detach().numpy(), rtol=2e-4, atol=2e-5, err_msg=n)


def test_init_sync_broadcasts_rank0_parameters():
    w, r = _world()
    model = _make(seed=100 + r)  # every rank starts elsewhere
    rank0 = {n: _gathered(p.detach().numpy())[0] for n, p in model.named_parameters()}
    ddp = DDP(model)
    for n, p in ddp.module.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), rank0[n], err_msg=n)
    other = DDP(_make(seed=100 + r), init_sync=False)
    first = next(other.module.parameters()).detach().numpy()
    assert not np.allclose(_gathered(first)[0], _gathered(first)[1])


def test_no_sync_accumulates_then_reduces_the_sum():
    w, _ = _world()
    ref, model = _make(), DDP(_make(), bucket_cap_mb=0.0005)
    x = _batches(1, 4 * w + 1, per_rank=4)[0]
    xl = local(x)
    before = pg.collective_counts().get("all_reduce", 0)
    with model.no_sync():
        (model(hp.tensor(xl[:2])) / 2).backward()
    assert pg.collective_counts().get("all_reduce", 0) == before  # nothing reduced inside no_sync
    (model(hp.tensor(xl[2:])) / 2).backward()
    assert pg.collective_counts().get("all_reduce", 0) == before + len(model._buckets)
    # the reference: mean over the two micro-batches of each rank's mean, averaged over ranks
    loss = ref(hp.tensor(np.concatenate([s[:2] for s in _slices(x, w)]))) / 2 + \
        ref(hp.tensor(np.concatenate([s[2:] for s in _slices(x, w)]))) / 2
    loss.backward()
    rp = dict(ref.named_parameters())
    for n, p in model.module.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), rp[n].grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=n)


def _slices(x, w):
    n = x.shape[0] // w
    return [x[r * n:(r + 1) * n] for r in range(w)]


def test_state_dict_keys_carry_the_module_prefix():
    model = DDP(_make())
    inner = list(model.module.state_dict())
    assert list(model.state_dict()) == ["module." + k for k in inner]
    assert inner[0] == "emb.weight"
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    with hp.no_grad():
        for p in model.parameters():
            p.zero_()
    model.load_state_dict(sd)
    np.testing.assert_array_equal(model.module.emb.weight.detach().numpy(), sd["module.emb.weight"].numpy())
    assert not hasattr(model, "emb")  # as PyTorch: the wrapper does not forward attributes


class _BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.lin(x)).sum()


@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_buffers_follow_rank0_before_each_forward(broadcast_buffers):
    w, r = _world()
    hp.manual_seed(0)
    model = DDP(_BN(), broadcast_buffers=broadcast_buffers)
    x = hp.tensor(np.random.default_rng(r).standard_normal((5, 3)).astype(np.float32) + r)
    model(x).backward()  # each rank's running statistics now follow its own data
    mean_after_first = model.module.bn.running_mean.numpy().copy()
    every = _gathered(mean_after_first)
    assert not np.allclose(every[0], every[1])
    model.eval()
    with hp.no_grad():
        model(x)  # the previous forward was synchronised: buffers come from rank 0 first
    got = model.module.bn.running_mean.numpy()
    np.testing.assert_array_equal(got, every[0] if broadcast_buffers else mean_after_first)
    assert model.module.bn.num_batches_tracked.item() == 1


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.c = nn.Linear(3, 1)

    def forward(self, x, use_b=False):
        h = self.a(x)
        if use_b:
            h = self.b(h)
        return self.c(h).sum()


def _unused(**kw):
    hp.manual_seed(1)
    return DDP(_Unused(), **kw)


def test_find_unused_parameters_reduces_the_used_ones():
    w, r = _world()
    x = hp.tensor(np.random.default_rng(r).standard_normal((2, 3)).astype(np.float32))
    model = _unused(find_unused_parameters=True)
    model(x).backward()
    assert model.module.b.weight.grad is None  # no rank used it: left alone, as PyTorch
    model.zero_grad()
    model(x, use_b=(r == 0)).backward()  # only rank 0 uses b: every rank gets rank 0's gradient / world
    g = model.module.b.weight.grad
    assert g is not None
    every = _gathered(g.numpy())
    np.testing.assert_allclose(every, np.broadcast_to(every[0], every.shape))
    ref = _Unused()
    ref.load_state_dict(model.module.state_dict())
    if r == 0:
        (ref(x, use_b=True) / w).backward()
        np.testing.assert_allclose(g.numpy(), ref.b.weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    for _ in range(2):  # keeps working, iteration after iteration
        model.zero_grad()
        model(x).backward()


@pytest.mark.parametrize("static_graph", [False, True])
def test_unused_parameter_without_detection(static_graph):
    model = _unused(static_graph=static_graph)
    x = hp.tensor(np.ones((2, 3), dtype=np.float32))
    model(x).backward()
    assert model.module.b.weight.grad is None and model.module.a.weight.grad is not None
    if static_graph:  # allowed: the unused parameters are found when backward ends
        model(x).backward()
        return
    with pytest.raises(RuntimeError, match=r"Expected to have finished reduction in the prior iteration(.|\n)*"
                                           r"did not receive grad for rank \d+: 2 3(.|\n)*b\.weight, b\.bias"):
        model(x)


def test_reductions_overlap_backward():
    """Structural: buckets of later layers are issued before backward reaches the first layer."""
    hp.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)])
    model = DDP(layers, bucket_cap_mb=16 * 17 * 4 / 2**20)  # one layer per bucket
    assert len(model._buckets) == 6
    seen = []

    def hook(_mod, _inp, out):
        out.register_hook(lambda g: seen.append(pg.collective_counts().get("all_reduce", 0)))

    layers[0].register_forward_hook(hook)
    before = pg.collective_counts().get("all_reduce", 0)
    model(hp.randn(4, 16)).pow(2).mean().backward()
    assert seen[0] - before == 5  # every bucket but layer 0's was issued while backward still ran
    assert pg.collective_counts()["all_reduce"] - before == 6


def test_device_mesh_and_bad_arguments():
    w, _ = _world()
    mesh = dist.init_device_mesh("cpu", (w,))
    model = DDP(_make(), device_mesh=mesh)
    assert model.process_group.size() == w
    with pytest.raises(RuntimeError, match="Cannot specify both"):
        DDP(_make(), device_mesh=mesh, process_group=dist.group.WORLD)
    with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a gradient"):
        DDP(nn.ReLU())
    with pytest.raises(ValueError, match="device_ids and output_device arguments only work"):
        DDP(_make(), device_ids=[0])
    with pytest.raises(NotImplementedError, match="mixed_precision"):
        DDP(_make(), mixed_precision=object())
    with pytest.raises(NotImplementedError, match="register_comm_hook"):
        model.register_comm_hook(None, None)


@pytest.mark.gpu
@pytest.mark.parametrize("as_view", [False, True], ids=["copy", "view"])
@pytest.mark.parametrize("cuda_aware", [0, 1], ids=["staged", "cuda_aware"])
def test_cuda_training_matches_the_cpu_reference(cuda_aware, as_view, monkeypatch):
    import cupy as cp

    from hpcfsdp.distributed import _mpi

    monkeypatch.setattr(_mpi, "_CUDA_AWARE", (bool(cuda_aware), "test"))
    w, r = _world()
    before = cp.cuda.runtime.getDevice()
    cp.cuda.Device(r % cp.cuda.runtime.getDeviceCount()).use()
    dev = hp.device("cuda", cp.cuda.runtime.getDevice())
    try:
        ref = _make()
        model = DDP(_make().to(dev), device_ids=[dev], bucket_cap_mb=0.0005, gradient_as_bucket_view=as_view)
        opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
        ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
        for x in _batches(3, 4 * w + 1):
            model(hp.tensor(local(x))).backward()  # device_ids: the input moves to the device
            ref(hp.tensor(x)).backward()
            opt.step()
            opt.zero_grad()
            ropt.step()
            ropt.zero_grad()
        rp = dict(ref.named_parameters())
        for n, p in model.module.named_parameters():
            assert p.device == dev
            np.testing.assert_allclose(p.detach().cpu().numpy(), rp[n].detach().numpy(), rtol=2e-4, atol=2e-5,
                                       err_msg=n)
    finally:
        cp.cuda.Device(before).use()
