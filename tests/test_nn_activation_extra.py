"""The second batch of activations (PReLU, SELU, CELU, GLU, Hardswish, Hardsigmoid, Softsign, Tanhshrink, Threshold,
Softmin, LogSigmoid, Softmax2d): values against NumPy float64, finite-difference gradients, PyTorch's choices at the
kinks, reprs and errors."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn

from _gradcheck import gradcheck


def _t(a, requires_grad=False):
    return hp.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def _np(t):
    return t.detach().numpy()


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


SELU_A, SELU_S = 1.6732632423543772, 1.0507009873554805


def _away(x, kinks, gap=1e-2):
    for k in kinks:
        x = np.where(np.abs(x - k) < gap, k + 2 * gap, x)
    return x


ACTS = {  # name: (functional, module, NumPy reference, kinks to keep away from)
    "selu": (F.selu, nn.SELU(), lambda x: SELU_S * np.where(x > 0, x, SELU_A * np.expm1(x)), [0]),
    "celu": (lambda x: F.celu(x, 0.7), nn.CELU(0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x / 0.7)), [0]),
    "hardswish": (F.hardswish, nn.Hardswish(), lambda x: x * np.clip(x + 3, 0, 6) / 6, [-3, 3]),
    "hardsigmoid": (F.hardsigmoid, nn.Hardsigmoid(), lambda x: np.clip(x + 3, 0, 6) / 6, [-3, 3]),
    "softsign": (F.softsign, nn.Softsign(), lambda x: x / (1 + np.abs(x)), [0]),
    "tanhshrink": (F.tanhshrink, nn.Tanhshrink(), lambda x: x - np.tanh(x), []),
    "threshold": (lambda x: F.threshold(x, 0.3, -2.0), nn.Threshold(0.3, -2.0), lambda x: np.where(x > 0.3, x, -2.0),
                  [0.3]),
    "logsigmoid": (F.logsigmoid, nn.LogSigmoid(), lambda x: -np.logaddexp(0, -x), []),
    "softmin": (lambda x: F.softmin(x, 1), nn.Softmin(1), lambda x: _softmax(-x.swapaxes(1, -1)).swapaxes(1, -1), []),
    "glu": (lambda x: F.glu(x, 1), nn.GLU(1), lambda x: x[:, :2] / (1 + np.exp(-x[:, 2:])), []),
    "softmax2d": (lambda x: F.softmax(x, -3), nn.Softmax2d(), lambda x: _softmax(x.swapaxes(-3, -1)).swapaxes(-3, -1),
                  []),
}


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_values_and_gradcheck(name):
    fn, mod, ref, kinks = ACTS[name]
    x = _away(np.random.default_rng(3).standard_normal((2, 4, 3, 2)) * 3, kinks)
    np.testing.assert_allclose(_np(fn(_t(x))), ref(x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(_np(mod(_t(x))), ref(x), rtol=1e-12, atol=1e-14)
    gradcheck(fn, [x.copy()])
    y32 = mod(hp.tensor(x.astype(np.float32)))
    assert y32.dtype == hp.float32
    np.testing.assert_allclose(_np(y32), ref(x), rtol=1e-5, atol=1e-5)


def test_activation_gradients_at_kinks_are_pytorchs():
    x = _t([-4.0, -3.0, 0.0, 2.9999, 3.0, 4.0], requires_grad=True)
    F.hardswish(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, 0.5, 2.9999 / 3 + 0.5, 1, 1])
    x.grad = None
    F.hardsigmoid(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, 1 / 6, 1 / 6, 0, 0])
    z = _t([0.0], requires_grad=True)
    F.selu(z).sum().backward()  # the negative branch at 0, as PyTorch
    np.testing.assert_allclose(z.grad.numpy(), [SELU_A * SELU_S])
    z.grad = None
    F.celu(z, 0.5).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), [1.0])
    t = _t([0.1, 0.0, 0.2, np.nan], requires_grad=True)
    y = F.threshold(t, 0.1, 5.0)
    np.testing.assert_array_equal(y.detach().numpy()[:3], [5.0, 5.0, 0.2])
    assert np.isnan(y.detach().numpy()[3])  # NaN passes through (NaN <= threshold is False)
    y[:3].sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [0, 0, 1, 0])
    np.testing.assert_array_equal(F.threshold(hp.tensor([1, 2, 3]), 2, 9).numpy(), [9, 9, 3])
    big = _t([-800.0, 800.0])
    np.testing.assert_allclose(F.logsigmoid(big).numpy(), [-800.0, 0.0])


@pytest.mark.parametrize("shape,num", [((2, 3, 4), 3), ((2, 3), 3), ((5,), 1), ((2, 3, 2, 2), 1), ((), 1)])
def test_prelu(shape, num):
    rng = np.random.default_rng(5)
    x = _away(rng.standard_normal(shape), [0])
    w = rng.uniform(0.05, 0.5, num)
    wb = w.reshape((1, num) + (1,) * (len(shape) - 2)) if num > 1 else w[0]
    np.testing.assert_allclose(_np(F.prelu(_t(x), _t(w))), np.where(x > 0, x, wb * x), rtol=1e-12)
    gradcheck(F.prelu, [np.array(x), w.copy()])
    m = nn.PReLU(num, init=0.1, dtype=hp.float64)
    assert list(m.state_dict()) == ["weight"] and (_np(m.weight) == 0.1).all() and m.init == 0.1
    np.testing.assert_allclose(_np(m(_t(x))), np.where(x > 0, x, 0.1 * x), rtol=1e-12)


def test_activation_reprs_and_errors():
    assert [repr(m) for m in (nn.PReLU(), nn.PReLU(3, init=0.1), nn.SELU(), nn.SELU(True), nn.CELU(),
                              nn.CELU(0.5, True), nn.GLU(), nn.GLU(1), nn.Hardswish(True), nn.Hardsigmoid(),
                              nn.Softsign(), nn.Tanhshrink(), nn.Threshold(0.1, 20), nn.Threshold(0.1, 20.0, True),
                              nn.Softmin(), nn.Softmin(1), nn.LogSigmoid(), nn.Softmax2d())] == [
        "PReLU(num_parameters=1)", "PReLU(num_parameters=3)", "SELU()", "SELU(inplace=True)", "CELU(alpha=1.0)",
        "CELU(alpha=0.5, inplace=True)", "GLU(dim=-1)", "GLU(dim=1)", "Hardswish()", "Hardsigmoid()", "Softsign()",
        "Tanhshrink()", "Threshold(threshold=0.1, value=20)", "Threshold(threshold=0.1, value=20.0, inplace=True)",
        "Softmin(dim=None)", "Softmin(dim=1)", "LogSigmoid()", "Softmax2d()"]
    with pytest.raises(RuntimeError, match="Mismatch of parameter numbers and input channel size. Found parameter "
                                           "numbers = 4 and channel size = 3"):
        F.prelu(hp.randn(2, 3), hp.full((4,), 0.25))
    with pytest.raises(RuntimeError, match="scalar or 1D tensor"):
        F.prelu(hp.randn(2, 3), hp.full((3, 1), 0.25))
    with pytest.raises(RuntimeError, match="Halving dimension must be even, but dimension 1 is size 5"):
        F.glu(hp.randn(3, 5))
    with pytest.raises(RuntimeError, match="glu does not support scalars"):
        F.glu(hp.tensor(1.0))
    with pytest.raises(ValueError, match="Softmax2d: expected input to be 3D or 4D, got 2D instead"):
        nn.Softmax2d()(hp.randn(2, 3))
    with pytest.raises(RuntimeError, match="alpha cannot be 0 for CELU"):
        F.celu(hp.randn(3), 0.0)
    with pytest.raises(RuntimeError, match="floating point"):
        F.selu(hp.tensor([1, 2]))
    np.testing.assert_allclose(F.softmin(_t([[1.0, 2.0], [3.0, 0.0]])).numpy().sum(1), [1, 1])  # implicit dim 1
