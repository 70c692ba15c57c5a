"""nn.init: bounds and moments against PyTorch's published formulas; meta tensors are skipped."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.nn import init


def _np(t):
    return t.detach().numpy().astype(np.float64)


def test_calculate_gain_table():
    assert init.calculate_gain("linear") == 1 and init.calculate_gain("sigmoid") == 1
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("leaky_relu") == pytest.approx(math.sqrt(2 / (1 + 0.01**2)))
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == pytest.approx(math.sqrt(2 / 6))
    assert init.calculate_gain("selu") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="Unsupported nonlinearity softplus"):
        init.calculate_gain("softplus")
    with pytest.raises(ValueError, match="negative_slope True not a valid number"):
        init.calculate_gain("leaky_relu", True)


def test_uniform_normal_constant():
    hp.manual_seed(0)
    t = hp.empty(200, 200)
    init.uniform_(t, -0.5, 1.5)
    a = _np(t)
    assert a.min() >= -0.5 and a.max() <= 1.5
    assert abs(a.mean() - 0.5) < 0.01 and abs(a.std() - 2 / math.sqrt(12)) < 0.01
    init.normal_(t, mean=3.0, std=0.5)
    a = _np(t)
    assert abs(a.mean() - 3.0) < 0.01 and abs(a.std() - 0.5) < 0.01
    init.constant_(t, 2.5)
    assert np.all(_np(t) == 2.5)
    init.zeros_(t)
    assert np.all(_np(t) == 0)
    init.ones_(t)
    assert np.all(_np(t) == 1)
    e = hp.empty(3, 4)
    init.eye_(e)
    np.testing.assert_array_equal(_np(e), np.eye(3, 4))
    assert init.normal_(t) is t


def test_trunc_normal_bounds_and_moments():
    hp.manual_seed(1)
    t = hp.empty(300, 300, dtype=hp.float64)
    init.trunc_normal_(t, mean=0.0, std=1.0, a=-1.0, b=2.0)
    a = _np(t)
    assert a.min() >= -1.0 and a.max() <= 2.0
    # moments of the truncated normal: alpha=-1, beta=2
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    Z = Phi(2.0) - Phi(-1.0)
    mean = (phi(-1.0) - phi(2.0)) / Z
    var = 1 + (-1.0 * phi(-1.0) - 2.0 * phi(2.0)) / Z - mean**2
    assert abs(a.mean() - mean) < 0.01 and abs(a.var() - var) < 0.01
    init.trunc_normal_(t, std=0.02)  # timm/ViT use: a=-2, b=2 are absolute, far outside 0.02 std
    a = _np(t)
    assert abs(a.std() - 0.02) < 0.001


def test_kaiming_and_xavier():
    hp.manual_seed(2)
    w = hp.empty(256, 128)
    init.kaiming_uniform_(w, a=math.sqrt(5))
    bound = math.sqrt(3) * math.sqrt(2 / 6) / math.sqrt(128)  # = 1/sqrt(fan_in)
    a = _np(w)
    assert bound == pytest.approx(1 / math.sqrt(128))
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.98 * bound
    assert abs(a.std() - bound / math.sqrt(3)) < 0.02 * bound
    init.kaiming_uniform_(w, mode="fan_out", nonlinearity="relu")
    assert np.abs(_np(w)).max() <= math.sqrt(2) * math.sqrt(3 / 256)
    init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(_np(w).std() - math.sqrt(2 / 128)) < 0.01 * math.sqrt(2 / 128) * 5
    init.xavier_uniform_(w, gain=2.0)
    xb = 2.0 * math.sqrt(6 / (128 + 256))
    assert np.abs(_np(w)).max() <= xb and np.abs(_np(w)).max() > 0.98 * xb
    init.xavier_normal_(w)
    assert abs(_np(w).std() - math.sqrt(2 / 384)) < 0.05 * math.sqrt(2 / 384)
    conv = hp.empty(8, 4, 3, 3)  # fan_in includes the receptive field
    init.kaiming_uniform_(conv, a=math.sqrt(5))
    assert np.abs(_np(conv)).max() <= 1 / math.sqrt(36)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(hp.empty(5))
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(w, mode="fan_avg")


def test_layer_default_inits():
    hp.manual_seed(3)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    w, b = _np(lin.weight), _np(lin.bias)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert np.abs(b).max() <= bound and abs(w.mean()) < 0.01 * bound * 10
    emb = nn.Embedding(300, 200)
    e = _np(emb.weight)
    assert abs(e.mean()) < 0.01 and abs(e.std() - 1) < 0.01
    ln = nn.LayerNorm(7)
    assert np.all(_np(ln.weight) == 1) and np.all(_np(ln.bias) == 0)


def test_init_skips_meta_and_is_seeded():
    m = hp.empty(3, 3, device="meta")
    for fn in (init.normal_, init.uniform_, init.zeros_, init.ones_, init.trunc_normal_, init.kaiming_uniform_,
               init.xavier_uniform_):
        assert fn(m) is m
    assert m.device == "meta"
    hp.manual_seed(7)
    a = _np(init.normal_(hp.empty(4)))
    hp.manual_seed(7)
    b = _np(init.normal_(hp.empty(4)))
    np.testing.assert_array_equal(a, b)
    p = nn.Parameter(hp.empty(3))
    init.uniform_(p)  # works on a leaf that requires grad, outside autograd
    assert p.grad_fn is None and p.requires_grad
    h = hp.empty(1000, dtype=hp.bfloat16)
    init.normal_(h, std=2.0)
    assert h.dtype == hp.bfloat16 and abs(_np(h).std() - 2.0) < 0.2
