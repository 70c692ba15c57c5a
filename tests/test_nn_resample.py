"""Interpolation (nearest, linear, bilinear, trilinear, area; scale factors) and the Upsample layers.

Each op: forward values against a direct loop written here, finite-difference gradients (tests/_gradcheck.py),
PyTorch's output sizes and its errors for bad input; the layers: init, reprs in PyTorch's layout.
"""

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._nn_refs import _tup, bilinear_ref, linear_src
from tests._gradcheck import gradcheck


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
