"""The margin, embedding, multi-class and likelihood losses of nn.functional and nn (margin_ranking, hinge_embedding,
cosine_embedding, triplet_margin (with distance), soft_margin, multi_margin, multilabel_margin,
multilabel_soft_margin, poisson_nll, gaussian_nll) against NumPy float64 loops of PyTorch's formulas, with
finite-difference gradients and PyTorch's errors."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck

REDUCTIONS = ["mean", "sum", "none"]


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _reduce(loss, reduction):
    return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]


def _close(got, want):
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_margin_ranking_and_hinge_embedding(rng, reduction):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    y = np.sign(rng.standard_normal((3, 4)))
    ref = _reduce(np.maximum(0, -y * (a - b) + 0.3), reduction)
    _close(F.margin_ranking_loss(hp.tensor(a), hp.tensor(b), hp.tensor(y), 0.3, reduction=reduction), ref)
    _close(nn.MarginRankingLoss(0.3, reduction=reduction)(hp.tensor(a), hp.tensor(b), hp.tensor(y)), ref)
    gradcheck(lambda p, q: F.margin_ranking_loss(p, q, hp.tensor(y), 0.3, reduction=reduction), [a, b])
    y[0, 0] = 0.0  # neither 1 nor -1: both terms, as ATen's
    hinge = np.where(y != 1, np.maximum(0, 0.5 - a), 0) + np.where(y != -1, a, 0)
    _close(F.hinge_embedding_loss(hp.tensor(a), hp.tensor(y), 0.5, reduction=reduction), _reduce(hinge, reduction))
    _close(nn.HingeEmbeddingLoss(0.5, reduction=reduction)(hp.tensor(a), hp.tensor(y)), _reduce(hinge, reduction))
    gradcheck(lambda p: F.hinge_embedding_loss(p, hp.tensor(y), 0.5, reduction=reduction), [a])


def test_margin_ranking_dims_differ():
    with pytest.raises(RuntimeError, match="All input tensors should have same dimension"):
        F.margin_ranking_loss(hp.ones(3, 4), hp.ones(4), hp.ones(3, 4))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cosine_embedding_loss(rng, reduction):
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    y = np.array([1.0, -1, 1, -1, -1])
    ref = []
    for i in range(5):
        cos = a[i] @ b[i] / math.sqrt((a[i] @ a[i] + 1e-12) * (b[i] @ b[i] + 1e-12))
        ref.append(1 - cos if y[i] == 1 else max(0.0, cos - 0.2))
    ref = _reduce(np.array(ref), reduction)
    _close(F.cosine_embedding_loss(hp.tensor(a), hp.tensor(b), hp.tensor(y), 0.2, reduction=reduction), ref)
    _close(nn.CosineEmbeddingLoss(0.2, reduction=reduction)(hp.tensor(a), hp.tensor(b), hp.tensor(y)), ref)
    gradcheck(lambda p, q: F.cosine_embedding_loss(p, q, hp.tensor(y), 0.2, reduction=reduction), [a, b])
    one = F.cosine_embedding_loss(hp.tensor(a[0]), hp.tensor(b[0]), hp.tensor(1.0), reduction="none")
    assert one.shape == ()
    with pytest.raises(RuntimeError, match="1D target tensor expects 2D input tensors"):
        F.cosine_embedding_loss(hp.tensor(a[0]), hp.tensor(b[0]), hp.tensor(y))


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_triplet_margin_loss(rng, swap, reduction):
    a, p, n = (rng.standard_normal((4, 3)) for _ in range(3))

    def dist(x, y, q=2.0):
        return (np.abs(x - y + 1e-6) ** q).sum(1) ** (1 / q)

    dn = np.minimum(dist(a, n), dist(p, n)) if swap else dist(a, n)
    ref = _reduce(np.maximum(0, 1.0 + dist(a, p) - dn), reduction)
    _close(F.triplet_margin_loss(hp.tensor(a), hp.tensor(p), hp.tensor(n), swap=swap, reduction=reduction), ref)
    _close(nn.TripletMarginLoss(swap=swap, reduction=reduction)(hp.tensor(a), hp.tensor(p), hp.tensor(n)), ref)
    _close(nn.TripletMarginWithDistanceLoss(swap=swap, reduction=reduction)(hp.tensor(a), hp.tensor(p),
                                                                             hp.tensor(n)), ref)
    gradcheck(lambda x, y, z: F.triplet_margin_loss(x, y, z, p=3, swap=swap, reduction=reduction), [a, p, n])
    l1 = F.triplet_margin_with_distance_loss(hp.tensor(a), hp.tensor(p), hp.tensor(n),
                                             distance_function=lambda x, y: (x - y).abs().sum(1), margin=0.5)
    assert l1.item() == pytest.approx(np.maximum(0, 0.5 + np.abs(a - p).sum(1) - np.abs(a - n).sum(1)).mean())


def test_triplet_margin_errors():
    x = hp.ones(2, 3)
    with pytest.raises(ValueError, match="margin must be greater than 0, got 0"):
        F.triplet_margin_loss(x, x, x, margin=0)
    with pytest.raises(ValueError, match="TripletMarginLoss: expected margin to be greater than 0"):
        nn.TripletMarginLoss(margin=-1)
    with pytest.raises(RuntimeError, match="anchor 2D, positive 2D, and negative 1D"):
        F.triplet_margin_loss(x, x, hp.ones(3))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_soft_margin_and_multilabel_soft_margin(rng, reduction):
    x = rng.standard_normal((3, 4))
    y = np.sign(rng.standard_normal((3, 4)))
    _close(F.soft_margin_loss(hp.tensor(x), hp.tensor(y), reduction=reduction),
           _reduce(np.log1p(np.exp(-y * x)), reduction))
    gradcheck(lambda p: nn.SoftMarginLoss(reduction=reduction)(p, hp.tensor(y)), [x])
    t = (y > 0).astype(np.float64)
    w = rng.uniform(0.5, 2, 4)
    logsig = -np.log1p(np.exp(-x))
    per = -(t * logsig + (1 - t) * (logsig - x)) * w
    ref = _reduce(per.mean(1), reduction)
    _close(F.multilabel_soft_margin_loss(hp.tensor(x), hp.tensor(t), hp.tensor(w), reduction=reduction), ref)
    _close(nn.MultiLabelSoftMarginLoss(hp.tensor(w), reduction=reduction)(hp.tensor(x), hp.tensor(t)), ref)
    gradcheck(lambda p: F.multilabel_soft_margin_loss(p, hp.tensor(t), reduction=reduction), [x])


def multi_margin_ref(x, y, p, margin, w):
    n, c = x.shape
    out = np.zeros(n)
    for i in range(n):
        for j in range(c):
            if j != y[i]:
                z = max(0.0, margin - x[i, y[i]] + x[i, j]) ** p
                out[i] += z * (w[y[i]] if w is not None else 1.0)
    return out / c


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multi_margin_loss(rng, p, reduction):
    x = rng.standard_normal((4, 5))
    y = np.array([0, 4, 2, 2])
    w = rng.uniform(0.5, 2, 5)
    for weight in (None, w):
        ref = _reduce(multi_margin_ref(x, y, p, 0.8, weight), reduction)
        wt = None if weight is None else hp.tensor(weight)
        _close(F.multi_margin_loss(hp.tensor(x), hp.tensor(y), p, 0.8, wt, reduction=reduction), ref)
        _close(nn.MultiMarginLoss(p, 0.8, wt, reduction=reduction)(hp.tensor(x), hp.tensor(y)), ref)
        gradcheck(lambda a: F.multi_margin_loss(a, hp.tensor(y), p, 0.8, wt, reduction=reduction), [x])
    one = F.multi_margin_loss(hp.tensor(x[1]), hp.tensor(4), reduction="none")
    assert one.shape == () and one.item() == pytest.approx(multi_margin_ref(x[1:2], [4], 1, 1.0, None)[0])


def test_multi_margin_errors():
    x = hp.ones(3, 4)
    with pytest.raises(ValueError, match="only p == 1 and p == 2 supported"):
        F.multi_margin_loss(x, hp.tensor([0, 1, 2]), p=3)
    with pytest.raises(ValueError, match="only p == 1 and p == 2 supported"):
        nn.MultiMarginLoss(p=3)
    with pytest.raises(RuntimeError, match="target out of range"):
        F.multi_margin_loss(x, hp.tensor([0, 1, 4]))
    with pytest.raises(RuntimeError, match=r"Expected target size \[3\], but got \[2\]"):
        F.multi_margin_loss(x, hp.tensor([0, 1]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss(rng, reduction):
    x = rng.standard_normal((3, 4))
    y = np.array([[3, 0, -1, 1], [1, 2, 3, 0], [-1, 0, 0, 0]])
    ref = np.zeros(3)
    for i in range(3):
        tgts = []
        for k in y[i]:
            if k < 0:
                break
            tgts.append(k)
        for j in tgts:
            for k in range(4):
                if k not in tgts:
                    ref[i] += max(0.0, 1 - (x[i, j] - x[i, k]))
    ref = _reduce(ref / 4, reduction)
    _close(F.multilabel_margin_loss(hp.tensor(x), hp.tensor(y), reduction=reduction), ref)
    _close(nn.MultiLabelMarginLoss(reduction=reduction)(hp.tensor(x), hp.tensor(y)), ref)
    gradcheck(lambda a: F.multilabel_margin_loss(a, hp.tensor(y), reduction=reduction), [x])
    with pytest.raises(RuntimeError, match="argument #2 'target' is out of range"):
        F.multilabel_margin_loss(hp.tensor(x), hp.tensor([[0, 1, 5, -1]] * 3))
    with pytest.raises(RuntimeError, match="inconsistent target size"):
        F.multilabel_margin_loss(hp.tensor(x), hp.tensor([[0, 1, -1]] * 3))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_poisson_nll_loss(rng, reduction):
    x = rng.standard_normal((3, 4))
    t = np.abs(rng.standard_normal((3, 4))) * 3
    ref = np.exp(x) - t * x
    _close(F.poisson_nll_loss(hp.tensor(x), hp.tensor(t), reduction=reduction), _reduce(ref, reduction))
    stirling = np.where(t > 1, t * np.log(np.where(t > 1, t, 1)) - t + 0.5 * np.log(2 * np.pi * np.where(t > 1, t, 1)),
                        0)
    _close(nn.PoissonNLLLoss(full=True, reduction=reduction)(hp.tensor(x), hp.tensor(t)),
           _reduce(ref + stirling, reduction))
    xp_ = np.abs(x) + 0.1
    _close(F.poisson_nll_loss(hp.tensor(xp_), hp.tensor(t), log_input=False, eps=1e-3, reduction=reduction),
           _reduce(xp_ - t * np.log(xp_ + 1e-3), reduction))
    gradcheck(lambda a: F.poisson_nll_loss(a, hp.tensor(t), full=True, reduction=reduction), [x])
    with pytest.raises(ValueError, match="foo is not a valid value for reduction"):
        F.poisson_nll_loss(hp.tensor(x), hp.tensor(t), reduction="foo")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gaussian_nll_loss(rng, reduction):
    x, t = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    v = np.abs(rng.standard_normal((3, 4))) + 0.1
    v[0, 0] = 1e-9  # clamped at eps
    vc = np.maximum(v, 1e-6)
    ref = 0.5 * (np.log(vc) + (x - t) ** 2 / vc)
    _close(F.gaussian_nll_loss(hp.tensor(x), hp.tensor(t), hp.tensor(v), reduction=reduction), _reduce(ref, reduction))
    _close(nn.GaussianNLLLoss(full=True, reduction=reduction)(hp.tensor(x), hp.tensor(t), hp.tensor(v)),
           _reduce(ref + 0.5 * math.log(2 * math.pi), reduction))
    v1 = v[:, 0] + 0.5  # one variance per row: the input's shape without its last dim
    ref1 = 0.5 * (np.log(v1[:, None]) + (x - t) ** 2 / v1[:, None])
    _close(F.gaussian_nll_loss(hp.tensor(x), hp.tensor(t), hp.tensor(v1), reduction=reduction),
           _reduce(ref1, reduction))
    _close(F.gaussian_nll_loss(hp.tensor(x), hp.tensor(t), 2.0, reduction=reduction),
           _reduce(0.5 * (math.log(2.0) + (x - t) ** 2 / 2.0), reduction))
    gradcheck(lambda a, b: F.gaussian_nll_loss(a, hp.tensor(t), b, reduction=reduction), [x, v + 0.5])
    with pytest.raises(ValueError, match="var is of incorrect size"):
        F.gaussian_nll_loss(hp.tensor(x), hp.tensor(t), hp.ones(3, 2))
    with pytest.raises(ValueError, match="var has negative entry/entries"):
        F.gaussian_nll_loss(hp.tensor(x), hp.tensor(t), -1.0)


def test_loss_modules_deprecated_flags_and_buffers():
    with pytest.warns(UserWarning, match="reduction='sum'"):
        m = nn.MarginRankingLoss(size_average=False)
    assert m.reduction == "sum"
    with pytest.warns(UserWarning):
        assert nn.MSELoss(size_average=False).reduction == "sum"
    with pytest.warns(UserWarning):
        assert nn.CrossEntropyLoss(reduce=False).reduction == "none"
    assert list(nn.MultiMarginLoss(weight=hp.ones(3)).state_dict()) == ["weight"]
    assert repr(nn.TripletMarginWithDistanceLoss().distance_function) == "PairwiseDistance()"
