"""The special functions erfc, erfinv, lgamma, digamma, polygamma and mvlgamma: known values to the accuracy
documented in [Note: Special functions] (hpcfsdp/_special_math.py), identities, gradients, dtypes and errors."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from tests._gradcheck import _np, gradcheck

EULER_GAMMA = 0.57721566490153286061
F64 = dict(dtype=hp.float64)


def test_lgamma_of_integers_and_half_integers():
    n = np.arange(1.0, 60.0)
    ref = [math.log(math.factorial(int(k) - 1)) for k in n]  # log((n-1)!)
    np.testing.assert_allclose(_np(hp.lgamma(hp.tensor(n, **F64))), ref, rtol=1e-15, atol=1e-14)
    half = np.array([0.5, -0.5, -1.5, 2.5, -20.5])
    np.testing.assert_allclose(_np(hp.tensor(half, **F64).lgamma()), [math.lgamma(v) for v in half], rtol=1e-14)
    poles = hp.tensor([0.0, -1.0, -7.0, float("inf"), float("-inf")], **F64).lgamma()
    assert (_np(poles) == math.inf).all()
    assert math.isnan(hp.tensor([float("nan")]).lgamma().item())


def test_lgamma_against_math_on_a_grid():
    x = np.concatenate([np.linspace(-30.25, 40.0, 2001), np.logspace(-300, 300, 61)])
    x = x[~((x <= 0) & (x == np.floor(x)))]
    ref = np.array([math.lgamma(v) for v in x])
    got = _np(hp.tensor(x, **F64).lgamma())
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=5e-14)


def test_digamma_and_polygamma_known_values():
    x = hp.tensor([1.0, 0.5, 2.0, 10.0, -0.5], **F64)
    ref = [-EULER_GAMMA, -EULER_GAMMA - 2 * math.log(2), 1 - EULER_GAMMA,
           sum(1 / k for k in range(1, 10)) - EULER_GAMMA, 2 - EULER_GAMMA - 2 * math.log(2)]
    np.testing.assert_allclose(_np(x.digamma()), ref, rtol=1e-14, atol=2e-15)
    zeta3 = 1.2020569031595942854
    np.testing.assert_allclose(_np(hp.polygamma(1, hp.tensor([1.0, 0.5, -0.5], **F64))),
                               [math.pi ** 2 / 6, math.pi ** 2 / 2, math.pi ** 2 / 2 + 4], rtol=1e-14)
    np.testing.assert_allclose(hp.tensor([1.0], **F64).polygamma(2).item(), -2 * zeta3, rtol=1e-14)
    np.testing.assert_allclose(hp.polygamma(3, hp.tensor([1.0], **F64)).item(), math.pi ** 4 / 15, rtol=1e-14)
    # the recurrence: psi(x + 1) = psi(x) + 1 / x, also where the reflection is used
    y = np.array([-7.3, -2.5, 0.1, 0.4, 3.3, 12.0])
    np.testing.assert_allclose(_np(hp.tensor(y + 1).digamma()) - _np(hp.tensor(y).digamma()), 1 / y, rtol=1e-12)
    t = hp.tensor(y).polygamma(1)
    np.testing.assert_allclose(_np(t) - _np(hp.tensor(y + 1).polygamma(1)), 1 / y ** 2, rtol=1e-11)
    d = _np(hp.tensor([0.0, -0.0, -1.0, -3.0, float("inf")], **F64).digamma())  # PyTorch's pole values
    assert d[0] == -math.inf and d[1] == math.inf and np.isnan(d[2:4]).all() and d[4] == math.inf


def test_erfc_without_cancellation():
    x = np.array([-3.0, -0.5, 0.0, 0.3, 1.0, 1.3, 3.0, 10.0, 26.0, 27.5])
    ref = [math.erfc(v) for v in x]  # math.erfc keeps full relative precision in the tail
    np.testing.assert_allclose(_np(hp.erfc(hp.tensor(x, **F64))), ref, rtol=6e-15, atol=0)
    assert hp.tensor([30.0, -30.0], **F64).erfc().tolist() == [0.0, 2.0]
    grid = np.linspace(-6.0, 26.0, 1601)
    np.testing.assert_allclose(_np(hp.tensor(grid, **F64).erfc()), [math.erfc(v) for v in grid], rtol=1e-14, atol=0)


def test_erfinv_inverts_erf():
    x = np.concatenate([np.linspace(-5.8, 5.8, 581), [1e-300, -1e-20]])
    y = np.array([math.erf(v) for v in x])
    keep = np.abs(y) < 1
    got = _np(hp.tensor(y[keep], **F64).erfinv())
    np.testing.assert_allclose([math.erf(v) for v in got], y[keep], rtol=1e-15, atol=1e-300)  # 4 ulp
    inner = np.abs(x[keep]) < 1  # where erfinv is well conditioned (beyond, y rounded to float64 moves x)
    np.testing.assert_allclose(got[inner], x[keep][inner], rtol=2e-15)
    tail = 1 - np.logspace(-1, -16, 16)  # 1 - y exact: erfc(erfinv(y)) = 1 - y
    np.testing.assert_allclose([math.erfc(v) for v in _np(hp.tensor(tail, **F64).erfinv())], 1 - tail, rtol=1e-13)
    edge = _np(hp.tensor([1.0, -1.0, 1.5, -2.0, 0.0], **F64).erfinv())
    assert edge[0] == math.inf and edge[1] == -math.inf and np.isnan(edge[2:4]).all() and edge[4] == 0.0


@pytest.mark.parametrize("name", ["erfc", "erfinv", "lgamma", "digamma", "polygamma1", "polygamma2", "mvlgamma"])
def test_special_gradients(rng, name):
    a = rng.uniform(0.2, 0.9, (3, 4)) * np.sign(rng.standard_normal((3, 4)))
    fn = {"erfc": lambda x: x.erfc(), "erfinv": lambda x: x.erfinv(), "lgamma": lambda x: (x * 3).lgamma(),
          "digamma": lambda x: hp.digamma(x * 3), "polygamma1": lambda x: hp.polygamma(1, x * 3),
          "polygamma2": lambda x: (x * 3).polygamma(2), "mvlgamma": lambda x: hp.mvlgamma(x + 3, 3)}[name]
    gradcheck(fn, [a], rtol=1e-6, atol=1e-6)


def test_dtypes_in_place_and_errors():
    i = hp.tensor([1, 2, 3])
    for f in (hp.erfc, hp.erfinv, hp.lgamma, hp.digamma, lambda t: hp.polygamma(1, t), lambda t: hp.mvlgamma(t, 2)):
        assert f(i).dtype == hp.float32  # integers compute in the default float dtype
    h = hp.tensor([0.5, 2.5], dtype=hp.bfloat16).lgamma()
    assert h.dtype == hp.bfloat16
    np.testing.assert_allclose(h.float().numpy(), [math.lgamma(0.5), math.lgamma(2.5)], rtol=1e-2)
    t = hp.tensor([1.0, 3.0])
    assert t.lgamma_() is t and np.allclose(t.numpy(), [0.0, math.log(2)])
    t = hp.tensor([0.25])
    assert t.erfinv_() is t and t.erfc_() is t and t.digamma_() is t and t.polygamma_(1) is t
    with pytest.raises(RuntimeError, match="can't be cast"):
        hp.tensor([1, 2]).lgamma_()
    with pytest.raises(RuntimeError, match="does not support negative n"):
        hp.polygamma(-1, hp.tensor([1.0]))
    with pytest.raises(RuntimeError, match="p has to be greater than or equal to 1"):
        hp.tensor([2.0]).mvlgamma(0)
    np.testing.assert_allclose(hp.tensor([[2.5, 3.0]], **F64).mvlgamma(p=2).numpy(),
                               [[math.lgamma(2.5) + math.lgamma(2.0) + 0.5 * math.log(math.pi),
                                 math.lgamma(3.0) + math.lgamma(2.5) + 0.5 * math.log(math.pi)]], rtol=1e-14)
