"""Random ops: multinomial, normal's overloads, bernoulli (frequencies and errors)."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _np


# -- multinomial -----------------------------------------------------------------------------------------
def test_multinomial_with_replacement_frequencies():
    hp.manual_seed(0)
    w = hp.tensor([[1.0, 0.0, 3.0, 6.0], [0.0, 0.0, 0.0, 2.0]])
    s = hp.multinomial(w, 20000, replacement=True)
    assert s.dtype == hp.int64 and s.shape == (2, 20000)
    freq = np.bincount(s[0].numpy(), minlength=4) / 20000
    np.testing.assert_allclose(freq, [0.1, 0.0, 0.3, 0.6], atol=0.015)
    assert (s[1].numpy() == 3).all()
    one = hp.multinomial(hp.tensor([0.5, 0.5]), 7, True)
    assert one.shape == (7,) and set(one.tolist()) <= {0, 1}


def test_multinomial_without_replacement():
    hp.manual_seed(1)
    w = hp.tensor([0.05, 0.0, 0.15, 0.8])
    draws = np.stack([hp.multinomial(w, 3).numpy() for _ in range(3000)])
    assert all(len(set(r)) == 3 and 1 not in r for r in draws.tolist())  # distinct, zero weight never drawn
    np.testing.assert_allclose(np.bincount(draws[:, 0], minlength=4) / 3000, [0.05, 0.0, 0.15, 0.8], atol=0.03)
    assert sorted(hp.multinomial(w, 4).tolist()) == [0, 1, 2, 3]  # a zero weight is drawn only when it must be
    rows = hp.multinomial(hp.rand(5, 6) + 0.1, 6)
    assert rows.shape == (5, 6) and all(sorted(r) == list(range(6)) for r in rows.tolist())
    hp.manual_seed(3)
    a = hp.multinomial(hp.rand(4, 10), 2)
    hp.manual_seed(3)
    assert hp.multinomial(hp.rand(4, 10), 2).tolist() == a.tolist()  # hp.manual_seed makes it reproducible
    g = hp.Generator().manual_seed(5)
    first = hp.multinomial(w, 2, generator=g).tolist()
    assert hp.multinomial(w, 2, generator=g.manual_seed(5)).tolist() == first  # an hp.Generator of its own


def test_multinomial_errors():
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.multinomial(hp.tensor([1, 2]), 1)
    with pytest.raises(RuntimeError, match="element < 0"):
        hp.multinomial(hp.tensor([1.0, -2.0]), 1)
    with pytest.raises(RuntimeError, match="element < 0"):
        hp.multinomial(hp.tensor([1.0, math.nan]), 1)
    with pytest.raises(RuntimeError, match="element < 0"):
        hp.multinomial(hp.tensor([1.0, math.inf]), 1)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        hp.multinomial(hp.tensor([[1.0, 1.0], [0.0, 0.0]]), 1)
    with pytest.raises(RuntimeError, match="1 or 2 dim"):
        hp.multinomial(hp.ones(2, 2, 2), 1)
    with pytest.raises(RuntimeError, match="without replacement"):
        hp.multinomial(hp.ones(2), 3)
    with pytest.raises(RuntimeError, match="n_sample <= 0"):
        hp.multinomial(hp.ones(2), 0)


# -- sampling ----------------------------------------------------------------------------------------------------
def test_normal_overloads():
    hp.manual_seed(0)
    s = hp.normal(2.0, 3.0, size=(20000,))
    assert s.dtype == hp.float32 and abs(s.mean().item() - 2.0) < 0.1 and abs(s.std().item() - 3.0) < 0.1
    assert hp.normal(0.0, 1.0, (2, 3), dtype=hp.float64).dtype == hp.float64
    mean = hp.tensor([0.0, 100.0], dtype=hp.float64, requires_grad=True)
    std = hp.tensor([1.0, 0.0], dtype=hp.float64, requires_grad=True)
    r = hp.normal(mean, std)
    assert r.dtype == hp.float64 and r[1].item() == 100.0
    r.sum().backward()  # PyTorch's gradients for mean and std are zero
    assert mean.grad.tolist() == [0.0, 0.0] and std.grad.tolist() == [0.0, 0.0]
    assert hp.normal(hp.zeros(3, 1), 2.0).shape == (3, 1) and hp.normal(1.0, hp.ones(2, 2)).shape == (2, 2)
    g1, g2 = hp.Generator().manual_seed(5), hp.Generator().manual_seed(5)
    assert hp.normal(hp.zeros(4), 1.0, generator=g1).tolist() == hp.normal(hp.zeros(4), 1.0, generator=g2).tolist()
    with pytest.raises(TypeError, match="size"):
        hp.normal(0.0, 1.0)
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        hp.normal(hp.zeros(2), hp.tensor([1.0, -1.0]))


def test_bernoulli():
    hp.manual_seed(0)
    p = hp.tensor([0.0, 1.0, 0.3]).repeat(4000, 1)
    s = hp.bernoulli(p)
    assert s.dtype == hp.float32 and set(np.unique(_np(s))) <= {0.0, 1.0}
    m = s.mean(0).tolist()
    assert m[0] == 0.0 and m[1] == 1.0 and abs(m[2] - 0.3) < 0.03
    assert abs(hp.ones(10000, dtype=hp.float64).bernoulli(0.25).mean().item() - 0.25) < 0.02
    with pytest.raises(RuntimeError, match="p_in >= 0"):
        hp.bernoulli(hp.tensor([1.5]))


N_FILL = 200_000


def _moments(t):
    a = t.double().numpy()
    return a.mean(), a.var()


def test_in_place_distribution_fills_have_their_moments():
    hp.manual_seed(0)
    m, v = _moments(hp.empty(N_FILL).exponential_(2.0))  # mean 1/lambda, variance 1/lambda^2
    assert abs(m - 0.5) < 0.01 and abs(v - 0.25) < 0.01
    g = hp.empty(N_FILL).geometric_(0.25)  # trials to the first success: mean 1/p, variance (1-p)/p^2
    m, v = _moments(g)
    assert abs(m - 4) < 0.05 and abs(v - 12) < 0.5 and g.min().item() == 1 and (g == g.floor()).all().item()
    m, v = _moments(hp.empty(N_FILL, dtype=hp.float64).log_normal_(0.0, 0.5))  # exp(N(0, 1/4))
    assert abs(m - np.exp(0.125)) < 0.01 and abs(v - (np.exp(0.25) - 1) * np.exp(0.25)) < 0.02
    c = hp.empty(N_FILL).cauchy_(1.0, 2.0).numpy()  # median 1, quartiles at median -+ sigma
    assert abs(np.median(c) - 1) < 0.03 and abs((np.quantile(c, 0.75) - np.quantile(c, 0.25)) / 2 - 2) < 0.05
    b = hp.empty(N_FILL).bernoulli_(0.3)
    assert abs(b.mean().item() - 0.3) < 0.01 and set(np.unique(b.numpy())) == {0.0, 1.0}
    assert hp.zeros(3, dtype=hp.int64).bernoulli_(hp.tensor([0.0, 1.0, 1.0])).tolist() == [0, 1, 1]


def test_random_fill_ranges():
    hp.manual_seed(1)
    r = hp.empty(N_FILL).random_(3, 7)
    assert set(np.unique(r.numpy())) == {3.0, 4.0, 5.0, 6.0}
    assert set(np.unique(hp.empty(1000, dtype=hp.int32).random_(5).numpy())) == {0, 1, 2, 3, 4}  # random_(to)
    u8 = hp.empty(N_FILL, dtype=hp.uint8).random_()
    assert u8.min().item() == 0 and u8.max().item() == 255  # [0, max] for integers
    f = hp.empty(N_FILL).random_()  # [0, 2^24] for float32: every value exactly representable
    assert f.max().item() <= 2 ** 24 and f.max().item() > 2 ** 23 and (f == f.floor()).all().item()
    assert set(hp.empty(100, dtype=hp.bool).random_().tolist()) == {False, True}
    g = hp.Generator().manual_seed(3)
    a = hp.empty(8).cauchy_(generator=g)
    g.manual_seed(3)
    assert hp.equal(a, hp.empty(8).cauchy_(generator=g))


@pytest.mark.parametrize("call, err, match", [
    (lambda: hp.zeros(3, dtype=hp.int64).exponential_(), RuntimeError, "continuous probability distribution"),
    (lambda: hp.zeros(3).exponential_(0), RuntimeError, "lambda > 0.0"),
    (lambda: hp.zeros(3).geometric_(1), RuntimeError, r"p to be in \(0, 1\)"),
    (lambda: hp.zeros(3).log_normal_(std=0), RuntimeError, "std > 0.0"),
    (lambda: hp.zeros(3, dtype=hp.int64).log_normal_(), NotImplementedError, "log_normal_"),
    (lambda: hp.zeros(3).cauchy_(sigma=0), RuntimeError, "sigma > 0.0"),
    (lambda: hp.zeros(3).random_(5, 3), RuntimeError, "'from' to be less than 'to'"),
    (lambda: hp.zeros(3, dtype=hp.uint8).random_(0, 300), RuntimeError, "to - 1 is out of bounds"),
    (lambda: hp.zeros(3).bernoulli_(1.5), RuntimeError, r"p to be in \[0, 1\]"),
    (lambda: hp.zeros(3).bernoulli_(hp.tensor([0.0, 1.0])), RuntimeError, "does not broadcast"),
    (lambda: hp.zeros(3, requires_grad=True).exponential_(), RuntimeError, "leaf Variable"),
])
def test_in_place_fill_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()
