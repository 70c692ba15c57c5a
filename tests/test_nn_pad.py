"""Padding (F.pad's modes, negative and constant pads) and the padding layers.

Each op: forward values against a direct loop written here, finite-difference gradients (tests/_gradcheck.py),
PyTorch's output sizes and its errors for bad input; the layers: init, reprs in PyTorch's layout.
"""

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck


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
