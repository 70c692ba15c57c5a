"""Activations (nn.functional and nn.modules.activation) against NumPy float64: values, finite-difference gradients,
PyTorch's choices at the kinks and at extreme inputs, the layers' reprs and errors."""
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


# -- hardshrink, softshrink, rrelu, the in-place functions, alpha dropout, gumbel_softmax ------------------------
def test_hardshrink_softshrink_values_grads_and_modules():
    x = np.array([[-1.2, -0.4, 0.0, 0.3, 0.6], [2.0, -0.55, 0.45, -3.0, 0.1]])
    np.testing.assert_array_equal(F.hardshrink(hp.tensor(x), 0.5).numpy(), np.where(np.abs(x) > 0.5, x, 0.0))
    soft = np.where(x > 0.5, x - 0.5, np.where(x < -0.5, x + 0.5, 0.0))
    np.testing.assert_allclose(F.softshrink(hp.tensor(x), 0.5).numpy(), soft, rtol=1e-12)
    np.testing.assert_allclose(nn.Softshrink(0.5)(hp.tensor(x)).numpy(), soft, rtol=1e-12)
    np.testing.assert_array_equal(nn.Hardshrink()(hp.tensor(x)).numpy(), np.where(np.abs(x) > 0.5, x, 0.0))
    gradcheck(lambda a: F.hardshrink(a, 0.5), [x.copy()])
    gradcheck(lambda a: F.softshrink(a, 0.5), [x.copy()])
    assert repr(nn.Hardshrink()) == "Hardshrink(0.5)" and repr(nn.Softshrink(0.2)) == "Softshrink(0.2)"
    with pytest.raises(RuntimeError, match="lambda must be greater or equal to 0"):
        F.softshrink(hp.tensor(x), -1.0)


def test_rrelu_eval_train_and_module():
    x = np.linspace(-2, 2, 40).reshape(4, 10)
    mid = (0.125 + 1 / 3) / 2
    np.testing.assert_allclose(F.rrelu(hp.tensor(x)).numpy(), np.where(x > 0, x, x * mid), rtol=1e-12)
    hp.manual_seed(0)
    y = F.rrelu(hp.tensor(x), 0.1, 0.3, training=True).numpy()
    slope = y[x < 0] / x[x < 0]
    assert np.all((slope >= 0.1) & (slope <= 0.3)) and slope.std() > 0  # one slope per element
    np.testing.assert_array_equal(y[x >= 0], x[x >= 0])
    m = nn.RReLU(0.1, 0.3)
    assert repr(m) == "RReLU(lower=0.1, upper=0.3)"
    m.eval()
    np.testing.assert_allclose(m(hp.tensor(x)).numpy(), np.where(x > 0, x, x * 0.2), rtol=1e-12)
    with pytest.raises(RuntimeError, match="Lower bound should be less than or equal to the upper bound"):
        F.rrelu(hp.tensor(x), 0.5, 0.1, training=True)


@pytest.mark.parametrize("name, ref", [
    ("relu_", lambda x: np.maximum(x, 0)), ("elu_", lambda x: np.where(x > 0, x, np.expm1(x))),
    ("leaky_relu_", lambda x: np.where(x > 0, x, 0.01 * x)), ("hardtanh_", lambda x: np.clip(x, -1, 1)),
    ("selu_", lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x))),
    ("celu_", lambda x: np.where(x > 0, x, np.expm1(x))),
])
def test_inplace_activations_write_into_input(name, ref):
    x = np.linspace(-3, 3, 12)
    t = hp.tensor(x.copy())
    out = getattr(F, name)(t)
    assert out is t
    np.testing.assert_allclose(t.numpy(), ref(x), rtol=1e-12)
    t2 = hp.tensor(x.copy())
    assert F.threshold_(t2, 0.5, -7.0) is t2
    np.testing.assert_array_equal(t2.numpy(), np.where(x > 0.5, x, -7.0))
    leaf = hp.tensor(x.copy(), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        getattr(F, name)(leaf)


def test_alpha_dropout_keeps_mean_and_variance():
    hp.manual_seed(1)
    x = hp.randn(20000, dtype=hp.float64)
    y = F.alpha_dropout(x, 0.3, training=True).numpy()
    alpha, p = 1.7580993408473766, 0.3
    a = 1 / np.sqrt((alpha * alpha * p + 1) * (1 - p))
    dropped = np.isclose(y, alpha * a * (p - 1))
    assert abs(dropped.mean() - p) < 0.02
    np.testing.assert_allclose(y[~dropped], a * x.numpy()[~dropped] + alpha * a * p, rtol=1e-12)
    assert abs(y.mean()) < 0.05 and abs(y.std() - 1) < 0.05
    assert F.alpha_dropout(x, 0.3) is x  # training=False by default
    z = F.feature_alpha_dropout(hp.randn(8, 50, 6, dtype=hp.float64), 0.5, training=True).numpy()
    assert np.all(np.ptp(np.isclose(z, alpha * (1 / np.sqrt((alpha * alpha * 0.5 + 1) * 0.5)) * -0.5).astype(int), axis=2) == 0)
    m = nn.AlphaDropout(0.2)
    m.eval()
    assert m(x) is x and repr(m) == "AlphaDropout(p=0.2, inplace=False)"
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        F.alpha_dropout(x, 1.5, True)


def test_gumbel_softmax_soft_and_hard():
    hp.manual_seed(2)
    logits = np.log(np.array([[0.7, 0.2, 0.1]] * 4000))
    y = F.gumbel_softmax(hp.tensor(logits), tau=0.5).numpy()
    np.testing.assert_allclose(y.sum(1), 1, rtol=1e-12)
    freq = np.bincount(y.argmax(1), minlength=3) / 4000  # argmax of logits + Gumbel noise ~ softmax(logits)
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.03)
    x = hp.tensor(logits[:5].copy(), requires_grad=True)
    h = F.gumbel_softmax(x, hard=True)
    assert set(np.unique(h.detach().numpy())) <= {0.0, 1.0} and np.all(h.detach().numpy().sum(1) == 1)
    (h * hp.tensor(np.arange(3.0))).sum().backward()
    assert x.grad is not None and np.abs(x.grad.numpy()).sum() > 0  # straight through: the soft sample's gradient
