"""Structured products of the linalg family: kron, cross / linalg.cross, vander / linalg.vander, against NumPy
float64, with finite-difference gradients and PyTorch's errors."""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp

from _gradcheck import gradcheck

RNG = np.random.default_rng(7)


def _t(a):
    return hp.tensor(np.asarray(a))


@pytest.mark.parametrize("sa,sb", [((2, 3), (4, 5)), ((2,), (3, 4)), ((2, 3, 2), (3,)), ((), (3,)), ((3,), (2,))])
def test_kron_matches_numpy(sa, sb):
    a, b = RNG.standard_normal(sa), RNG.standard_normal(sb)
    np.testing.assert_allclose(hp.kron(_t(a), _t(b)).numpy(), np.kron(a, b), rtol=1e-12)
    np.testing.assert_allclose(_t(a).kron(_t(b)).numpy(), np.kron(a, b), rtol=1e-12)
    gradcheck(lambda x, y: hp.kron(x, y), [np.array(a, dtype=np.float64), b.copy()])


def test_kron_dtypes():
    r = hp.kron(hp.tensor([[1, 2], [3, 4]]), hp.tensor([[0, 1], [1, 0]]))
    assert r.dtype == hp.int64
    np.testing.assert_array_equal(r.numpy(), np.kron([[1, 2], [3, 4]], [[0, 1], [1, 0]]))
    assert hp.kron(hp.ones(2, dtype=hp.int32), hp.ones(2)).dtype == hp.float32
    assert hp.kron(hp.ones(2, 3, 4), hp.ones(5)).shape == (2, 3, 20)
    with pytest.raises(TypeError):
        hp.kron(hp.ones(2), [1.0])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_linalg_cross_matches_numpy(dim):
    shape = [4, 2, 5]
    shape[dim] = 3
    a, b = RNG.standard_normal(shape), RNG.standard_normal(shape)
    ref = np.cross(a, b, axis=dim)
    np.testing.assert_allclose(hp.linalg.cross(_t(a), _t(b), dim=dim).numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(hp.cross(_t(a), _t(b), dim=dim).numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(_t(a).cross(_t(b), dim).numpy(), ref, rtol=1e-12)
    gradcheck(lambda x, y: hp.linalg.cross(x, y, dim=dim), [a.copy(), b.copy()])


def test_cross_default_dim_and_broadcasting():
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    with pytest.warns(UserWarning, match="without specifying the dim arg is deprecated"):
        out = hp.cross(_t(a), _t(b))  # the first dim of size 3
    np.testing.assert_allclose(out.numpy(), np.cross(a, b, axis=0), rtol=1e-12)
    a1, b3 = RNG.standard_normal((1, 3)), RNG.standard_normal((5, 3))
    np.testing.assert_allclose(hp.linalg.cross(_t(a1), _t(b3)).numpy(), np.cross(a1, b3), rtol=1e-12)
    assert hp.linalg.cross(hp.ones(1, 3), hp.ones(3, 3)).shape == (3, 3)
    np.testing.assert_array_equal(hp.linalg.cross(hp.tensor([1, 0, 0]), hp.tensor([0, 1, 0])).numpy(), [0, 0, 1])


def test_cross_errors():
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        hp.linalg.cross(hp.tensor([[1.0, 0, 0]]), hp.tensor([0.0, 1, 0]))
    with pytest.raises(RuntimeError, match="must have length 3. Got 4 and 4"):
        hp.linalg.cross(hp.ones(4, 3), hp.ones(4, 3), dim=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(RuntimeError, match="no dimension of size 3 in input"):
            hp.cross(hp.ones(4, 4), hp.ones(4, 4))
        with pytest.raises(RuntimeError, match="expected scalar type"):
            hp.cross(hp.ones(3, 3, dtype=hp.int64), hp.ones(3, 3))
    with pytest.raises(RuntimeError, match="broadcast"):
        hp.linalg.cross(hp.ones(2, 3), hp.ones(4, 3))


@pytest.mark.parametrize("n,increasing", [(None, False), (2, True), (5, False), (4, True)])
def test_vander_matches_numpy(n, increasing):
    x = RNG.standard_normal(4)
    x[1] = 0.0  # exact gradient at 0
    ref = np.vander(x, n, increasing=increasing)
    np.testing.assert_allclose(hp.vander(_t(x), n, increasing).numpy(), ref, rtol=1e-12)
    gradcheck(lambda t: hp.vander(t, N=n, increasing=increasing), [x.copy()])


def test_vander_dtypes_and_errors():
    r = hp.vander(hp.tensor([1, 2, 3]))
    assert r.dtype == hp.int64
    np.testing.assert_array_equal(r.numpy(), [[1, 1, 1], [4, 2, 1], [9, 3, 1]])
    assert hp.vander(hp.tensor([1, 2, 3], dtype=hp.int32)).dtype == hp.int64
    assert hp.vander(hp.tensor([True, False])).dtype == hp.int64
    assert hp.vander(hp.tensor([1.0, 2.0], dtype=hp.float16)).dtype == hp.float16
    assert hp.vander(hp.tensor([1.0, 2, 3]), N=0).shape == (3, 0)
    with pytest.raises(RuntimeError, match="x must be a one-dimensional tensor"):
        hp.vander(hp.tensor(2.0))
    with pytest.raises(RuntimeError, match="x must be a one-dimensional tensor"):
        hp.vander(hp.ones(2, 2))
    with pytest.raises(RuntimeError, match="N must be non-negative"):
        hp.vander(hp.ones(2), N=-1)
    assert not hasattr(hp.Tensor, "vander")  # a function only, as PyTorch


def test_linalg_vander():
    x = RNG.standard_normal((2, 3))
    ref = np.stack([np.vander(r, 4, increasing=True) for r in x])
    np.testing.assert_allclose(hp.linalg.vander(_t(x), N=4).numpy(), ref, rtol=1e-12)
    np.testing.assert_array_equal(hp.linalg.vander(hp.tensor([1, 2, 3])).numpy(), [[1, 1, 1], [1, 2, 4], [1, 3, 9]])
    gradcheck(lambda t: hp.linalg.vander(t), [x.copy()])
    with pytest.raises(RuntimeError, match="N must be greater than 1"):
        hp.linalg.vander(hp.ones(2), N=1)
    with pytest.raises(RuntimeError, match="but got Bool"):
        hp.linalg.vander(hp.tensor([True, False]))
