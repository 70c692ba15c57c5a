"""unfold/fold, pixel_shuffle/pixel_unshuffle and channel_shuffle (nn.functional and their modules) against NumPy
float64 loops of PyTorch's definitions, finite-difference gradients and PyTorch's errors."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def unfold_ref(x, ks, dil, pad, st):
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (ks[0] - 1) - 1) // st[0] + 1
    ow = (w + 2 * pad[1] - dil[1] * (ks[1] - 1) - 1) // st[1] + 1
    out = np.zeros((n, c * ks[0] * ks[1], oh * ow))
    for ci in range(c):
        for i in range(ks[0]):
            for j in range(ks[1]):
                row = (ci * ks[0] + i) * ks[1] + j
                for a in range(oh):
                    for b in range(ow):
                        out[:, row, a * ow + b] = xp[:, ci, a * st[0] + i * dil[0], b * st[1] + j * dil[1]]
    return out


def test_unfold_fold_values_adjoint_and_grads(rng):
    x = rng.standard_normal((2, 3, 5, 6))
    geom = dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1))
    ref = unfold_ref(x, (2, 3), (1, 2), (1, 1), (2, 1))
    got = F.unfold(hp.tensor(x), **geom)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)
    np.testing.assert_allclose(nn.Unfold(**geom)(hp.tensor(x)).numpy(), ref, rtol=1e-12)
    cols = rng.standard_normal(ref.shape)
    folded = F.fold(hp.tensor(cols), (5, 6), **geom).numpy()
    assert (x * folded).sum() == pytest.approx((ref * cols).sum(), rel=1e-12)  # fold is unfold's adjoint
    np.testing.assert_allclose(nn.Fold((5, 6), **geom)(hp.tensor(cols)).numpy(), folded, rtol=1e-12)
    gradcheck(lambda a: F.unfold(a, **geom), [x])
    gradcheck(lambda a: F.fold(a, (5, 6), **geom), [cols])
    assert F.unfold(hp.tensor(x[0]), 2).shape == (12, 20)
    assert F.fold(hp.tensor(cols[0]), (5, 6), **geom).shape == (3, 5, 6)


def test_unfold_fold_errors():
    with pytest.raises(RuntimeError, match="calculated shape of the array of sliding blocks"):
        F.unfold(hp.ones(1, 1, 3, 3), 4)
    with pytest.raises(NotImplementedError, match="Only 3D or 4D input"):
        F.unfold(hp.ones(3, 3), 2)
    with pytest.raises(RuntimeError, match="divisible by the product of kernel_size"):
        F.fold(hp.ones(2, 11, 4), (3, 3), 2)
    with pytest.raises(RuntimeError, match=r"number of sliding blocks 2 \* 2 = 4, but got input.size\(2\)=5"):
        F.fold(hp.ones(2, 12, 5), (3, 3), 2)
    assert repr(nn.Fold(3, 2)) == "Fold(output_size=3, kernel_size=2, dilation=1, padding=0, stride=1)"


def test_pixel_shuffle_unshuffle(rng):
    x = rng.standard_normal((2, 8, 3, 5))
    r = 2
    ref = np.zeros((2, 2, 6, 10))
    for c in range(2):
        for h in range(6):
            for w in range(10):
                ref[:, c, h, w] = x[:, c * r * r + (h % r) * r + (w % r), h // r, w // r]
    np.testing.assert_array_equal(F.pixel_shuffle(hp.tensor(x), 2).numpy(), ref)
    np.testing.assert_array_equal(nn.PixelShuffle(2)(hp.tensor(x)).numpy(), ref)
    np.testing.assert_array_equal(F.pixel_unshuffle(hp.tensor(ref), 2).numpy(), x)
    np.testing.assert_array_equal(nn.PixelUnshuffle(2)(hp.tensor(ref)).numpy(), x)
    gradcheck(lambda a: F.pixel_shuffle(a, 2), [x[:, :, :2, :2].copy()])
    assert F.pixel_shuffle(hp.ones(4, 9, 2, 2), 3).shape == (4, 1, 6, 6)
    with pytest.raises(RuntimeError, match="input.size\\(-3\\)=3 is not divisible by 4"):
        F.pixel_shuffle(hp.ones(3, 5, 5), 2)
    with pytest.raises(RuntimeError, match="input.size\\(-2\\)=5 is not divisible by 2"):
        F.pixel_unshuffle(hp.ones(4, 5, 6), 2)
    with pytest.raises(RuntimeError, match="at least 3 dimensions"):
        F.pixel_shuffle(hp.ones(3, 5), 2)
    assert repr(nn.PixelShuffle(2)) == "PixelShuffle(upscale_factor=2)"


def test_channel_shuffle(rng):
    x = rng.standard_normal((2, 6, 3))
    ref = np.stack([x[:, g * 2 + k] for k in range(2) for g in range(3)], axis=1)  # channel g*(C/g)+k -> k*g+g
    np.testing.assert_array_equal(F.channel_shuffle(hp.tensor(x), 3).numpy(), ref)
    np.testing.assert_array_equal(nn.ChannelShuffle(3)(hp.tensor(x)).numpy(), ref)
    with pytest.raises(RuntimeError, match="Got 5 channels and 2 groups"):
        F.channel_shuffle(hp.ones(2, 5, 3), 2)
    with pytest.raises(RuntimeError, match="expects input with > 2 dims"):
        F.channel_shuffle(hp.ones(2, 4), 2)
    assert repr(nn.ChannelShuffle(3)) == "ChannelShuffle(groups=3)"
