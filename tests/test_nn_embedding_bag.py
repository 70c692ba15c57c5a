"""embedding_bag / nn.EmbeddingBag, embedding's max_norm, bilinear / nn.Bilinear and pdist against NumPy float64
loops of PyTorch's definitions, with finite-difference gradients and PyTorch's errors."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from tests._gradcheck import gradcheck


@pytest.fixture
def rng():
    return np.random.default_rng(9)


def bag_ref(idx, w, starts, ends, mode, psw=None, pad=None):
    out = np.zeros((len(starts), w.shape[1]))
    for b, (s, e) in enumerate(zip(starts, ends)):
        rows = [w[idx[k]] * (psw[k] if psw is not None else 1.0) for k in range(s, e) if idx[k] != pad]
        if rows:
            out[b] = {"sum": np.sum, "mean": np.mean, "max": np.max}[mode](rows, axis=0)
    return out


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_modes(rng, mode):
    w = rng.standard_normal((10, 3))
    idx = np.array([1, 2, 3, 5, 2, 7])
    offs = np.array([0, 2, 2, 5])  # bag 1 is empty
    ref = bag_ref(idx, w, offs, [2, 2, 5, 6], mode, pad=2)
    got = F.embedding_bag(hp.tensor(idx), hp.tensor(w), hp.tensor(offs), mode=mode, padding_idx=2)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12)
    gradcheck(lambda a: F.embedding_bag(hp.tensor(idx), a, hp.tensor(offs), mode=mode), [w])
    two = np.array([[1, 2, 3], [4, 4, 9]])
    np.testing.assert_allclose(F.embedding_bag(hp.tensor(two), hp.tensor(w), mode=mode).numpy(),
                               bag_ref(two.reshape(-1), w, [0, 3], [3, 6], mode), rtol=1e-12)
    last = F.embedding_bag(hp.tensor(idx), hp.tensor(w), hp.tensor([0, 2, 6]), mode=mode, include_last_offset=True)
    np.testing.assert_allclose(last.numpy(), bag_ref(idx, w, [0, 2], [2, 6], mode), rtol=1e-12)


def test_embedding_bag_per_sample_weights_and_module(rng):
    w = rng.standard_normal((10, 3))
    idx, offs, psw = np.array([1, 2, 3, 5, 2, 7]), np.array([0, 2, 2]), rng.standard_normal(6)
    got = F.embedding_bag(hp.tensor(idx), hp.tensor(w), hp.tensor(offs), mode="sum", per_sample_weights=hp.tensor(psw))
    np.testing.assert_allclose(got.numpy(), bag_ref(idx, w, offs, [2, 2, 6], "sum", psw), rtol=1e-12)
    gradcheck(lambda a, p: F.embedding_bag(hp.tensor(idx), a, hp.tensor(offs), mode="sum", per_sample_weights=p),
              [w, psw])
    bag = nn.EmbeddingBag.from_pretrained(hp.tensor(w), mode="max", padding_idx=2)
    assert repr(bag) == "EmbeddingBag(10, 3, mode='max', padding_idx=2)" and not bag.weight.requires_grad
    np.testing.assert_allclose(bag(hp.tensor(idx), hp.tensor(offs)).numpy(),
                               bag_ref(idx, w, offs, [2, 2, 6], "max", pad=2), rtol=1e-12)
    fresh = nn.EmbeddingBag(6, 4, padding_idx=-1)
    assert fresh.padding_idx == 5 and not fresh.weight.detach().numpy()[5].any() and list(fresh.state_dict()) == ["weight"]


def test_embedding_bag_errors():
    w = hp.ones(10, 3)
    with pytest.raises(ValueError, match="if input is 2D, then offsets has to be None"):
        F.embedding_bag(hp.tensor([[1, 2]]), w, hp.tensor([0]))
    with pytest.raises(ValueError, match="offsets has to be a 1D Tensor but got None"):
        F.embedding_bag(hp.tensor([1, 2]), w)
    with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0"):
        F.embedding_bag(hp.tensor([1, 2]), w, hp.tensor([1]))
    with pytest.raises(NotImplementedError, match="only supported for mode='sum' \\(got mode='mean'\\)"):
        F.embedding_bag(hp.tensor([1, 2]), w, hp.tensor([0]), per_sample_weights=hp.ones(2))
    with pytest.raises(ValueError, match="mode has to be one of sum, mean or max"):
        F.embedding_bag(hp.tensor([1, 2]), w, hp.tensor([0]), mode="min")


def test_embedding_max_norm_renormalises_rows_read(rng):
    w = rng.standard_normal((5, 3)) * 3
    t = hp.tensor(w.copy())
    out = F.embedding(hp.tensor([1, 3, 1]), t, max_norm=1.0)
    norms = np.linalg.norm(w, axis=1)
    want = w.copy()
    for r in (1, 3):
        if norms[r] > 1.0:
            want[r] = w[r] / (norms[r] + 1e-7)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-12)  # rows 0, 2, 4 untouched
    np.testing.assert_allclose(out.numpy(), want[[1, 3, 1]], rtol=1e-12)
    emb = nn.Embedding(5, 3, max_norm=0.5, _weight=hp.tensor(w.copy()))
    assert repr(emb) == "Embedding(5, 3, max_norm=0.5)"
    assert np.linalg.norm(emb(hp.tensor([0])).detach().numpy()) == pytest.approx(0.5, rel=1e-6)


def test_bilinear(rng):
    x1, x2 = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 5))
    w, b = rng.standard_normal((6, 4, 5)), rng.standard_normal(6)
    ref = np.einsum("...i,oij,...j->...o", x1, w, x2) + b
    np.testing.assert_allclose(F.bilinear(hp.tensor(x1), hp.tensor(x2), hp.tensor(w), hp.tensor(b)).numpy(), ref,
                               rtol=1e-12)
    gradcheck(F.bilinear, [x1, x2, w, b])
    m = nn.Bilinear(4, 5, 6)
    assert repr(m) == "Bilinear(in1_features=4, in2_features=5, out_features=6, bias=True)"
    assert list(m.state_dict()) == ["weight", "bias"] and float(np.abs(m.weight.detach().numpy()).max()) <= 0.5
    assert m(hp.tensor(x1), hp.tensor(x2)).shape == (2, 3, 6)
    assert nn.Bilinear(4, 5, 6, bias=False).bias is None
    with pytest.raises(RuntimeError, match="input2 size does not match weight size: got 5 but expected 4"):
        F.bilinear(hp.tensor(x1), hp.tensor(x2), hp.tensor(rng.standard_normal((6, 4, 4))))


@pytest.mark.parametrize("p", [2.0, 1.0, 3.5])
def test_pdist(rng, p):
    x = rng.standard_normal((5, 3))
    ref = [np.sum(np.abs(x[i] - x[j]) ** p) ** (1 / p) for i in range(5) for j in range(i + 1, 5)]
    np.testing.assert_allclose(F.pdist(hp.tensor(x), p).numpy(), ref, rtol=1e-12)
    gradcheck(lambda a: F.pdist(a, p), [x])
    with pytest.raises(RuntimeError, match="pdist only supports 2D tensors, got: 1D"):
        F.pdist(hp.ones(3))
    with pytest.raises(RuntimeError, match="pdist only supports non-negative p values"):
        F.pdist(hp.ones(3, 2), -1)
