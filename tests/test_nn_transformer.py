"""MultiheadAttention and the Transformer layers against NumPy float64 references written here (same weights):
forward values, finite-difference gradients, PyTorch's parameter names and reprs. The activations added with them
are tested in test_nn_activations.py."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.nn.functional as F
from hpcfsdp import nn

from _gradcheck import gradcheck

E, H = 8, 2  # embedding size and heads of the module tests
L, S, N = 5, 6, 3  # target length, source length, batch
_erf = np.vectorize(math.erf)


def _t(a, requires_grad=False):
    a = np.asarray(a)
    return hp.tensor(a, requires_grad=requires_grad) if a.dtype == np.bool_ else \
        hp.tensor(a.astype(np.float64), requires_grad=requires_grad)


def _np(t):
    return t.detach().numpy()


def _randomize(module, seed=0, scale=0.5):
    """Random values for every parameter (biases too, which init leaves at 0); returns {name: array}."""
    rng = np.random.default_rng(seed)
    with hp.no_grad():
        for p in module.parameters():
            p.copy_(hp.tensor(rng.standard_normal(tuple(p.shape)) * scale))
    return {n: _np(p) for n, p in module.named_parameters()}


# -- NumPy float64 references (sequence first: (L, N, E)) ------------------------------------------------------

def _additive(mask):
    """A bool mask (True = forbidden) as 0 / -inf; a float mask as it is; None as None."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    return np.where(mask, -np.inf, 0.0) if mask.dtype == np.bool_ else mask.astype(np.float64)


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def np_mha(q, k, v, P, num_heads, attn_mask=None, key_padding_mask=None, prefix="", add_zero_attn=False):
    """Multi-head attention with the parameters ``P`` (PyTorch's names under ``prefix``); returns the (L, N, E)
    output and the per-head weights (N, nh, L, S')."""
    Lq, Nb, Em = q.shape
    hd = Em // num_heads
    b = P.get(prefix + "in_proj_bias")
    bq, bk, bv = (np.zeros(Em),) * 3 if b is None else np.split(b, 3)
    if prefix + "in_proj_weight" in P:
        wq, wk, wv = np.split(P[prefix + "in_proj_weight"], 3)
    else:
        wq, wk, wv = (P[prefix + n] for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    qp, kp, vp = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv
    am, kpm = _additive(attn_mask), _additive(key_padding_mask)
    if prefix + "bias_k" in P:  # one more key position
        kp = np.concatenate([kp, np.broadcast_to(P[prefix + "bias_k"], (1, Nb, Em))])
        vp = np.concatenate([vp, np.broadcast_to(P[prefix + "bias_v"], (1, Nb, Em))])
        am = None if am is None else np.pad(am, [(0, 0)] * (am.ndim - 1) + [(0, 1)])
        kpm = None if kpm is None else np.pad(kpm, [(0, 0), (0, 1)])
    qh = qp.reshape(Lq, Nb, num_heads, hd).transpose(1, 2, 0, 3)  # (N, nh, L, hd)
    kh = kp.reshape(kp.shape[0], Nb, num_heads, hd).transpose(1, 2, 0, 3)
    vh = vp.reshape(vp.shape[0], Nb, num_heads, hd).transpose(1, 2, 0, 3)
    if add_zero_attn:
        z = np.zeros((Nb, num_heads, 1, hd))
        kh, vh = np.concatenate([kh, z], 2), np.concatenate([vh, z], 2)
        am = None if am is None else np.pad(am, [(0, 0)] * (am.ndim - 1) + [(0, 1)])
        kpm = None if kpm is None else np.pad(kpm, [(0, 0), (0, 1)])
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(hd)  # (N, nh, L, S')
    if am is not None:
        s = s + (am if am.ndim == 2 else am.reshape(Nb, num_heads, Lq, -1))
    if kpm is not None:
        s = s + kpm[:, None, None, :]
    p = _softmax(s)
    o = (p @ vh).transpose(2, 0, 1, 3).reshape(Lq, Nb, Em)
    out = o @ P[prefix + "out_proj.weight"].T
    if prefix + "out_proj.bias" in P:
        out = out + P[prefix + "out_proj.bias"]
    return out, p


def _ln(x, P, name, eps=1e-5):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * P[name + ".weight"] + P[name + ".bias"]


def _act(name):
    return {"relu": lambda x: np.maximum(x, 0), "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))}[name]


def _ff(x, P, act, prefix=""):
    h = _act(act)(x @ P[prefix + "linear1.weight"].T + P[prefix + "linear1.bias"])
    return h @ P[prefix + "linear2.weight"].T + P[prefix + "linear2.bias"]


def np_encoder_layer(x, P, nh, norm_first, act, mask=None, kpm=None, prefix=""):
    def sa(y):
        return np_mha(y, y, y, P, nh, mask, kpm, prefix + "self_attn.")[0]

    if norm_first:
        x = x + sa(_ln(x, P, prefix + "norm1"))
        return x + _ff(_ln(x, P, prefix + "norm2"), P, act, prefix)
    x = _ln(x + sa(x), P, prefix + "norm1")
    return _ln(x + _ff(x, P, act, prefix), P, prefix + "norm2")


def np_decoder_layer(x, mem, P, nh, norm_first, act, tgt_mask=None, mem_mask=None, tgt_kpm=None, mem_kpm=None,
                     prefix=""):
    def sa(y):
        return np_mha(y, y, y, P, nh, tgt_mask, tgt_kpm, prefix + "self_attn.")[0]

    def ca(y):
        return np_mha(y, mem, mem, P, nh, mem_mask, mem_kpm, prefix + "multihead_attn.")[0]

    if norm_first:
        x = x + sa(_ln(x, P, prefix + "norm1"))
        x = x + ca(_ln(x, P, prefix + "norm2"))
        return x + _ff(_ln(x, P, prefix + "norm3"), P, act, prefix)
    x = _ln(x + sa(x), P, prefix + "norm1")
    x = _ln(x + ca(x), P, prefix + "norm2")
    return _ln(x + _ff(x, P, act, prefix), P, prefix + "norm3")


# -- inputs -------------------------------------------------------------------------------------------------------

_RNG = np.random.default_rng(7)
Q, K, V = _RNG.standard_normal((L, N, E)), _RNG.standard_normal((S, N, E)), _RNG.standard_normal((S, N, E))
BOOL_MASK = _RNG.random((L, S)) < 0.3
BOOL_MASK[:, 0] = False  # no row fully masked
FLOAT_MASK = _RNG.standard_normal((L, S))
MASK_3D = _RNG.random((N * H, L, S)) < 0.3
MASK_3D[..., 2] = False
KPM = _RNG.random((N, S)) < 0.3
KPM[:, :3] = False  # with the masks above, no row is fully masked (that gives NaN, as in PyTorch)
KPM[0, 4] = True
FLOAT_KPM = _RNG.standard_normal((N, S))
CAUSAL_BOOL = np.triu(np.ones((L, L), bool), 1)

MASKS = {
    "none": (None, None), "bool": (BOOL_MASK, None), "float": (FLOAT_MASK, None), "3d": (MASK_3D, None),
    "kpm": (None, KPM), "float_kpm": (None, FLOAT_KPM), "bool_both": (BOOL_MASK, KPM),
    "float_both": (FLOAT_MASK, FLOAT_KPM), "3d_kpm": (MASK_3D, KPM),
}


# -- MultiheadAttention ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_matches_reference(mask, need_weights, average, batch_first):
    mha = nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=hp.float64)
    P = _randomize(mha)
    am, kpm = MASKS[mask]
    ref, p = np_mha(Q, K, V, P, H, am, kpm)
    assert np.isfinite(ref).all()
    q, k, v = (a.transpose(1, 0, 2) if batch_first else a for a in (Q, K, V))
    out, w = mha(_t(q), _t(k), _t(v), key_padding_mask=None if kpm is None else _t(kpm), need_weights=need_weights,
                 attn_mask=None if am is None else _t(am), average_attn_weights=average)
    np.testing.assert_allclose(_np(out), ref.transpose(1, 0, 2) if batch_first else ref, rtol=1e-10, atol=1e-12)
    if not need_weights:
        assert w is None
    else:
        np.testing.assert_allclose(_np(w), p.mean(1) if average else p, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_self_attention_causal_and_unbatched(need_weights, batch_first):
    mha = nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=hp.float64)
    P = _randomize(mha, seed=1)
    ref, p = np_mha(Q, Q, Q, P, H, CAUSAL_BOOL)
    x = _t(Q.transpose(1, 0, 2) if batch_first else Q)
    for is_causal in (False, True):  # the hint lets the kernel apply the mask itself (need_weights=False)
        out, w = mha(x, x, x, attn_mask=_t(CAUSAL_BOOL), is_causal=is_causal, need_weights=need_weights)
        np.testing.assert_allclose(_np(out), ref.transpose(1, 0, 2) if batch_first else ref, rtol=1e-10,
                                   atol=1e-12)
    # unbatched: (L, E) in and out (batch_first does not apply), (S,) key padding mask, (nh, L, S) mask
    ref1, p1 = np_mha(Q[:, :1], K[:, :1], V[:, :1], P, H, MASK_3D[:H], KPM[:1])
    out, w = mha(_t(Q[:, 0]), _t(K[:, 0]), _t(V[:, 0]), key_padding_mask=_t(KPM[0]), attn_mask=_t(MASK_3D[:H]),
                 need_weights=need_weights, average_attn_weights=False)
    np.testing.assert_allclose(_np(out), ref1[:, 0], rtol=1e-10, atol=1e-12)
    if need_weights:
        np.testing.assert_allclose(_np(w), p1[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(kdim=4, vdim=6), dict(add_bias_kv=True), dict(add_zero_attn=True),
                                dict(bias=False), dict(kdim=4, vdim=6, add_bias_kv=True, add_zero_attn=True)],
                         ids=["kvdim", "bias_kv", "zero_attn", "no_bias", "all"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_options(kw, need_weights):
    mha = nn.MultiheadAttention(E, H, dtype=hp.float64, **kw)
    P = _randomize(mha, seed=2)
    k, v = K[..., :kw.get("kdim", E)], V[..., :kw.get("vdim", E)]
    ref, p = np_mha(Q, k, v, P, H, BOOL_MASK, KPM, add_zero_attn=kw.get("add_zero_attn", False))
    out, w = mha(_t(Q), _t(k), _t(v), key_padding_mask=_t(KPM), attn_mask=_t(BOOL_MASK), need_weights=need_weights)
    np.testing.assert_allclose(_np(out), ref, rtol=1e-10, atol=1e-12)
    if need_weights:
        np.testing.assert_allclose(_np(w), p.mean(1), rtol=1e-10, atol=1e-12)


def test_mha_parameters_init_and_names():
    hp.manual_seed(0)
    mha = nn.MultiheadAttention(E, H)
    assert list(mha.state_dict()) == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    assert tuple(mha.in_proj_weight.shape) == (3 * E, E) and mha.q_proj_weight is None and mha.bias_k is None
    bound = math.sqrt(6.0 / (E + 3 * E))  # xavier_uniform of (3E, E)
    w = _np(mha.in_proj_weight)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert not _np(mha.in_proj_bias).any() and not _np(mha.out_proj.bias).any()
    assert isinstance(mha.out_proj, nn.Linear) and type(mha.out_proj).__name__ == "NonDynamicallyQuantizableLinear"
    assert repr(mha) == ("MultiheadAttention(\n  (out_proj): NonDynamicallyQuantizableLinear(in_features=8, "
                         "out_features=8, bias=True)\n)")
    sep = nn.MultiheadAttention(E, H, kdim=4, vdim=6, add_bias_kv=True, bias=False)
    # PyTorch 2.13's key list for the same arguments
    assert list(sep.state_dict()) == ["q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v",
                                      "out_proj.weight"]
    assert sep.in_proj_weight is None and sep.in_proj_bias is None and tuple(sep.k_proj_weight.shape) == (E, 4)
    assert tuple(sep.bias_k.shape) == (1, 1, E) and _np(sep.bias_k).std() > 0
    assert mha.head_dim == 4 and mha._qkv_same_embed_dim and not sep._qkv_same_embed_dim


def test_mha_functional_dropout_and_dtypes():
    mha = nn.MultiheadAttention(E, H, dropout=0.5, dtype=hp.float64)
    P = _randomize(mha, seed=3)
    ref, p = np_mha(Q, K, V, P, H)
    out, w = F.multi_head_attention_forward(
        _t(Q), _t(K), _t(V), E, H, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.5,
        mha.out_proj.weight, mha.out_proj.bias, training=False)
    np.testing.assert_allclose(_np(out), ref, rtol=1e-10, atol=1e-12)
    mha.eval()  # no dropout in eval mode
    np.testing.assert_allclose(_np(mha(_t(Q), _t(K), _t(V))[0]), ref, rtol=1e-10, atol=1e-12)
    mha.train()
    hp.manual_seed(0)
    _, w = mha(_t(Q), _t(K), _t(V), average_attn_weights=False)
    w = _np(w)
    dropped = w == 0
    assert 0.3 < dropped.mean() < 0.7  # returned weights are after dropout, as PyTorch's
    np.testing.assert_allclose(w[~dropped], 2 * p[~dropped], rtol=1e-10)
    hp.manual_seed(0)
    out_sdpa, _ = mha(_t(Q), _t(K), _t(V), need_weights=False)
    assert np.isfinite(_np(out_sdpa)).all() and not np.allclose(_np(out_sdpa), ref)
    m32 = nn.MultiheadAttention(E, H)
    m32.load_state_dict({k: hp.tensor(v.astype(np.float32)) for k, v in P.items()})
    out32, w32 = m32(hp.tensor(Q.astype(np.float32)), hp.tensor(K.astype(np.float32)),
                     hp.tensor(V.astype(np.float32)), key_padding_mask=_t(KPM))
    ref32, p32 = np_mha(Q, K, V, P, H, None, KPM)
    assert out32.dtype == hp.float32 and w32.dtype == hp.float32
    np.testing.assert_allclose(_np(out32), ref32, rtol=1e-4, atol=1e-5)


def test_mha_errors_and_warnings():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        nn.MultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="greater than 0"):
        nn.MultiheadAttention(0, 1)
    mha = nn.MultiheadAttention(E, H, dtype=hp.float64)
    q, k, v = _t(Q), _t(K), _t(V)
    with pytest.raises(TypeError, match="only bool and floating types of attn_mask"):
        mha(q, k, v, attn_mask=hp.tensor(BOOL_MASK.astype(np.int64)))
    with pytest.raises(RuntimeError, match=r"The shape of the 2D attn_mask is \(5, 5\), but should be \(5, 6\)"):
        mha(q, k, v, attn_mask=_t(CAUSAL_BOOL))
    with pytest.raises(RuntimeError, match="The shape of the 3D attn_mask"):
        mha(q, k, v, attn_mask=_t(MASK_3D[:2]))
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        mha(q, q, q, is_causal=True)
    with pytest.raises(RuntimeError, match="expected `key` and `value` to be 3-D"):
        mha(q, _t(K[:, 0]), v)
    with pytest.raises(RuntimeError, match="query should be unbatched 2D or batched 3D"):
        mha(_t(Q[0, 0]), k, v)
    with pytest.raises(RuntimeError, match="was expecting embedding dimension of 8"):
        mha(_t(Q[..., :4]), k, v)
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        mha(q, k, v, key_padding_mask=_t(KPM), attn_mask=_t(FLOAT_MASK))


# -- gradients (float64 central differences) ----------------------------------------------------------------------

_GRNG = np.random.default_rng(11)
_GE, _GH, _GL, _GS, _GN = 4, 2, 3, 4, 2


@pytest.mark.parametrize("case", ["weights_masks", "sdpa_masks", "self_causal", "bias_kv_zero", "separate"])
def test_mha_gradcheck(case):
    r = _GRNG
    q, k, v = r.standard_normal((_GL, _GN, _GE)), r.standard_normal((_GS, _GN, _GE)), r.standard_normal((_GS, _GN, _GE))
    w_in, b_in = r.standard_normal((3 * _GE, _GE)) * 0.5, r.standard_normal(3 * _GE) * 0.5
    w_o, b_o = r.standard_normal((_GE, _GE)) * 0.5, r.standard_normal(_GE) * 0.5
    fmask = hp.tensor(r.standard_normal((_GL, _GS)))
    kpm = np.zeros((_GN, _GS), bool)
    kpm[0, 3] = kpm[1, 0] = True
    kpm = hp.tensor(kpm)
    if case in ("weights_masks", "sdpa_masks"):
        nw = case == "weights_masks"

        fkpm = hp.tensor(np.where(kpm.numpy(), -np.inf, r.standard_normal((_GN, _GS))))

        def fn(q, k, v, w_in, b_in, w_o, b_o):
            out = F.multi_head_attention_forward(q, k, v, _GE, _GH, w_in, b_in, None, None, False, 0.0, w_o, b_o,
                                                 key_padding_mask=fkpm, attn_mask=fmask, need_weights=nw)
            return out if nw else out[0]
        gradcheck(fn, [q, k, v, w_in, b_in, w_o, b_o])
    elif case == "self_causal":
        causal = hp.tensor(np.triu(np.ones((_GL, _GL), bool), 1))
        x = q

        def fn(x, w_in, b_in, w_o, b_o):
            a = F.multi_head_attention_forward(x, x, x, _GE, _GH, w_in, b_in, None, None, False, 0.0, w_o, b_o,
                                               attn_mask=causal, need_weights=False, is_causal=True)[0]
            b = F.multi_head_attention_forward(x, x, x, _GE, _GH, w_in, b_in, None, None, False, 0.0, w_o, b_o,
                                               attn_mask=causal, average_attn_weights=False)
            return a, b[0], b[1]
        gradcheck(fn, [x, w_in, b_in, w_o, b_o])
    elif case == "bias_kv_zero":
        bk, bv = r.standard_normal((1, 1, _GE)), r.standard_normal((1, 1, _GE))

        def fn(q, k, v, w_in, b_in, w_o, bk, bv):
            return F.multi_head_attention_forward(q, k, v, _GE, _GH, w_in, b_in, bk, bv, True, 0.0, w_o, None,
                                                  key_padding_mask=kpm, need_weights=False)[0]
        gradcheck(fn, [q, k, v, w_in, b_in, w_o, bk, bv])
    else:
        wk, wv = r.standard_normal((_GE, 3)) * 0.5, r.standard_normal((_GE, 5)) * 0.5

        def fn(q, k, v, wq, wk, wv, w_o):
            return F.multi_head_attention_forward(q, k, v, _GE, _GH, None, None, None, None, False, 0.0, w_o, None,
                                                  use_separate_proj_weight=True, q_proj_weight=wq, k_proj_weight=wk,
                                                  v_proj_weight=wv, attn_mask=fmask)
        gradcheck(fn, [q, r.standard_normal((_GS, _GN, 3)), r.standard_normal((_GS, _GN, 5)), w_in[:_GE].copy(), wk,
                       wv, w_o])


# -- Transformer layers ---------------------------------------------------------------------------------------------

SRC = _RNG.standard_normal((S, N, E))
TGT = _RNG.standard_normal((L, N, E))
SRC_CAUSAL = np.triu(np.ones((S, S), bool), 1)
TGT_CAUSAL_F = np.triu(np.full((L, L), -np.inf), 1)
ENC_MASKS = {"none": (None, None), "causal_bool": (SRC_CAUSAL, None), "kpm": (None, KPM),
             "float_both": (np.where(SRC_CAUSAL, -np.inf, 0.3), FLOAT_KPM)}


def _bf(a, batch_first):
    return a.transpose(1, 0, 2) if batch_first else a


@pytest.mark.parametrize("mask", list(ENC_MASKS))
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_matches_reference(mask, norm_first, activation, batch_first):
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, activation=activation, batch_first=batch_first,
                                       norm_first=norm_first, dtype=hp.float64)
    P = _randomize(layer, seed=5)
    am, kpm = ENC_MASKS[mask]
    ref = np_encoder_layer(SRC, P, H, norm_first, activation, am, kpm)
    out = layer(_t(_bf(SRC, batch_first)), src_mask=None if am is None else _t(am),
                src_key_padding_mask=None if kpm is None else _t(kpm))
    np.testing.assert_allclose(_np(out), _bf(ref, batch_first), rtol=1e-7, atol=1e-7)  # gelu's erf: 2e-8


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_decoder_layer_matches_reference(norm_first, activation, batch_first):
    layer = nn.TransformerDecoderLayer(E, H, 16, dropout=0.0, activation=activation, batch_first=batch_first,
                                       norm_first=norm_first, dtype=hp.float64)
    P = _randomize(layer, seed=6)
    mem_mask = _RNG.random((L, S)) < 0.2
    mem_mask[:, 0] = False
    ref = np_decoder_layer(TGT, SRC, P, H, norm_first, activation, TGT_CAUSAL_F, mem_mask, None, KPM)
    assert np.isfinite(ref).all()
    tgt, mem = _t(_bf(TGT, batch_first)), _t(_bf(SRC, batch_first))
    for causal in (False, True):
        out = layer(tgt, mem, tgt_mask=_t(TGT_CAUSAL_F), memory_mask=_t(mem_mask), memory_key_padding_mask=_t(KPM),
                    tgt_is_causal=causal)
        np.testing.assert_allclose(_np(out), _bf(ref, batch_first), rtol=1e-7, atol=1e-7)


def test_encoder_layer_callable_activation_unbatched_and_grads():
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, activation=nn.GELU(), dtype=hp.float64)
    assert layer.activation_relu_or_gelu == 2 and "(activation): GELU(approximate='none')" in repr(layer)
    P = _randomize(layer, seed=8)
    ref = np_encoder_layer(SRC[:, :1], P, H, False, "gelu")[:, 0]
    np.testing.assert_allclose(_np(layer(_t(SRC[:, 0]))), ref, rtol=1e-7, atol=1e-7)
    tanh_layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, activation=F.tanh)
    assert tanh_layer.activation_relu_or_gelu == 0 and "activation" not in dict(tanh_layer.named_modules())
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(E, H, activation="tanh")
    # every parameter gets a gradient, and the input's gradient matches central differences in one direction
    x = _t(SRC, requires_grad=True)
    g = _RNG.standard_normal(SRC.shape)
    (layer(x, src_key_padding_mask=_t(KPM)) * _t(g)).sum().backward()
    assert all(p.grad is not None and np.abs(_np(p.grad)).sum() > 0 for p in layer.parameters())
    d = _RNG.standard_normal(SRC.shape)
    eps = 1e-6
    with hp.no_grad():
        fp = (_np(layer(_t(SRC + eps * d), src_key_padding_mask=_t(KPM))) * g).sum()
        fm = (_np(layer(_t(SRC - eps * d), src_key_padding_mask=_t(KPM))) * g).sum()
    np.testing.assert_allclose((fp - fm) / (2 * eps), (x.grad.numpy() * d).sum(), rtol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_stacks_and_transformer(norm_first):
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, norm_first=norm_first,
                                                           dtype=hp.float64), 2, norm=nn.LayerNorm(E, dtype=hp.float64))
    P = _randomize(enc, seed=9)
    src_mask = np.triu(np.full((S, S), -np.inf), 1)
    ref = SRC
    for i in range(2):
        ref = np_encoder_layer(ref, P, H, norm_first, "relu", src_mask, _additive(KPM), prefix=f"layers.{i}.")
    ref = _ln(ref, P, "norm")
    assert np.isfinite(ref).all()
    for is_causal in (None, True, False):
        out = enc(_t(SRC), mask=_t(src_mask), src_key_padding_mask=_t(_additive(KPM)), is_causal=is_causal)
        np.testing.assert_allclose(_np(out), ref, rtol=1e-9, atol=1e-9)
    ref_causal_only = SRC
    for i in range(2):
        ref_causal_only = np_encoder_layer(ref_causal_only, P, H, norm_first, "relu", src_mask, prefix=f"layers.{i}.")
    np.testing.assert_allclose(_np(enc(_t(SRC), mask=_t(SRC_CAUSAL))), _ln(ref_causal_only, P, "norm"), rtol=1e-9,
                               atol=1e-9)

    tr = nn.Transformer(E, H, 2, 2, 16, dropout=0.0, norm_first=norm_first, batch_first=True, dtype=hp.float64)
    P = _randomize(tr, seed=10)
    mem = SRC
    for i in range(2):
        mem = np_encoder_layer(mem, P, H, norm_first, "relu", None, KPM, prefix=f"encoder.layers.{i}.")
    mem = _ln(mem, P, "encoder.norm")
    ref = TGT
    for i in range(2):
        ref = np_decoder_layer(ref, mem, P, H, norm_first, "relu", TGT_CAUSAL_F, None, None, KPM,
                               prefix=f"decoder.layers.{i}.")
    ref = _ln(ref, P, "decoder.norm")
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=hp.float64)
    out = tr(_t(_bf(SRC, True)), _t(_bf(TGT, True)), tgt_mask=tgt_mask, src_key_padding_mask=_t(KPM),
             memory_key_padding_mask=_t(KPM))
    np.testing.assert_allclose(_np(out), _bf(ref, True), rtol=1e-9, atol=1e-9)
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        tr(_t(_bf(SRC, True)), _t(_bf(TGT, True)[:2]))
    with pytest.raises(RuntimeError, match="the feature number of src and tgt must be equal to d_model"):
        tr(_t(_bf(SRC, True)[..., :4]), _t(_bf(TGT, True)))


def test_generate_square_subsequent_mask_and_clones():
    m = nn.Transformer.generate_square_subsequent_mask(3)
    assert m.dtype == hp.float32
    np.testing.assert_array_equal(m.numpy(), [[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, 0, 0]])
    hp.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 16)
    enc = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False, mask_check=False)
    assert enc.num_layers == 3 and enc.norm is None and not enc.use_nested_tensor and not enc.mask_check
    a, b = enc.layers[0], enc.layers[1]
    assert a is not layer and a is not b and a.linear1.weight is not b.linear1.weight
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):  # deep copies: equal values
        np.testing.assert_array_equal(_np(p), _np(q), err_msg=n)
    tr = nn.Transformer(E, H, 1, 1, 16)  # every matrix xavier_uniform'd, layer norms untouched
    w = _np(tr.encoder.layers[0].linear1.weight)
    assert np.abs(w).max() <= math.sqrt(6 / (E + 16)) and (_np(tr.encoder.norm.weight) == 1).all()


# PyTorch 2.13's state_dict keys for the same constructor arguments
ENC_LAYER_KEYS = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                  "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
                  "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"]
DEC_LAYER_KEYS = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                  "self_attn.out_proj.bias", "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias",
                  "multihead_attn.out_proj.weight", "multihead_attn.out_proj.bias", "linear1.weight", "linear1.bias",
                  "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias",
                  "norm3.weight", "norm3.bias"]
TRANSFORMER_KEYS = (["encoder.layers.0." + k for k in ENC_LAYER_KEYS] + ["encoder.norm.weight", "encoder.norm.bias"]
                    + ["decoder.layers.0." + k for k in DEC_LAYER_KEYS] + ["decoder.norm.weight", "decoder.norm.bias"])


def test_state_dict_keys_are_pytorchs():
    assert list(nn.TransformerEncoderLayer(E, H, 16).state_dict()) == ENC_LAYER_KEYS
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, batch_first=True), 2, norm=nn.LayerNorm(E))
    assert list(enc.state_dict()) == ([f"layers.0.{k}" for k in ENC_LAYER_KEYS] +
                                      [f"layers.1.{k}" for k in ENC_LAYER_KEYS] + ["norm.weight", "norm.bias"])
    assert list(nn.TransformerDecoderLayer(E, H, 16).state_dict()) == DEC_LAYER_KEYS
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H, 16), 1)
    assert list(dec.state_dict()) == [f"layers.0.{k}" for k in DEC_LAYER_KEYS]
    tr = nn.Transformer(E, H, 1, 1, 16)
    assert list(tr.state_dict()) == TRANSFORMER_KEYS
    nb = nn.TransformerEncoderLayer(E, H, 16, bias=False)
    assert list(nb.state_dict()) == ["self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
                                     "linear2.weight", "norm1.weight", "norm2.weight"]
    tr2 = nn.Transformer(E, H, 1, 1, 16)
    tr2.load_state_dict(tr.state_dict())
    x, y = hp.randn(S, 2, E), hp.randn(L, 2, E)
    tr.eval()
    tr2.eval()
    np.testing.assert_array_equal(_np(tr(x, y)), _np(tr2(x, y)))


def test_transformer_reprs():
    # PyTorch's layout; hpcfsdp's LayerNorm repr has no ", bias=True" (PyTorch 2.13 adds it)
    ln = "LayerNorm((8,), eps=1e-05, elementwise_affine=True, bias=True)"
    mha = ("MultiheadAttention(\n    (out_proj): NonDynamicallyQuantizableLinear(in_features=8, out_features=8, "
           "bias=True)\n  )")
    assert repr(nn.TransformerEncoderLayer(E, H, 16)) == (
        "TransformerEncoderLayer(\n"
        f"  (self_attn): {mha}\n"
        "  (linear1): Linear(in_features=8, out_features=16, bias=True)\n"
        "  (dropout): Dropout(p=0.1, inplace=False)\n"
        "  (linear2): Linear(in_features=16, out_features=8, bias=True)\n"
        f"  (norm1): {ln}\n  (norm2): {ln}\n"
        "  (dropout1): Dropout(p=0.1, inplace=False)\n"
        "  (dropout2): Dropout(p=0.1, inplace=False)\n)")
    enc = repr(nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16), 2, norm=nn.LayerNorm(8)))
    assert enc.startswith("TransformerEncoder(\n  (layers): ModuleList(\n    (0-1): 2 x TransformerEncoderLayer(\n")
    assert enc.endswith(f"  )\n  (norm): {ln}\n)")
    dec = repr(nn.TransformerDecoderLayer(E, H, 16))
    assert "\n  (multihead_attn): MultiheadAttention(\n" in dec and f"\n  (norm3): {ln}\n" in dec
    assert "\n  (dropout3): Dropout(p=0.1, inplace=False)\n)" in dec


def test_float32_encoder_on_device(device):
    """A float32 encoder runs forward and backward on each array backend and matches the float64 reference."""
    hp.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True), 2,
                                norm=nn.LayerNorm(E))
    P = {n: _np(p).astype(np.float64) for n, p in enc.named_parameters()}
    enc.to(device)
    ref = SRC
    for i in range(2):
        ref = np_encoder_layer(ref, P, H, False, "relu", None, KPM, prefix=f"layers.{i}.")
    ref = _ln(ref, P, "norm")
    x = hp.tensor(_bf(SRC, True).astype(np.float32), device=device, requires_grad=True)
    out = enc(x, src_key_padding_mask=hp.tensor(KPM, device=device))
    out.sum().backward()
    assert out.device.type == device and x.grad.device.type == device
    np.testing.assert_allclose(out.detach().cpu().numpy(), _bf(ref, True), rtol=1e-4, atol=1e-4)
    assert all(p.grad is not None for p in enc.parameters())
