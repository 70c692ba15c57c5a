"""hpcfsdp._normal_math: Box-Muller on uniform pairs and the inverse normal CDF against scalar references built on
the math module (cos, sin, log; erf/erfc with Newton's method), tails included."""
import math

import numpy as np
import pytest

from hpcfsdp._normal_math import box_muller, ndtri, standard_normal_, truncated_normal


def _ndtri_ref(p):
    """The standard normal quantile of p by Newton's method on math.erf (the centre) or math.erfc's logarithm (the
    tails, p from the nearer end), to the last bit math's functions give."""
    if abs(p - 0.5) <= 0.25:  # Phi(x) - 1/2 = erf(x / sqrt 2) / 2 keeps full relative precision near 0
        x = (p - 0.5) * math.sqrt(2 * math.pi)
        for _ in range(60):
            step = (0.5 * math.erf(x / math.sqrt(2)) - (p - 0.5)) / math.exp(-x * x / 2 + math.log(1 / math.sqrt(2 * math.pi)))
            x -= step
            if abs(step) <= 1e-18 * abs(x):
                break
        return x
    q = p if p < 0.5 else 1.0 - p
    lq, x = math.log(q), -math.sqrt(-2 * math.log(q))
    for _ in range(200):
        phi_cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        step = (math.log(phi_cdf) - lq) / math.exp(-x * x / 2 - 0.5 * math.log(2 * math.pi) - math.log(phi_cdf))
        x -= step
        if abs(step) <= 1e-18 * abs(x):
            break
    return x if p < 0.5 else -x


def test_ndtri_matches_newton_on_erf_to_1e_14_relative_tails_included():
    ps = np.concatenate([10.0 ** -np.arange(300, 0, -0.25), np.linspace(0.001, 0.999, 498),
                         1 - 10.0 ** -np.arange(1, 16.01, 0.125), [0.5 - 2 ** -40, 0.5 + 2 ** -40, 0.075, 0.925]])
    ps = ps[(ps > 0) & (ps < 1)]
    got = ndtri(ps)
    want = np.array([_ndtri_ref(float(p)) for p in ps])
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
    assert rel.max() < 1e-14, (ps[rel.argmax()], got[rel.argmax()], want[rel.argmax()])
    assert got.dtype == np.float64 and got.shape == ps.shape
    assert np.all(np.diff(got[np.argsort(ps)]) >= 0)  # monotone
    # the ends and the middle, and any shape
    np.testing.assert_array_equal(ndtri(np.array([[0.0, 0.5], [1.0, 0.5]])), [[-np.inf, 0.0], [np.inf, 0.0]])
    assert ndtri(np.array([1e-300]))[0] == pytest.approx(-37.0471, abs=1e-4)  # R's qnorm(1e-300)


def test_ndtri_is_blocked_without_changing_values(monkeypatch):
    import hpcfsdp._normal_math as nm

    p = np.random.default_rng(0).random(1001)
    whole = ndtri(p)
    monkeypatch.setattr(nm, "_VALUES", 64)
    np.testing.assert_array_equal(ndtri(p), whole)
    np.testing.assert_allclose(whole[:5], [_ndtri_ref(float(x)) for x in p[:5]], rtol=1e-13)


def test_box_muller_matches_the_formula_on_each_pair():
    rng = np.random.default_rng(5)
    u = rng.random(2 * 5000)
    u[:6] = [0.0, 0.0, 0.0, 0.25, 1 - 2 ** -53, 0.999999]  # r = 0, the largest radius, angles near a full turn
    got = box_muller(u, np.empty(u.shape[0]))
    want = np.empty_like(got)
    for i in range(0, u.shape[0], 2):
        r = math.sqrt(-2 * math.log(1 - u[i]))
        want[i], want[i + 1] = r * math.cos(2 * math.pi * u[i + 1]), r * math.sin(2 * math.pi * u[i + 1])
    # 2 pi u rounds (up to 5e-16 of a turn in math's reference); the reduction used is exact
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=4e-15)
    assert abs(got[4]) == pytest.approx(math.sqrt(2 * 53 * math.log(2)))
    odd = box_muller(u, np.empty(u.shape[0] - 1, np.float32))  # an odd count drops the last partner
    np.testing.assert_array_equal(odd, got[:-1].astype(np.float32))
    with pytest.raises(ValueError, match="an even count"):
        box_muller(u[:-1], np.empty(u.shape[0] - 1))


def test_standard_normal_draws_two_uniforms_per_pair_whatever_the_chunk(monkeypatch):
    import hpcfsdp._normal_math as nm

    z = standard_normal_(np.random.default_rng(9), np.empty(1001))
    g = np.random.default_rng(9)
    np.testing.assert_array_equal(z, box_muller(g.random(1002), np.empty(1001)))
    after = g.random(3)
    monkeypatch.setattr(nm, "_CHUNK", 6)
    g2 = np.random.default_rng(9)
    np.testing.assert_array_equal(standard_normal_(g2, np.empty(1001)), z)
    np.testing.assert_array_equal(g2.random(3), after)  # 1002 uniforms drawn, in chunks or not


def test_truncated_normal_maps_uniforms_through_the_quantile_and_clips():
    u = np.random.default_rng(2).random(257)
    lo, hi = -1.0, 2.0
    p_lo, p_hi = 0.5 * math.erfc(-lo / math.sqrt(2)), 0.5 * math.erfc(-hi / math.sqrt(2))
    got = truncated_normal(u, p_lo, p_hi, 0.5, 3.0, 3.0 + 0.5 * lo, 3.0 + 0.5 * hi)
    want = [3.0 + 0.5 * _ndtri_ref(p_lo + x * (p_hi - p_lo)) for x in u]
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert got.min() >= 2.5 and got.max() <= 4.0
