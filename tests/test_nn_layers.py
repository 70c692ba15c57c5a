"""Layers (linear, embedding, norms, dropout, flatten) against NumPy float64 references: forward values and
finite-difference gradients; instance norm and SyncBatchNorm without a process group."""
import math
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck

RNG = np.random.default_rng(1234)


def _t(a, requires_grad=False):
    return hp.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def _numgrad(f, arrays, eps=1e-6):
    """Central differences of the scalar f() with respect to every array in ``arrays`` (modified in place)."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        it = np.nditer(a, flags=["multi_index"])
        for _ in it:
            i = it.multi_index
            old = a[i]
            a[i] = old + eps
            fp = f()
            a[i] = old - eps
            fm = f()
            a[i] = old
            g[i] = (fp - fm) / (2 * eps)
        grads.append(g)
    return grads


def _check_grads(module, x_np, loss_weights=None):
    """Backprop sum(out * w) through ``module`` (float64) and compare with central differences."""
    x = _t(x_np, requires_grad=True)
    out = module(x)
    w = loss_weights if loss_weights is not None else RNG.standard_normal(tuple(out.shape))
    (out * _t(w)).sum().backward()
    params = [p for p in module.parameters()]
    arrays = [x._data] + [p._data for p in params]

    def f():
        with hp.no_grad():
            return float((module(x).detach().numpy() * w).sum())

    num = _numgrad(f, arrays)
    np.testing.assert_allclose(x.grad.numpy(), num[0], rtol=1e-5, atol=1e-7)
    for p, g in zip(params, num[1:]):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-5, atol=1e-7)


def test_linear_forward_and_grad():
    lin = nn.Linear(4, 3, dtype=hp.float64)
    x = RNG.standard_normal((5, 4))
    W, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    np.testing.assert_allclose(lin(_t(x)).detach().numpy(), x @ W.T + b, rtol=1e-12)
    x3 = RNG.standard_normal((2, 5, 4))
    np.testing.assert_allclose(lin(_t(x3)).detach().numpy(), x3 @ W.T + b, rtol=1e-12)
    _check_grads(lin, x)
    nb = nn.Linear(4, 2, bias=False, dtype=hp.float64)
    np.testing.assert_allclose(nb(_t(x)).detach().numpy(), x @ nb.weight.detach().numpy().T, rtol=1e-12)
    assert lin.weight.dtype == hp.float64 and nn.Linear(2, 2).weight.dtype == hp.float32


def test_embedding_forward_and_grad():
    emb = nn.Embedding(7, 3, dtype=hp.float64)
    idx = np.array([[0, 3, 3], [6, 1, 0]])
    W = emb.weight.detach().numpy()
    out = emb(hp.tensor(idx))
    np.testing.assert_array_equal(out.detach().numpy(), W[idx])
    w = RNG.standard_normal((2, 3, 3))
    (out * _t(w)).sum().backward()
    ref = np.zeros_like(W)
    np.add.at(ref, idx, w)  # repeated indices accumulate
    np.testing.assert_allclose(emb.weight.grad.numpy(), ref, rtol=1e-12)
    pad = nn.Embedding(5, 2, padding_idx=1)
    assert np.all(pad.weight.detach().numpy()[1] == 0)
    assert repr(pad) == "Embedding(5, 2, padding_idx=1)"


def test_layernorm_forward_and_grad():
    ln = nn.LayerNorm(6, dtype=hp.float64)
    with hp.no_grad():
        ln.weight.copy_(_t(RNG.standard_normal(6)))
        ln.bias.copy_(_t(RNG.standard_normal(6)))
    x = RNG.standard_normal((3, 6)) * 2 + 1
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)  # biased, as PyTorch
    ref = (x - mu) / np.sqrt(var + 1e-5) * ln.weight.detach().numpy() + ln.bias.detach().numpy()
    np.testing.assert_allclose(ln(_t(x)).detach().numpy(), ref, rtol=1e-10)
    _check_grads(ln, x)
    nob = nn.LayerNorm((2, 3), bias=False, eps=1e-3)
    assert nob.bias is None and nob.normalized_shape == (2, 3)
    assert repr(nob) == "LayerNorm((2, 3), eps=0.001, elementwise_affine=True, bias=False)"
    assert repr(nn.LayerNorm(8)) == "LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True)"
    assert repr(nn.LayerNorm(8, elementwise_affine=False)) == "LayerNorm((8,), eps=1e-05, elementwise_affine=False, bias=False)"
    noaff = nn.LayerNorm(4, elementwise_affine=False)
    assert list(noaff.parameters()) == []


def test_activations_forward_and_grad():
    x = RNG.standard_normal((4, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep away from relu's kink
    erf = np.vectorize(math.erf)
    # the exact GELU uses a rational erf approximation (abs error < 2e-8, see autograd/ops/unary.py)
    np.testing.assert_allclose(nn.GELU()(_t(x)).detach().numpy(), 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=5e-8)
    tanh_ref = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(nn.GELU("tanh")(_t(x)).detach().numpy(), tanh_ref, rtol=1e-10)
    np.testing.assert_allclose(nn.ReLU()(_t(x)).detach().numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(nn.Tanh()(_t(x)).detach().numpy(), np.tanh(x), rtol=1e-12)
    for m in (nn.GELU(), nn.GELU("tanh"), nn.ReLU(), nn.Tanh()):
        _check_grads(m, x)
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")
    y = _t(x)
    assert nn.Identity(3, foo=1)(y) is y


def test_dropout_train_and_eval():
    hp.manual_seed(0)
    d = nn.Dropout(0.25)
    x = hp.ones(20000, dtype=hp.float64)
    out = d(x).numpy()
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(out[kept], 1 / 0.75)
    d.eval()
    assert np.array_equal(d(x).numpy(), x.numpy())
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        nn.Dropout(1.5)
    assert repr(nn.Dropout(0.1)) == "Dropout(p=0.1, inplace=False)"


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_cross_entropy_and_mse_losses():
    logits = RNG.standard_normal((6, 5))
    target = np.array([0, 4, 2, -100, 1, 3])
    ls = _log_softmax(logits)
    valid = target != -100
    nll = -ls[np.arange(6)[valid], target[valid]]
    ce = nn.CrossEntropyLoss()
    np.testing.assert_allclose(ce(_t(logits), hp.tensor(target)).item(), nll.mean(), rtol=1e-10)
    np.testing.assert_allclose(nn.CrossEntropyLoss(reduction="sum")(_t(logits), hp.tensor(target)).item(),
                               nll.sum(), rtol=1e-10)
    x = _t(logits, requires_grad=True)
    ce(x, hp.tensor(target)).backward()
    p = np.exp(ls)
    onehot = np.zeros_like(p)
    onehot[np.arange(6)[valid], target[valid]] = 1
    ref = (p - onehot) * valid[:, None] / valid.sum()
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-9, atol=1e-12)
    # class weights: mean over valid targets weighted by w[target], normalised by the weight sum
    w = RNG.uniform(0.5, 2.0, 5)
    wce = nn.CrossEntropyLoss(weight=_t(w))
    wt = w[target[valid]]
    np.testing.assert_allclose(wce(_t(logits), hp.tensor(target)).item(), (wt * nll).sum() / wt.sum(), rtol=1e-10)
    assert "weight" in dict(wce.named_buffers())
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    np.testing.assert_allclose(nn.MSELoss()(_t(a), _t(b)).item(), ((a - b) ** 2).mean(), rtol=1e-12)
    np.testing.assert_allclose(nn.MSELoss(reduction="none")(_t(a), _t(b)).numpy(), (a - b) ** 2, rtol=1e-12)
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        nn.MSELoss(reduction="avg")


def test_sequential_mlp_grad():
    mlp = nn.Sequential(nn.Linear(3, 4, dtype=hp.float64), nn.Tanh(), nn.Linear(4, 2, dtype=hp.float64))
    _check_grads(mlp, RNG.standard_normal((2, 3)))


def _bn_ref(x, C, weight, bias, eps):
    """NumPy float64 batch norm of (N, C, *) with batch statistics; returns (out, mean, biased var, n)."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, C) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    out = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        out = out * weight.reshape(shape) + bias.reshape(shape)
    return out, mean, var, x.size // C


@pytest.mark.parametrize("cls,shape", [(nn.BatchNorm1d, (6, 3)), (nn.BatchNorm1d, (4, 3, 5)),
                                       (nn.BatchNorm2d, (3, 3, 2, 4))])
def test_batchnorm_forward_running_stats_and_eval(cls, shape):
    C = shape[1]
    bn = cls(C, eps=1e-3, momentum=0.3, dtype=hp.float64)
    assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
    assert sorted(dict(bn.named_buffers())) == ["num_batches_tracked", "running_mean", "running_var"]
    assert sorted(dict(bn.named_parameters())) == ["bias", "weight"]
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    with hp.no_grad():
        bn.weight.copy_(_t(RNG.uniform(0.5, 2.0, C)))
        bn.bias.copy_(_t(RNG.standard_normal(C)))
    w, b = bn.weight.detach().numpy(), bn.bias.detach().numpy()
    rm, rv = np.zeros(C), np.ones(C)
    for step in range(3):
        x = RNG.standard_normal(shape) * 2 + 1
        out, mean, var, n = _bn_ref(x, C, w, b, 1e-3)
        np.testing.assert_allclose(bn(_t(x)).detach().numpy(), out, rtol=1e-10, atol=1e-12)
        rm = 0.7 * rm + 0.3 * mean
        rv = 0.7 * rv + 0.3 * var * n / (n - 1)  # the running variance takes the unbiased batch variance
        np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-12)
        np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-12)
        assert bn.num_batches_tracked.item() == step + 1
    bn.eval()
    x = RNG.standard_normal(shape)
    sh = (1, C) + (1,) * (len(shape) - 2)
    ref = (x - rm.reshape(sh)) / np.sqrt(rv.reshape(sh) + 1e-3) * w.reshape(sh) + b.reshape(sh)
    np.testing.assert_allclose(bn(_t(x)).detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-12)  # eval leaves the statistics alone
    assert bn.num_batches_tracked.item() == 3
    fresh = cls(C, dtype=hp.float64)
    old = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}  # a version-1 state dict
    fresh.load_state_dict(old)  # strict: the missing num_batches_tracked is filled in, as PyTorch does
    np.testing.assert_array_equal(fresh.running_var.numpy(), bn.running_var.numpy())
    assert fresh.num_batches_tracked.item() == 0


def test_batchnorm_cumulative_average_and_no_running_stats():
    bn = nn.BatchNorm1d(2, momentum=None, dtype=hp.float64)
    xs = [RNG.standard_normal((5, 2)) for _ in range(3)]
    for x in xs:
        bn(_t(x))
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([x.mean(0) for x in xs], axis=0), rtol=1e-12)
    # momentum=None: the running statistics are the plain average over the batches seen
    np.testing.assert_allclose(bn.running_var.numpy(), np.mean([x.var(0, ddof=1) for x in xs], axis=0), rtol=1e-12)
    free = nn.BatchNorm1d(2, affine=False, track_running_stats=False, dtype=hp.float64)
    assert free.weight is None and free.running_mean is None and dict(free.named_buffers()) == {}
    free.eval()  # no running statistics: eval still normalises with the batch's
    x = RNG.standard_normal((4, 2))
    np.testing.assert_allclose(free(_t(x)).numpy(), _bn_ref(x, 2, None, None, 1e-5)[0], rtol=1e-10, atol=1e-12)
    assert repr(free) == "BatchNorm1d(2, eps=1e-05, momentum=0.1, affine=False, bias=False, track_running_stats=False)"
    nobias = nn.BatchNorm2d(2, bias=False, dtype=hp.float64)
    assert nobias.bias is None and list(nobias.state_dict()) == ["weight", "running_mean", "running_var",
                                                                 "num_batches_tracked"]
    x = RNG.standard_normal((3, 2, 2, 2))
    with hp.no_grad():
        nobias.weight.fill_(1.5)
    np.testing.assert_allclose(nobias(_t(x)).detach().numpy(), 1.5 * _bn_ref(x, 2, None, None, 1e-5)[0], rtol=1e-10)


def test_batchnorm_grad_train_and_eval():
    bn = nn.BatchNorm2d(3, dtype=hp.float64)
    with hp.no_grad():
        bn.weight.copy_(_t(RNG.uniform(0.5, 2.0, 3)))
        bn.bias.copy_(_t(RNG.standard_normal(3)))
    _check_grads(bn, RNG.standard_normal((2, 3, 2, 2)))
    _check_grads(nn.BatchNorm1d(4, dtype=hp.float64), RNG.standard_normal((3, 4, 2)))
    bn.eval()
    bn.zero_grad()
    _check_grads(bn, RNG.standard_normal((2, 3, 2, 2)))


def test_batchnorm_bad_input():
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        nn.BatchNorm2d(3)(hp.randn(2, 3, 4))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        nn.BatchNorm1d(3)(hp.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        nn.BatchNorm1d(3)(hp.randn(1, 3))
    with pytest.raises(ValueError, match="expected 3 channels"):
        nn.BatchNorm1d(3)(hp.randn(4, 5))


# -- flatten and channel dropout -------------------------------------------------------------------------
def test_flatten_unflatten(rng):
    x = hp.tensor(rng.standard_normal((2, 3, 4, 5)), requires_grad=True)
    y = nn.Flatten()(x)
    assert y.shape == (2, 60) and nn.Flatten(0, 2)(x).shape == (24, 5)
    z = nn.Unflatten(1, (3, -1))(y)
    assert z.shape == (2, 3, 20)
    z.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 1.0)
    assert repr(nn.Flatten()) == "Flatten(start_dim=1, end_dim=-1)"
    assert repr(nn.Unflatten(1, (2, 5))) == "Unflatten(dim=1, unflattened_size=(2, 5))"
    with pytest.raises(TypeError, match="unflattened_size must be a tuple of ints, but found type int"):
        nn.Unflatten(1, 5)
    with pytest.raises(RuntimeError):
        nn.Unflatten(1, (2, 5))(hp.zeros(3, 9))


@pytest.mark.parametrize("cls,shape", [(nn.Dropout1d, (40, 50, 3)), (nn.Dropout2d, (40, 50, 2, 3)),
                                       (nn.Dropout3d, (40, 50, 2, 1, 3)), (nn.Dropout1d, (500, 4))])
def test_channel_dropout(cls, shape):
    hp.manual_seed(1)
    d = cls(0.3)
    x = hp.ones(*shape, dtype=hp.float64, requires_grad=True)
    y = d(x)
    out = y.detach().numpy()
    lead = len(shape) - (1 if cls is nn.Dropout1d else {nn.Dropout2d: 2, nn.Dropout3d: 3}[cls])
    per_channel = out.reshape(shape[:lead] + (-1,))
    assert np.all(per_channel == per_channel[..., :1])  # whole channels kept or dropped
    kept = per_channel[..., 0] != 0
    assert abs(kept.mean() - 0.7) < 0.05
    np.testing.assert_allclose(per_channel[kept], 1 / 0.7)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), out)
    d.eval()
    assert d(x) is x or np.array_equal(d(x).detach().numpy(), x.detach().numpy())
    assert repr(cls(0.2)) == f"{cls.__name__}(p=0.2, inplace=False)"


def test_channel_dropout_errors_and_warnings():
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input, but received a 4D input"):
        F.dropout1d(hp.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout2d(hp.zeros(2, 3, 4, 5), p=2)
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout2d(-0.1)
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        assert F.dropout2d(hp.zeros(3, 4, 5)).shape == (3, 4, 5)
    np.testing.assert_array_equal(F.dropout2d(hp.ones(2, 3, 2, 2), p=1.0).numpy(), 0)


# -- instance norm ----------------------------------------------------------------------------------------
def _inorm_ref(x, eps=1e-5):
    ax = tuple(range(2, x.ndim))
    return (x - x.mean(ax, keepdims=True)) / np.sqrt(x.var(ax, keepdims=True) + eps)


def test_instance_norm(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    m = nn.InstanceNorm2d(3)
    assert m.weight is None and m.running_mean is None
    assert repr(m) == "InstanceNorm2d(3, eps=1e-05, momentum=0.1, affine=False, bias=False, track_running_stats=False)"
    np.testing.assert_allclose(m(hp.tensor(x)).numpy(), _inorm_ref(x), atol=1e-12)
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    ref = _inorm_ref(x) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(F.instance_norm(hp.tensor(x), weight=hp.tensor(w), bias=hp.tensor(b)).numpy(), ref,
                               atol=1e-12)
    gradcheck(lambda a, ww, bb: F.instance_norm(a, weight=ww, bias=bb), [x[:, :, :2], w, b])
    x1 = rng.standard_normal((3, 6))  # unbatched (C, L)
    np.testing.assert_allclose(nn.InstanceNorm1d(3)(hp.tensor(x1)).numpy(), _inorm_ref(x1[None])[0], atol=1e-12)


def test_instance_norm_running_stats_and_errors(rng):
    x = rng.standard_normal((4, 3, 6))
    m = nn.InstanceNorm1d(3, momentum=0.3, affine=True, track_running_stats=True).to(hp.float64)
    m(hp.tensor(x))
    np.testing.assert_allclose(m.running_mean.numpy(), 0.3 * x.mean(2).mean(0), atol=1e-12)
    np.testing.assert_allclose(m.running_var.numpy(), 0.7 + 0.3 * x.var(2, ddof=1).mean(0), atol=1e-12)
    m.eval()
    rm, rv = m.running_mean.numpy()[None, :, None], m.running_var.numpy()[None, :, None]
    np.testing.assert_allclose(m(hp.tensor(x)).detach().numpy(), (x - rm) / np.sqrt(rv + 1e-5), atol=1e-12)
    with pytest.raises(ValueError, match=r"expected input's size at dim=1 to match num_features \(3\), but got: 4"):
        nn.InstanceNorm1d(3, affine=True)(hp.randn(2, 4, 5))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        nn.InstanceNorm1d(3)(hp.randn(2, 4, 5))
    assert any("does not match num_features" in str(r.message) for r in rec)
    with pytest.raises(ValueError, match="Expected more than 1 spatial element when training"):
        nn.InstanceNorm2d(3)(hp.randn(2, 3, 1, 1))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        nn.InstanceNorm1d(3)(hp.randn(2, 3, 4, 4))


# -- SyncBatchNorm without a process group ----------------------------------------------------------------
def test_sync_batchnorm_without_group_is_batchnorm(rng):
    x = rng.standard_normal((4, 3, 5))
    hp.manual_seed(0)
    bn = nn.BatchNorm1d(3).to(hp.float64)
    sbn = nn.SyncBatchNorm(3).to(hp.float64)
    assert repr(sbn) == "SyncBatchNorm(3, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)"
    np.testing.assert_allclose(sbn(hp.tensor(x)).detach().numpy(), bn(hp.tensor(x)).detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(sbn.running_var.numpy(), bn.running_var.numpy(), atol=1e-12)
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        sbn(hp.randn(3))


def test_convert_sync_batchnorm_shares_parameters():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(2)), nn.InstanceNorm2d(4))
    model[1].eval()
    w = model[1].weight
    conv = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(conv[1], nn.SyncBatchNorm) and isinstance(conv[2][0], nn.SyncBatchNorm)
    assert isinstance(conv[3], nn.InstanceNorm2d) and isinstance(conv[0], nn.Conv2d)
    assert conv[1].weight is w and conv[1].running_mean is model[1].running_mean and not conv[1].training
    assert conv[2][0].num_features == 2
    single = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(5, affine=False))
    assert isinstance(single, nn.SyncBatchNorm) and single.weight is None
