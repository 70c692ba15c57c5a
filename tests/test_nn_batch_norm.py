"""F.batch_norm (training and evaluation, the running statistics' update), BatchNorm3d, InstanceNorm3d and bias=,
and local_response_norm / LocalResponseNorm against NumPy float64 formulas and finite differences."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck


@pytest.fixture
def rng():
    return np.random.default_rng(4)


def test_batch_norm_training_updates_running_stats(rng):
    x, w, b = rng.standard_normal((4, 3, 5)), rng.standard_normal(3), rng.standard_normal(3)
    rm0, rv0 = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    rm, rv = hp.tensor(rm0.copy()), hp.tensor(rv0.copy())
    out = F.batch_norm(hp.tensor(x), rm, rv, hp.tensor(w), hp.tensor(b), training=True, momentum=0.3, eps=1e-4)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    ref = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-4) * w[None, :, None] + b[None, :, None]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10)
    np.testing.assert_allclose(rm.numpy(), 0.7 * rm0 + 0.3 * mean, rtol=1e-12)
    np.testing.assert_allclose(rv.numpy(), 0.7 * rv0 + 0.3 * var * 20 / 19, rtol=1e-12)  # unbiased, n = 20
    gradcheck(lambda a, c, d: F.batch_norm(a, None, None, c, d, training=True), [x, w, b])


def test_batch_norm_eval_and_errors(rng):
    x = rng.standard_normal((4, 3))
    rm, rv = rng.standard_normal(3), rng.uniform(0.5, 2, 3)
    out = F.batch_norm(hp.tensor(x), hp.tensor(rm), hp.tensor(rv))
    np.testing.assert_allclose(out.numpy(), (x - rm) / np.sqrt(rv + 1e-5), rtol=1e-12)
    gradcheck(lambda a: F.batch_norm(a, hp.tensor(rm), hp.tensor(rv)), [x])
    with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
        F.batch_norm(hp.tensor(x), None, None)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        F.batch_norm(hp.tensor(x[:1]), None, None, training=True)
    with pytest.raises(RuntimeError, match="running_mean should contain 3 elements not 2"):
        F.batch_norm(hp.tensor(x), hp.zeros(2), hp.ones(2), training=True)


def test_batchnorm3d_and_instancenorm3d(rng):
    x = rng.standard_normal((2, 3, 2, 3, 2))
    bn = nn.BatchNorm3d(3, momentum=None).double()
    y = bn(hp.tensor(x)).detach().numpy()
    mean, var = x.mean(axis=(0, 2, 3, 4)), x.var(axis=(0, 2, 3, 4))
    np.testing.assert_allclose(y, (x - mean[:, None, None, None]) / np.sqrt(var[:, None, None, None] + 1e-5),
                               rtol=1e-10)
    np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-12)  # cumulative average of one batch
    with pytest.raises(ValueError, match="expected 5D input"):
        bn(hp.tensor(x[0]))
    inorm = nn.InstanceNorm3d(3, affine=True, bias=False)
    assert inorm.bias is None and list(inorm.state_dict()) == ["weight"]
    flat = x.reshape(2, 3, -1)
    ref = (flat - flat.mean(2, keepdims=True)) / np.sqrt(flat.var(2, keepdims=True) + 1e-5)
    np.testing.assert_allclose(nn.InstanceNorm3d(3)(hp.tensor(x)).numpy(), ref.reshape(x.shape), rtol=1e-10)
    assert nn.SyncBatchNorm(3, bias=False).bias is None


def lrn_ref(x, size, alpha, beta, k):
    c = x.shape[1]
    out = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - size // 2), min(c, ch + (size - 1) // 2 + 1)
        s = (x[:, lo:hi] ** 2).sum(1)
        out[:, ch] = x[:, ch] / (k + alpha / size * s) ** beta
    return out


@pytest.mark.parametrize("shape", [(2, 5, 6), (2, 5, 3, 4)])
def test_local_response_norm(rng, shape):
    x = rng.standard_normal(shape)
    np.testing.assert_allclose(F.local_response_norm(hp.tensor(x), 3, 0.1, 0.5, 2.0).numpy(),
                               lrn_ref(x, 3, 0.1, 0.5, 2.0), rtol=1e-10)
    np.testing.assert_allclose(nn.LocalResponseNorm(2)(hp.tensor(x)).numpy(), lrn_ref(x, 2, 1e-4, 0.75, 1.0),
                               rtol=1e-10)
    gradcheck(lambda a: F.local_response_norm(a, 3, 0.1, 0.5, 2.0), [x])
    assert repr(nn.LocalResponseNorm(2)) == "LocalResponseNorm(2, alpha=0.0001, beta=0.75, k=1.0)"
    with pytest.raises(ValueError, match="Expected 3D or higher dimensionality input"):
        F.local_response_norm(hp.ones(2, 3), 2)


def test_mse_loss_weight_and_deprecated_flags(rng):
    x, t, w = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.uniform(0.5, 2, (3, 4))
    got = F.mse_loss(hp.tensor(x), hp.tensor(t), weight=hp.tensor(w))
    assert got.item() == pytest.approx(((x - t) ** 2 * w).sum() / w.sum(), rel=1e-12)
    np.testing.assert_allclose(F.mse_loss(hp.tensor(x), hp.tensor(t), reduction="none", weight=hp.tensor(w)).numpy(),
                               (x - t) ** 2 * w, rtol=1e-12)
    with pytest.warns(UserWarning, match="reduction='sum'"):
        s = F.mse_loss(hp.tensor(x), hp.tensor(t), size_average=False)
    assert s.item() == pytest.approx(((x - t) ** 2).sum(), rel=1e-12)
    with pytest.raises(ValueError, match="Weights and input must have the same size."):
        F.mse_loss(hp.tensor(x), hp.tensor(t), weight=hp.ones(4))
