"""hpcfsdp.nn.functional: gradient checks (float64 finite differences) and numerics vs float64 references."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn
from hpcfsdp.autograd.ops import erf, normal_cdf
from tests._gradcheck import gradcheck, rand


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# -- gradient checks -------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["c", "t", "s"])
def test_linear_grad(rng, layout):
    x, w, b = rand(rng, 2, 3, 4, layout=layout), rand(rng, 5, 4, layout=layout), rng.standard_normal(5)
    gradcheck(F.linear, [x, w, b])
    gradcheck(lambda x, w: F.linear(x, w), [rand(rng, 3, 4, layout=layout), w])
    ref = x @ w.T + b
    np.testing.assert_allclose(F.linear(hp.tensor(x), hp.tensor(w), hp.tensor(b)).numpy(), ref, rtol=1e-12)


@pytest.mark.parametrize("fn", [F.relu, F.tanh, F.sigmoid, lambda x: F.gelu(x), lambda x: F.gelu(x, approximate="tanh"),
                                F.silu])
def test_activation_grads(rng, fn):
    gradcheck(fn, [rand(rng, 3, 4, layout="t") * 2])


@pytest.mark.parametrize("dim", [0, -1])
def test_softmax_functional_grad(rng, dim):
    gradcheck(lambda x: F.softmax(x, dim), [rng.standard_normal((3, 4))])
    gradcheck(lambda x: F.log_softmax(x, dim=dim), [rand(rng, 3, 4, layout="s")])


def ce_ref(x, t, weight=None, ignore_index=-100, reduction="mean", eps=0.0):
    """Cross entropy from PyTorch's documented formula, float64."""
    c = x.shape[1]
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    w = np.ones(c) if weight is None else weight
    valid = t != ignore_index
    ts = np.where(valid, t, 0)
    nll = -w[ts] * logp[np.arange(len(t)), ts] * valid
    smooth = -(logp * w).sum(axis=1) * valid
    loss = (1 - eps) * nll + eps / c * smooth
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (w[ts] * valid).sum()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("use_weight", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_grad_and_value(rng, reduction, use_weight, eps):
    x = rng.standard_normal((6, 5))
    t = np.array([0, 4, -100, 2, 2, 1])
    wt = rng.uniform(0.5, 2.0, 5) if use_weight else None
    tt = hp.tensor(t)
    wtt = hp.tensor(wt) if use_weight else None
    f = lambda a: F.cross_entropy(a, tt, weight=wtt, reduction=reduction, label_smoothing=eps)  # noqa: E731
    gradcheck(f, [x])
    np.testing.assert_allclose(f(hp.tensor(x)).numpy(), ce_ref(x, t, wt, -100, reduction, eps), rtol=1e-12)


def test_cross_entropy_spatial_and_unbatched(rng):
    x = rng.standard_normal((2, 4, 3))  # (N, C, d1)
    t = np.array([[0, 3, 1], [2, -100, 3]])
    tt = hp.tensor(t)
    gradcheck(lambda a: F.cross_entropy(a, tt, reduction="none"), [x])
    gradcheck(lambda a: F.cross_entropy(a, tt), [rand(rng, 2, 4, 3, layout="t")])
    flat = x.transpose(0, 2, 1).reshape(-1, 4)
    np.testing.assert_allclose(F.cross_entropy(hp.tensor(x), tt).item(), ce_ref(flat, t.reshape(-1)), rtol=1e-12)
    v = rng.standard_normal(4)
    np.testing.assert_allclose(F.cross_entropy(hp.tensor(v), hp.tensor(2)).item(), ce_ref(v[None], np.array([2])),
                               rtol=1e-12)


def test_cross_entropy_probability_targets(rng):
    x = rng.standard_normal((3, 4))
    p = rng.uniform(size=(3, 4))
    p /= p.sum(1, keepdims=True)
    pt = hp.tensor(p)
    gradcheck(lambda a: F.cross_entropy(a, pt, label_smoothing=0.2), [x])
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    np.testing.assert_allclose(F.cross_entropy(hp.tensor(x), pt).item(), -(p * logp).sum(1).mean(), rtol=1e-12)


def test_cross_entropy_errors():
    with pytest.raises(ValueError, match="target"):
        F.cross_entropy(hp.zeros(3, 4), hp.tensor([0, 1]))
    with pytest.raises(IndexError, match="7"):
        F.cross_entropy(hp.zeros(2, 4), hp.tensor([0, 7]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(hp.zeros(2, 4), hp.tensor([0, 1]), reduction="avg")


def test_cross_entropy_all_ignored_is_nan():
    assert math.isnan(F.cross_entropy(hp.zeros(2, 3), hp.tensor([-100, -100])).item())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(rng, reduction):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    gradcheck(lambda x, y: F.mse_loss(x, y, reduction=reduction), [a, b])
    d = (a - b) ** 2
    ref = {"mean": d.mean(), "sum": d.sum(), "none": d}[reduction]
    np.testing.assert_allclose(F.mse_loss(hp.tensor(a), hp.tensor(b), reduction=reduction).numpy(), ref)


def ln_ref(x, nd, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - nd, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("nshape", [(4,), (3, 4)])
def test_layer_norm(rng, affine, nshape):
    x = rand(rng, 2, 3, 4, layout="t")
    w = rng.standard_normal(nshape) if affine in ("both", "weight") else None
    b = rng.standard_normal(nshape) if affine in ("both", "bias") else None
    gradcheck(lambda a, ww, bb: F.layer_norm(a, nshape, ww, bb), [x, w, b])
    out = F.layer_norm(hp.tensor(x), nshape, None if w is None else hp.tensor(w), None if b is None else hp.tensor(b))
    np.testing.assert_allclose(out.numpy(), ln_ref(x, len(nshape), w, b), rtol=1e-10, atol=1e-12)


def test_layer_norm_float32_large_offset(rng):
    x = (rng.standard_normal((4, 64)) + 1000.0).astype(np.float32)
    out = F.layer_norm(hp.tensor(x), (64,)).numpy()
    np.testing.assert_allclose(out, ln_ref(x.astype(np.float64), 1), atol=2e-3)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(hp.tensor(x), (32,))


def test_embedding(rng):
    w = rng.standard_normal((6, 3))
    idx = hp.tensor([[0, 2, 2], [5, 0, 1]])
    gradcheck(lambda ww: F.embedding(idx, ww), [w])
    np.testing.assert_array_equal(F.embedding(idx, hp.tensor(w)).numpy(), w[idx.numpy()])
    wt = hp.tensor(w, requires_grad=True)
    F.embedding(idx, wt, padding_idx=2).sum().backward()
    np.testing.assert_array_equal(wt.grad.numpy()[:, 0], [2, 1, 0, 0, 0, 1])


def test_embedding_errors():
    w = hp.zeros(4, 2)
    with pytest.raises(TypeError, match="float32"):
        F.embedding(hp.tensor([0.0, 1.0]), w)
    with pytest.raises(IndexError):
        F.embedding(hp.tensor([4]), w)
    with pytest.raises(IndexError):
        F.embedding(hp.tensor([-1]), w)


def test_dropout(rng):
    x = hp.ones(200, 100, requires_grad=True)
    hp.manual_seed(3)
    y = F.dropout(x, 0.3)
    kept = y.detach().numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y.detach().numpy()[kept], 1 / 0.7, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.7, rtol=1e-6)
    assert F.dropout(x, 0.3, training=False) is x
    hp.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, 0.3).detach().numpy(), y.detach().numpy())
    with pytest.raises(ValueError):
        F.dropout(x, 1.5)
    np.testing.assert_array_equal(F.dropout(x, 1.0).detach().numpy(), 0)


def sdpa_ref(q, k, v, mask=None, causal=False, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return p @ v


@pytest.mark.parametrize("case", ["plain", "causal", "bool", "additive", "scale", "broadcast", "cross"])
def test_sdpa(rng, case):
    q, k, v = rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 4, 5))
    kw = {}
    ref_kw = {}
    if case == "causal":
        kw = ref_kw = {"is_causal": True}
        ref_kw = {"causal": True}
    elif case == "bool":
        m = rng.standard_normal((4, 4)) > -0.5
        m[:, 0] = True
        kw, ref_kw = {"attn_mask": hp.tensor(m)}, {"mask": m}
    elif case == "additive":
        m = rng.standard_normal((2, 1, 4, 4))
        kw, ref_kw = {"attn_mask": hp.tensor(m)}, {"mask": m}
    elif case == "scale":
        kw = ref_kw = {"scale": 0.3}
    elif case == "broadcast":
        k, v = k[:1], v[:1]
    elif case == "cross":
        k, v = rng.standard_normal((2, 2, 6, 3)), rng.standard_normal((2, 2, 6, 5))
    gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, **kw), [q, k, v])
    out = F.scaled_dot_product_attention(hp.tensor(q), hp.tensor(k), hp.tensor(v), **kw)
    np.testing.assert_allclose(out.numpy(), sdpa_ref(q, k, v, **ref_kw), rtol=1e-10, atol=1e-12)


def test_sdpa_float32_and_dropout(rng):
    q, k, v = (rng.standard_normal((2, 3, 16, 8)).astype(np.float32) for _ in range(3))
    out = F.scaled_dot_product_attention(hp.tensor(q), hp.tensor(k), hp.tensor(v), is_causal=True)
    ref = sdpa_ref(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    qt = hp.tensor(q, requires_grad=True)
    hp.manual_seed(0)
    o1 = F.scaled_dot_product_attention(qt, hp.tensor(k), hp.tensor(v), dropout_p=0.5)
    hp.manual_seed(0)
    o2 = F.scaled_dot_product_attention(qt, hp.tensor(k), hp.tensor(v), dropout_p=0.5)
    np.testing.assert_array_equal(o1.detach().numpy(), o2.detach().numpy())
    assert not np.allclose(o1.detach().numpy(), out.numpy())
    o1.sum().backward()
    assert np.isfinite(qt.grad.numpy()).all()


def test_sdpa_dropout_grad(rng):
    q, k, v = rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 3, 2))

    def f(a, b, c):
        hp.manual_seed(11)  # the same dropout mask on every evaluation
        return F.scaled_dot_product_attention(a, b, c, dropout_p=0.4)

    gradcheck(f, [q, k, v])


# -- numerics ------------------------------------------------------------------------------------------
def test_softmax_large_logits_float32(rng):
    x = (rng.standard_normal((5, 7)) * 50 + 1e4).astype(np.float32)
    x64 = x.astype(np.float64)
    ref = np.exp(x64 - x64.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(F.softmax(hp.tensor(x), -1).numpy(), ref, rtol=1e-5, atol=1e-7)
    lref = x64 - x64.max(1, keepdims=True) - np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1, keepdims=True))
    np.testing.assert_allclose(F.log_softmax(hp.tensor(x), -1).numpy(), lref, rtol=1e-5, atol=1e-4)
    assert np.isfinite(F.log_softmax(hp.tensor(x), -1).numpy()).all()


def test_cross_entropy_large_logits_float32(rng):
    x = (rng.standard_normal((8, 11)) * 1e3).astype(np.float32)
    t = rng.integers(0, 11, 8)
    got = F.cross_entropy(hp.tensor(x), hp.tensor(t)).item()
    np.testing.assert_allclose(got, ce_ref(x.astype(np.float64), t), rtol=1e-5)
    xt = hp.tensor(x, requires_grad=True)
    F.cross_entropy(xt, hp.tensor(t)).backward()
    assert np.isfinite(xt.grad.numpy()).all()


def test_erf_matches_math_erf():
    xs = np.concatenate([np.linspace(-6, 6, 20001), [0.0, 1e-8, -1e-8, 1e-3, 3.9, 4.0, 10.0, -10.0]])
    ref = np.array([math.erf(v) for v in xs])
    e64 = erf(xs)
    assert np.abs(e64 - ref).max() < 3e-8
    small = np.abs(xs) < 0.5
    assert (np.abs(e64 - ref)[small] / np.maximum(np.abs(ref[small]), 1e-300)).max() < 1e-7
    e32 = erf(xs.astype(np.float32))
    assert e32.dtype == np.float32
    ref32 = np.array([math.erf(v) for v in xs.astype(np.float32).astype(np.float64)])
    assert np.abs(e32 - ref32).max() < 5e-7  # ~4 ulp of 1.0


def test_gelu_exact_matches_math_erf(rng):
    xs = np.concatenate([rng.standard_normal(2000) * 3, np.linspace(-10, 10, 1001)])
    ref = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xs])
    # |Phi error| <= 2e-8 (See [Note: erf]), so |gelu error| <= 2e-8 |x| beyond float64 rounding
    err = np.abs(F.gelu(hp.tensor(xs)).numpy() - ref)
    assert (err <= 1e-12 * np.abs(ref) + 2e-8 * np.abs(xs)).all()
    g32 = F.gelu(hp.tensor(xs, dtype=hp.float32)).numpy()
    ref32 = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xs.astype(np.float32).astype(np.float64)])
    np.testing.assert_allclose(g32, ref32, rtol=1e-6, atol=5e-7 * np.abs(xs).max())
    cdf = normal_cdf(xs)
    np.testing.assert_allclose(cdf, [0.5 * (1 + math.erf(v / math.sqrt(2))) for v in xs], atol=2e-8)
    t = F.gelu(hp.tensor(xs), approximate="tanh").numpy()
    tref = 0.5 * xs * (1 + np.tanh(math.sqrt(2 / math.pi) * (xs + 0.044715 * xs ** 3)))
    np.testing.assert_allclose(t, tref, rtol=1e-12, atol=1e-15)


def test_gelu_large_array_blocked_path(rng):
    x = rng.standard_normal(100_003).astype(np.float32) * 3  # crosses the block size
    xt = hp.tensor(x, requires_grad=True)
    y = F.gelu(xt)
    y.sum().backward()
    x64 = x.astype(np.float64)
    cdf = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x64[:2000]])
    np.testing.assert_allclose(y.detach().numpy()[:2000], x64[:2000] * cdf, rtol=1e-5, atol=1e-6)
    dref = cdf + x64[:2000] * np.exp(-x64[:2000] ** 2 / 2) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(xt.grad.numpy()[:2000], dref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [hp.float16, hp.bfloat16])
def test_half_inputs_compute_in_float32(rng, dt):
    x = hp.tensor(rng.standard_normal((4, 16)), dtype=dt, requires_grad=True)
    w = hp.tensor(rng.standard_normal((8, 16)), dtype=dt, requires_grad=True)
    y = F.layer_norm(F.gelu(F.linear(x, w)), (8,))
    assert y.dtype == dt
    F.cross_entropy(y, hp.tensor([0, 1, 2, 3])).backward()
    assert x.grad.dtype == dt and w.grad.dtype == dt
    ref = ln_ref(np.array([[0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in row] for row in
                           (x.float().detach().numpy() @ w.float().detach().numpy().T)]), 1)
    np.testing.assert_allclose(y.float().detach().numpy(), ref, atol=0.05)


@pytest.mark.parametrize("L,S", [(5, 5), (6, 4), (3, 7)])
def test_sdpa_block_causal_path(rng, monkeypatch, L, S):
    from hpcfsdp.autograd.ops import attention

    monkeypatch.setattr(attention, "CAUSAL_BLOCK", 2)  # several query blocks on a small problem
    q, k, v = rng.standard_normal((2, L, 3)), rng.standard_normal((2, S, 3)), rng.standard_normal((1, S, 4))
    gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), [q, k, v])
    out = F.scaled_dot_product_attention(hp.tensor(q), hp.tensor(k), hp.tensor(v), is_causal=True)
    np.testing.assert_allclose(out.numpy(), sdpa_ref(q, k, v, causal=True), rtol=1e-10, atol=1e-12)

    def f(a, b, c):
        hp.manual_seed(2)
        return F.scaled_dot_product_attention(a, b, c, is_causal=True, dropout_p=0.3)

    gradcheck(f, [q, k, v])


def test_sdpa_block_causal_matches_dense_float32(rng):
    q, k, v = (rng.standard_normal((2, 2, 300, 8)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((300, 300), bool))
    ts = [hp.tensor(a, requires_grad=True) for a in (q, k, v)]
    tm = [hp.tensor(a, requires_grad=True) for a in (q, k, v)]
    a = F.scaled_dot_product_attention(*ts, is_causal=True)  # block path (300 > CAUSAL_BLOCK)
    b = F.scaled_dot_product_attention(*tm, attn_mask=hp.tensor(mask))  # dense path
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = hp.tensor(rng.standard_normal(a.shape).astype(np.float32))
    a.backward(g)
    b.backward(g)
    for x, y in zip(ts, tm):
        np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_dropout_grad(rng):
    def f(a):
        hp.manual_seed(5)  # the same mask on every evaluation
        return F.dropout(a, 0.4)

    gradcheck(f, [rand(rng, 4, 5, layout="t")])


def test_nll_loss(rng):
    x = rng.standard_normal((5, 4))
    t = hp.tensor([0, 3, -100, 1, 1])
    w = hp.tensor(rng.uniform(0.5, 2, 4))
    for red in ("mean", "sum", "none"):
        gradcheck(lambda a: F.nll_loss(F.log_softmax(a, 1), t, weight=w, reduction=red), [x])
        np.testing.assert_allclose(F.nll_loss(F.log_softmax(hp.tensor(x), 1), t, weight=w, reduction=red).numpy(),
                                   ce_ref(x, t.numpy(), w.numpy(), reduction=red), rtol=1e-12)


def test_embedding_float32_duplicates_match_reference(rng):
    w = rng.standard_normal((50, 8)).astype(np.float32)
    idx = rng.integers(0, 50, (4, 30))
    wt = hp.tensor(w, requires_grad=True)
    g = rng.standard_normal((4, 30, 8)).astype(np.float32)
    F.embedding(hp.tensor(idx), wt).backward(hp.tensor(g))
    ref = np.zeros((50, 8))
    np.add.at(ref, idx.reshape(-1), g.reshape(-1, 8).astype(np.float64))
    np.testing.assert_allclose(wt.grad.numpy(), ref, rtol=1e-5, atol=1e-5)


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


# -- group_norm, normalize, one_hot ----------------------------------------------------------------------
def gn_ref(x, g, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    xr = x.reshape(n, g, -1)
    y = ((xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(shape)) + (0 if b is None else b.reshape(shape))


def test_group_norm(rng):
    x = rand(rng, 2, 6, 3, 2, layout="t") * 2 + 1
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    np.testing.assert_allclose(F.group_norm(hp.tensor(x), 3, hp.tensor(w), hp.tensor(b)).numpy(), gn_ref(x, 3, w, b),
                               rtol=1e-10, atol=1e-12)
    gradcheck(lambda a, ww, bb: F.group_norm(a, 3, ww, bb), [x, w, b])
    gradcheck(lambda a: F.group_norm(a, 2, eps=1e-3), [x[:, :, 0]])
    m = nn.GroupNorm(3, 6, dtype=hp.float64)
    assert (m.weight.detach().numpy() == 1).all() and (m.bias.detach().numpy() == 0).all()
    np.testing.assert_allclose(m(hp.tensor(x)).detach().numpy(), gn_ref(x, 3), rtol=1e-10, atol=1e-12)
    assert repr(m) == "GroupNorm(3, 6, eps=1e-05, affine=True, bias=True)"
    assert repr(nn.GroupNorm(2, 4, affine=False)) == "GroupNorm(2, 4, eps=1e-05, affine=False, bias=False)"
    assert nn.GroupNorm(2, 4, bias=False).bias is None and list(nn.GroupNorm(2, 4, affine=False).parameters()) == []
    assert nn.GroupNorm(2, 4, device="meta").weight.device.type == "meta"
    with pytest.raises(ValueError, match=r"num_channels \(6\) must be divisible by num_groups \(4\)"):
        nn.GroupNorm(4, 6)
    with pytest.raises(RuntimeError, match="Expected number of channels in input to be divisible by num_groups"):
        F.group_norm(hp.zeros(2, 6, 3), 4)
    with pytest.raises(RuntimeError, match="Expected weight to be a vector of size equal to the number of channels"):
        F.group_norm(hp.zeros(2, 6, 3), 3, weight=hp.ones(5))
    with pytest.raises(RuntimeError, match="Expected at least 2 dimensions for input tensor but received 1"):
        F.group_norm(hp.zeros(6), 3)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
def test_normalize(rng, p, dim=1):
    x = rand(rng, 3, 4, 2, layout="s")
    norm = np.max(np.abs(x), axis=dim, keepdims=True) if p == float("inf") else \
        (np.abs(x) ** p).sum(axis=dim, keepdims=True) ** (1 / p)
    np.testing.assert_allclose(F.normalize(hp.tensor(x), p=p, dim=dim).numpy(), x / np.maximum(norm, 1e-12),
                               rtol=1e-12)
    gradcheck(lambda a: F.normalize(a, p=p, dim=dim), [x])
    gradcheck(lambda a: F.normalize(a, p=p, dim=-1), [x])


def test_normalize_zero_vector_and_errors():
    z = hp.zeros(2, 3, dtype=hp.float64, requires_grad=True)
    out = F.normalize(z)
    out.sum().backward()
    np.testing.assert_array_equal(out.detach().numpy(), 0)
    assert np.isfinite(z.grad.numpy()).all()
    np.testing.assert_allclose(F.normalize(hp.tensor([3.0, 4.0]), dim=0).numpy(), [0.6, 0.8])
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.normalize(hp.zeros(3))


def test_one_hot():
    out = F.one_hot(hp.tensor([0, 2, 1]))
    assert out.dtype == hp.int64 and out.numpy().tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    assert F.one_hot(hp.tensor([[0, 2]]), 5).shape == (1, 2, 5)
    assert F.one_hot(hp.tensor(np.zeros(0, np.int64)), 3).shape == (0, 3)
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes."):
        F.one_hot(hp.tensor([0, 2, 1]), 2)
    with pytest.raises(RuntimeError, match="Class values must be non-negative."):
        F.one_hot(hp.tensor([0, -2, 1]))
    with pytest.raises(RuntimeError, match="one_hot is only applicable to index tensor of type LongTensor."):
        F.one_hot(hp.tensor([0.0, 2.0]))
    with pytest.raises(RuntimeError, match="Can not infer total number of classes from empty tensor."):
        F.one_hot(hp.tensor(np.zeros(0, np.int64)))
