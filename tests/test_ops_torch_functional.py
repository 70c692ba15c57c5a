"""The nn.functional ops PyTorch also exposes as torch.* (dropout, layer_norm, group_norm, embedding, conv*,
selu, celu, threshold, pixel_(un)shuffle, cosine_similarity, pairwise_distance, pdist): PyTorch's torch-level
signatures, each giving nn.functional's result."""
import inspect

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F

RNG = np.random.default_rng(2)


def _t(*shape):
    return hp.tensor(RNG.standard_normal(shape))


def test_signatures_are_pytorchs():
    assert list(inspect.signature(hp.dropout).parameters) == ["input", "p", "train"]
    assert inspect.signature(hp.dropout).parameters["train"].default is inspect.Parameter.empty
    assert list(inspect.signature(hp.embedding).parameters)[:3] == ["weight", "indices", "padding_idx"]
    assert list(inspect.signature(hp.selu).parameters) == ["input"]
    assert "dilation" == list(inspect.signature(hp.conv_transpose1d).parameters)[-1]


@pytest.mark.parametrize("name,args,ref", [
    ("layer_norm", lambda x: (x, (4,)), lambda x: F.layer_norm(x, (4,))),
    ("group_norm", lambda x: (x, 1), lambda x: F.group_norm(x, 1)),
    ("selu", lambda x: (x,), F.selu),
    ("celu", lambda x: (x, 0.5), lambda x: F.celu(x, 0.5)),
    ("threshold", lambda x: (x, 0.1, -1.0), lambda x: F.threshold(x, 0.1, -1.0)),
    ("cosine_similarity", lambda x: (x, x * 2 + 1), lambda x: F.cosine_similarity(x, x * 2 + 1)),
    ("pairwise_distance", lambda x: (x, x + 1), lambda x: F.pairwise_distance(x, x + 1)),
])
def test_elementwise_and_norm_functions(name, args, ref):
    x = _t(2, 3, 4)
    np.testing.assert_array_equal(getattr(hp, name)(*args(x)).numpy(), ref(x).numpy())


def test_dropout_embedding_shuffle_pdist():
    x = _t(4, 5)
    assert hp.dropout(x, 0.5, False).tolist() == x.tolist()
    y = hp.dropout(x, 0.5, True)
    assert y.shape == x.shape and set(np.round(y.numpy() / np.where(x.numpy() == 0, 1, x.numpy()), 6).ravel()) <= {
        0.0, 2.0}
    w = _t(6, 3)
    idx = hp.tensor([[1, 5], [0, 1]])
    np.testing.assert_array_equal(hp.embedding(w, idx).numpy(), w.numpy()[idx.numpy()])
    w.requires_grad_(True)
    hp.embedding(w, idx, padding_idx=1).sum().backward()
    assert w.grad[1].abs().sum().item() == 0 and w.grad[5].sum().item() == 3
    z = _t(1, 8, 2, 3)
    np.testing.assert_array_equal(hp.pixel_shuffle(z, 2).numpy(), F.pixel_shuffle(z, 2).numpy())
    np.testing.assert_array_equal(hp.pixel_unshuffle(hp.pixel_shuffle(z, 2), 2).numpy(), z.numpy())
    p = _t(4, 3)
    np.testing.assert_allclose(hp.pdist(p).numpy(), F.pdist(p).numpy())


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_convolutions(nd):
    x = _t(1, 2, *([5] * nd))
    w = _t(3, 2, *([3] * nd))
    b = _t(3)
    conv = getattr(hp, f"conv{nd}d")
    np.testing.assert_array_equal(conv(x, w, b, 1, 1).numpy(), getattr(F, f"conv{nd}d")(x, w, b, 1, 1).numpy())
    if nd < 3:
        wt = _t(2, 3, *([3] * nd))
        out = getattr(hp, f"conv_transpose{nd}d")(x, wt, None, 2, 1, 1)
        np.testing.assert_array_equal(out.numpy(), getattr(F, f"conv_transpose{nd}d")(x, wt, None, 2, 1, 1).numpy())
