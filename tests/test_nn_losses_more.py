"""Losses, activations, group_norm, normalize, one_hot and the parameter containers against NumPy float64 formulas.

Each differentiable function: values against the formula written here, finite-difference gradients of
the input (and of the target where PyTorch differentiates it), PyTorch's errors and the layers' reprs.
"""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck, rand


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def _reduce(loss, reduction):
    return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]


def _log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


REDUCTIONS = ["mean", "sum", "none"]


# -- nll_loss --------------------------------------------------------------------------------------------
def nll_ref(logp, t, w=None, ignore_index=-100, reduction="mean"):
    """logp (N, C, *), t (N, *): the documented formula with a loop over every (sample, position)."""
    c = logp.shape[1]
    w = np.ones(c) if w is None else w
    loss = np.zeros(t.shape)
    wt = np.zeros(t.shape)
    for idx in np.ndindex(*t.shape):
        k = t[idx]
        if k != ignore_index:
            wt[idx] = w[k]
            loss[idx] = -w[k] * logp[(idx[0], k) + idx[1:]]
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / wt.sum()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_nd_weight_ignore_index(rng, reduction):
    x = rand(rng, 3, 5, 4, layout="t")
    t = rng.integers(0, 5, (3, 4))
    t[0, 1] = t[2, 3] = 7
    w = rng.uniform(0.5, 2.0, 5)
    tt, wt = hp.tensor(t), hp.tensor(w)
    out = F.nll_loss(hp.tensor(x), tt, wt, ignore_index=7, reduction=reduction)
    np.testing.assert_allclose(out.numpy(), nll_ref(x, t, w, 7, reduction), rtol=1e-12)
    gradcheck(lambda a: F.nll_loss(a, tt, wt, ignore_index=7, reduction=reduction), [x])
    x2 = rng.standard_normal((4, 3))
    t2 = np.array([2, 0, -100, 1])
    np.testing.assert_allclose(F.nll_loss(hp.tensor(x2), hp.tensor(t2), reduction=reduction).numpy(),
                               nll_ref(x2, t2, reduction=reduction), rtol=1e-12)
    v = rng.standard_normal(4)
    got = F.nll_loss(hp.tensor(v), hp.tensor(2), reduction=reduction)
    assert got.shape == () and got.item() == pytest.approx(-v[2])
    m = nn.NLLLoss(weight=wt, ignore_index=7, reduction=reduction)
    np.testing.assert_allclose(m(hp.tensor(x), tt).numpy(), nll_ref(x, t, w, 7, reduction), rtol=1e-12)


def test_nll_loss_mnist_tutorial_call_and_errors(rng):
    logp = F.log_softmax(hp.tensor(rng.standard_normal((6, 10))), dim=1)
    t = rng.integers(0, 10, 6)
    assert F.nll_loss(logp, hp.tensor(t), reduction="sum").item() == pytest.approx(-logp.numpy()[np.arange(6), t].sum())
    assert math.isnan(F.nll_loss(logp[:2], hp.tensor([-100, -100])).item())
    with pytest.raises(IndexError, match="Target 10 is out of bounds."):
        F.nll_loss(logp, hp.tensor([0, 1, 2, 3, 4, 10]))
    with pytest.raises(IndexError, match="Target -1 is out of bounds."):
        F.nll_loss(logp, hp.tensor([0, 1, 2, 3, 4, -1]))
    with pytest.raises(ValueError, match=r"Expected input batch_size \(6\) to match target batch_size \(2\)"):
        F.nll_loss(logp, hp.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="expected target dtype"):
        F.nll_loss(logp, hp.zeros(6))
    with pytest.raises(RuntimeError, match=r"Expected target size \[3, 5\], got \[3, 4\]"):
        F.nll_loss(hp.zeros(3, 4, 5), hp.tensor(np.zeros((3, 4), np.int64)))
    with pytest.raises(RuntimeError, match="weight tensor should be defined either for all 10 classes"):
        F.nll_loss(logp, hp.tensor(t), weight=hp.ones(3))
    with pytest.raises(ValueError, match="foo is not a valid value for reduction"):
        F.nll_loss(logp, hp.tensor(t), reduction="foo")


def test_legacy_size_average_and_reduce(rng):
    logp, t = hp.tensor(rng.standard_normal((4, 3))), hp.tensor([0, 1, 2, 1])
    with pytest.warns(UserWarning, match="reduction='sum'"):
        s = F.nll_loss(logp, t, size_average=False)
    assert s.item() == pytest.approx(F.nll_loss(logp, t, reduction="sum").item())
    with pytest.warns(UserWarning, match="reduction='none'"):
        assert nn.L1Loss(reduce=False).reduction == "none"


# -- binary cross entropy --------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy(rng, reduction):
    x = rng.uniform(0.05, 0.95, (3, 4))
    t = rng.uniform(0, 1, (3, 4))
    w = rng.uniform(0.5, 2.0, 4)
    ref = -w * (t * np.log(x) + (1 - t) * np.log(1 - x))
    wt = hp.tensor(w)
    got = F.binary_cross_entropy(hp.tensor(x), hp.tensor(t), wt, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), _reduce(ref, reduction), rtol=1e-12)
    gradcheck(lambda a, b: F.binary_cross_entropy(a, b, wt, reduction=reduction), [x, t])
    np.testing.assert_allclose(nn.BCELoss(reduction=reduction)(hp.tensor(x), hp.tensor(t)).numpy(),
                               _reduce(ref / w, reduction), rtol=1e-12)


def test_binary_cross_entropy_clamps_logs_and_errors():
    out = F.binary_cross_entropy(hp.tensor([0.0, 1.0]), hp.tensor([1.0, 0.0]), reduction="none")
    np.testing.assert_array_equal(out.numpy(), [100.0, 100.0])  # log clamped at -100, as PyTorch
    x = hp.tensor([0.0, 1.0, 0.5], requires_grad=True)
    F.binary_cross_entropy(x, hp.tensor([1.0, 0.0, 1.0])).backward()
    assert np.isfinite(x.grad.numpy()).all()
    with pytest.raises(ValueError, match="Using a target size .* that is different to the input size"):
        F.binary_cross_entropy(hp.zeros(3), hp.zeros(3, 1))
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(hp.tensor([0.5, 1.5]), hp.zeros(2))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_binary_cross_entropy_with_logits(rng, reduction):
    x = rng.standard_normal((3, 4)) * 3
    t = rng.uniform(0, 1, (3, 4))
    w, pw = rng.uniform(0.5, 2.0, (3, 1)), rng.uniform(0.5, 3.0, 4)
    sig = 1 / (1 + np.exp(-x))
    ref = -w * (pw * t * np.log(sig) + (1 - t) * np.log(1 - sig))
    wt, pwt = hp.tensor(w), hp.tensor(pw)
    got = F.binary_cross_entropy_with_logits(hp.tensor(x), hp.tensor(t), wt, reduction=reduction, pos_weight=pwt)
    np.testing.assert_allclose(got.numpy(), _reduce(ref, reduction), rtol=1e-10)
    gradcheck(lambda a, b: F.binary_cross_entropy_with_logits(a, b, wt, reduction=reduction, pos_weight=pwt), [x, t])
    gradcheck(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction), [x, t])
    m = nn.BCEWithLogitsLoss(pos_weight=pwt, reduction=reduction)
    assert sorted(dict(m.named_buffers())) == ["pos_weight"]
    np.testing.assert_allclose(m(hp.tensor(x), hp.tensor(t)).numpy(), _reduce(ref / w, reduction), rtol=1e-10)


def test_binary_cross_entropy_with_logits_is_stable():
    x = hp.tensor([1000.0, -1000.0, 0.0], dtype=hp.float64, requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(x, hp.tensor([0.0, 1.0, 1.0]), reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [1000.0, 1000.0, math.log(2)], rtol=1e-12)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, -1.0, -0.5])
    with pytest.raises(ValueError, match=r"Target size .* must be the same as input size"):
        F.binary_cross_entropy_with_logits(hp.zeros(3), hp.zeros(3, 1))


# -- regression losses -----------------------------------------------------------------------------------
def _smooth_ref(d, beta):
    a = np.abs(d)
    return a if beta == 0 else np.where(a < beta, 0.5 * d * d / beta, a - 0.5 * beta)


def _huber_ref(d, delta):
    a = np.abs(d)
    return np.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_l1_smooth_l1_huber(rng, reduction):
    x, t = rng.standard_normal((3, 4)) * 2, rng.standard_normal((3, 4))
    d = x - t
    cases = [
        (lambda a, b: F.l1_loss(a, b, reduction=reduction), np.abs(d), nn.L1Loss(reduction=reduction)),
        (lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.7), _smooth_ref(d, 0.7),
         nn.SmoothL1Loss(reduction=reduction, beta=0.7)),
        (lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), np.abs(d), None),
        (lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=0.7), _huber_ref(d, 0.7),
         nn.HuberLoss(reduction=reduction, delta=0.7)),
    ]
    for fn, ref, module in cases:
        np.testing.assert_allclose(fn(hp.tensor(x), hp.tensor(t)).numpy(), _reduce(ref, reduction), rtol=1e-12)
        gradcheck(fn, [x, t])
        if module is not None:
            np.testing.assert_allclose(module(hp.tensor(x), hp.tensor(t)).numpy(), _reduce(ref, reduction),
                                       rtol=1e-12)


def test_regression_loss_weights_broadcast_and_errors(rng):
    x, t, w = rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.uniform(0.5, 2, (3, 4))
    got = F.l1_loss(hp.tensor(x), hp.tensor(t), weight=hp.tensor(w))
    assert got.item() == pytest.approx((np.abs(x - t) * w).sum() / w.sum())  # PyTorch: weighted mean
    got = F.huber_loss(hp.tensor(x), hp.tensor(t), weight=hp.tensor(w))
    assert got.item() == pytest.approx((_huber_ref(x - t, 1.0) * w).mean())  # PyTorch: plain mean
    with pytest.warns(UserWarning, match="Using a target size"):
        b = F.l1_loss(hp.tensor(x), hp.tensor(t[0]))
    assert b.item() == pytest.approx(np.abs(x - t[0]).mean())
    with pytest.raises(RuntimeError, match="smooth_l1_loss does not support negative values for beta"):
        F.smooth_l1_loss(hp.tensor(x), hp.tensor(t), beta=-1)
    with pytest.raises(RuntimeError, match="huber_loss does not support non-positive values for delta"):
        F.huber_loss(hp.tensor(x), hp.tensor(t), delta=0)
    with pytest.raises(ValueError, match="Weights and input must have the same size"):
        F.l1_loss(hp.tensor(x), hp.tensor(t), weight=hp.ones(4))
    with pytest.raises(ValueError, match="foo is not a valid value for reduction"):
        nn.L1Loss(reduction="foo")


@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(rng, reduction, log_target):
    x = _log_softmax(rng.standard_normal((3, 4)), 1)
    p = np.exp(_log_softmax(rng.standard_normal((3, 4)), 1))
    t = np.log(p) if log_target else p
    ref = p * (np.log(p) - x)
    want = ref.sum() / 3 if reduction == "batchmean" else _reduce(ref, reduction)

    def fn(a, b):
        return F.kl_div(a, b, reduction=reduction, log_target=log_target)

    if reduction == "mean":
        with pytest.warns(UserWarning, match="batchmean"):
            got = fn(hp.tensor(x), hp.tensor(t))
    else:
        got = fn(hp.tensor(x), hp.tensor(t))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    if reduction != "mean":
        gradcheck(fn, [x, t])
        np.testing.assert_allclose(nn.KLDivLoss(reduction=reduction, log_target=log_target)(
            hp.tensor(x), hp.tensor(t)).numpy(), want, rtol=1e-12)


def test_kl_div_zero_target_and_reprs():
    out = F.kl_div(hp.tensor([-1.0, -2.0]), hp.tensor([0.0, 1.0]), reduction="none")
    np.testing.assert_array_equal(out.numpy(), [0.0, 2.0])  # 0 log 0 = 0
    with pytest.raises(ValueError, match="foo is not a valid value for reduction"):
        F.kl_div(hp.zeros(2), hp.zeros(2), reduction="foo")
    for m in (nn.NLLLoss(), nn.BCELoss(), nn.BCEWithLogitsLoss(), nn.L1Loss(), nn.SmoothL1Loss(), nn.HuberLoss(),
              nn.KLDivLoss(reduction="batchmean")):
        assert repr(m) == type(m).__name__ + "()"


# -- activations -----------------------------------------------------------------------------------------
def _away_from(x, points, margin=1e-3):
    for p in points:
        x[np.abs(x - p) < margin] = p + 0.1
    return x


ACTIVATIONS = [
    ("leaky_relu", lambda a: F.leaky_relu(a, 0.2), lambda x: np.where(x > 0, x, 0.2 * x), (0,)),
    ("elu", lambda a: F.elu(a, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)), (0,)),
    ("softplus", F.softplus, lambda x: np.log1p(np.exp(x)), ()),
    ("softplus_beta", lambda a: F.softplus(a, 2.0, 3.0), lambda x: np.where(2 * x > 3, x, np.log1p(np.exp(2 * x)) / 2),
     (1.5,)),
    ("mish", F.mish, lambda x: x * np.tanh(np.log1p(np.exp(x))), ()),
    ("hardtanh", lambda a: F.hardtanh(a, -1.5, 2.0), lambda x: np.clip(x, -1.5, 2.0), (-1.5, 2.0)),
    ("relu6", F.relu6, lambda x: np.clip(x, 0, 6), (0, 6)),
]


@pytest.mark.parametrize("name,fn,ref,kinks", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_values_and_grad(rng, name, fn, ref, kinks):
    x = _away_from(rand(rng, 4, 5, layout="t") * 4, kinks)
    np.testing.assert_allclose(fn(hp.tensor(x)).numpy(), ref(x), rtol=1e-12, atol=1e-15)
    gradcheck(fn, [x])


def test_activation_edges():
    x = hp.tensor([-1e4, -50.0, 0.0, 50.0, 1e4], requires_grad=True)
    for fn in (F.softplus, F.mish, F.elu):
        y = fn(x)
        y.sum().backward()
        assert np.isfinite(y.detach().numpy()).all() and np.isfinite(x.grad.numpy()).all()
        x.grad = None
    np.testing.assert_allclose(F.softplus(x).detach().numpy(), [0, math.log1p(math.exp(-50)), math.log(2), 50, 1e4])
    z = hp.tensor([0.0, 6.0, -1.0, 1.0], requires_grad=True)
    F.relu6(z).sum().backward()
    np.testing.assert_array_equal(z.grad.numpy(), [0, 0, 0, 1])  # no gradient at the bounds, as PyTorch
    with pytest.raises(ValueError, match="min_val cannot be greater than max_val"):
        F.hardtanh(z, 2, 1)
    y = F.leaky_relu(hp.tensor([1.0, -1.0], dtype=hp.float32))
    assert y.dtype == hp.float32 and y.numpy().tolist() == pytest.approx([1.0, -0.01])
    assert F.elu(hp.tensor([-1.0], dtype=hp.bfloat16)).dtype == hp.bfloat16


def test_activation_layers(rng):
    x = hp.tensor(rng.standard_normal((3, 4)))
    pairs = [(nn.Softmax(dim=1), F.softmax(x, 1)), (nn.LogSoftmax(dim=0), F.log_softmax(x, 0)),
             (nn.Sigmoid(), F.sigmoid(x)), (nn.LeakyReLU(0.3), F.leaky_relu(x, 0.3)), (nn.ELU(0.5), F.elu(x, 0.5)),
             (nn.Softplus(2, 10), F.softplus(x, 2, 10)), (nn.Mish(), F.mish(x)), (nn.Hardtanh(-0.5, 0.5),
                                                                                   F.hardtanh(x, -0.5, 0.5)),
             (nn.ReLU6(), F.relu6(x))]
    for m, want in pairs:
        np.testing.assert_array_equal(m(x).numpy(), want.numpy())
    reprs = {nn.Softmax(1): "Softmax(dim=1)", nn.Softmax(): "Softmax(dim=None)", nn.LogSoftmax(dim=1): "LogSoftmax(dim=1)",
             nn.Sigmoid(): "Sigmoid()", nn.LeakyReLU(): "LeakyReLU(negative_slope=0.01)",
             nn.LeakyReLU(0.2, True): "LeakyReLU(negative_slope=0.2, inplace=True)", nn.ELU(): "ELU(alpha=1.0)",
             nn.ELU(0.5, True): "ELU(alpha=0.5, inplace=True)", nn.Softplus(): "Softplus(beta=1.0, threshold=20.0)",
             nn.Mish(): "Mish()", nn.Hardtanh(): "Hardtanh(min_val=-1.0, max_val=1.0)",
             nn.Hardtanh(-2, 2): "Hardtanh(min_val=-2, max_val=2)", nn.ReLU6(): "ReLU6()",
             nn.ReLU6(True): "ReLU6(inplace=True)"}
    for m, r in reprs.items():
        assert repr(m) == r
    with pytest.raises(ValueError, match=r"max_val \(1\) must be greater than min_val \(2\)"):
        nn.Hardtanh(2, 1)


# -- group_norm, normalize, one_hot ----------------------------------------------------------------------
def gn_ref(x, g, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    xr = x.reshape(n, g, -1)
    y = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


def test_group_norm(rng):
    x = rand(rng, 2, 6, 3, 2, layout="t") * 2 + 1
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    np.testing.assert_allclose(F.group_norm(hp.tensor(x), 3, hp.tensor(w), hp.tensor(b)).numpy(), gn_ref(x, 3, w, b),
                               rtol=1e-10, atol=1e-12)
    gradcheck(lambda a, ww, bb: F.group_norm(a, 3, ww, bb), [x, w, b])
    gradcheck(lambda a: F.group_norm(a, 2, eps=1e-3), [x[:, :, 0]])
    m = nn.GroupNorm(3, 6, dtype=hp.float64)
    assert (m.weight.detach().numpy() == 1).all() and (m.bias.detach().numpy() == 0).all()
    np.testing.assert_allclose(m(hp.tensor(x)).detach().numpy(), gn_ref(x, 3), rtol=1e-10, atol=1e-12)
    assert repr(m) == "GroupNorm(3, 6, eps=1e-05, affine=True, bias=True)"
    assert repr(nn.GroupNorm(2, 4, affine=False)) == "GroupNorm(2, 4, eps=1e-05, affine=False, bias=False)"
    assert nn.GroupNorm(2, 4, bias=False).bias is None and list(nn.GroupNorm(2, 4, affine=False).parameters()) == []
    assert nn.GroupNorm(2, 4, device="meta").weight.device.type == "meta"
    with pytest.raises(ValueError, match=r"num_channels \(6\) must be divisible by num_groups \(4\)"):
        nn.GroupNorm(4, 6)
    with pytest.raises(RuntimeError, match="Expected number of channels in input to be divisible by num_groups"):
        F.group_norm(hp.zeros(2, 6, 3), 4)
    with pytest.raises(RuntimeError, match="Expected weight to be a vector of size equal to the number of channels"):
        F.group_norm(hp.zeros(2, 6, 3), 3, weight=hp.ones(5))
    with pytest.raises(RuntimeError, match="Expected at least 2 dimensions for input tensor but received 1"):
        F.group_norm(hp.zeros(6), 3)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
def test_normalize(rng, p, dim=1):
    x = rand(rng, 3, 4, 2, layout="s")
    norm = np.max(np.abs(x), axis=dim, keepdims=True) if p == float("inf") else \
        (np.abs(x) ** p).sum(axis=dim, keepdims=True) ** (1 / p)
    np.testing.assert_allclose(F.normalize(hp.tensor(x), p=p, dim=dim).numpy(), x / np.maximum(norm, 1e-12),
                               rtol=1e-12)
    gradcheck(lambda a: F.normalize(a, p=p, dim=dim), [x])
    gradcheck(lambda a: F.normalize(a, p=p, dim=-1), [x])


def test_normalize_zero_vector_and_errors():
    z = hp.zeros(2, 3, dtype=hp.float64, requires_grad=True)
    out = F.normalize(z)
    out.sum().backward()
    np.testing.assert_array_equal(out.detach().numpy(), 0)
    assert np.isfinite(z.grad.numpy()).all()
    np.testing.assert_allclose(F.normalize(hp.tensor([3.0, 4.0]), dim=0).numpy(), [0.6, 0.8])
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.normalize(hp.zeros(3))


def test_one_hot():
    out = F.one_hot(hp.tensor([0, 2, 1]))
    assert out.dtype == hp.int64 and out.numpy().tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    assert F.one_hot(hp.tensor([[0, 2]]), 5).shape == (1, 2, 5)
    assert F.one_hot(hp.tensor(np.zeros(0, np.int64)), 3).shape == (0, 3)
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes."):
        F.one_hot(hp.tensor([0, 2, 1]), 2)
    with pytest.raises(RuntimeError, match="Class values must be non-negative."):
        F.one_hot(hp.tensor([0, -2, 1]))
    with pytest.raises(RuntimeError, match="one_hot is only applicable to index tensor of type LongTensor."):
        F.one_hot(hp.tensor([0.0, 2.0]))
    with pytest.raises(RuntimeError, match="Can not infer total number of classes from empty tensor."):
        F.one_hot(hp.tensor(np.zeros(0, np.int64)))


# -- parameter containers --------------------------------------------------------------------------------
def test_parameter_list():
    pl = nn.ParameterList([nn.Parameter(hp.randn(3, 4)), hp.randn(5)])
    assert len(pl) == 2 and all(isinstance(p, nn.Parameter) for p in pl)  # a plain Tensor becomes a Parameter
    pl.append(hp.zeros(2))
    pl.extend([hp.ones(1)])
    assert [tuple(p.shape) for p in pl.parameters()] == [(3, 4), (5,), (2,), (1,)]
    assert list(pl.state_dict()) == ["0", "1", "2", "3"]
    assert pl[-1].shape == (1,) and len(pl[1:3]) == 2
    pl[0] = hp.ones(7)
    assert pl[0].shape == (7,) and isinstance(pl[0], nn.Parameter)
    assert repr(nn.ParameterList([hp.zeros(3, 4), hp.zeros(5, dtype=hp.float64)])) == (
        "ParameterList(\n    (0): Parameter containing: [hp.float32 of size 3x4]\n"
        "    (1): Parameter containing: [hp.float64 of size 5]\n)")
    # one entry: PyTorch's Module.__repr__ puts a single extra_repr line inline
    assert repr(nn.ParameterList([hp.zeros(3)])) == "ParameterList(  (0): Parameter containing: [hp.float32 of size 3])"
    assert repr(nn.ParameterList()) == "ParameterList()"

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.ParameterList([hp.zeros(2)])

    assert list(dict(M().named_parameters())) == ["p.0"]
    with pytest.raises(IndexError):
        pl[4]
    with pytest.raises(TypeError, match="should be called with an iterable"):
        pl.extend(3)
    with pytest.raises(RuntimeError, match="ParameterList should not be called"):
        pl(1)


def test_parameter_dict():
    pd = nn.ParameterDict({"b": hp.randn(3, 4), "a": nn.Parameter(hp.zeros(5, dtype=hp.float64))})
    assert list(pd.keys()) == ["a", "b"]  # a plain dict is inserted in sorted order, as PyTorch
    assert all(isinstance(v, nn.Parameter) for v in pd.values())
    assert list(pd.state_dict()) == ["a", "b"] and "a" in pd and len(pd) == 2
    pd["c"] = hp.ones(1)
    pd.update([("d", hp.ones(2))])
    assert list(pd) == ["a", "b", "c", "d"]
    assert pd.pop("c").shape == (1,) and "c" not in dict(pd.named_parameters())
    assert pd.popitem()[0] == "d" and pd.get("zz", 3) == 3 and pd.setdefault("e", hp.ones(3)).shape == (3,)
    assert repr(nn.ParameterDict({"a": hp.zeros(5, dtype=hp.float64), "b": hp.zeros(2, 3)})) == (
        "ParameterDict(\n    (a): Parameter containing: [hp.DoubleTensor of size 5]\n"
        "    (b): Parameter containing: [hp.FloatTensor of size 2x3]\n)")
    merged = nn.ParameterDict({"x": hp.ones(1)}) | nn.ParameterDict({"y": hp.ones(2)})
    assert list(merged) == ["x", "y"]
    with pytest.raises(TypeError, match="not a string"):
        pd[1] = hp.ones(1)
    with pytest.raises(RuntimeError, match="ParameterDict should not be called"):
        pd(1)
