"""Convolution and transposed convolution (F.conv*d, F.conv_transpose*d, nn.Conv*d, nn.ConvTranspose*d) against
nested-loop NumPy float64 references; the MNIST tutorial's network; conv and pooling on the device.

Each op: forward values against a direct loop written here, finite-difference gradients (tests/_gradcheck.py),
PyTorch's output sizes and its errors for bad input; the layers: init, reprs in PyTorch's layout.
"""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._nn_refs import conv_ref, convt_ref, maxpool_ref
from tests._gradcheck import gradcheck, rand


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
