"""Normal values from uniform ones at fixed positions: Box-Muller on pairs and the inverse normal CDF (ndtri), both
vectorised in float64 on NumPy or CuPy arrays (See [Note: Normal values at fixed positions] in hpcfsdp/random.py)."""
import math

import numpy as np

from ._backend import array_module

__all__ = ["box_muller", "ndtri", "normal_cdf", "standard_normal_", "truncated_normal", "uniform64"]

_TWO_PI = 2.0 * math.pi
_PAIRS = 1 << 15  # pairs per pass of box_muller on NumPy: the float64 temporaries of one pass stay in L2
_VALUES = 1 << 16  # values per pass of ndtri on NumPy
_CHUNK = 1 << 16  # uniform values a NumPy generator is asked for at a time (its stream goes on across calls)


def uniform64(gen, k):
    """``k`` float64 U[0, 1) values from a NumPy Generator (one 64-bit draw each), a NumPy RandomState or a CuPy
    RandomState."""
    if isinstance(gen, np.random.Generator):
        return gen.random(k)
    return gen.random_sample(k, dtype=np.float64) if not isinstance(gen, np.random.RandomState) else \
        gen.random_sample(k)


# The quarter turn k in 0..4 of an angle uniform v (t = 2 pi v = k pi / 2 + x): (cos, sin) of k pi / 2.
_QUARTER_COS = (1.0, 0.0, -1.0, 0.0, 1.0)
_QUARTER_SIN = (0.0, 1.0, 0.0, -1.0, 0.0)


def _box_muller_pass(u, out, xp, ws, tables):
    """One pass of box_muller() over the pairs of ``u`` into ``out``, in the float64 buffers ``ws`` (six, one value
    per pair) and ``ws[6]`` (intp). cos and sin come from tan(x / 2) of the angle's remainder after its nearest
    quarter turn, |x| <= pi / 4: NumPy's tan is vectorised where its cos and sin are not (3-10x slower, slower still
    for arguments past 1), and the reduction v - k / 4 is exact, so the angle keeps a uniform's full precision."""
    r, v, k, t, d, e, ki = ws
    pairs = u.reshape(-1, 2)  # (m, 2): (radius uniform, angle uniform)
    xp.subtract(1.0, pairs[:, 0], out=r)  # 1 - u is exact and in (0, 1]: u = 0 gives r = 0, never log(0)
    xp.log(r, out=r)
    r *= -2.0
    xp.sqrt(r, out=r)  # r = sqrt(-2 log(1 - u))
    v[...] = pairs[:, 1]
    xp.multiply(v, 4.0, out=k)
    xp.rint(k, out=k)  # the nearest quarter turn, 0..4
    xp.multiply(k, -0.25, out=t)
    t += v  # v - k / 4, exact, in [-1/8, 1/8]
    t *= math.pi
    xp.tan(t, out=t)  # tan(x / 2), x = 2 pi (v - k / 4)
    xp.multiply(t, t, out=d)
    xp.subtract(1.0, d, out=v)  # 1 - tan^2 >= 0.82: no cancellation
    d += 1.0
    xp.divide(r, d, out=d)
    v *= d  # r cos x = r (1 - tan^2) / (1 + tan^2)
    t *= 2.0
    t *= d  # r sin x = r 2 tan / (1 + tan^2)
    ki[...] = k
    cq, sq = xp.take(tables[0], ki, out=k), xp.take(tables[1], ki, out=r)  # products with 0 and +-1 are exact
    n = out.shape[0]
    xp.multiply(v, cq, out=d)
    xp.multiply(t, sq, out=e)
    d -= e  # r cos(k pi / 2 + x)
    out[0::2] = d[:(n + 1) // 2]
    xp.multiply(v, sq, out=d)
    xp.multiply(t, cq, out=e)
    d += e  # r sin(k pi / 2 + x)
    out[1::2] = d[:n // 2]


def box_muller(u, out):
    """Standard normal values from float64 uniforms ``u`` (an even count 2m) into ``out`` (2m or 2m - 1 values, any
    float dtype: computed in float64, rounded once): with r = sqrt(-2 log(1 - u[2i])), t = 2 pi u[2i + 1],
    out[2i] = r cos t and out[2i + 1] = r sin t."""
    xp = array_module(u)
    m = u.shape[0] // 2
    if u.shape[0] % 2 or out.shape[0] not in (2 * m, 2 * m - 1):
        raise ValueError(f"box_muller: {u.shape[0]} uniforms (an even count) for {out.shape[0]} values")
    step = min(m, _PAIRS) if xp is np else m  # NumPy: L2-sized passes; CuPy: one kernel each
    if step == 0:
        return out
    ws = [xp.empty(step, dtype=np.float64) for _ in range(6)] + [xp.empty(step, dtype=np.intp)]
    tables = (xp.asarray(_QUARTER_COS), xp.asarray(_QUARTER_SIN))
    for s in range(0, m, step):
        k = min(step, m - s)
        _box_muller_pass(u[2 * s:2 * (s + k)], out[2 * s:2 * (s + k)], xp, [w[:k] for w in ws], tables)
    return out


def standard_normal_(gen, out):
    """Fill the flat array ``out`` with the standard normal values of ``gen``'s stream: value i from the uniform pair
    of i (2 * ceil(n / 2) uniforms drawn). NumPy generators are asked for _CHUNK values at a time, CuPy's at once."""
    n = int(out.shape[0])
    total = n + (n & 1)
    chunk = _CHUNK if isinstance(gen, (np.random.Generator, np.random.RandomState)) else max(total, 2)
    for s in range(0, total, chunk):
        k = min(chunk, total - s)
        box_muller(uniform64(gen, k), out[s:min(s + k, n)])
    return out


# [Note: ndtri]
# The inverse of the standard normal CDF by Wichura's AS241 (PPND16, Applied Statistics 37, 1988): a rational
# function of degree (7, 7) in (p - 1/2)^2 on |p - 1/2| <= 0.425, and two of degree (7, 7) in r = sqrt(-log(min(p,
# 1 - p))) below and above r = 5, good to about 1e-16 relative by its author's account, so no refinement step
# follows. r stays finite for every positive float64 (r <= 27.3 at the smallest subnormal); p = 0 gives -inf,
# p = 1 +inf. For p > 1/2, 1 - p is exact (Sterbenz), so the upper tail is as accurate as p is; a caller that
# needs values far in the upper tail passes the lower-tail p of the mirrored value (trunc_normal_ does).
_A = (3.3871328727963666080e0, 1.3314166789178437745e+2, 1.9715909503065514427e+3, 1.3731693765509461125e+4,
      4.5921953931549871457e+4, 6.7265770927008700853e+4, 3.3430575583588128105e+4, 2.5090809287301226727e+3)
_B = (1.0, 4.2313330701600911252e+1, 6.8718700749205790830e+2, 5.3941960214247511077e+3,
      2.1213794301586595867e+4, 3.9307895800092710610e+4, 2.8729085735721942674e+4, 5.2264952788528545610e+3)
_C = (1.42343711074968357734e0, 4.63033784615654529590e0, 5.76949722146069140550e0, 3.64784832476320460504e0,
      1.27045825245236838258e0, 2.41780725177450611770e-1, 2.27238449892691845833e-2, 7.74545014278341407640e-4)
_D = (1.0, 2.05319162663775882187e0, 1.67638483018380384940e0, 6.89767334985100004550e-1,
      1.48103976427480074590e-1, 1.51986665636164571966e-2, 5.47593808499534494600e-4, 1.05075007164441684324e-9)
_E = (6.65790464350110377720e0, 5.46378491116411436990e0, 1.78482653991729133580e0, 2.96560571828504891230e-1,
      2.65321895265761230930e-2, 1.24266094738807843860e-3, 2.71155556874348757815e-5, 2.01033439929228813265e-7)
_F = (1.0, 5.99832206555887937690e-1, 1.36929880922735805310e-1, 1.48753612908506148525e-2,
      7.86869131145613259100e-4, 1.84631831751005468180e-5, 1.42151175831644588870e-7, 2.04426310338993978564e-15)


def _ratio(x, num, den, p, q):
    """num(x) / den(x) into ``p`` (``q`` a scratch buffer; coefficients lowest degree first, Horner)."""
    xp = array_module(x)
    xp.multiply(x, num[-1], out=p)
    p += num[-2]
    xp.multiply(x, den[-1], out=q)
    q += den[-2]
    for a, b in zip(num[-3::-1], den[-3::-1]):
        p *= x
        p += a
        q *= x
        q += b
    p /= q
    return p


def _ndtri_pass(p, out, xp, ws):
    """ndtri of the float64 ``p`` into float64 ``out`` in the buffers ``ws`` (three of p's size)."""
    q, x, w = ws
    xp.subtract(p, 0.5, out=q)
    xp.multiply(q, q, out=x)
    xp.subtract(0.180625, x, out=x)
    out[...] = _ratio(x, _A, _B, w, out) * q  # |p - 1/2| <= 0.425; the tails are redone below
    tail = xp.nonzero(xp.abs(q) > 0.425)[0]
    if tail.size == 0:
        return out
    pt = p[tail]
    with np.errstate(divide="ignore", invalid="ignore"):  # p = 0 or 1: r = inf, set below
        r = xp.sqrt(-xp.log(xp.minimum(pt, 1.0 - pt)))
        z = xp.empty_like(r)
        for part, c, num, den in ((r <= 5.0, 1.6, _C, _D), (r > 5.0, 5.0, _E, _F)):  # r > 5: p < 1.4e-11, rare
            idx = xp.nonzero(part)[0]
            if idx.size:
                x = r[idx] - c
                z[idx] = _ratio(x, num, den, x.copy(), xp.empty_like(x))
    z[r == xp.inf] = xp.inf
    out[tail] = xp.where(q[tail] < 0, -z, z)
    return out


def _passes(flat_in, flat_out, xp, buffers):
    """(input piece, output piece, work buffers) over L2-sized pieces of the flat arrays (one piece on CuPy)."""
    n = flat_in.shape[0]
    step = min(n, _VALUES) if xp is np else n
    if step == 0:
        return
    ws = [xp.empty(step, dtype=np.float64) for _ in range(buffers)]
    for s in range(0, n, step):
        k = min(step, n - s)
        yield flat_in[s:s + k], flat_out[s:s + k], [w[:k] for w in ws]


def ndtri(p, out=None):
    """The standard normal quantile of float64 probabilities ``p`` (NumPy or CuPy, any shape; into ``out``, float64,
    if given; See [Note: ndtri])."""
    xp = array_module(p)
    p = xp.ascontiguousarray(p, dtype=np.float64)
    out = xp.empty_like(p) if out is None else out
    for piece, o, ws in _passes(p.reshape(-1), out.reshape(-1), xp, 3):
        _ndtri_pass(piece, o, xp, ws)
    return out


def truncated_normal(u, p_lo, p_hi, scale, shift, a, b):
    """shift + scale * ndtri(p_lo + u (p_hi - p_lo)) clipped into [a, b], for float64 uniforms ``u`` (float64, in
    L2-sized passes on NumPy): trunc_normal_'s values (See [Note: Truncated normal values] in hpcfsdp/nn/init.py)."""
    xp = array_module(u)
    out = xp.empty(u.shape, dtype=np.float64)
    for piece, o, ws in _passes(u.reshape(-1), out.reshape(-1), xp, 4):
        p = ws[0]
        xp.multiply(piece, p_hi - p_lo, out=p)
        p += p_lo
        o = _ndtri_pass(p, o, xp, ws[1:])
        o *= scale
        o += shift
        xp.clip(o, a, b, out=o)
    return out


def normal_cdf(x):
    """Phi(x) of a Python float, accurate in both tails' relative sense below 1/2 (math.erfc)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))
