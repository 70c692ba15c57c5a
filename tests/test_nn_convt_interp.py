"""Transposed convolution, interpolation, adaptive max pooling, padding layers, distances, instance norm and
SyncBatchNorm without a process group, against NumPy float64 references written here.

Each op: forward values against a direct loop, finite-difference gradients (tests/_gradcheck.py), PyTorch's
output sizes and its errors for bad input; the layers: init, reprs in PyTorch's layout.
"""
import math
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck


@pytest.fixture
def rng():
    return np.random.default_rng(5)


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


# -- references ------------------------------------------------------------------------------------------
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


# -- transposed convolution -------------------------------------------------------------------------------
CONVT_CASES = [
    dict(),
    dict(stride=2),
    dict(stride=2, padding=1, output_padding=1),
    dict(stride=(2, 1), padding=(0, 1), dilation=(1, 2)),
    dict(stride=3, output_padding=2, groups=2),
    dict(dilation=2, output_padding=1, groups=2, padding=2),
]


@pytest.mark.parametrize("case", CONVT_CASES)
def test_conv_transpose2d_values_and_grad(rng, case):
    x = rng.standard_normal((2, 4, 3, 4))
    w = rng.standard_normal((4, 3, 2, 3))
    b = rng.standard_normal(3 * case.get("groups", 1))
    y = F.conv_transpose2d(hp.tensor(x), hp.tensor(w), hp.tensor(b), **case)
    np.testing.assert_allclose(y.numpy(), convt_ref(x, w, b, **case), atol=1e-12)
    gradcheck(lambda a, ww, bb: F.conv_transpose2d(a, ww, bb, **case), [x, w, b])


def test_conv_transpose1d_values_grad_and_unbatched(rng):
    x = rng.standard_normal((2, 2, 5))
    w = rng.standard_normal((2, 3, 3))
    kw = dict(stride=2, padding=1, output_padding=1)
    y = F.conv_transpose1d(hp.tensor(x), hp.tensor(w), None, **kw)
    np.testing.assert_allclose(y.numpy(), convt_ref(x, w, None, **kw), atol=1e-12)
    assert tuple(y.shape) == (2, 3, (5 - 1) * 2 - 2 + 2 + 1 + 1)
    gradcheck(lambda a, ww: F.conv_transpose1d(a, ww, **kw), [x, w])
    yu = F.conv_transpose1d(hp.tensor(x[0]), hp.tensor(w), **kw)
    np.testing.assert_allclose(yu.numpy(), y.numpy()[0], atol=1e-12)


def test_conv_transpose_is_adjoint_of_conv(rng):
    """<conv(x, w), y> = <x, conv_transpose(y, w)> for matching stride, padding, dilation and groups."""
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 2, 3, 3))
    kw = dict(stride=2, padding=1, dilation=1, groups=2)
    cy = F.conv2d(hp.tensor(x), hp.tensor(w), **kw).numpy()
    y = rng.standard_normal(cy.shape)
    op = tuple(n - ((m - 1) * 2 - 2 + 3) for n, m in zip(x.shape[2:], y.shape[2:]))
    ty = F.conv_transpose2d(hp.tensor(y), hp.tensor(w), output_padding=op, **kw).numpy()
    assert ty.shape == x.shape
    np.testing.assert_allclose((cy * y).sum(), (x * ty).sum(), rtol=1e-10)


def test_conv_transpose_float32(rng):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    y = F.conv_transpose2d(hp.tensor(x), hp.tensor(w), stride=2)
    assert y.dtype == hp.float32
    np.testing.assert_allclose(y.numpy(), convt_ref(x.astype(np.float64), w.astype(np.float64), stride=2), atol=1e-4)


def test_conv_transpose_errors():
    x, w = hp.randn(1, 4, 3, 3), hp.randn(4, 2, 3, 3)
    with pytest.raises(RuntimeError, match="output padding must be smaller than either stride or dilation"):
        F.conv_transpose2d(x, w, stride=2, output_padding=2)
    with pytest.raises(RuntimeError, match=r"expected input\[1, 5, 3, 3\] to have 4 channels, but got 5"):
        F.conv_transpose2d(hp.randn(1, 5, 3, 3), w)
    with pytest.raises(RuntimeError, match="expected bias to be 1-dimensional with 2 elements"):
        F.conv_transpose2d(x, w, bias=hp.randn(3))
    with pytest.raises(RuntimeError, match="expected weight to be divisible by 3 at dimension 0"):
        F.conv_transpose2d(x, w, groups=3)
    with pytest.raises(RuntimeError, match=r"Calculated output size per channel: \(-5 x -5\). Output size is too"):
        F.conv_transpose2d(x, w, padding=5)
    with pytest.raises(RuntimeError, match=r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv_transpose2d"):
        F.conv_transpose2d(hp.randn(3, 3), w)
    with pytest.raises(ValueError, match='Only "zeros" padding mode is supported for ConvTranspose2d'):
        nn.ConvTranspose2d(4, 2, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.ConvTranspose2d(3, 2, 3, groups=2)


def test_conv_transpose_layer_init_repr_and_output_size(rng):
    hp.manual_seed(0)
    m = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, bias=True, dilation=2)
    assert tuple(m.weight.shape) == (4, 3, 3, 3) and m.transposed and m.output_padding == (1, 1)
    fan_in = 3 * 9  # weight dim 1 times the kernel: PyTorch's fan_in of a transposed weight
    assert np.abs(m.weight.detach().numpy()).max() <= 1 / math.sqrt(fan_in) + 1e-7
    assert np.abs(m.bias.detach().numpy()).max() <= 1 / math.sqrt(fan_in) + 1e-7
    assert repr(m) == ("ConvTranspose2d(4, 6, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(2, 2), "
                       "output_padding=(1, 1), groups=2)")
    assert repr(nn.ConvTranspose1d(4, 6, 3, bias=False)) == "ConvTranspose1d(4, 6, kernel_size=(3,), stride=(1,), bias=False)"
    m = nn.ConvTranspose2d(4, 2, 3, stride=2)
    x = hp.randn(1, 4, 3, 3)
    assert tuple(m(x).shape) == (1, 2, 7, 7)
    assert tuple(m(x, output_size=[8, 8]).shape) == (1, 2, 8, 8)
    assert tuple(m(x, output_size=[1, 4, 8, 7]).shape) == (1, 2, 8, 7)
    with pytest.raises(ValueError, match=r"requested an output size of \[9, 9\], but valid sizes range from \[7, 7\] "
                                         r"to \[8, 8\]"):
        m(x, output_size=[9, 9])
    xw = rng.standard_normal((1, 4, 3, 3))
    out = m(hp.tensor(xw.astype(np.float32)), output_size=(8, 8)).detach().numpy()
    ref = convt_ref(xw, m.weight.detach().numpy().astype(np.float64), m.bias.detach().numpy().astype(np.float64),
                    stride=2, output_padding=1)
    np.testing.assert_allclose(out, ref, atol=1e-5)


# -- interpolation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("kw,out_hw", [(dict(size=(7, 3)), (7, 3)), (dict(scale_factor=2), (8, 10)),
                                       (dict(scale_factor=(1.5, 0.6)), (6, 3)), (dict(size=1), (1, 1))])
def test_bilinear_values_and_grad(rng, align_corners, kw, out_hw):
    x = rng.standard_normal((2, 2, 4, 5))
    y = F.interpolate(hp.tensor(x), mode="bilinear", align_corners=align_corners, **kw)
    sf = kw.get("scale_factor")
    scale = (None, None) if sf is None else _tup(sf, 2) if not isinstance(sf, int) else (sf, sf)
    assert tuple(y.shape) == (2, 2) + out_hw
    np.testing.assert_allclose(y.numpy(), bilinear_ref(x, out_hw, align_corners, scale), atol=1e-12)
    gradcheck(lambda a: F.interpolate(a, mode="bilinear", align_corners=align_corners, **kw), [x])


def test_linear_and_recompute_scale_factor(rng):
    x = rng.standard_normal((1, 2, 10))
    y = F.interpolate(hp.tensor(x), scale_factor=0.35, mode="linear").numpy()
    ref = np.stack([(1 - lam) * x[..., i0] + lam * x[..., i1] for i0, i1, lam in linear_src(10, 3, False, 0.35)], -1)
    np.testing.assert_allclose(y, ref, atol=1e-12)
    y2 = F.interpolate(hp.tensor(x), scale_factor=0.35, mode="linear", recompute_scale_factor=True).numpy()
    ref2 = np.stack([(1 - lam) * x[..., i0] + lam * x[..., i1] for i0, i1, lam in linear_src(10, 3, False)], -1)
    np.testing.assert_allclose(y2, ref2, atol=1e-12)
    assert not np.allclose(y, y2)
    gradcheck(lambda a: F.interpolate(a, size=17, mode="linear", align_corners=True), [x])


def test_nearest_modes(rng):
    x = np.arange(10.0).reshape(1, 1, 10)
    t = hp.tensor(x)
    np.testing.assert_array_equal(F.interpolate(t, size=3).numpy().ravel(), [0, 3, 6])
    np.testing.assert_array_equal(F.interpolate(t, scale_factor=0.35).numpy().ravel(), [0, 2, 5])  # floor(j / 0.35)
    np.testing.assert_array_equal(F.interpolate(t, scale_factor=0.35, recompute_scale_factor=True).numpy().ravel(),
                                  [0, 3, 6])
    np.testing.assert_array_equal(F.interpolate(t, size=7, mode="nearest-exact").numpy().ravel(),
                                  [0, 2, 3, 5, 6, 7, 9])  # floor((j + 0.5) * 10 / 7)
    x2 = rng.standard_normal((2, 3, 3, 4))
    y = F.interpolate(hp.tensor(x2), scale_factor=2).numpy()
    np.testing.assert_array_equal(y, x2.repeat(2, axis=2).repeat(2, axis=3))
    gradcheck(lambda a: F.interpolate(a, size=(5, 7)), [x2])
    gradcheck(lambda a: F.interpolate(a, size=(2, 9), mode="nearest-exact"), [x2])


def test_interpolate_area_and_trilinear(rng):
    x = rng.standard_normal((1, 2, 6))
    np.testing.assert_allclose(F.interpolate(hp.tensor(x), size=3, mode="area").numpy(),
                               x.reshape(1, 2, 3, 2).mean(-1), atol=1e-12)
    x3 = rng.standard_normal((1, 1, 2, 3, 2))
    y = F.interpolate(hp.tensor(x3), size=(2, 3, 2), mode="trilinear")
    np.testing.assert_allclose(y.numpy(), x3, atol=1e-12)
    gradcheck(lambda a: F.interpolate(a, size=(3, 4, 3), mode="trilinear"), [x3])


def test_interpolate_errors():
    x = hp.randn(1, 1, 4, 4)
    with pytest.raises(ValueError, match="only one of size or scale_factor should be defined"):
        F.interpolate(x, size=3, scale_factor=2)
    with pytest.raises(ValueError, match="either size or scale_factor should be defined"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="align_corners option can only be set with the interpolating modes"):
        F.interpolate(x, size=3, align_corners=True)
    with pytest.raises(NotImplementedError, match="Got 4D input, but linear mode needs 3D input"):
        F.interpolate(x, size=3, mode="linear")
    with pytest.raises(ValueError, match=r"spatial dimensions of \[4, 4\] and output size of \[3\]"):
        F.interpolate(x, size=[3])
    with pytest.raises(ValueError, match="recompute_scale_factor is not meaningful with an explicit size"):
        F.interpolate(x, size=3, recompute_scale_factor=True)
    with pytest.raises(RuntimeError, match=r"Input and output sizes should be greater than 0, but got input "
                                           r"\(W: 10\) and output \(W: 0\)"):
        F.interpolate(hp.randn(1, 1, 10), scale_factor=0.05)
    with pytest.raises(NotImplementedError, match=r"Only 3D, 4D and 5D input Tensors supported \(got 2D\)"):
        F.interpolate(hp.randn(1, 10), size=4)


def test_upsample_layers():
    assert repr(nn.Upsample(scale_factor=2)) == "Upsample(scale_factor=2.0, mode='nearest')"
    assert repr(nn.Upsample(size=(3, 4), mode="bilinear")) == "Upsample(size=(3, 4), mode='bilinear')"
    assert repr(nn.UpsamplingBilinear2d(scale_factor=2)) == "UpsamplingBilinear2d(scale_factor=2.0, mode='bilinear')"
    x = np.arange(4.0).reshape(1, 1, 2, 2)
    y = nn.UpsamplingBilinear2d(size=3)(hp.tensor(x)).numpy()
    np.testing.assert_allclose(y, bilinear_ref(x, (3, 3), True), atol=1e-12)
    assert tuple(nn.UpsamplingNearest2d(scale_factor=3)(hp.tensor(x)).shape) == (1, 1, 6, 6)


# -- adaptive max pooling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("out", [3, (2, 3), (None, 4), (5, 7), (4, 2)])
def test_adaptive_max_pool2d(rng, out):
    x = rng.standard_normal((2, 3, 5, 7))
    y, idx = F.adaptive_max_pool2d(hp.tensor(x), out, return_indices=True)
    osz = tuple(s if o is None else o for s, o in zip((5, 7), _tup(out, 2)))
    ry, ridx = adaptive_max_ref(x, osz)
    np.testing.assert_array_equal(y.numpy(), ry)
    np.testing.assert_array_equal(idx.numpy(), ridx)
    assert idx.dtype == hp.int64
    gradcheck(lambda a: F.adaptive_max_pool2d(a, out), [x])


def test_adaptive_max_pool1d_ties_nan_unbatched_and_layers(rng):
    x = np.array([[[1.0, 3, 3, 0, 2, 2, 2]]])
    y, idx = F.adaptive_max_pool1d(hp.tensor(x), 3, return_indices=True)
    np.testing.assert_array_equal(idx.numpy().ravel(), [1, 2, 4])  # the first maximum of each window
    np.testing.assert_array_equal(y.numpy().ravel(), [3, 3, 2])
    xn = np.array([[1.0, np.nan, 3, np.nan, 2]])
    _, idx = F.adaptive_max_pool1d(hp.tensor(xn), 1, return_indices=True)
    assert idx.numpy().ravel().tolist() == [3]  # NaN wins, the last one, as PyTorch
    x = rng.standard_normal((3, 10))
    ry, _ = adaptive_max_ref(x[None], (4,))
    np.testing.assert_array_equal(nn.AdaptiveMaxPool1d(4)(hp.tensor(x)).numpy(), ry[0])
    gradcheck(lambda a: F.adaptive_max_pool1d(a, 4), [x])
    assert repr(nn.AdaptiveMaxPool2d((3, None))) == "AdaptiveMaxPool2d(output_size=(3, None))"
    out, ind = nn.AdaptiveMaxPool2d(2, return_indices=True)(hp.randn(1, 4, 4))
    assert tuple(out.shape) == tuple(ind.shape) == (1, 2, 2)
    with pytest.raises(RuntimeError, match=r"Expected 3D or 4D tensor, but got: \[5\]"):
        F.adaptive_max_pool2d(hp.randn(5), 2)
    with pytest.raises(RuntimeError, match="should contain one int"):
        F.adaptive_max_pool1d(hp.randn(1, 5, 7), (2, 3))


# -- padding layers ---------------------------------------------------------------------------------------
def test_padding_layers(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    x1 = rng.standard_normal((2, 3, 5))
    cases = [
        (nn.ZeroPad2d((1, 2, 3, 0)), x, [(3, 0), (1, 2)], dict(mode="constant")),
        (nn.ConstantPad2d(1, 2.5), x, [(1, 1), (1, 1)], dict(mode="constant", constant_values=2.5)),
        (nn.ConstantPad1d((2, 1), -1.0), x1, [(2, 1)], dict(mode="constant", constant_values=-1.0)),
        (nn.ZeroPad1d(2), x1, [(2, 2)], dict(mode="constant")),
        (nn.ReflectionPad1d((3, 1)), x1, [(3, 1)], dict(mode="reflect")),
        (nn.ReflectionPad2d((1, 2, 3, 1)), x, [(3, 1), (1, 2)], dict(mode="reflect")),
        (nn.ReplicationPad1d(2), x1, [(2, 2)], dict(mode="edge")),
        (nn.ReplicationPad2d((0, 3, 2, 1)), x, [(2, 1), (0, 3)], dict(mode="edge")),
    ]
    for m, a, widths, npkw in cases:
        ref = np.pad(a, [(0, 0)] * (a.ndim - len(widths)) + widths, **npkw)
        np.testing.assert_array_equal(m(hp.tensor(a)).numpy(), ref, err_msg=repr(m))
        gradcheck(m, [a[:1, :2]])
    assert repr(nn.ZeroPad2d(2)) == "ZeroPad2d((2, 2, 2, 2))"
    assert repr(nn.ConstantPad1d(2, 3.5)) == "ConstantPad1d(padding=(2, 2), value=3.5)"
    assert repr(nn.ReflectionPad2d((1, 1, 2, 0))) == "ReflectionPad2d((1, 1, 2, 0))"
    assert repr(nn.ReplicationPad1d((1, 2))) == "ReplicationPad1d((1, 2))"
    with pytest.raises(RuntimeError, match="Padding size should be less than the corresponding input dimension"):
        nn.ReflectionPad2d(2)(hp.randn(1, 1, 2, 2))


# -- distances --------------------------------------------------------------------------------------------
def test_cosine_similarity(rng):
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 1, 4))
    bb = np.broadcast_to(b, a.shape)
    ref = (a * bb).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(bb, axis=1))
    np.testing.assert_allclose(F.cosine_similarity(hp.tensor(a), hp.tensor(b)).numpy(), ref, atol=1e-12)
    gradcheck(lambda p, q: F.cosine_similarity(p, q), [a, b])
    z = F.cosine_similarity(hp.zeros(2, 3, dtype=hp.float64), hp.tensor(rng.standard_normal((2, 3))))
    np.testing.assert_array_equal(z.numpy(), [0.0, 0.0])
    small = F.cosine_similarity(hp.full((1, 3), 1e-9, dtype=hp.float64), hp.ones(1, 3, dtype=hp.float64), eps=1e-8)
    np.testing.assert_allclose(small.numpy(), [3 * (1e-9 / 1e-8) / math.sqrt(3)])  # the norm clamped at eps
    m = nn.CosineSimilarity(dim=0)
    assert repr(m) == "CosineSimilarity()" and tuple(m(hp.randn(3), hp.randn(3)).shape) == ()
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(3\) must match the size of tensor b \(4\)"):
        F.cosine_similarity(hp.randn(2, 3), hp.randn(2, 4))


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf])
def test_pairwise_distance(rng, p):
    a, b = rng.standard_normal((4, 5)), rng.standard_normal(5)
    d = a - b + 1e-6
    ref = np.abs(d).max(-1) if math.isinf(p) else (np.abs(d) ** p).sum(-1) ** (1 / p)
    np.testing.assert_allclose(F.pairwise_distance(hp.tensor(a), hp.tensor(b), p).numpy(), ref, rtol=1e-12)
    gradcheck(lambda x, y: F.pairwise_distance(x, y, p), [a, b])
    m = nn.PairwiseDistance(p, keepdim=True)
    assert tuple(m(hp.tensor(a), hp.tensor(b)).shape) == (4, 1)
    assert repr(nn.PairwiseDistance()) == "PairwiseDistance()"


# -- instance norm ----------------------------------------------------------------------------------------
def _inorm_ref(x, eps=1e-5):
    ax = tuple(range(2, x.ndim))
    return (x - x.mean(ax, keepdims=True)) / np.sqrt(x.var(ax, keepdims=True) + eps)


def test_instance_norm(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    m = nn.InstanceNorm2d(3)
    assert m.weight is None and m.running_mean is None
    assert repr(m) == "InstanceNorm2d(3, eps=1e-05, momentum=0.1, affine=False, bias=False, track_running_stats=False)"
    np.testing.assert_allclose(m(hp.tensor(x)).numpy(), _inorm_ref(x), atol=1e-12)
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    ref = _inorm_ref(x) * w.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(F.instance_norm(hp.tensor(x), weight=hp.tensor(w), bias=hp.tensor(b)).numpy(), ref,
                               atol=1e-12)
    gradcheck(lambda a, ww, bb: F.instance_norm(a, weight=ww, bias=bb), [x[:, :, :2], w, b])
    x1 = rng.standard_normal((3, 6))  # unbatched (C, L)
    np.testing.assert_allclose(nn.InstanceNorm1d(3)(hp.tensor(x1)).numpy(), _inorm_ref(x1[None])[0], atol=1e-12)


def test_instance_norm_running_stats_and_errors(rng):
    x = rng.standard_normal((4, 3, 6))
    m = nn.InstanceNorm1d(3, momentum=0.3, affine=True, track_running_stats=True).to(hp.float64)
    m(hp.tensor(x))
    np.testing.assert_allclose(m.running_mean.numpy(), 0.3 * x.mean(2).mean(0), atol=1e-12)
    np.testing.assert_allclose(m.running_var.numpy(), 0.7 + 0.3 * x.var(2, ddof=1).mean(0), atol=1e-12)
    m.eval()
    rm, rv = m.running_mean.numpy()[None, :, None], m.running_var.numpy()[None, :, None]
    np.testing.assert_allclose(m(hp.tensor(x)).detach().numpy(), (x - rm) / np.sqrt(rv + 1e-5), atol=1e-12)
    with pytest.raises(ValueError, match=r"expected input's size at dim=1 to match num_features \(3\), but got: 4"):
        nn.InstanceNorm1d(3, affine=True)(hp.randn(2, 4, 5))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        nn.InstanceNorm1d(3)(hp.randn(2, 4, 5))
    assert any("does not match num_features" in str(r.message) for r in rec)
    with pytest.raises(ValueError, match="Expected more than 1 spatial element when training"):
        nn.InstanceNorm2d(3)(hp.randn(2, 3, 1, 1))
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        nn.InstanceNorm1d(3)(hp.randn(2, 3, 4, 4))


# -- SyncBatchNorm without a process group ----------------------------------------------------------------
def test_sync_batchnorm_without_group_is_batchnorm(rng):
    x = rng.standard_normal((4, 3, 5))
    hp.manual_seed(0)
    bn = nn.BatchNorm1d(3).to(hp.float64)
    sbn = nn.SyncBatchNorm(3).to(hp.float64)
    assert repr(sbn) == "SyncBatchNorm(3, eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)"
    np.testing.assert_allclose(sbn(hp.tensor(x)).detach().numpy(), bn(hp.tensor(x)).detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(sbn.running_var.numpy(), bn.running_var.numpy(), atol=1e-12)
    with pytest.raises(ValueError, match=r"expected at least 2D input \(got 1D input\)"):
        sbn(hp.randn(3))


def test_convert_sync_batchnorm_shares_parameters():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(2)), nn.InstanceNorm2d(4))
    model[1].eval()
    w = model[1].weight
    conv = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(conv[1], nn.SyncBatchNorm) and isinstance(conv[2][0], nn.SyncBatchNorm)
    assert isinstance(conv[3], nn.InstanceNorm2d) and isinstance(conv[0], nn.Conv2d)
    assert conv[1].weight is w and conv[1].running_mean is model[1].running_mean and not conv[1].training
    assert conv[2][0].num_features == 2
    single = nn.SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm1d(5, affine=False))
    assert isinstance(single, nn.SyncBatchNorm) and single.weight is None
