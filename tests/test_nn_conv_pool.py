"""Convolution, pooling, padding, flatten and channel dropout against nested-loop NumPy float64 references.

Each op: forward values against a direct loop written here, finite-difference gradients (tests/_gradcheck.py),
PyTorch's output sizes and its errors for bad input; the layers: init, meta construction, reprs.
"""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck, rand


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


# -- references ------------------------------------------------------------------------------------------
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


# -- convolution -----------------------------------------------------------------------------------------
CONV2D_CASES = [
    dict(),
    dict(stride=2),
    dict(padding=1, bias=False),
    dict(padding="same"),
    dict(padding="valid", stride=(2, 1)),
    dict(padding=(2, 1), dilation=(2, 1), stride=(1, 2)),
    dict(groups=2, padding="same", dilation=2),
    dict(groups=4),
]


@pytest.mark.parametrize("case", CONV2D_CASES, ids=[str(c) for c in CONV2D_CASES])
def test_conv2d_values_and_grad(rng, case):
    case = dict(case)
    use_bias = case.pop("bias", True)
    g = case.get("groups", 1)
    x = rand(rng, 2, 4, 6, 5, layout="t")
    w = rng.standard_normal((4, 4 // g, 3, 2))
    b = rng.standard_normal(4) if use_bias else None
    got = F.conv2d(hp.tensor(x), hp.tensor(w), None if b is None else hp.tensor(b), **case)
    np.testing.assert_allclose(got.numpy(), conv_ref(x, w, b, **case), rtol=1e-12, atol=1e-12)
    gradcheck(lambda a, ww, bb: F.conv2d(a, ww, bb, **case), [x, w, b])


def test_conv2d_same_even_kernel_pads_right(rng):
    x, w = rng.standard_normal((1, 2, 5, 6)), rng.standard_normal((3, 2, 2, 4))
    out = F.conv2d(hp.tensor(x), hp.tensor(w), padding="same", dilation=(1, 1))
    assert out.shape == (1, 3, 5, 6)
    np.testing.assert_allclose(out.numpy(), conv_ref(x, w, padding="same"), rtol=1e-12, atol=1e-12)


def test_conv1d_and_conv3d(rng):
    x, w, b = rng.standard_normal((2, 3, 9)), rng.standard_normal((4, 3, 3)), rng.standard_normal(4)
    kw = dict(stride=2, padding=2, dilation=2)
    np.testing.assert_allclose(F.conv1d(hp.tensor(x), hp.tensor(w), hp.tensor(b), **kw).numpy(),
                               conv_ref(x, w, b, **kw), rtol=1e-12, atol=1e-12)
    gradcheck(lambda a, ww, bb: F.conv1d(a, ww, bb, **kw), [x, w, b])
    x3, w3 = rng.standard_normal((1, 2, 4, 3, 4)), rng.standard_normal((2, 1, 2, 2, 3))
    kw3 = dict(padding="same", groups=2)
    np.testing.assert_allclose(F.conv3d(hp.tensor(x3), hp.tensor(w3), **kw3).numpy(), conv_ref(x3, w3, **kw3),
                               rtol=1e-12, atol=1e-12)
    gradcheck(lambda a, ww: F.conv3d(a, ww, **kw3), [x3, w3])


def test_conv_unbatched_input(rng):
    x, w = rng.standard_normal((3, 6, 5)), rng.standard_normal((2, 3, 3, 3))
    out = F.conv2d(hp.tensor(x), hp.tensor(w), padding=1)
    assert out.shape == (2, 6, 5)
    np.testing.assert_allclose(out.numpy(), conv_ref(x[None], w, padding=1)[0], rtol=1e-12, atol=1e-12)
    gradcheck(lambda a: F.conv1d(a, hp.tensor(w[:, :, 0])), [x[:, 0]])


@pytest.mark.parametrize("seed", range(4))
def test_conv_output_size_formula(seed):
    r = np.random.default_rng(seed)
    for _ in range(10):
        k, s, p, d = (int(v) for v in (r.integers(1, 4), r.integers(1, 4), r.integers(0, 3), r.integers(1, 3)))
        n = int(r.integers(d * (k - 1) + 1 - 2 * p if d * (k - 1) + 1 > 2 * p else 1, 12))
        out = F.conv2d(hp.zeros(1, 1, n, n + 1), hp.zeros(1, 1, k, k), stride=s, padding=p, dilation=d)
        assert out.shape == (1, 1, (n + 2 * p - d * (k - 1) - 1) // s + 1, (n + 1 + 2 * p - d * (k - 1) - 1) // s + 1)


def test_conv_float32_and_half(rng):
    x, w = rng.standard_normal((2, 3, 8, 8)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(F.conv2d(hp.tensor(x), hp.tensor(w)).numpy(), ref, rtol=1e-5, atol=1e-5)
    for dt in (hp.float16, hp.bfloat16):
        xt, wt = hp.tensor(x, dtype=dt, requires_grad=True), hp.tensor(w, dtype=dt, requires_grad=True)
        out = F.conv2d(xt, wt)
        assert out.dtype == dt
        np.testing.assert_allclose(out.float().detach().numpy(), ref, rtol=0.05, atol=0.1)
        out.sum().backward()
        assert xt.grad.dtype == dt and wt.grad.dtype == dt


def test_conv_errors():
    x, w = hp.zeros(2, 3, 8, 8), hp.zeros(4, 3, 3, 3)
    with pytest.raises(RuntimeError, match=r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got "
                                           r"input of size: \[3, 8\]"):
        F.conv2d(hp.zeros(3, 8), w)
    with pytest.raises(RuntimeError, match=r"expected input\[2, 5, 8, 8\] to have 3 channels, but got 5 channels"):
        F.conv2d(hp.zeros(2, 5, 8, 8), w)
    with pytest.raises(RuntimeError, match=r"Calculated padded input size per channel: \(2 x 2\). Kernel size: "
                                           r"\(3 x 3\). Kernel size can't be greater than actual input size"):
        F.conv2d(hp.zeros(2, 3, 2, 2), w)
    with pytest.raises(RuntimeError, match="padding='same' is not supported for strided convolutions"):
        F.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(RuntimeError, match="Invalid padding string: 'foo'"):
        F.conv2d(x, w, padding="foo")
    with pytest.raises(RuntimeError, match="non-positive stride"):
        F.conv2d(x, w, stride=0)
    with pytest.raises(RuntimeError, match="negative padding"):
        F.conv2d(x, w, padding=-1)
    with pytest.raises(RuntimeError, match="non-positive dilation"):
        F.conv2d(x, w, dilation=0)
    with pytest.raises(RuntimeError, match="a list of 2 values"):
        F.conv2d(x, w, stride=(1, 2, 3))
    with pytest.raises(RuntimeError, match="expected bias to be 1-dimensional with 4 elements"):
        F.conv2d(x, w, bias=hp.zeros(5))
    with pytest.raises(RuntimeError, match=r"Given groups=2, weight of size \[4, 3, 3, 3\], expected input\[2, 3, 8, "
                                           r"8\] to have 6 channels"):
        F.conv2d(x, w, groups=2)
    with pytest.raises(RuntimeError, match="should be the same"):
        F.conv2d(x.double(), w)
    with pytest.raises(RuntimeError, match="4-D weight"):
        F.conv2d(x, hp.zeros(4, 3, 3))


def test_conv_layer_init_attributes_and_repr():
    hp.manual_seed(0)
    c = nn.Conv2d(4, 6, (3, 2), groups=2)
    fan_in = 2 * 3 * 2
    assert c.weight.shape == (6, 2, 3, 2) and c.bias.shape == (6,)
    assert np.abs(c.weight.detach().numpy()).max() <= 1 / math.sqrt(fan_in)
    assert np.abs(c.bias.detach().numpy()).max() <= 1 / math.sqrt(fan_in)
    assert c.weight.detach().numpy().std() > 0.3 / math.sqrt(fan_in)  # uniform, not constant
    assert (c.kernel_size, c.stride, c.padding, c.dilation, c.groups) == ((3, 2), (1, 1), (0, 0), (1, 1), 2)
    assert c.output_padding == (0, 0) and c.transposed is False and c.padding_mode == "zeros"
    assert repr(nn.Conv2d(1, 32, 3, 1)) == "Conv2d(1, 32, kernel_size=(3, 3), stride=(1, 1))"
    assert repr(nn.Conv2d(3, 8, (3, 5), stride=2, padding=1, dilation=2, bias=False, padding_mode="reflect")) == (
        "Conv2d(3, 8, kernel_size=(3, 5), stride=(2, 2), padding=(1, 1), dilation=(2, 2), bias=False, "
        "padding_mode=reflect)")
    assert repr(nn.Conv2d(4, 8, 3, padding="same", groups=2)) == \
        "Conv2d(4, 8, kernel_size=(3, 3), stride=(1, 1), padding=same, groups=2)"
    assert repr(nn.Conv1d(4, 8, 3, padding="valid")) == "Conv1d(4, 8, kernel_size=(3,), stride=(1,), padding=valid)"
    assert repr(nn.Conv3d(2, 2, 1)) == "Conv3d(2, 2, kernel_size=(1, 1, 1), stride=(1, 1, 1))"
    assert list(c.state_dict()) == ["weight", "bias"]
    d = nn.Conv1d(2, 3, 2, bias=False, dtype=hp.float64)
    assert d.bias is None and d.weight.dtype == hp.float64
    m = nn.Conv2d(3, 5, 3, device="meta")
    assert m.weight.device.type == "meta" and m.weight.shape == (5, 3, 3, 3)


def test_conv_layer_forward_and_padding_modes(rng):
    x = rng.standard_normal((2, 2, 5, 6))
    c = nn.Conv2d(2, 3, 3, padding=1, dtype=hp.float64)
    w, b = c.weight.detach().numpy(), c.bias.detach().numpy()
    np.testing.assert_allclose(c(hp.tensor(x)).detach().numpy(), conv_ref(x, w, b, padding=1), rtol=1e-12)
    for mode, np_mode in (("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")):
        m = nn.Conv2d(2, 3, 3, padding=(1, 2), padding_mode=mode, dtype=hp.float64)
        xp_ = np.pad(x, [(0, 0), (0, 0), (1, 1), (2, 2)], mode=np_mode)
        ref = conv_ref(xp_, m.weight.detach().numpy(), m.bias.detach().numpy())
        np.testing.assert_allclose(m(hp.tensor(x)).detach().numpy(), ref, rtol=1e-12, atol=1e-12)
    same = nn.Conv2d(2, 2, 4, padding="same", padding_mode="circular", dtype=hp.float64)
    assert same(hp.tensor(x)).shape == (2, 2, 5, 6)


def test_conv_layer_errors():
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="out_channels must be divisible by groups"):
        nn.Conv2d(4, 3, 3, groups=2)
    with pytest.raises(ValueError, match="groups must be a positive integer"):
        nn.Conv2d(4, 4, 3, groups=0)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided convolutions"):
        nn.Conv2d(4, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="Invalid padding string 'foo'"):
        nn.Conv2d(4, 4, 3, padding="foo")
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv2d(4, 4, 3, padding_mode="foo")
    with pytest.raises(RuntimeError, match="Padding size should be less than the corresponding input dimension"):
        nn.Conv2d(4, 4, 3, padding_mode="reflect", padding=5)(hp.zeros(1, 4, 4, 4))


# -- pooling ---------------------------------------------------------------------------------------------
MAXPOOL_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), dilation=(2, 1), ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=2, stride=1, padding=1, dilation=2),
]


@pytest.mark.parametrize("case", MAXPOOL_CASES, ids=[str(c) for c in MAXPOOL_CASES])
def test_max_pool2d_values_indices_and_grad(rng, case):
    x = rand(rng, 2, 2, 7, 6, layout="s")
    out, idx = F.max_pool2d(hp.tensor(x), **case, return_indices=True)
    ref, ref_idx = maxpool_ref(x, case["kernel_size"], case.get("stride", case["kernel_size"]), case.get("padding", 0),
                               case.get("dilation", 1), case.get("ceil_mode", False))
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    assert idx.dtype == hp.int64 and not idx.requires_grad
    np.testing.assert_array_equal(F.max_pool2d(hp.tensor(x), **case).numpy(), ref)
    gradcheck(lambda a: F.max_pool2d(a, **case), [x])
    gradcheck(lambda a: F.max_pool2d(a, **case, return_indices=True)[0], [x])


def test_max_pool_1d_3d_unbatched_ties_and_ints(rng):
    x = rng.standard_normal((2, 3, 10))
    np.testing.assert_array_equal(F.max_pool1d(hp.tensor(x), 3, 2, 1, ceil_mode=True).numpy(),
                                  maxpool_ref(x, 3, 2, 1, 1, True)[0])
    gradcheck(lambda a: F.max_pool1d(a, 3, 2, 1, ceil_mode=True), [x])
    x3 = rng.standard_normal((1, 2, 4, 5, 3))
    np.testing.assert_array_equal(F.max_pool3d(hp.tensor(x3), 2, padding=1).numpy(), maxpool_ref(x3, 2, 2, 1, 1, False)[0])
    u = rng.standard_normal((3, 6, 6))
    assert F.max_pool2d(hp.tensor(u), 2).shape == (3, 3, 3)
    t = hp.tensor(np.ones((1, 1, 2, 2)), requires_grad=True)  # ties: the first maximum gets the gradient
    out, idx = F.max_pool2d(t, 2, return_indices=True)
    out.sum().backward()
    np.testing.assert_array_equal(t.grad.numpy()[0, 0], [[1, 0], [0, 0]])
    assert idx.item() == 0
    ints = hp.tensor(np.arange(16).reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(F.max_pool2d(ints, 2).numpy()[0, 0], [[5, 7], [13, 15]])
    nan = hp.tensor(np.array([[[[1.0, np.nan], [3.0, 2.0]]]]))
    assert np.isnan(F.max_pool2d(nan, 2).item())
    # padding is never selected: a window of -inf inputs points at its first tap inside the input (PyTorch's values)
    _, idx = F.max_pool2d(hp.full((1, 1, 3, 3), -np.inf), 2, padding=1, return_indices=True)
    assert idx.numpy()[0, 0].tolist() == [[0, 1], [3, 4]]
    _, idx = F.max_pool2d(hp.full((1, 1, 5, 5), -np.inf), 3, stride=2, dilation=2, padding=1, return_indices=True)
    assert idx.numpy()[0, 0].tolist() == [[6, 6], [6, 6]]


AVGPOOL_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True, divisor_override=5),
]


@pytest.mark.parametrize("case", AVGPOOL_CASES, ids=[str(c) for c in AVGPOOL_CASES])
def test_avg_pool2d_values_and_grad(rng, case):
    x = rand(rng, 2, 2, 8, 7, layout="t")
    ref = avgpool_ref(x, case["kernel_size"], case.get("stride", case["kernel_size"]), case.get("padding", 0),
                      case.get("ceil_mode", False), case.get("count_include_pad", True), case.get("divisor_override"))
    np.testing.assert_allclose(F.avg_pool2d(hp.tensor(x), **case).numpy(), ref, rtol=1e-12, atol=1e-14)
    gradcheck(lambda a: F.avg_pool2d(a, **case), [x])


def test_avg_pool_1d_3d(rng):
    x = rng.standard_normal((2, 3, 10))
    np.testing.assert_allclose(F.avg_pool1d(hp.tensor(x), 3, 2, 1, ceil_mode=True).numpy(),
                               avgpool_ref(x, 3, 2, 1, True), rtol=1e-12)
    x3 = rng.standard_normal((1, 2, 4, 5, 3))
    np.testing.assert_allclose(F.avg_pool3d(hp.tensor(x3), 2, padding=1, count_include_pad=False).numpy(),
                               avgpool_ref(x3, 2, 2, 1, False, False), rtol=1e-12)
    gradcheck(lambda a: F.avg_pool3d(a, 2, padding=1), [x3])


@pytest.mark.parametrize("osz", [1, (1, 1), 3, (4, None), (7, 5), (10, 8), (13, 11)])
def test_adaptive_avg_pool2d(rng, osz):
    x = rand(rng, 2, 2, 10, 8, layout="s")
    full = (osz, osz) if isinstance(osz, int) else tuple(n if o is None else o for o, n in zip(osz, (10, 8)))
    out = F.adaptive_avg_pool2d(hp.tensor(x), osz)
    assert out.shape == (2, 2) + full
    np.testing.assert_allclose(out.numpy(), adaptive_ref(x, full), rtol=1e-12, atol=1e-14)
    gradcheck(lambda a: F.adaptive_avg_pool2d(a, osz), [x[:, :1, :5, :4]] if full[0] > 5 else [x])


def test_adaptive_avg_pool_1d_3d_unbatched(rng):
    x = rng.standard_normal((3, 7))
    np.testing.assert_allclose(F.adaptive_avg_pool1d(hp.tensor(x), 3).numpy(), adaptive_ref(x[None], (3,))[0])
    x3 = rng.standard_normal((1, 2, 5, 4, 3))
    np.testing.assert_allclose(F.adaptive_avg_pool3d(hp.tensor(x3), (2, 3, 1)).numpy(), adaptive_ref(x3, (2, 3, 1)))
    gradcheck(lambda a: F.adaptive_avg_pool3d(a, (2, 3, 1)), [x3])


def test_pool_output_sizes_match_formula():
    for n in range(3, 12):
        for k, s, p, d in ((2, 2, 0, 1), (3, 2, 1, 1), (3, 3, 1, 2), (2, 1, 1, 1), (4, 3, 2, 1)):
            for ceil in (False, True):
                if p > (d * (k - 1) + 1) // 2 or pool_size(n, k, s, p, d, ceil) < 1:
                    continue
                want = pool_size(n, k, s, p, d, ceil)
                assert F.max_pool1d(hp.zeros(1, 1, n), k, s, p, d, ceil_mode=ceil).shape[-1] == want
                if d == 1:
                    assert F.avg_pool1d(hp.zeros(1, 1, n), k, s, p, ceil_mode=ceil).shape[-1] == want


def test_pool_errors():
    with pytest.raises(RuntimeError, match="pad should be at most half of effective kernel size, but got pad=2, "
                                           "kernel_size=3 and dilation=1"):
        F.max_pool2d(hp.zeros(2, 3, 7, 7), 3, padding=2)
    with pytest.raises(RuntimeError, match="pad should be smaller than or equal to half of kernel size"):
        F.max_pool2d(hp.zeros(1, 1, 5, 5), 3, stride=2, dilation=2, padding=2)
    with pytest.raises(RuntimeError, match=r"non-empty 3D or 4D \(batch mode\) tensor expected for input"):
        F.max_pool2d(hp.zeros(3, 7), 2)
    with pytest.raises(RuntimeError, match=r"Given input size: \(3x1x1\). Calculated output size: \(3x0x0\). "
                                           r"Output size is too small"):
        F.max_pool2d(hp.zeros(2, 3, 1, 1), 2)
    with pytest.raises(RuntimeError, match="stride should not be zero"):
        F.max_pool2d(hp.zeros(2, 3, 5, 5), 2, stride=0)
    with pytest.raises(RuntimeError, match="Expected 2D or 3D input tensor"):
        F.max_pool1d(hp.zeros(2, 3, 4, 4), 2)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.avg_pool2d(hp.zeros(2, 3, 5, 5), 2, padding=2)
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        F.avg_pool2d(hp.zeros(2, 3, 5, 5), 2, divisor_override=0)
    with pytest.raises(RuntimeError, match=r"adaptive_avg_pool2d\(\): Expected 3D or 4D tensor, but got \[3, 5\]"):
        F.adaptive_avg_pool2d(hp.zeros(3, 5), 2)
    with pytest.raises(RuntimeError, match="output_size must be 2"):
        F.adaptive_avg_pool2d(hp.zeros(1, 3, 5, 5), (2, 2, 2))
    with pytest.raises(RuntimeError, match="dimension 2 being empty"):
        F.adaptive_avg_pool2d(hp.zeros(1, 3, 0, 5), 2)


def test_pool_layers_forward_and_repr(rng):
    x = hp.tensor(rng.standard_normal((2, 3, 6, 6)))
    np.testing.assert_array_equal(nn.MaxPool2d(2)(x).numpy(), F.max_pool2d(x, 2).numpy())
    y, idx = nn.MaxPool2d(3, 2, 1, return_indices=True)(x)
    assert y.shape == idx.shape == (2, 3, 3, 3)
    np.testing.assert_array_equal(nn.AvgPool2d(3, 1, 1, count_include_pad=False)(x).numpy(),
                                  F.avg_pool2d(x, 3, 1, 1, count_include_pad=False).numpy())
    np.testing.assert_allclose(nn.AdaptiveAvgPool2d((1, 1))(x).numpy(), x.numpy().mean((2, 3), keepdims=True), rtol=1e-12)
    assert nn.AdaptiveAvgPool1d(2)(hp.tensor(rng.standard_normal((2, 4)))).shape == (2, 2)
    assert repr(nn.MaxPool2d(2)) == "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
    assert repr(nn.MaxPool2d((2, 3), stride=1, ceil_mode=True)) == \
        "MaxPool2d(kernel_size=(2, 3), stride=1, padding=0, dilation=1, ceil_mode=True)"
    assert repr(nn.AvgPool2d(2)) == "AvgPool2d(kernel_size=2, stride=2, padding=0)"
    assert repr(nn.AvgPool1d(3)) == "AvgPool1d(kernel_size=(3,), stride=(3,), padding=(0,))"
    assert repr(nn.AdaptiveAvgPool2d((None, 7))) == "AdaptiveAvgPool2d(output_size=(None, 7))"
    assert repr(nn.MaxPool1d(2)) == "MaxPool1d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"


# -- padding ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,np_mode", [("constant", "constant"), ("reflect", "reflect"), ("replicate", "edge"),
                                          ("circular", "wrap")])
@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 3), (1, 1, 1, 1, 1, 1)])
def test_pad_modes(rng, mode, np_mode, pad):
    nd = len(pad) // 2
    x = rng.standard_normal({1: (3, 5), 2: (2, 3, 4, 5), 3: (1, 2, 3, 4, 5)}[nd])
    widths = [(0, 0)] * (x.ndim - nd) + [(pad[2 * i], pad[2 * i + 1]) for i in reversed(range(nd))]
    out = F.pad(hp.tensor(x), pad, mode=mode)
    np.testing.assert_array_equal(out.numpy(), np.pad(x, widths, mode=np_mode))
    gradcheck(lambda a: F.pad(a, pad, mode=mode), [x])


def test_pad_constant_value_negative_and_errors(rng):
    x = rng.standard_normal((2, 3, 4))
    np.testing.assert_array_equal(F.pad(hp.tensor(x), (1, 1), value=2.5).numpy(),
                                  np.pad(x, [(0, 0), (0, 0), (1, 1)], constant_values=2.5))
    np.testing.assert_array_equal(F.pad(hp.tensor(x), (-1, 2, 0, -2)).numpy(),
                                  np.pad(x[:, :1, 1:], [(0, 0), (0, 0), (0, 2)]))
    gradcheck(lambda a: F.pad(a, (-1, 2, 1, -1)), [x])
    ints = F.pad(hp.tensor(np.arange(3)), (1, 0), value=7)
    assert ints.dtype == hp.int64 and ints.numpy().tolist() == [7, 0, 1, 2]
    y = hp.tensor(np.arange(4.0).reshape(1, 1, 4))
    assert F.pad(y, (-1, 2), mode="circular").numpy().tolist() == [[[1.0, 2.0, 3.0, 1.0, 2.0]]]  # PyTorch's order
    with pytest.raises(RuntimeError, match="Padding length must be divisible by 2"):
        F.pad(hp.tensor(x), (1, 2, 3))
    with pytest.raises(RuntimeError, match="Padding length should be less than or equal to two times"):
        F.pad(hp.tensor(x), (1,) * 8)
    with pytest.raises(NotImplementedError, match="Padding size 2 is not supported for 4D input tensor"):
        F.pad(hp.zeros(1, 1, 2, 3), (1, 1), mode="reflect")
    with pytest.raises(RuntimeError, match="Padding size should be less than the corresponding input dimension"):
        F.pad(hp.zeros(1, 2, 3), (3, 0), mode="reflect")
    with pytest.raises(RuntimeError, match="wrapping around more than once"):
        F.pad(hp.zeros(1, 2, 3), (0, 4), mode="circular")
    with pytest.raises(RuntimeError, match="doesn't take in value argument"):
        F.pad(hp.zeros(1, 2, 3), (1, 1), mode="reflect", value=2)
    with pytest.raises(NotImplementedError, match="Unrecognised padding mode foo"):
        F.pad(hp.zeros(1, 2, 3), (1, 1), mode="foo")


# -- flatten and channel dropout -------------------------------------------------------------------------
def test_flatten_unflatten(rng):
    x = hp.tensor(rng.standard_normal((2, 3, 4, 5)), requires_grad=True)
    y = nn.Flatten()(x)
    assert y.shape == (2, 60) and nn.Flatten(0, 2)(x).shape == (24, 5)
    z = nn.Unflatten(1, (3, -1))(y)
    assert z.shape == (2, 3, 20)
    z.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 1.0)
    assert repr(nn.Flatten()) == "Flatten(start_dim=1, end_dim=-1)"
    assert repr(nn.Unflatten(1, (2, 5))) == "Unflatten(dim=1, unflattened_size=(2, 5))"
    with pytest.raises(TypeError, match="unflattened_size must be a tuple of ints, but found type int"):
        nn.Unflatten(1, 5)
    with pytest.raises(RuntimeError):
        nn.Unflatten(1, (2, 5))(hp.zeros(3, 9))


@pytest.mark.parametrize("cls,shape", [(nn.Dropout1d, (40, 50, 3)), (nn.Dropout2d, (40, 50, 2, 3)),
                                       (nn.Dropout3d, (40, 50, 2, 1, 3)), (nn.Dropout1d, (500, 4))])
def test_channel_dropout(cls, shape):
    hp.manual_seed(1)
    d = cls(0.3)
    x = hp.ones(*shape, dtype=hp.float64, requires_grad=True)
    y = d(x)
    out = y.detach().numpy()
    lead = len(shape) - (1 if cls is nn.Dropout1d else {nn.Dropout2d: 2, nn.Dropout3d: 3}[cls])
    per_channel = out.reshape(shape[:lead] + (-1,))
    assert np.all(per_channel == per_channel[..., :1])  # whole channels kept or dropped
    kept = per_channel[..., 0] != 0
    assert abs(kept.mean() - 0.7) < 0.05
    np.testing.assert_allclose(per_channel[kept], 1 / 0.7)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), out)
    d.eval()
    assert d(x) is x or np.array_equal(d(x).detach().numpy(), x.detach().numpy())
    assert repr(cls(0.2)) == f"{cls.__name__}(p=0.2, inplace=False)"


def test_channel_dropout_errors_and_warnings():
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input, but received a 4D input"):
        F.dropout1d(hp.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout2d(hp.zeros(2, 3, 4, 5), p=2)
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout2d(-0.1)
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        assert F.dropout2d(hp.zeros(3, 4, 5)).shape == (3, 4, 5)
    np.testing.assert_array_equal(F.dropout2d(hp.ones(2, 3, 2, 2), p=1.0).numpy(), 0)


# -- the MNIST tutorial's network, and the simulated/real GPU --------------------------------------------
def test_mnist_tutorial_net_matches_reference(rng):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, 1)
            self.conv2 = nn.Conv2d(4, 6, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.fc1 = nn.Linear(6 * 3 * 3, 5)

        def forward(self, x):
            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            x = self.dropout1(F.max_pool2d(x, 2))
            return F.log_softmax(self.fc1(x.flatten(1)), dim=1)

    hp.manual_seed(0)
    net = Net().double().eval()
    x, t = rng.standard_normal((3, 1, 10, 10)), np.array([0, 4, 2])
    loss = F.nll_loss(net(hp.tensor(x)), hp.tensor(t), reduction="sum")
    p = {k: v.detach().numpy() for k, v in net.named_parameters()}
    h = np.maximum(conv_ref(np.maximum(conv_ref(x, p["conv1.weight"], p["conv1.bias"]), 0), p["conv2.weight"],
                            p["conv2.bias"]), 0)
    h = maxpool_ref(h, 2, 2, 0, 1, False)[0].reshape(3, -1) @ p["fc1.weight"].T + p["fc1.bias"]
    logp = h - h.max(1, keepdims=True) - np.log(np.exp(h - h.max(1, keepdims=True)).sum(1, keepdims=True))
    np.testing.assert_allclose(loss.item(), -logp[np.arange(3), t].sum(), rtol=1e-12)
    loss.backward()
    assert all(v.grad is not None for v in net.parameters())
    assert "(conv1): Conv2d(1, 4, kernel_size=(3, 3), stride=(1, 1))" in repr(net)


@pytest.mark.gpu
def test_conv_pool_on_device_match_cpu():
    r = np.random.default_rng(0)
    x = r.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = r.standard_normal((4, 3, 3, 3)).astype(np.float32)
    res = []
    for dev in ("cpu", "cuda"):
        xt, wt = hp.tensor(x, device=dev, requires_grad=True), hp.tensor(w, device=dev, requires_grad=True)
        y = F.conv2d(xt, wt, padding=1, stride=(1, 2))
        y = F.max_pool2d(y, 2, ceil_mode=True) + F.avg_pool2d(y, 2, ceil_mode=True, count_include_pad=False)
        y = F.pad(F.adaptive_avg_pool2d(y, (3, 2)), (1, 1, 1, 1), mode="reflect")
        y.sum().backward()
        res.append((y.detach().cpu().numpy(), xt.grad.cpu().numpy(), wt.grad.cpu().numpy()))
    for a, b in zip(*res):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
