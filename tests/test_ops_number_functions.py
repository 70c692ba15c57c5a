"""gcd, lcm, ldexp, frexp, nextafter, rsub, i0, hardshrink, dist, vdot, diag_embed, diagflat, fill_diagonal_,
renorm, sum_to_size and the complex views of real tensors (real, imag, conj, angle, H, mH, adjoint), against NumPy
float64 with finite-difference gradients and PyTorch's errors."""
import math

import numpy as np
import pytest

import hpcfsdp as hp

from _gradcheck import gradcheck

RNG = np.random.default_rng(7)


def _t(a):
    return hp.tensor(np.asarray(a))


def test_gcd_lcm():
    a, b = np.array([4, -6, 0, 9, 7]), np.array([6, 4, 0, -3, 0])
    assert hp.gcd(_t(a), _t(b)).tolist() == np.gcd(a, b).tolist()
    assert hp.lcm(_t(a), _t(b)).tolist() == np.lcm(a, b).tolist()
    t = _t(a)
    t.gcd_(_t(b))
    assert t.tolist() == np.gcd(a, b).tolist()
    with pytest.raises(NotImplementedError, match="not implemented for 'Float'"):
        hp.gcd(hp.tensor([4.0]), hp.tensor([6.0]))


def test_ldexp_frexp_nextafter():
    assert hp.ldexp(hp.tensor([1, 2]), hp.tensor([2, 3])).tolist() == [4.0, 16.0]
    x, e = RNG.standard_normal(5), np.array([1, -2, 0, 3, 5])
    np.testing.assert_allclose(hp.ldexp(_t(x), _t(e)).numpy(), np.ldexp(x, e), rtol=1e-15)
    gradcheck(lambda t: hp.ldexp(t, _t(e)), [x.copy()])
    m, ex = hp.frexp(_t([8.0, 0.3, 0.0, -5.0]))
    rm, rex = np.frexp([8.0, 0.3, 0.0, -5.0])
    assert m.tolist() == rm.tolist() and ex.dtype == hp.int32 and ex.tolist() == rex.tolist()
    with pytest.raises(RuntimeError, match="floating-point"):
        hp.frexp(hp.tensor([8]))
    a, b = _t([1.0, 2.0]), _t([2.0, 0.0])
    assert hp.nextafter(a, b).tolist() == np.nextafter([1.0, 2.0], [2.0, 0.0]).tolist()
    assert (hp.nextafter(hp.tensor([1.0]), hp.tensor([2.0])) - 1).item() == np.finfo(np.float32).eps
    with pytest.raises(RuntimeError, match="expected scalar type"):
        hp.nextafter(hp.tensor([1.0]), a)


def test_rsub_i0_hardshrink():
    x, y = RNG.standard_normal(4), RNG.standard_normal(4)
    np.testing.assert_allclose(hp.rsub(_t(x), _t(y), alpha=2).numpy(), y - 2 * x)
    assert hp.rsub(hp.tensor([1, 2]), 5).tolist() == [4, 3]
    gradcheck(lambda a, b: hp.rsub(a, b, alpha=3), [x, y])
    z = np.array([0.0, 0.5, -2.0, 10.0, 100.0])
    np.testing.assert_allclose(hp.i0(_t(z)).numpy(), np.i0(z), rtol=1e-13)
    np.testing.assert_allclose(_t(z).i0().numpy(), np.i0(z), rtol=1e-13)
    assert hp.i0(hp.tensor([0, 1])).dtype == hp.float32
    gradcheck(lambda t: t.i0(), [np.array([0.3, -1.5, 4.0])])
    h = np.array([0.3, -1.0, 0.6, -0.2])
    ref = np.where(np.abs(h) > 0.5, h, 0)
    for out in (hp.hardshrink(_t(h)), _t(h).hardshrink(), hp.nn.functional.hardshrink(_t(h))):
        np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(_t(h).hardshrink(0.25).numpy(), np.where(np.abs(h) > 0.25, h, 0))


def test_dist_vdot():
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal(4)
    for p in (1, 2, 3, math.inf):
        ref = np.linalg.norm((a - b).ravel(), p)
        np.testing.assert_allclose(hp.dist(_t(a), _t(b), p).item(), ref, rtol=1e-12)
    gradcheck(lambda x, y: hp.dist(x, y), [a, b])
    v, w = RNG.standard_normal(5), RNG.standard_normal(5)
    np.testing.assert_allclose(hp.vdot(_t(v), _t(w)).item(), np.vdot(v, w), rtol=1e-12)
    gradcheck(lambda x, y: x.vdot(y), [v, w])
    with pytest.raises(RuntimeError, match="same dtype"):
        hp.vdot(hp.tensor([1, 2]), hp.tensor([1.0, 2.0]))


@pytest.mark.parametrize("offset,dim1,dim2", [(0, -2, -1), (1, -2, -1), (-2, -1, -2), (1, 0, 2)])
def test_diag_embed(offset, dim1, dim2):
    x = RNG.standard_normal((2, 3))
    n = 3 + abs(offset)
    ref = np.zeros((2, n, n))
    for i in range(3):
        r, c = (i, i + offset) if offset >= 0 else (i - offset, i)
        ref[:, r, c] = x[:, i]
    ref = np.moveaxis(ref, (-2, -1), (dim1 % 3, dim2 % 3))
    np.testing.assert_array_equal(hp.diag_embed(_t(x), offset, dim1, dim2).numpy(), ref)
    gradcheck(lambda t: t.diag_embed(offset, dim1, dim2), [x])


def test_diagflat_fill_diagonal_renorm():
    assert hp.diagflat(hp.tensor([[1, 2], [3, 4]]), 1).tolist() == np.diagflat([[1, 2], [3, 4]], 1).tolist()
    t = hp.zeros(7, 3)
    t.fill_diagonal_(1, wrap=True)
    ref = np.zeros((7, 3))
    np.fill_diagonal(ref, 1, wrap=True)
    assert t.tolist() == ref.tolist()
    t = hp.zeros(7, 3).fill_diagonal_(2.0)
    assert t.sum().item() == 6.0 and t[2, 2].item() == 2.0
    assert hp.zeros(3, 3, 3).fill_diagonal_(1).sum().item() == 3.0
    with pytest.raises(RuntimeError, match="equal length"):
        hp.zeros(2, 3, 4).fill_diagonal_(1)
    x = RNG.standard_normal((3, 4)) * 3
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    ref = np.where(norms > 2, x * 2 / (norms + 1e-7), x)
    np.testing.assert_allclose(hp.renorm(_t(x), 2, 0, 2).numpy(), ref, rtol=1e-12)
    y = _t(x)
    y.renorm_(2, 0, 2)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-12)
    gradcheck(lambda t: t.renorm(2, 0, 2), [x])


def test_sum_to_size():
    x = RNG.standard_normal((2, 3, 4))
    np.testing.assert_allclose(_t(x).sum_to_size(3, 1).numpy(), x.sum(0).sum(1, keepdims=True))
    np.testing.assert_allclose(_t(x).sum_to_size((1, 3, 4)).numpy(), x.sum(0, keepdims=True))
    assert _t(x).sum_to_size(2, 3, 4).shape == (2, 3, 4)
    gradcheck(lambda t: t.sum_to_size(1, 4), [x])
    with pytest.raises(RuntimeError, match="not expandable"):
        _t(x).sum_to_size(2, 4)


def test_complex_views_of_real_tensors():
    x = hp.tensor([1.0, -2.0, 0.0, float("nan")])
    assert x.real is x and hp.real(x) is x and x.conj() is x and hp.conj(x) is x
    with pytest.raises(RuntimeError, match="non-complex"):
        x.imag
    with pytest.raises(RuntimeError, match="non-complex"):
        hp.imag(x)
    np.testing.assert_array_equal(hp.angle(x).numpy(), np.float32([0, np.pi, 0, np.nan]))
    assert hp.angle(hp.tensor([1, -2])).dtype == hp.float32
    m = hp.ones(2, 3)
    assert m.H.shape == (3, 2) and hp.ones(2, 3, 4).mH.shape == (2, 4, 3) and hp.adjoint(m).shape == (3, 2)
    assert m.adjoint().shape == (3, 2)
    with pytest.raises(RuntimeError, match="mH"):
        hp.ones(2, 3, 4).H
