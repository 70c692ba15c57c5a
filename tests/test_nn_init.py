"""nn.init: bounds and moments against PyTorch's published formulas; meta tensors are skipped."""
import math
import warnings

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


def _moments(a):
    a = a.astype(np.float64).ravel()
    c = a - a.mean()
    var = (c * c).mean()
    return a.mean(), math.sqrt(var), (c ** 3).mean() / var ** 1.5, (c ** 4).mean() / var ** 2


@pytest.mark.parametrize("dtype", [hp.float32, hp.float64])
def test_normal_moments_on_a_million_values(dtype):
    """Mean, std, skewness and kurtosis of N(0, 1) within 6 standard errors; neighbouring values uncorrelated (the
    two of a Box-Muller pair and the second of one with the first of the next)."""
    hp.manual_seed(11)
    t = init.normal_(hp.empty(1000, 1000, dtype=dtype), mean=0.0, std=1.0)
    mean, std, skew, kurt = _moments(_np(t))
    n = 1e6
    assert abs(mean) < 6 / math.sqrt(n) and abs(std - 1) < 6 * math.sqrt(0.5 / n)
    assert abs(skew) < 6 * math.sqrt(6 / n) and abs(kurt - 3) < 6 * math.sqrt(24 / n)
    z = _np(t).ravel()
    for a, b in ((z[0::2], z[1::2]), (z[1:-1:2], z[2::2])):
        assert abs(np.corrcoef(a, b)[0, 1]) < 6 / math.sqrt(n / 2)
    assert np.abs(z).max() < math.sqrt(2 * 53 * math.log(2))  # Box-Muller's bound for 53-bit uniforms
    shifted = init.normal_(hp.empty(1000, 1000, dtype=dtype), mean=3.0, std=0.5)
    m2, s2, _, _ = _moments(_np(shifted))
    assert abs(m2 - 3.0) < 6 * 0.5 / math.sqrt(n) and abs(s2 - 0.5) < 6 * 0.5 * math.sqrt(0.5 / n)


@pytest.mark.parametrize("dtype", [hp.float32, hp.float64])
@pytest.mark.parametrize("n", [11, 12])
def test_normal_fill_is_box_muller_on_float64_uniform_pairs(n, dtype):
    """Value 2i and 2i + 1 from the generator's float64 uniforms 2i and 2i + 1 (math's log, cos and sin here), rounded
    once to the dtype; an odd count draws its last partner, so the generator ends past 2 ceil(n / 2) draws. Every
    normal fill gives these values: nn.init's, Tensor.normal_, kaiming_normal_ and xavier_normal_ (their std)."""
    u = np.random.default_rng(4).random(n + n % 2)
    want = np.empty(n + n % 2)
    for i in range(0, n + n % 2, 2):
        r = math.sqrt(-2 * math.log(1 - u[i]))
        want[i], want[i + 1] = r * math.cos(2 * math.pi * u[i + 1]), r * math.sin(2 * math.pi * u[i + 1])
    want = want[:n]
    rtol = 1e-6 if dtype == hp.float32 else 1e-14
    g = np.random.default_rng(4)
    t = init.normal_(hp.empty(n, dtype=dtype), mean=1.0, std=2.0, generator=g)
    np.testing.assert_allclose(_np(t), 2.0 * want + 1.0, rtol=rtol, atol=1e-14)
    after = np.random.default_rng(4)
    after.random(n + n % 2)
    np.testing.assert_array_equal(g.random(4), after.random(4))
    hp.manual_seed(8)
    a = _np(init.normal_(hp.empty(3, n, dtype=dtype), 0.0, 0.5))
    hp.manual_seed(8)
    np.testing.assert_array_equal(_np(hp.empty(3, n, dtype=dtype).normal_(0.0, 0.5)), a)
    hp.manual_seed(8)
    np.testing.assert_allclose(_np(init.kaiming_normal_(hp.empty(3, n, dtype=dtype))), 2 * a * math.sqrt(2 / n), rtol=rtol)
    hp.manual_seed(8)
    xs = math.sqrt(2.0 / (3 + n))
    np.testing.assert_allclose(_np(init.xavier_normal_(hp.empty(3, n, dtype=dtype))), 2 * a * xs, rtol=rtol)


def _truncated_moments(mean, std, a, b):
    """Mean and variance of N(mean, std^2) truncated to [a, b] (math.erfc: accurate in either tail)."""
    al, be = (a - mean) / std, (b - mean) / std
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    if al + be > 0:  # Z from the upper tail's erfc
        Z = 0.5 * (math.erfc(al / math.sqrt(2)) - math.erfc(be / math.sqrt(2)))
    else:
        Z = 0.5 * (math.erfc(-be / math.sqrt(2)) - math.erfc(-al / math.sqrt(2)))
    m = (phi(al) - phi(be)) / Z
    var = 1 + (al * phi(al) - be * phi(be)) / Z - m * m
    return mean + std * m, std * std * var


@pytest.mark.parametrize("dtype", [hp.float32, hp.float64])
@pytest.mark.parametrize("mean,std,a,b", [(0.0, 1.0, -2.0, 2.0), (0.0, 1.0, -1.0, 2.0), (1.0, 0.5, 1.5, 2.5),
                                          (0.0, 0.02, -2.0, 2.0), (0.0, 1.0, 5.0, 6.0), (0.0, 1.0, -9.0, -8.0)])
def test_trunc_normal_values_lie_in_the_window_with_the_truncated_normals_moments(mean, std, a, b, dtype):
    """Bounds and the first two moments of a million values against the truncated normal's formulas, tail windows
    (5..6 std, -9..-8 std) included: the inverse CDF, no rejection (See [Note: Truncated normal values])."""
    hp.manual_seed(21)
    with pytest.warns(UserWarning, match="more than 2 std") if (mean < a - 2 * std or mean > b + 2 * std) else \
            warnings.catch_warnings(action="error"):
        t = init.trunc_normal_(hp.empty(1000, 1000, dtype=dtype), mean=mean, std=std, a=a, b=b)
    x = _np(t).ravel()
    assert x.min() >= a and x.max() <= b
    m, var = _truncated_moments(mean, std, a, b)
    n = x.size
    assert abs(x.mean() - m) < 6 * math.sqrt(var / n) + 1e-6 * abs(m)  # float32 rounding of values near 8
    assert abs(x.var() - var) < 6 * var * math.sqrt(2 / n)
    if (b - a) / std <= 4:  # a window of a few std is filled to its ends
        assert abs(x.min() - a) < 2e-2 * (b - a) and abs(x.max() - b) < 2e-2 * (b - a)


def test_trunc_normal_is_the_quantile_of_one_float64_uniform_per_value():
    """Value i = mean + std * ndtri(Phi(lo) + u_i (Phi(hi) - Phi(lo))) from the generator's float64 uniform i (a
    window above the mean mirrored: -ndtri over Phi(-hi)..Phi(-lo)); Newton on math.erf gives the quantile here."""
    from test_normal_math import _ndtri_ref

    for mean, std, a, b in ((0.5, 2.0, -1.0, 3.0), (0.0, 1.0, 5.0, 6.0)):
        lo, hi = (a - mean) / std, (b - mean) / std
        s = -1.0 if lo + hi > 0 else 1.0
        p0, p1 = sorted((0.5 * math.erfc(-s * lo / math.sqrt(2)), 0.5 * math.erfc(-s * hi / math.sqrt(2))))
        u = np.random.default_rng(6).random(33)
        want = [mean + s * std * _ndtri_ref(p0 + x * (p1 - p0)) for x in u]
        g = np.random.default_rng(6)
        with warnings.catch_warnings(action="ignore"):  # 5..6 std: the far-window warning, as PyTorch's
            t = init.trunc_normal_(hp.empty(3, 11, dtype=hp.float64), mean=mean, std=std, a=a, b=b, generator=g)
        np.testing.assert_allclose(_np(t).ravel(), want, rtol=1e-13)
        after = np.random.default_rng(6)
        after.random(33)
        np.testing.assert_array_equal(g.random(3), after.random(3))


def test_normal_and_trunc_normal_fills_take_the_generators_float64_uniforms_on_every_device(device):
    """On a CuPy generator too (drawn whole: cuRAND cannot skip ahead), value i comes from the uniforms that
    hp.rand(dtype=float64) draws from an identically seeded generator: Box-Muller pairs for normal_, the quantile
    for trunc_normal_ (math's cos, sin, log and Newton on math.erf here)."""
    from test_normal_math import _ndtri_ref

    n = 35
    g = hp.Generator(device).manual_seed(3)
    w = init.normal_(hp.empty(5, 7, device=device, dtype=hp.float64), generator=g)
    u = hp.rand(n + 1, dtype=hp.float64, device=device, generator=hp.Generator(device).manual_seed(3)).cpu().numpy()
    want = []
    for i in range(0, n + 1, 2):
        r = math.sqrt(-2 * math.log(1 - u[i]))
        want += [r * math.cos(2 * math.pi * u[i + 1]), r * math.sin(2 * math.pi * u[i + 1])]
    np.testing.assert_allclose(w.cpu().numpy().ravel(), want[:n], rtol=1e-14, atol=1e-14)
    g.manual_seed(3)
    t = init.trunc_normal_(hp.empty(5, 7, device=device, dtype=hp.float64), std=0.5, a=-0.5, b=1.0, generator=g)
    p0, p1 = 0.5 * math.erfc(2 / math.sqrt(2)), 0.5 * math.erfc(-1 / math.sqrt(2))  # [-1, 2] std, mirrored
    np.testing.assert_allclose(t.cpu().numpy().ravel(), [-0.5 * _ndtri_ref(p0 + x * (p1 - p0)) for x in u[:n]],
                               rtol=1e-13)


def _dirac_reference(shape, groups):
    """PyTorch's loop, written out: out channel g * (C_out / groups) + d takes in channel d at the centre."""
    want = np.zeros(shape)
    per = shape[0] // groups
    for g in range(groups):
        for d in range(min(per, shape[1])):
            want[(g * per + d, d) + tuple(n // 2 for n in shape[2:])] = 1
    return want


@pytest.mark.parametrize("shape,groups", [((6, 4, 3), 1), ((6, 4, 3, 5), 2), ((4, 6, 3, 3, 3), 2), ((3, 8, 4), 3)])
def test_dirac_places_ones_at_the_kernel_centre(shape, groups):
    t = init.dirac_(hp.full(shape, 5.0), groups=groups)
    np.testing.assert_array_equal(_np(t), _dirac_reference(shape, groups))


def test_dirac_is_the_identity_convolution():
    x = hp.randn(2, 4, 9)
    w = init.dirac_(hp.empty(4, 4, 3))
    np.testing.assert_allclose(nn.functional.conv1d(x, w, padding=1).numpy(), x.numpy(), rtol=0, atol=0)


def test_dirac_orthogonal_sparse_errors_and_meta():
    with pytest.raises(ValueError, match="Only tensors with 3, 4, or 5 dimensions are supported"):
        init.dirac_(hp.empty(3, 3))
    with pytest.raises(ValueError, match="dim 0 must be divisible by groups"):
        init.dirac_(hp.empty(5, 2, 3), groups=2)
    with pytest.raises(ValueError, match="Only tensors with 2 or more dimensions are supported"):
        init.orthogonal_(hp.empty(4))
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"):
        init.sparse_(hp.empty(2, 3, 4), 0.5)
    for fn in (lambda t: init.dirac_(t), init.orthogonal_, lambda t: init.sparse_(t[0], 0.5)):
        m = hp.empty(4, 4, 3, device="meta")
        assert fn(m).device == "meta"
    assert init.orthogonal_(hp.empty(0, 3)).shape == (0, 3)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 2, 3), (6, 6)])
def test_orthogonal_rows_or_columns_are_orthonormal_times_gain(shape, device):
    t = init.orthogonal_(hp.empty(*shape, device=device), gain=2.0)
    a = t.cpu().numpy().astype(np.float64).reshape(shape[0], -1)
    gram = a @ a.T if a.shape[0] <= a.shape[1] else a.T @ a
    np.testing.assert_allclose(gram, 4.0 * np.eye(min(a.shape)), atol=2e-6)


def test_orthogonal_is_q_of_the_normal_matrix_with_rs_diagonal_signs():
    """PyTorch's construction on the values normal_ draws: Q of the (transposed when wide) normal matrix, each
    column multiplied by sign(R_ii), transposed back (NumPy's QR in float64 here)."""
    for shape in ((3, 5), (5, 3)):
        hp.manual_seed(4)
        z = _np(init.normal_(hp.empty(*shape, dtype=hp.float64)))
        hp.manual_seed(4)
        t = init.orthogonal_(hp.empty(*shape, dtype=hp.float64))
        wide = shape[0] < shape[1]
        q, r = np.linalg.qr(z.T if wide else z)
        q = q * np.sign(np.diag(r))
        np.testing.assert_allclose(_np(t), q.T if wide else q, rtol=1e-12, atol=1e-12)


def test_sparse_zeros_ceil_sparsity_rows_per_column_from_the_global_randperm():
    hp.manual_seed(0)
    t = init.sparse_(hp.empty(10, 7), 0.25, std=0.5, generator=hp.Generator().manual_seed(1))
    a = _np(t)
    np.testing.assert_array_equal((a == 0).sum(axis=0), [3] * 7)  # ceil(0.25 * 10)
    hp.manual_seed(0)
    want = _np(init.normal_(hp.empty(10, 7), std=0.5, generator=hp.Generator().manual_seed(1)))
    for col in range(7):
        want[hp.randperm(10).numpy()[:3], col] = 0  # the global generator's permutations, one per column
    np.testing.assert_array_equal(a, want)


def test_deprecated_names_warn_and_fill():
    with pytest.warns(FutureWarning, match=r"`nn.init.uniform` is now deprecated in favor of `nn.init.uniform_`"):
        t = init.uniform(hp.empty(50), 2.0, 3.0)
    assert _np(t).min() >= 2.0 and _np(t).max() <= 3.0
    with pytest.warns(FutureWarning, match="nn.init.orthogonal_"):
        init.orthogonal(hp.empty(3, 3))
