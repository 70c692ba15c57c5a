"""erf and the normal CDF as a rational approximation, vectorised on NumPy or CuPy arrays (a leaf: the autograd
ops and the fused kernels' NumPy twins both evaluate it)."""
import math

__all__ = ["_rational_odd"]

# [Note: erf]
# Neither NumPy nor CuPy-free environments give a vectorised erf, and math.erf per element is far too
# slow. erf(x) = x * P(x^2) / Q(x^2) on |x| <= 4 with degrees (6, 5), fitted here by iteratively
# reweighted least squares (Lawson) against math.erf: max abs error 1.7e-8 in float64 (relative error
# < 2e-8 near 0, where the odd form keeps full relative precision), about 3 ulp of 1.0 evaluated in float32.
# Beyond |x| = 4 erf(x) = sign(x) (1 - 1.5e-8 or less), so clamping costs < 2e-8. All coefficients are
# positive but the last of P: Horner's rule in float32 has no cancellation.
_ERF_P = (1.1283791855567618, 0.1838358553920622, 0.05413784674469526, 0.003793526551674772,
          0.0003785172594783417, 4.687874290934535e-06, -1.310956790345763e-08)
_ERF_Q = (1.0, 0.49625390328465735, 0.11339510549254213, 0.01534699830033233, 0.0012946184711885931,
          6.313639149763128e-05)
_ERF_CLAMP = 4.0
# normal_cdf(x) = 0.5 + 0.5 erf(x / sqrt 2) = 0.5 + x * P'(x^2) / Q'(x^2): the 1/sqrt(2) and 0.5 folded in.
_CDF_P = tuple(c * 0.5 / math.sqrt(2.0) / 2.0 ** k for k, c in enumerate(_ERF_P))
_CDF_Q = tuple(c / 2.0 ** k for k, c in enumerate(_ERF_Q))
_CDF_CLAMP = _ERF_CLAMP * math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _rational_odd(x, out, p, q, clamp, offset, xp):
    """out = offset + c * P(c^2) / Q(c^2) with c = clip(x, -clamp, clamp) (out may not alias x)."""
    dt = out.dtype.type
    c = xp.clip(x, -clamp, clamp)
    t = c * c
    num = t * dt(p[-1])
    num += dt(p[-2])
    for a in p[-3::-1]:
        num *= t
        num += dt(a)
    den = t * dt(q[-1])
    den += dt(q[-2])
    for a in q[-3::-1]:
        den *= t
        den += dt(a)
    num *= c
    xp.divide(num, den, out=out)
    if offset:
        out += dt(offset)
    return out
