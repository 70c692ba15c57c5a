"""Central finite-difference gradient check in float64 (shared by the autograd and functional tests)."""
import math

import numpy as np

import hpcfsdp as hp


def _outputs(out):
    return out if isinstance(out, (tuple, list)) else (out,)


def gradcheck(fn, arrays, *, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0, check=None):
    """Compare backward() of ``fn(*tensors)`` with central differences of L = sum_i <out_i, g_i>.

    ``arrays``: float64 ndarrays (views allowed: transposed / sliced inputs stay non-contiguous), one leaf
    each; None entries are passed through as None. ``check``: indices of inputs to check (default: all).
    Returns the analytic gradients.
    """
    rng = np.random.default_rng(seed)
    arrays = [a if (a is None or isinstance(a, np.ndarray)) else np.array(a, dtype=np.float64) for a in arrays]
    leaves = [None if a is None else hp.Tensor._wrap(a, requires_grad=True) for a in arrays]
    outs = _outputs(fn(*leaves))
    diff = [o for o in outs if o.requires_grad]
    assert diff, "function output does not require grad"
    gs = [rng.standard_normal(o.shape) for o in diff]
    hp.autograd.backward(diff, [hp.tensor(g) for g in gs])

    def loss():
        with hp.no_grad():
            os_ = [o for o in _outputs(fn(*leaves)) if o.dtype == np.float64]
        return sum(float((o.numpy() * g).sum()) for o, g in zip(os_, gs))

    idx = range(len(arrays)) if check is None else check
    grads = []
    for i in idx:
        a = arrays[i]
        if a is None:
            continue
        num = np.zeros(a.shape)
        for j in np.ndindex(a.shape):
            old = a[j]
            a[j] = old + eps
            lp = loss()
            a[j] = old - eps
            lm = loss()
            a[j] = old
            num[j] = (lp - lm) / (2 * eps)
        got = leaves[i].grad
        assert got is not None, f"input {i} got no gradient"
        got = got.numpy()
        assert got.shape == a.shape and got.dtype == np.float64, (got.shape, got.dtype)
        np.testing.assert_allclose(got, num, atol=atol, rtol=rtol, err_msg=f"gradient of input {i}")
        grads.append(got)
    return grads


LAYOUTS = ["c", "t", "s"]  # rand()'s layouts: contiguous, transposed, strided


def rand(rng, *shape, layout="c"):
    """A float64 array of ``shape``: C-contiguous ('c'), a transposed view ('t') or a strided slice ('s')."""
    if layout == "c":
        return rng.standard_normal(shape)
    if layout == "t":
        return rng.standard_normal(shape[::-1]).T
    if layout == "s":
        big = rng.standard_normal(tuple(2 * s for s in shape))
        return big[tuple(slice(None, None, 2) for _ in shape)]
    raise ValueError(layout)


def _np(t):
    """A tensor's values as a NumPy array (detached, on the host)."""
    return t.detach().cpu().numpy()


def _distinct(rng, *shape):
    """float64 values with no ties and no element near 0 (sort/topk/norm gradients are smooth there)."""
    n = math.prod(shape)
    return ((rng.permutation(n) + 1.0) * np.sign(rng.standard_normal(n)) / n + 0.01 * rng.random(n)).reshape(shape)


def fd_vjp(f, a, g, h=1e-6):
    """d/da of sum(g * f(a)) by central differences, element by element (float64 NumPy): the reference the fused
    kernels' backward twins are held to."""
    out = np.zeros_like(a)
    for i in np.ndindex(*a.shape):
        e = np.zeros_like(a)
        e[i] = h
        out[i] = ((g * f(a + e)).sum() - (g * f(a - e)).sum()) / (2 * h)
    return out
