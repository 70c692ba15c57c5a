"""NumPy float64 references for the nn tests: direct loops for convolution, transposed convolution, pooling
and interpolation (what hpcfsdp's vectorised ops are checked against)."""
import math

import numpy as np


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)

def conv_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Direct convolution: one dot product per (sample, output channel, output position)."""
    nd = x.ndim - 2
    st, dl, ks = _tup(stride, nd), _tup(dilation, nd), w.shape[2:]
    if padding == "same":
        pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(ks, dl)]
    else:
        pads = [(p, p) for p in _tup(0 if padding == "valid" else padding, nd)]
    xpad = np.pad(x, [(0, 0), (0, 0)] + pads)
    n, c = x.shape[:2]
    o = w.shape[0]
    out_size = [(xpad.shape[2 + i] - dl[i] * (ks[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    out = np.zeros([n, o] + out_size)
    cg, og = c // groups, o // groups
    for i in range(n):
        for oc in range(o):
            g = oc // og
            for pos in np.ndindex(*out_size):
                acc = 0.0
                for ci in range(cg):
                    for tap in np.ndindex(*ks):
                        idx = tuple(pos[d] * st[d] + tap[d] * dl[d] for d in range(nd))
                        acc += xpad[(i, g * cg + ci) + idx] * w[(oc, ci) + tap]
                out[(i, oc) + pos] = acc + (b[oc] if b is not None else 0.0)
    return out

def convt_ref(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Scatter: every input value adds value * weight tap into the output, then the padding is cropped."""
    nd = x.ndim - 2
    st, pd, op, dl = (_tup(v, nd) for v in (stride, padding, output_padding, dilation))
    n, c = x.shape[:2]
    ks = w.shape[2:]
    og = w.shape[1]
    o = og * groups
    cg = c // groups
    full = [(x.shape[2 + i] - 1) * st[i] + dl[i] * (ks[i] - 1) + 1 + op[i] for i in range(nd)]
    out = np.zeros([n, o] + full)
    for i in range(n):
        for ci in range(c):
            g = ci // cg
            for pos in np.ndindex(*x.shape[2:]):
                v = x[(i, ci) + pos]
                for oj in range(og):
                    for tap in np.ndindex(*ks):
                        q = tuple(pos[d] * st[d] + tap[d] * dl[d] for d in range(nd))
                        out[(i, g * og + oj) + q] += v * w[(ci, oj) + tap]
    out = out[(slice(None), slice(None)) + tuple(slice(pd[d], full[d] - pd[d]) for d in range(nd))]
    if b is not None:
        out = out + b.reshape((1, o) + (1,) * nd)
    return out

def pool_size(n, k, s, p, d, ceil):
    """PyTorch's documented pooling output length."""
    num = n + 2 * p - d * (k - 1) - 1
    o = (math.ceil(num / s) if ceil else num // s) + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o

def maxpool_ref(x, k, s, p, d, ceil):
    """Max over each window's positions inside the input; the first maximum's flat index."""
    nd = x.ndim - 2
    k, s, p, d = _tup(k, nd), _tup(s, nd), _tup(p, nd), _tup(d, nd)
    sp = x.shape[2:]
    osz = [pool_size(sp[i], k[i], s[i], p[i], d[i], ceil) for i in range(nd)]
    out = np.zeros(x.shape[:2] + tuple(osz))
    idx = np.zeros(out.shape, dtype=np.int64)
    for nc in np.ndindex(*x.shape[:2]):
        for pos in np.ndindex(*osz):
            best, where = -np.inf, None
            for tap in np.ndindex(*k):
                q = tuple(pos[i] * s[i] - p[i] + tap[i] * d[i] for i in range(nd))
                if all(0 <= q[i] < sp[i] for i in range(nd)) and (where is None or x[nc + q] > best):
                    best, where = x[nc + q], q
            out[nc + pos] = best
            idx[nc + pos] = np.ravel_multi_index(where, sp)
    return out, idx

def avgpool_ref(x, k, s, p, ceil, count_include_pad=True, divisor=None):
    nd = x.ndim - 2
    k, s, p = _tup(k, nd), _tup(s, nd), _tup(p, nd)
    sp = x.shape[2:]
    osz = [pool_size(sp[i], k[i], s[i], p[i], 1, ceil) for i in range(nd)]
    out = np.zeros(x.shape[:2] + tuple(osz))
    for pos in np.ndindex(*osz):
        sl, incl, excl = [], 1, 1
        for i in range(nd):
            start = pos[i] * s[i] - p[i]
            end = min(start + k[i], sp[i] + p[i])  # a ceil-mode window stops at the padded edge
            incl *= end - start
            lo, hi = max(start, 0), min(end, sp[i])
            excl *= hi - lo
            sl.append(slice(lo, hi))
        total = x[(Ellipsis,) + tuple(sl)].sum(axis=tuple(range(2, 2 + nd)))
        div = divisor if divisor else (incl if count_include_pad else excl)
        out[(Ellipsis,) + pos] = total / div
    return out

def adaptive_ref(x, osz):
    nd = x.ndim - 2
    sp = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(osz))
    for pos in np.ndindex(*osz):
        sl = tuple(slice(math.floor(pos[i] * sp[i] / osz[i]), math.ceil((pos[i] + 1) * sp[i] / osz[i]))
                   for i in range(nd))
        out[(Ellipsis,) + pos] = x[(Ellipsis,) + sl].mean(axis=tuple(range(2, 2 + nd)))
    return out

def adaptive_max_ref(x, out_size):
    """Max over [floor(i n / o), ceil((i + 1) n / o)) windows; flat index of the first maximum."""
    nd = len(out_size)
    sp = x.shape[2:]
    out = np.zeros(x.shape[:2] + tuple(out_size))
    idx = np.zeros(out.shape, dtype=np.int64)
    for nc in np.ndindex(*x.shape[:2]):
        for pos in np.ndindex(*out_size):
            rng_ = [range(pos[d] * sp[d] // out_size[d], -(-(pos[d] + 1) * sp[d] // out_size[d])) for d in range(nd)]
            best, where = -np.inf, None
            for q in np.ndindex(*[len(r) for r in rng_]):
                q = tuple(rng_[d][q[d]] for d in range(nd))
                if where is None or x[nc + q] > best:
                    best, where = x[nc + q], q
            out[nc + pos] = best
            idx[nc + pos] = np.ravel_multi_index(where, sp)
    return out, idx

def linear_src(n_in, n_out, align_corners, scale_factor=None):
    """(i0, i1, lambda) per output position: the align_corners formulas of linear interpolation."""
    res = []
    for j in range(n_out):
        if n_in == n_out:
            res.append((j, j, 0.0))
            continue
        if align_corners:
            src = j * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            scale = 1.0 / scale_factor if scale_factor else n_in / n_out
            src = max((j + 0.5) * scale - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        res.append((i0, i1, src - i0))
    return res

def bilinear_ref(x, out_hw, align_corners, scale=(None, None)):
    """Direct bilinear interpolation: four taps per output pixel."""
    h, w = x.shape[2:]
    rows = linear_src(h, out_hw[0], align_corners, scale[0])
    cols = linear_src(w, out_hw[1], align_corners, scale[1])
    out = np.zeros(x.shape[:2] + tuple(out_hw))
    for a, (r0, r1, lr) in enumerate(rows):
        for b, (c0, c1, lc) in enumerate(cols):
            out[:, :, a, b] = ((1 - lr) * ((1 - lc) * x[:, :, r0, c0] + lc * x[:, :, r0, c1])
                               + lr * ((1 - lc) * x[:, :, r1, c0] + lc * x[:, :, r1, c1]))
    return out
