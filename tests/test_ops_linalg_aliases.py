"""The torch-level linear algebra (hp.det, logdet, slogdet, inverse, pinverse, matrix_power, matrix_exp, the older
svd/qr/cholesky, chain_matmul) with their Tensor methods, and linalg.slogdet/matrix_power/matrix_exp/inv_ex/
cholesky_ex: against NumPy float64, with finite-difference gradients."""
import math
import warnings

import numpy as np
import pytest

import hpcfsdp as hp

from _gradcheck import gradcheck

RNG = np.random.default_rng(11)


def _t(a):
    return hp.tensor(np.asarray(a))


def _spd(n, batch=()):
    a = RNG.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def test_det_logdet_slogdet_inverse():
    a = RNG.standard_normal((2, 3, 3))
    np.testing.assert_allclose(hp.det(_t(a)).numpy(), np.linalg.det(a), rtol=1e-12)
    np.testing.assert_allclose(_t(a).det().numpy(), np.linalg.det(a), rtol=1e-12)
    sign, logabs = np.linalg.slogdet(a)
    for out in (hp.slogdet(_t(a)), _t(a).slogdet(), hp.linalg.slogdet(_t(a))):
        np.testing.assert_allclose(out.sign.numpy(), sign)
        np.testing.assert_allclose(out.logabsdet.numpy(), logabs, rtol=1e-12)
    ref = np.where(sign > 0, logabs, np.nan)
    np.testing.assert_allclose(hp.logdet(_t(a)).numpy(), ref, rtol=1e-12)
    assert math.isnan(hp.logdet(_t([[-1.0, 0.0], [0.0, 1.0]])).item())
    assert hp.logdet(hp.zeros(2, 2)).item() == -math.inf
    assert tuple(v.item() for v in hp.slogdet(hp.zeros(2, 2))) == (0.0, -math.inf)
    np.testing.assert_allclose(_t(a).inverse().numpy(), np.linalg.inv(a), rtol=1e-10)
    s = _spd(3)
    gradcheck(lambda x: hp.slogdet(x).logabsdet, [s.copy()])
    gradcheck(lambda x: hp.logdet(x), [s.copy()])
    gradcheck(lambda x: x.inverse(), [s.copy()])
    with pytest.raises(RuntimeError, match="floating point"):
        hp.det(hp.ones(2, 2, dtype=hp.int64))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, -1, -2])
def test_matrix_power(n):
    a = _spd(3, (2,))
    ref = np.linalg.matrix_power(a, n)
    np.testing.assert_allclose(hp.matrix_power(_t(a), n).numpy(), ref, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(_t(a).matrix_power(n).numpy(), ref, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(hp.linalg.matrix_power(_t(a), n).numpy(), ref, rtol=1e-10, atol=1e-14)
    if n:
        gradcheck(lambda x: x.matrix_power(n), [a[0] / 10])


def test_matrix_power_integers():
    assert hp.matrix_power(hp.tensor([[2, 0], [0, 1]]), 3).tolist() == [[8, 0], [0, 1]]
    with pytest.raises(RuntimeError, match="floating point"):
        hp.matrix_power(hp.tensor([[2, 0], [0, 1]]), -1)


def _expm(a):
    """exp(a) by its eigendecomposition (symmetric a) or a long Taylor series in float64."""
    out, term = np.eye(a.shape[-1]), np.eye(a.shape[-1])
    for k in range(1, 80):
        term = term @ a / k
        out = out + term
    return out


@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0])
def test_matrix_exp(scale):
    a = RNG.standard_normal((3, 3)) * scale
    ref = _expm(a)
    np.testing.assert_allclose(hp.matrix_exp(_t(a)).numpy(), ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_t(a).matrix_exp().numpy(), ref, rtol=1e-10, atol=1e-12)
    rot = hp.linalg.matrix_exp(_t([[0.0, 1.0], [-1.0, 0.0]]))
    np.testing.assert_allclose(rot.numpy(), [[np.cos(1), np.sin(1)], [-np.sin(1), np.cos(1)]], rtol=1e-12)
    gradcheck(lambda x: x.matrix_exp(), [a.copy()], rtol=1e-4, atol=1e-5)


def test_old_svd_qr_cholesky():
    a = RNG.standard_normal((4, 3))
    u, s, v = hp.svd(_t(a))
    assert u.shape == (4, 3) and s.shape == (3,) and v.shape == (3, 3)
    np.testing.assert_allclose((u.numpy() * s.numpy()) @ v.numpy().T, a, atol=1e-12)
    u, s, v = _t(a).svd(some=False)
    assert u.shape == (4, 4) and v.shape == (3, 3)
    out = hp.svd(_t(a), compute_uv=False)
    np.testing.assert_allclose(out.S.numpy(), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    assert not out.U.numpy().any() and out.U.shape == (4, 4) and out.V.shape == (3, 3)
    with pytest.warns(UserWarning, match="deprecated"):
        q, r = hp.qr(_t(a))
    assert q.shape == (4, 3) and r.shape == (3, 3)
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q, r = _t(a).qr(some=False)
        assert q.shape == (4, 4) and r.shape == (4, 3)
        s = _spd(3)
        low = hp.cholesky(_t(s))
        up = _t(s).cholesky(upper=True)
    np.testing.assert_allclose(low.numpy(), np.linalg.cholesky(s), rtol=1e-12)
    np.testing.assert_allclose(up.numpy(), np.linalg.cholesky(s).T, rtol=1e-12)


def test_pinverse_and_chain_matmul():
    a = RNG.standard_normal((3, 2))
    np.testing.assert_allclose(hp.pinverse(_t(a)).numpy(), np.linalg.pinv(a), rtol=1e-10)
    np.testing.assert_allclose(_t(a).pinverse().numpy(), np.linalg.pinv(a), rtol=1e-10)
    ms = [RNG.standard_normal(s) for s in ((2, 3), (3, 4), (4, 1))]
    with pytest.warns(UserWarning, match="deprecated"):
        out = hp.chain_matmul(*[_t(m) for m in ms])
    np.testing.assert_allclose(out.numpy(), ms[0] @ ms[1] @ ms[2], rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gradcheck(lambda *xs: hp.chain_matmul(*xs), ms)
        with pytest.raises(RuntimeError, match="expected 2"):
            hp.chain_matmul(hp.ones(2))


def test_inv_ex_and_cholesky_ex():
    a = np.stack([_spd(2), np.zeros((2, 2))])
    inv, info = hp.linalg.inv_ex(_t(a))
    assert info.dtype == hp.int32 and info.tolist()[0] == 0 and info.tolist()[1] > 0
    np.testing.assert_allclose(inv.numpy()[0], np.linalg.inv(a[0]), rtol=1e-12)
    assert np.isnan(inv.numpy()[1]).all()
    with pytest.raises(hp.linalg.LinAlgError):
        hp.linalg.inv_ex(_t(a), check_errors=True)
    low, info = hp.linalg.cholesky_ex(_t([[1.0, 2.0], [2.0, 1.0]]))
    assert info.item() == 2  # the leading minor of order 2 is not positive-definite (LAPACK's code)
    s = _spd(3)
    low, info = hp.linalg.cholesky_ex(_t(s))
    assert info.item() == 0
    np.testing.assert_allclose(low.numpy(), np.linalg.cholesky(s), rtol=1e-12)


def test_linalg_namespace_has_only_torch_names():
    public = {n for n in dir(hp.linalg) if not n.startswith("_")}
    assert not public & {"np", "ops", "Tensor", "dtype_category"}
    assert {"slogdet", "matrix_power", "matrix_exp", "inv_ex", "cholesky_ex", "det", "svd"} <= public
