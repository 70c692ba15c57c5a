"""NumPy float64 references of PyTorch's recurrences (RNN tanh/relu, LSTM with projection, GRU) and the module
builders the rnn tests share (test_nn_rnn.py, test_nn_rnn_packed.py)."""
import numpy as np

import hpcfsdp as hp
from hpcfsdp import nn

H_IN, HID, PROJ = 3, 4, 2
N = 2


def _np(t):
    return t.detach().numpy()


def _randomize(module, seed=0, scale=0.6):
    """Random values for every parameter; returns {name: float64 array}."""
    rng = np.random.default_rng(seed)
    with hp.no_grad():
        for p in module.parameters():
            p.copy_(hp.tensor(rng.standard_normal(tuple(p.shape)) * scale).to(p.dtype))
    return {n: _np(p).astype(np.float64) for n, p in module.named_parameters()}


# -- NumPy float64 references ---------------------------------------------------------------------------------------

def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_step(mode, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr=None):
    """One step of ``mode`` on (N, H_in) x and (N, H) h (c for LSTM); returns (h', c'). Gate blocks written out."""
    b_ih = 0.0 if b_ih is None else b_ih
    b_hh = 0.0 if b_hh is None else b_hh
    gi = x @ w_ih.T + b_ih
    gh = h @ w_hh.T + b_hh
    if mode == "RNN_TANH":
        return np.tanh(gi + gh), None
    if mode == "RNN_RELU":
        return np.maximum(gi + gh, 0.0), None
    hs = w_hh.shape[0] // (4 if mode == "LSTM" else 3)
    blk = [slice(k * hs, (k + 1) * hs) for k in range(4)]
    if mode == "LSTM":
        g = gi + gh
        i, f, gg, o = _sig(g[:, blk[0]]), _sig(g[:, blk[1]]), np.tanh(g[:, blk[2]]), _sig(g[:, blk[3]])
        c2 = f * c + i * gg
        h2 = o * np.tanh(c2)
        if w_hr is not None:
            h2 = h2 @ w_hr.T
        return h2, c2
    r = _sig(gi[:, blk[0]] + gh[:, blk[0]])
    z = _sig(gi[:, blk[1]] + gh[:, blk[1]])
    n = np.tanh(gi[:, blk[2]] + r * gh[:, blk[2]])
    return (1 - z) * n + z * h, None


def np_rnn(mode, x, h0, c0, P, num_layers, bidirectional, drop_mask=None):
    """The multi-layer recurrence on time-major (L, N, H_in) x with PyTorch-named parameters ``P``; returns
    (output (L, N, D*H_out), h_n, c_n). ``drop_mask[layer]`` multiplies the input of layer ``layer`` (>= 1)."""
    dirs = ["", "_reverse"] if bidirectional else [""]
    layer_in = x
    h_n, c_n = [], []
    for layer in range(num_layers):
        if drop_mask is not None and layer > 0:
            layer_in = layer_in * drop_mask[layer]
        outs = []
        for d, sfx in enumerate(dirs):
            k = layer * len(dirs) + d
            w = [P.get(f"{n}_l{layer}{sfx}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")]
            h, c = h0[k], (c0[k] if c0 is not None else None)
            out = [None] * layer_in.shape[0]
            steps = range(layer_in.shape[0])
            for t in (reversed(steps) if d == 1 else steps):
                h, c = np_step(mode, layer_in[t], h, c, *w)
                out[t] = h
            outs.append(np.stack(out))
            h_n.append(h)
            c_n.append(c)
        layer_in = np.concatenate(outs, -1)
    return layer_in, np.stack(h_n), (np.stack(c_n) if mode == "LSTM" else None)


MODULES = {"RNN_TANH": (nn.RNN, {}), "RNN_RELU": (nn.RNN, {"nonlinearity": "relu"}), "GRU": (nn.GRU, {}),
           "LSTM": (nn.LSTM, {}), "LSTM_PROJ": (nn.LSTM, {"proj_size": PROJ})}


def _build(key, num_layers, bidirectional, batch_first=False, dtype=hp.float64, bias=True, **extra):
    cls, kw = MODULES[key]
    m = cls(H_IN, HID, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias,
            dtype=dtype, **kw, **extra)
    return m, _randomize(m), ("LSTM" if key.startswith("LSTM") else key)


def _states(key, num_layers, bidirectional, rng, batch=N):
    d = 2 if bidirectional else 1
    h_out = PROJ if key == "LSTM_PROJ" else HID
    h0 = rng.standard_normal((d * num_layers, batch, h_out))
    c0 = rng.standard_normal((d * num_layers, batch, HID)) if key.startswith("LSTM") else None
    return h0, c0
