"""Losses (nn.functional and nn.modules.loss: NLL, binary cross entropy, L1, smooth L1, Huber, KL divergence) against
NumPy float64 formulas: values against the formula written here, finite-difference gradients of the input (and of
the target where PyTorch differentiates it), the deprecated size_average/reduce, PyTorch's errors and the reprs.
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
