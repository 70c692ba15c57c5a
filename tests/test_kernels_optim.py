"""The multi-tensor optimizer kernels (hpcfsdp/_kernels/optim.py): each twin equals PyTorch's published Adam, AdamW and
SGD formulas written here in float64 over several steps, bf16 within bf16 tolerance; the simulated launch of a group of
N tensors is one launch whatever N; a pointer table that does not hold its arrays' addresses is refused.

No GPU and no environment needed: the twins run on NumPy, the launches on hpcfsdp.testing.cuda_sim directly.
"""
import math

import ml_dtypes
import numpy as np
import pytest

from hpcfsdp import _kernels as K
from hpcfsdp._kernels import optim as O
from hpcfsdp._kernels import tables as T
from hpcfsdp._kernels.tables import TableCache
from hpcfsdp.testing import cuda_sim as cs

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = [(5, 3), (4,), (2, 3, 2), (1,)]


def _tensors(dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def _adam_ref(p, grads, lr, b1, b2, eps, wd, decoupled, maximize):
    """torch.optim.Adam / AdamW (PyTorch's documented algorithm) in float64, one parameter over len(grads) steps."""
    p, m, v = p.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        g = -g if maximize else g
        if wd and decoupled:
            p = p * (1 - lr * wd)
        elif wd:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p


def _sgd_ref(p, grads, lr, momentum, dampening, wd, nesterov, maximize):
    p, b = p.astype(np.float64), None
    for g in grads:
        g = -g if maximize else g
        if wd:
            g = g + wd * p
        if momentum:
            b = g if b is None else momentum * b + (1 - dampening) * g
            g = g + momentum * b if nesterov else b
        p = p - lr * g
    return p


def _adam_twin_steps(ps, grads_per_step, dtype, lr, b1, b2, eps, wd, decoupled, maximize):
    ms, vs = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
    for t, gs in enumerate(grads_per_step, 1):
        mode = 0 if wd == 0 else 2 if decoupled else 1
        K.KERNELS["adam_multi"].twin([ps, gs, ms, vs, None, len(ps), 0, 1 - lr * wd, wd, 1 - b1, b2, 1 - b2,
                                      math.sqrt(1 - b2 ** t), eps, -(lr / (1 - b1 ** t)), mode, int(maximize)], dtype)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5), (BF16, 3e-2)])
def test_adam_twin_equals_pytorchs_formulas(decoupled, maximize, dtype, tol):
    ps = _tensors(dtype, 0)
    p0 = [p.astype(np.float64) for p in ps]
    steps = [_tensors(dtype, 1 + t) for t in range(5)]
    hp = dict(lr=1e-2, b1=0.8, b2=0.95, eps=1e-6, wd=0.1, decoupled=decoupled, maximize=maximize)
    _adam_twin_steps(ps, steps, dtype, **hp)
    for i, p in enumerate(ps):
        ref = _adam_ref(p0[i], [s[i].astype(np.float64) for s in steps], **hp)
        np.testing.assert_allclose(p.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("kw", [dict(momentum=0.0, dampening=0.0, wd=0.0, nesterov=False, maximize=False),
                                dict(momentum=0.0, dampening=0.0, wd=0.01, nesterov=False, maximize=True),
                                dict(momentum=0.9, dampening=0.1, wd=0.01, nesterov=False, maximize=False),
                                dict(momentum=0.9, dampening=0.0, wd=0.0, nesterov=True, maximize=True)])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5), (BF16, 3e-2)])
def test_sgd_twins_equal_pytorchs_formulas(kw, dtype, tol):
    ps = _tensors(dtype, 0)
    p0 = [p.astype(np.float64) for p in ps]
    steps = [_tensors(dtype, 1 + t) for t in range(5)]
    bufs = [np.empty_like(p) for p in ps]
    for t, gs in enumerate(steps):
        if kw["momentum"]:
            K.KERNELS["sgd_momentum_multi"].twin([ps, gs, bufs, None, len(ps), 0, 0.05, kw["wd"], kw["momentum"],
                                                  1 - kw["dampening"], int(t == 0), int(kw["nesterov"]),
                                                  int(kw["maximize"])], dtype)
        else:
            K.KERNELS["sgd_multi"].twin([ps, gs, None, len(ps), 0, 0.05, kw["wd"], int(kw["maximize"])], dtype)
    for i, p in enumerate(ps):
        ref = _sgd_ref(p0[i], [s[i].astype(np.float64) for s in steps], 0.05, kw["momentum"], kw["dampening"],
                       kw["wd"], kw["nesterov"], kw["maximize"])
        np.testing.assert_allclose(p.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16])
def test_norm_and_clip_twins_equal_the_formula(dtype):
    gs = _tensors(dtype, 3)
    partials, sumsq, norm = np.empty(4), np.empty(1), np.empty(1, dtype)
    K.KERNELS["sumsq_partial"].twin([gs, None, len(gs), 0, partials], dtype)
    K.KERNELS["sumsq_finish"].twin([partials, np.int32(4), sumsq, norm], dtype)
    ref = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in gs))
    assert sumsq[0] == pytest.approx(ref * ref, rel=1e-12)
    assert float(norm[0]) == pytest.approx(ref, rel=2 ** -8 if dtype == BF16 else 1e-7)
    before = [g.astype(np.float64) for g in gs]
    K.KERNELS["clip_scale"].twin([gs, None, len(gs), 0, norm, 1.0], dtype)
    coef = min(1.0, 1.0 / (float(norm[0]) + 1e-6))
    for g, b in zip(gs, before):
        np.testing.assert_allclose(g.astype(np.float64), b * coef, rtol=2 ** -7 if dtype == BF16 else 1e-6)


# -- on the simulated device -----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _sim_module(monkeypatch):
    """The simulation as the array module of its arrays, its pinned memory for the tables (not installed as cupy)."""
    monkeypatch.setattr(O, "array_module", lambda a: cs)
    monkeypatch.setattr(T, "array_module", lambda a: cs)
    monkeypatch.setattr(T, "pinned_empty", lambda n, dtype: cs.cupyx.empty_pinned(n, dtype))
    monkeypatch.setattr(K._registry, "_module", lambda family: cs.RawModule(
        code=K.source(family), options=K._registry.OPTIONS, name_expressions=K.name_expressions(family)))


def _on_device(n, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(int(rng.integers(1, 40)),) for _ in range(n)]
    return [[cs.asarray(rng.standard_normal(s).astype(np.float32)) for s in shapes] for _ in range(4)]


@pytest.mark.parametrize("n", [1, 12, 40])
def test_a_group_of_n_tensors_is_one_launch(n):
    ps, gs, ms, vs = _on_device(n)
    for m, v in zip(ms, vs):
        m[...] = 0
        v[...] = 0
    host = [p.get() for p in ps]
    cache = TableCache()
    kw = dict(decay=1.0, wd=0.0, c1=0.1, beta2=0.999, c2=0.001, bc2_sqrt=math.sqrt(0.001), eps=1e-8,
              neg_step=-(1e-3 / 0.1), mode=0, maximize=False)
    with cs.counting() as c:
        O.adam_step(cache, "t", ps, gs, ms, vs, **kw)
    assert c.launches == 1 and c.host_syncs == [], (c.launches_by_op, c.sites())
    ref_ms, ref_vs = [np.zeros_like(h) for h in host], [np.zeros_like(h) for h in host]
    K.KERNELS["adam_multi"].twin([host, [g.get() for g in gs], ref_ms, ref_vs, None, n, 0,
                                  *list(kw.values())[:8], 0, 0], np.float32)
    for p, r in zip(ps, host):
        np.testing.assert_array_equal(p.get(), r)
    with cs.counting() as c:
        O.adam_step(cache, "t", ps, gs, ms, vs, **kw)
    assert c.launches == 1 and cache.uploads == 1  # the table stayed on the device


def test_a_pointer_table_must_hold_its_arrays_addresses():
    ps, gs, _, _ = _on_device(3)
    cache = TableCache()
    (tp, tg), off, total = cache.tables("t", [ps, gs])
    wrong = K.PointerTable(tp.ptrs, [ps[1], ps[0], ps[2]])
    spec = K.KERNELS["sgd_multi"]
    fn = cs.RawModule(code=K.source("optim"), name_expressions=K.name_expressions("optim")).get_function(
        spec.expression(np.float32))
    with pytest.raises(cs.CudaSimError, match="stale or mistyped pointer table"):
        fn((1,), (256,), (wrong, tg, off, np.int32(3), np.int64(total), np.float64(0.1), np.float64(0), np.int32(0)))
    with pytest.raises(TypeError, match=r"table grads\[1\] needs a C-contiguous float32 array, got float64"):
        K._registry._checked_args(spec, np.float32, (tp, K.PointerTable(tg.ptrs, [gs[0], gs[1].astype(np.float64),
                                                                                  gs[2]]), off, 3, total, 0.1, 0, 0))
    with pytest.raises(ValueError, match="access 'inout' is for tables"):
        K.Param("x", "in", "T", "inout")
