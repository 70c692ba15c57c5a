"""The residual family's ops (hpcfsdp/autograd/ops/residual.py, what GPT's fused block calls) equal their composition
of unfused ops in float64, forward and backward (finite differences). Their fused launches on the GPU are held to
the same ops in tests/test_gpu_gpt_fused.py."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.autograd.ops.residual import AddNorm, BiasGelu, BiasResidual, NormBranch
from hpcfsdp.nn import functional as F
from tests._gradcheck import gradcheck


def _arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def test_bias_residual_is_x_plus_y_plus_b():
    x, y, b = _arrays(0, (2, 3, 5), (2, 3, 5), (5,))
    out = BiasResidual.apply(hp.tensor(x), hp.tensor(y), hp.tensor(b))
    np.testing.assert_array_equal(out.numpy(), x + (y + b))  # the unfused order
    gradcheck(lambda x, y, b: BiasResidual.apply(x, y, b), [x, y, b])


@pytest.mark.parametrize("with_yb", [True, False])
def test_add_norm_is_the_residual_sum_and_its_layer_norm(with_yb):
    x, y, yb, w, b = _arrays(1, (3, 4, 6), (3, 4, 6), (6,), (6,), (6,))
    s, out = AddNorm.apply(hp.tensor(x), hp.tensor(y), hp.tensor(yb) if with_yb else None, hp.tensor(w),
                           hp.tensor(b), 1e-5)
    want = x + (y + yb if with_yb else y)
    np.testing.assert_array_equal(s.numpy(), want)
    np.testing.assert_allclose(out.numpy(), F.layer_norm(hp.tensor(want), (6,), hp.tensor(w), hp.tensor(b)).numpy(),
                               rtol=1e-12, atol=1e-12)
    if with_yb:
        gradcheck(lambda x, y, yb, w, b: AddNorm.apply(x, y, yb, w, b, 1e-5), [x, y, yb, w, b])
    else:
        gradcheck(lambda x, y, w, b: AddNorm.apply(x, y, None, w, b, 1e-5), [x, y, w, b])


def test_norm_branch_passes_the_stream_through_and_adds_its_gradient_to_the_norm_s():
    x, w, b = _arrays(2, (2, 5, 8), (8,), (8,))
    keep, out = NormBranch.apply(hp.tensor(x), hp.tensor(w), hp.tensor(b), 1e-5)
    np.testing.assert_array_equal(keep.numpy(), x)
    np.testing.assert_allclose(out.numpy(), F.layer_norm(hp.tensor(x), (8,), hp.tensor(w), hp.tensor(b)).numpy(),
                               rtol=1e-12, atol=1e-12)
    gradcheck(lambda x, w, b: NormBranch.apply(x, w, b, 1e-5), [x, w, b])
    # only one output used: the other's gradient counts as zero
    xt = hp.tensor(x, requires_grad=True)
    NormBranch.apply(xt, hp.tensor(w), hp.tensor(b), 1e-5)[0].sum().backward()
    np.testing.assert_array_equal(xt.grad.numpy(), np.ones_like(x))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_is_gelu_of_the_biased_input(approximate):
    x, b = _arrays(3, (4, 7), (7,))
    out = BiasGelu.apply(hp.tensor(x), hp.tensor(b), approximate)
    want = F.gelu(hp.tensor(x + b), approximate=approximate).numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)
    gradcheck(lambda x, b: BiasGelu.apply(x, b, approximate), [x, b])
