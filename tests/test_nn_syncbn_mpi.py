"""SyncBatchNorm over MPI ranks: each rank's slice gives what BatchNorm gives on the global batch.

Ranks hold uneven slices (rank r: r + 1 samples). Forward outputs, input gradients, the weight and bias
gradients (summed over ranks: SyncBatchNorm's own are the rank's share, as PyTorch's) and the running
statistics are compared with an unsharded BatchNorm in the same process.
"""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn

pytestmark = pytest.mark.mpi(min_size=2)


def _slices(n_world):
    sizes = [r + 1 for r in range(n_world)]
    starts = np.cumsum([0] + sizes)
    return sizes, starts


def _global_sum(a):
    t = hp.tensor(np.ascontiguousarray(a))
    dist.all_reduce(t)
    return t.numpy()


@pytest.mark.parametrize("shape,momentum,cls", [((3, 5), 0.1, nn.BatchNorm1d), ((3, 4, 5), None, nn.BatchNorm2d),
                                                ((3,), 0.3, nn.BatchNorm1d)])
def test_sync_batchnorm_matches_global_batchnorm(shape, momentum, cls):
    w, r = dist.get_world_size(), dist.get_rank()
    sizes, starts = _slices(w)
    rng = np.random.default_rng(3)
    xg = rng.standard_normal((int(starts[-1]),) + shape) * 2 + 1  # the global batch, the same on every rank
    gg = rng.standard_normal(xg.shape)
    c = shape[0]
    ref = cls(c, momentum=momentum).to(hp.float64)
    sbn = nn.SyncBatchNorm(c, momentum=momentum).to(hp.float64)
    with hp.no_grad():
        for m in (ref, sbn):
            m.weight.copy_(hp.tensor(np.linspace(0.5, 1.5, c)))
            m.bias.copy_(hp.tensor(np.linspace(-1, 1, c)))
    for step in range(2):
        xr = hp.tensor(xg + step, requires_grad=True)
        yr = ref(xr)
        (yr * hp.tensor(gg)).sum().backward()
        lo, hi = starts[r], starts[r + 1]
        xl = hp.tensor(np.ascontiguousarray(xg[lo:hi] + step), requires_grad=True)
        yl = sbn(xl)
        (yl * hp.tensor(np.ascontiguousarray(gg[lo:hi]))).sum().backward()
        np.testing.assert_allclose(yl.detach().numpy(), yr.detach().numpy()[lo:hi], atol=1e-10)
        np.testing.assert_allclose(xl.grad.numpy(), xr.grad.numpy()[lo:hi], atol=1e-10)
        np.testing.assert_allclose(_global_sum(sbn.weight.grad.numpy()), ref.weight.grad.numpy(), atol=1e-10)
        np.testing.assert_allclose(_global_sum(sbn.bias.grad.numpy()), ref.bias.grad.numpy(), atol=1e-10)
        for name in ("running_mean", "running_var"):
            np.testing.assert_allclose(getattr(sbn, name).numpy(), getattr(ref, name).numpy(), atol=1e-12,
                                       err_msg=f"{name} at step {step}")
        assert int(sbn.num_batches_tracked.item()) == step + 1
        for m in (ref, sbn):
            m.zero_grad()


def test_sync_batchnorm_eval_and_convert():
    w, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(4)
    xg = rng.standard_normal((2 * w, 3, 4))
    model = nn.Sequential(nn.Conv1d(3, 3, 1), nn.BatchNorm1d(3)).to(hp.float64)
    ref = nn.Sequential(nn.Conv1d(3, 3, 1), nn.BatchNorm1d(3)).to(hp.float64)
    ref.load_state_dict(model.state_dict())
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model[1], nn.SyncBatchNorm)
    local = hp.tensor(np.ascontiguousarray(xg[2 * r:2 * r + 2]))
    np.testing.assert_allclose(model(local).detach().numpy(), ref(hp.tensor(xg)).detach().numpy()[2 * r:2 * r + 2],
                               atol=1e-10)
    model.eval()
    ref.eval()
    np.testing.assert_allclose(model(local).detach().numpy(), ref(local).detach().numpy(), atol=1e-12)


def test_sync_batchnorm_float32_no_affine():
    w, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(5)
    xg = rng.standard_normal((2 * w, 2, 3, 3)).astype(np.float32)
    sbn = nn.SyncBatchNorm(2, affine=False)
    ref = nn.BatchNorm2d(2, affine=False)
    xl = hp.tensor(np.ascontiguousarray(xg[2 * r:2 * r + 2]), requires_grad=True)
    xr = hp.tensor(xg, requires_grad=True)
    sbn(xl).pow(2).sum().backward()
    ref(xr).pow(2).sum().backward()
    np.testing.assert_allclose(xl.grad.numpy(), xr.grad.numpy()[2 * r:2 * r + 2], atol=1e-4)
    np.testing.assert_allclose(sbn.running_var.numpy(), ref.running_var.numpy(), atol=1e-5)
