"""Pooling (max, average, adaptive average and adaptive max; functional and layers) against NumPy float64 loops.

Each op: forward values against a direct loop written here, finite-difference gradients (tests/_gradcheck.py),
PyTorch's output sizes and its errors for bad input; the layers: init, reprs in PyTorch's layout.
"""

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._nn_refs import _tup, adaptive_max_ref, adaptive_ref, avgpool_ref, maxpool_ref, pool_size
from tests._gradcheck import gradcheck, rand


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


# -- lp_pool, max_unpool, *_with_indices, the 3-d and circular pads ----------------------------------------------
def test_lp_pool_against_window_sums():
    rng = np.random.default_rng(21)
    x = np.abs(rng.standard_normal((2, 3, 5, 6)))
    got = F.lp_pool2d(hp.tensor(x), 3, (2, 3), stride=1).numpy()
    ref = np.empty((2, 3, 4, 4))
    for i in range(4):
        for j in range(4):
            ref[:, :, i, j] = ((x[:, :, i:i + 2, j:j + 3] ** 3).sum((2, 3))) ** (1 / 3)
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    np.testing.assert_allclose(nn.LPPool2d(3, (2, 3), stride=1)(hp.tensor(x)).numpy(), ref, rtol=1e-10)
    x1 = np.abs(rng.standard_normal((2, 3, 6)))
    ref1 = np.sqrt((x1.reshape(2, 3, 3, 2) ** 2).sum(3))
    np.testing.assert_allclose(F.lp_pool1d(hp.tensor(x1), 2, 2).numpy(), ref1, rtol=1e-10)
    gradcheck(lambda a: F.lp_pool1d(a, 2, 2), [x1 + 0.1])
    assert repr(nn.LPPool1d(2, 3)) == "LPPool1d(norm_type=2, kernel_size=3, stride=None, ceil_mode=False)"


def test_max_unpool_scatters_to_the_pooling_indices():
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 3, 4, 6))
    vals, idx = F.max_pool2d_with_indices(hp.tensor(x), 2)
    out = F.max_unpool2d(vals, idx, 2).numpy()
    ref = np.zeros((2, 3, 24))
    flat_idx, flat_val = idx.numpy().reshape(2, 3, -1), vals.numpy().reshape(2, 3, -1)
    for n in range(2):
        for c in range(3):
            ref[n, c, flat_idx[n, c]] = flat_val[n, c]
    np.testing.assert_array_equal(out, ref.reshape(2, 3, 4, 6))
    np.testing.assert_array_equal(nn.MaxUnpool2d(2)(vals, idx).numpy(), out)
    assert F.max_unpool2d(vals, idx, 2, output_size=(5, 7)).shape == (2, 3, 5, 7)
    gradcheck(lambda v: F.max_unpool2d(v, idx, 2), [vals.numpy().copy()])
    assert repr(nn.MaxUnpool2d(2)) == "MaxUnpool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))"
    with pytest.raises(ValueError, match="dim 0 must be between 2 and 6"):
        F.max_unpool2d(vals, idx, 2, output_size=(9, 9))
    with pytest.raises(RuntimeError, match="Found an invalid max index"):
        F.max_unpool2d(vals, idx * 10, 2)
    v1, i1 = F.adaptive_max_pool1d_with_indices(hp.tensor(x[:, :, 0]), 3)
    assert i1.dtype == hp.int64 and v1.shape == (2, 3, 3)


def test_3d_and_circular_pads():
    x = np.arange(2 * 2 * 3 * 4, dtype=np.float64).reshape(1, 2, 2, 3, 4)
    np.testing.assert_array_equal(nn.CircularPad2d(1)(hp.tensor(x[0])).numpy(),
                                  np.pad(x[0], ((0, 0), (0, 0), (1, 1), (1, 1)), mode="wrap"))
    np.testing.assert_array_equal(nn.CircularPad1d((2, 1))(hp.tensor(x[0, 0])).numpy(),
                                  np.pad(x[0, 0], ((0, 0), (0, 0), (2, 1)), mode="wrap"))
    np.testing.assert_array_equal(nn.ReplicationPad3d(1)(hp.tensor(x)).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)), mode="edge"))
    np.testing.assert_array_equal(nn.ReflectionPad3d((1, 0, 1, 0, 1, 0))(hp.tensor(x)).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 0), (1, 0), (1, 0)), mode="reflect"))
    np.testing.assert_array_equal(nn.ConstantPad3d(1, 2.5)(hp.tensor(x)).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)), constant_values=2.5))
    assert nn.ZeroPad3d(1)(hp.tensor(x)).shape == (1, 2, 4, 5, 6)
    assert repr(nn.ZeroPad3d(1)) == "ZeroPad3d((1, 1, 1, 1, 1, 1))"
    assert repr(nn.CircularPad2d(1)) == "CircularPad2d((1, 1, 1, 1))"
