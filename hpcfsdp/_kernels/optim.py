"""Multi-tensor optimizer steps (Adam/AdamW, SGD) and gradient-norm clipping as fused kernels (optim.cu)."""
from __future__ import annotations


import numpy as np

from .._backend import array_module
from ._registry import kernel, launch

__all__ = ["adam_step", "sgd_step", "sumsq_norm", "clip_scale", "BLOCK", "grid_for"]

BLOCK = 256  # threads per block of every kernel here: a multiple of 32 (block_sum's warps), at most 1024


def grid_for(n: int, block: int = BLOCK) -> int:
    """Blocks for a grid-stride loop over ``n`` elements: at most 8 per SM of an H200 (132 SMs)."""
    return max(1, min((int(n) + block - 1) // block, 132 * 8))


# -- twins: the concatenation's math on the unwrapped arrays, in the kernels' operation order ------------------
def _acc(dtype):
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


@kernel("adam_multi", "optim", [("params", "table", "T", "inout"), ("grads", "table"),
                                ("exp_avgs", "table", "T", "inout"), ("exp_avg_sqs", "table", "T", "inout"),
                                ("offsets", "in", "long long"), ("n", "scalar", "int"),
                                ("total", "scalar", "long long"), ("decay", "scalar", "double"),
                                ("wd", "scalar", "double"), ("c1", "scalar", "double"),
                                ("beta2", "scalar", "double"), ("c2", "scalar", "double"),
                                ("bc2_sqrt", "scalar", "double"), ("eps", "scalar", "double"),
                                ("neg_step", "scalar", "double"), ("mode", "scalar", "int"),
                                ("maximize", "scalar", "int")])
def _adam_twin(args, dtype):
    ps, gs, ms, vs, _off, _n, _total, decay, wd, c1, beta2, c2, bc2_sqrt, eps, neg_step, mode, maximize = args
    a = _acc(dtype).type
    decay, wd, c1, beta2, c2, bc2_sqrt, eps, neg_step = (a(s) for s in (decay, wd, c1, beta2, c2, bc2_sqrt, eps,
                                                                        neg_step))
    for p, g, m, v in zip(ps, gs, ms, vs):
        g = g.astype(a)
        if maximize:
            g = -g
        x = p.astype(a)
        if mode == 2:
            x = x * decay
        elif mode == 1:
            g = g + wd * x
        mm = m.astype(a)
        mm = mm + (g - mm) * c1
        vv = v.astype(a) * beta2 + (g * g) * c2
        x = x + (mm / (np.sqrt(vv) / bc2_sqrt + eps)) * neg_step
        m[...], v[...], p[...] = mm.astype(dtype), vv.astype(dtype), x.astype(dtype)


@kernel("sgd_multi", "optim", [("params", "table", "T", "inout"), ("grads", "table"),
                               ("offsets", "in", "long long"), ("n", "scalar", "int"),
                               ("total", "scalar", "long long"), ("lr", "scalar", "double"),
                               ("wd", "scalar", "double"), ("maximize", "scalar", "int")])
def _sgd_twin(args, dtype):
    ps, gs, _off, _n, _total, lr, wd, maximize = args
    a = _acc(dtype).type
    for p, g in zip(ps, gs):
        g = -g.astype(a) if maximize else g.astype(a)
        x = p.astype(a)
        if wd != 0:
            g = g + a(wd) * x
        p[...] = (x - a(lr) * g).astype(dtype)


@kernel("sgd_momentum_multi", "optim", [("params", "table", "T", "inout"), ("grads", "table"),
                                        ("bufs", "table", "T", "inout"), ("offsets", "in", "long long"),
                                        ("n", "scalar", "int"), ("total", "scalar", "long long"),
                                        ("lr", "scalar", "double"), ("wd", "scalar", "double"),
                                        ("momentum", "scalar", "double"), ("undamped", "scalar", "double"),
                                        ("first", "scalar", "int"), ("nesterov", "scalar", "int"),
                                        ("maximize", "scalar", "int")])
def _sgd_momentum_twin(args, dtype):
    ps, gs, bs, _off, _n, _total, lr, wd, momentum, undamped, first, nesterov, maximize = args
    a = _acc(dtype).type
    for p, g, b in zip(ps, gs, bs):
        g = -g.astype(a) if maximize else g.astype(a)
        x = p.astype(a)
        if wd != 0:
            g = g + a(wd) * x
        bb = g if first else b.astype(a) * a(momentum) + a(undamped) * g
        bb = bb.astype(dtype).astype(a)
        d = g + a(momentum) * bb if nesterov else bb
        b[...] = bb.astype(dtype)
        p[...] = (x - a(lr) * d).astype(dtype)


@kernel("sumsq_partial", "optim", [("grads", "table"), ("offsets", "in", "long long"), ("n", "scalar", "int"),
                                   ("total", "scalar", "long long"), ("partials", "out", "double")])
def _sumsq_partial_twin(args, dtype):
    gs, _off, _n, _total, partials = args
    partials[...] = 0.0  # (the blocks' split is the GPU's; the sum is the same up to its order)
    partials[0] = sum(float(np.dot(x, x)) for x in (g.astype(np.float64).reshape(-1) for g in gs))


@kernel("sumsq_finish", "optim", [("partials", "in", "double"), ("n_partials", "scalar", "int"),
                                  ("sumsq", "out", "double"), ("norm", "out")], block_max=BLOCK)
def _sumsq_finish_twin(args, dtype):
    partials, n_partials, sumsq, norm = args
    s = float(partials[:n_partials].sum())
    sumsq[0] = s
    norm[0] = np.asarray(np.sqrt(s), _acc(dtype)).astype(dtype)


@kernel("clip_scale", "optim", [("grads", "table", "T", "inout"), ("offsets", "in", "long long"),
                                ("n", "scalar", "int"), ("total", "scalar", "long long"), ("norm", "in"),
                                ("max_norm", "scalar", "double")])
def _clip_scale_twin(args, dtype):
    gs, _off, _n, _total, norm, max_norm = args
    a = _acc(dtype).type
    d = (norm.astype(a)[0] + a(1e-6)).astype(dtype).astype(a)
    c = (a(max_norm) / d).astype(dtype).astype(a)
    c = np.minimum(c, a(1))  # NaN stays NaN
    with np.errstate(invalid="ignore"):
        for g in gs:
            g[...] = (g.astype(a) * c).astype(dtype)


# -- launchers ------------------------------------------------------------------------------------------------
def _run(name, dtype, total, args):
    grid = grid_for(total)
    assert BLOCK % 32 == 0 and BLOCK <= 1024 and grid >= 1
    launch(name, dtype, grid, BLOCK, args)


def adam_step(cache, tag, params, grads, exp_avgs, exp_avg_sqs, *, decay, wd, c1, beta2, c2, bc2_sqrt, eps,
              neg_step, mode, maximize) -> None:
    """One Adam/AdamW update of every (param, grad, exp_avg, exp_avg_sq) of one dtype in one launch."""
    (tp, tg, tm, tv), off, total = cache.tables(tag, [params, grads, exp_avgs, exp_avg_sqs])
    _run("adam_multi", params[0].dtype, total, (tp, tg, tm, tv, off, len(params), total, decay, wd, c1, beta2, c2,
                                                 bc2_sqrt, eps, neg_step, mode, int(maximize)))


def sgd_step(cache, tag, params, grads, bufs, *, lr, wd, momentum, dampening, first, nesterov, maximize) -> None:
    """One SGD update of every (param, grad[, momentum buffer]) of one dtype in one launch (bufs None: no momentum;
    ``first``: the buffers are written, not read)."""
    dtype = params[0].dtype
    if bufs is None:
        (tp, tg), off, total = cache.tables(tag, [params, grads])
        _run("sgd_multi", dtype, total, (tp, tg, off, len(params), total, lr, wd, int(maximize)))
        return
    (tp, tg, tb), off, total = cache.tables(tag, [params, grads, bufs])
    _run("sgd_momentum_multi", dtype, total, (tp, tg, tb, off, len(params), total, lr, wd, momentum,
                                              1 - dampening, int(first), int(nesterov), int(maximize)))


def sumsq_norm(cache, tag, grads_by_dtype, out_dtype):
    """(sum of squares as a (1,) float64 device array, its square root as a 0-d ``out_dtype`` device array) of all
    the grads (a dict dtype -> arrays): one partial launch per dtype, one finishing launch."""
    xp = array_module(next(iter(grads_by_dtype.values()))[0])
    grids = {dt: grid_for(sum(int(g.size) for g in gs)) for dt, gs in grads_by_dtype.items()}
    partials = xp.empty(sum(grids.values()), np.float64)
    at = 0
    for dt, gs in grads_by_dtype.items():
        (tg,), off, total = cache.tables((tag, np.dtype(dt).str), [gs])
        launch("sumsq_partial", dt, grids[dt], BLOCK, (tg, off, len(gs), total, partials[at:at + grids[dt]]))
        at += grids[dt]
    sumsq, norm = xp.empty(1, np.float64), xp.empty(1, out_dtype)
    launch("sumsq_finish", out_dtype, 1, BLOCK, (partials, partials.size, sumsq, norm))
    return sumsq, norm.reshape(())


def clip_scale(cache, tag, grads, norm, max_norm: float) -> None:
    """grads *= min(1, max_norm / (norm + 1e-6)) in one launch, ``norm`` a device scalar of the grads' dtype."""
    (tg,), off, total = cache.tables(tag, [grads])
    _run("clip_scale", grads[0].dtype, total, (tg, off, len(grads), total, norm.reshape(1), float(max_norm)))
