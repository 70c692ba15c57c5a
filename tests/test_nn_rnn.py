"""nn.RNN / LSTM / GRU and RNNCell / LSTMCell / GRUCell against NumPy float64 recurrences written here (same
weights): forward values in float64 and float32, finite-difference gradients of every input and weight, PyTorch's
parameter names, reprs, init, dropout placement, autocast dtypes and errors. Packed sequences: test_nn_rnn_packed.py.
"""
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.nn.utils.rnn import pack_padded_sequence

from _gradcheck import gradcheck
from _rnn_refs import H_IN, HID, MODULES, N, _build, _np, _randomize, _states, np_rnn, np_step

L = 4
TOL = {hp.float64: dict(rtol=1e-10, atol=1e-12), hp.float32: dict(rtol=2e-5, atol=2e-6)}


# -- cells ----------------------------------------------------------------------------------------------------------

CELLS = {"RNN_TANH": (nn.RNNCell, {}), "RNN_RELU": (nn.RNNCell, {"nonlinearity": "relu"}), "LSTM": (nn.LSTMCell, {}),
         "GRU": (nn.GRUCell, {})}


@pytest.mark.parametrize("dtype", [hp.float64, hp.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [True, False])
@pytest.mark.parametrize("mode", list(CELLS))
def test_cell_matches_reference(mode, with_hx, batched, bias, dtype):
    cls, kw = CELLS[mode]
    cell = cls(H_IN, HID, bias=bias, dtype=dtype, **kw)
    P = _randomize(cell)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, H_IN))
    h = rng.standard_normal((N, HID)) if with_hx else np.zeros((N, HID))
    c = rng.standard_normal((N, HID)) if with_hx else np.zeros((N, HID))
    want_h, want_c = np_step(mode, x, h, c, P["weight_ih"], P["weight_hh"], P.get("bias_ih"), P.get("bias_hh"))
    sel = slice(None) if batched else 0  # unbatched: the first row, without the batch dim

    def t(a):
        return hp.tensor(a[sel]).to(dtype)
    hx = None if not with_hx else ((t(h), t(c)) if mode == "LSTM" else t(h))
    got = cell(t(x), hx)
    got_h, got_c = got if mode == "LSTM" else (got, None)
    assert got_h.dtype == dtype and tuple(got_h.shape) == want_h[sel].shape
    np.testing.assert_allclose(_np(got_h), want_h[sel], **TOL[dtype])
    if mode == "LSTM":
        np.testing.assert_allclose(_np(got_c), want_c[sel], **TOL[dtype])


@pytest.mark.parametrize("mode", list(CELLS))
def test_cell_gradients(mode):
    cls, kw = CELLS[mode]
    cell = cls(H_IN, HID, dtype=hp.float64, **kw)
    P = _randomize(cell)
    names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    rng = np.random.default_rng(2)
    x, h, c = rng.standard_normal((N, H_IN)), rng.standard_normal((N, HID)), rng.standard_normal((N, HID))
    if mode == "RNN_RELU":
        x *= 0.1  # keep pre-activations away from relu's kink: the finite differences stay exact

    def fn(x, h, c, *ws):
        for n, w in zip(names, ws):
            cell._parameters[n] = w  # the leaves as the cell's parameters (a functional call)
        out = cell(x, (h, c) if mode == "LSTM" else h)
        return out
    arrays = [x, h, c] + [P[n].copy() for n in names]
    gradcheck(fn, arrays, check=None if mode == "LSTM" else [0, 1, 3, 4, 5, 6])


def test_cell_parameters_init_and_repr():
    cell = nn.LSTMCell(H_IN, 9)
    assert [(n, tuple(p.shape)) for n, p in cell.named_parameters()] == [
        ("weight_ih", (36, 3)), ("weight_hh", (36, 9)), ("bias_ih", (36,)), ("bias_hh", (36,))]
    for p in cell.parameters():  # every parameter ~ U(-1/sqrt(9), 1/sqrt(9)), biases too
        v = _np(p)
        assert v.min() >= -1 / 3 and v.max() <= 1 / 3 and v.min() < -0.2 and v.max() > 0.2
    assert [n for n, _ in nn.GRUCell(2, 3, bias=False).named_parameters()] == ["weight_ih", "weight_hh"]
    assert nn.GRUCell(2, 3, bias=False).bias_ih is None
    assert tuple(nn.GRUCell(2, 3).weight_hh.shape) == (9, 3) and tuple(nn.RNNCell(2, 3).weight_ih.shape) == (3, 2)
    assert repr(nn.RNNCell(3, 4, bias=False, nonlinearity="relu")) == "RNNCell(3, 4, bias=False, nonlinearity=relu)"
    assert repr(nn.LSTMCell(3, 4)) == "LSTMCell(3, 4)"


def test_cell_errors():
    lstm, gru, rnn = nn.LSTMCell(3, 4), nn.GRUCell(3, 4), nn.RNNCell(3, 4)
    cases = [
        (lambda: lstm(hp.randn(1, 2, 3)), ValueError, "LSTMCell: Expected input to be 1D or 2D, got 3D instead"),
        (lambda: lstm(hp.randn(2, 3), (hp.randn(1, 2, 4), hp.randn(2, 4))), ValueError,
         r"LSTMCell: Expected hx\[0\] to be 1D or 2D, got 3D instead"),
        (lambda: lstm(hp.randn(2, 2)), RuntimeError, "input has inconsistent input_size: got 2 expected 3"),
        (lambda: lstm(hp.randn(2, 3), (hp.randn(3, 4), hp.randn(3, 4))), RuntimeError,
         "Input batch size 2 doesn't match hidden0 batch size 3"),
        (lambda: lstm(hp.randn(2, 3), (hp.randn(2, 5), hp.randn(2, 4))), RuntimeError,
         "hidden0 has inconsistent hidden_size: got 5, expected 4"),
        (lambda: lstm(hp.randn(2, 3), (hp.randn(2, 4), hp.randn(2, 5))), RuntimeError,
         "hidden1 has inconsistent hidden_size: got 5, expected 4"),
        (lambda: lstm(hp.randn(3), (hp.randn(1, 4), hp.randn(1, 4))), RuntimeError,
         "hidden0 has inconsistent hidden_size: got 1, expected 4"),
        (lambda: lstm(hp.randn(2, 3).double()), RuntimeError, "must have the same dtype"),
        (lambda: gru(hp.randn(1, 2, 3)), ValueError, "GRUCell: Expected input to be 1D or 2D, got 3D instead"),
        (lambda: gru(hp.randn(2, 3), hp.randn(1, 2, 4)), ValueError,
         "GRUCell: Expected hidden to be 1D or 2D, got 3D instead"),
        (lambda: gru(hp.randn(2, 3), hp.randn(3, 4)), RuntimeError,
         "Input batch size 2 doesn't match hidden0 batch size 3"),
        (lambda: rnn(hp.randn(2, 3), hp.randn(2, 5)), RuntimeError,
         "hidden0 has inconsistent hidden_size: got 5, expected 4"),
        (lambda: nn.RNNCell(3, 4, nonlinearity="gelu")(hp.randn(2, 3)), RuntimeError, "Unknown nonlinearity: gelu"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            fn()


# -- multi-layer modules --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [hp.float64, hp.float32])
@pytest.mark.parametrize("layout", ["seq_first", "batch_first", "unbatched"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("key", list(MODULES))
def test_module_matches_reference(key, num_layers, bidirectional, layout, dtype):
    m, P, mode = _build(key, num_layers, bidirectional, batch_first=layout == "batch_first", dtype=dtype)
    rng = np.random.default_rng(3)
    batch = 1 if layout == "unbatched" else N
    x = rng.standard_normal((L, batch, H_IN))
    h0, c0 = _states(key, num_layers, bidirectional, rng, batch)
    want_o, want_h, want_c = np_rnn(mode, x, h0, c0, P, num_layers, bidirectional)

    def arrange(a, is_input):  # the reference's (L, N, *) / (D*layers, N, *) as the module takes them
        if layout == "unbatched":
            return a[:, 0]
        return a.swapaxes(0, 1) if layout == "batch_first" and is_input else a
    t = lambda a, is_input=False: hp.tensor(arrange(a, is_input)).to(dtype)  # noqa: E731
    for given in (True, False):  # h0 (and c0) given, or zeros by default
        if not given:
            h0, c0 = np.zeros_like(h0), (None if c0 is None else np.zeros_like(c0))
            want_o, want_h, want_c = np_rnn(mode, x, h0, c0, P, num_layers, bidirectional)
        hx = None if not given else ((t(h0), t(c0)) if mode == "LSTM" else t(h0))
        out, hidden = m(t(x, True), hx)
        h_n, c_n = hidden if mode == "LSTM" else (hidden, None)
        assert out.dtype == dtype and tuple(out.shape) == arrange(want_o, True).shape
        np.testing.assert_allclose(_np(out), arrange(want_o, True), **TOL[dtype])
        assert tuple(h_n.shape) == arrange(want_h, False).shape
        np.testing.assert_allclose(_np(h_n), arrange(want_h, False), **TOL[dtype])
        if mode == "LSTM":
            np.testing.assert_allclose(_np(c_n), arrange(want_c, False), **TOL[dtype])


def test_module_without_bias_matches_reference():
    m, P, mode = _build("GRU", 2, True, bias=False)
    assert "bias_ih_l0" not in P
    rng = np.random.default_rng(4)
    x = rng.standard_normal((L, N, H_IN))
    h0, _ = _states("GRU", 2, True, rng)
    out, h_n = m(hp.tensor(x), hp.tensor(h0))
    want_o, want_h, _ = np_rnn(mode, x, h0, None, P, 2, True)
    np.testing.assert_allclose(_np(out), want_o, **TOL[hp.float64])
    np.testing.assert_allclose(_np(h_n), want_h, **TOL[hp.float64])


@pytest.mark.parametrize("key,bidirectional,batch_first", [
    ("RNN_TANH", True, False), ("RNN_RELU", False, True), ("GRU", True, True), ("LSTM", True, False),
    ("LSTM_PROJ", True, True)])
def test_module_gradients(key, bidirectional, batch_first):
    """d(output, h_n[, c_n]) / d(input, h_0[, c_0], every weight) by central differences, 2 layers."""
    m, P, mode = _build(key, 2, bidirectional, batch_first=batch_first)
    names = list(P)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N, 3, H_IN) if batch_first else (3, N, H_IN))
    if mode == "RNN_RELU":
        x *= 0.3
    h0, c0 = _states(key, 2, bidirectional, rng)
    c0 = np.zeros(1) if c0 is None else c0

    def fn(x, h0, c0, *ws):
        for n, w in zip(names, ws):
            m._parameters[n] = w
        out, hidden = m(x, (h0, c0) if mode == "LSTM" else h0)
        return (out, *hidden) if mode == "LSTM" else (out, hidden)
    arrays = [x, h0, c0] + [P[n].copy() for n in names]
    skip_c0 = [i for i in range(len(arrays)) if i != 2 or mode == "LSTM"]
    gradcheck(fn, arrays, check=skip_c0)


def test_state_dict_names_shapes_and_order_are_pytorchs():
    # read from torch 2.13: [(k, tuple(v.shape)) for k, v in nn.LSTM(3, 4, 2, bidirectional=True, proj_size=2)
    # .state_dict().items()]
    want = [("weight_ih_l0", (16, 3)), ("weight_hh_l0", (16, 2)), ("bias_ih_l0", (16,)), ("bias_hh_l0", (16,)),
            ("weight_hr_l0", (2, 4)), ("weight_ih_l0_reverse", (16, 3)), ("weight_hh_l0_reverse", (16, 2)),
            ("bias_ih_l0_reverse", (16,)), ("bias_hh_l0_reverse", (16,)), ("weight_hr_l0_reverse", (2, 4)),
            ("weight_ih_l1", (16, 4)), ("weight_hh_l1", (16, 2)), ("bias_ih_l1", (16,)), ("bias_hh_l1", (16,)),
            ("weight_hr_l1", (2, 4)), ("weight_ih_l1_reverse", (16, 4)), ("weight_hh_l1_reverse", (16, 2)),
            ("bias_ih_l1_reverse", (16,)), ("bias_hh_l1_reverse", (16,)), ("weight_hr_l1_reverse", (2, 4))]
    m = nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2)
    assert [(k, tuple(v.shape)) for k, v in m.state_dict().items()] == want
    assert m._flat_weights_names == [k for k, _ in want]
    assert [p is q for p, q in zip(m._flat_weights, m.parameters())] == [True] * len(want)
    assert [[tuple(p.shape) for p in ws] for ws in m.all_weights][1] == [s for _, s in want[5:10]]
    gru = nn.GRU(3, 5, num_layers=2, bias=False)
    assert [(k, tuple(v.shape)) for k, v in gru.state_dict().items()] == [
        ("weight_ih_l0", (15, 3)), ("weight_hh_l0", (15, 5)), ("weight_ih_l1", (15, 5)), ("weight_hh_l1", (15, 5))]
    assert [k for k in nn.RNN(3, 4, bidirectional=True).state_dict()] == [
        "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l0_reverse", "weight_hh_l0_reverse",
        "bias_ih_l0_reverse", "bias_hh_l0_reverse"]
    assert m.flatten_parameters() is None


def test_module_init_dtype_and_repr():
    m = nn.GRU(3, 16, num_layers=2, dtype=hp.float64)
    for p in m.parameters():  # every parameter ~ U(-1/4, 1/4)
        v = _np(p)
        assert p.dtype == hp.float64 and v.min() >= -0.25 and v.max() <= 0.25 and v.min() < -0.15 and v.max() > 0.15
    assert repr(nn.LSTM(3, 4, proj_size=2, num_layers=2, bidirectional=True)) == \
        "LSTM(3, 4, proj_size=2, num_layers=2, bidirectional=True)"
    assert repr(nn.GRU(3, 4, 2, dropout=0.5, batch_first=True)) == "GRU(3, 4, num_layers=2, batch_first=True, dropout=0.5)"
    assert repr(nn.RNN(3, 4, 1, "relu", False)) == "RNN(3, 4, bias=False)"
    assert nn.RNN(3, 4, 1, "relu").nonlinearity == "relu" and nn.RNN(3, 4, 1, "relu").mode == "RNN_RELU"


def test_module_trains_a_step():
    m = nn.LSTM(3, 4, num_layers=2, batch_first=True)
    opt = hp.optim.SGD(m.parameters(), lr=0.1)
    out, _ = m(hp.randn(2, 5, 3))
    out.pow(2).mean().backward()
    assert all(p.grad is not None for p in m.parameters())
    before = _np(m.weight_hh_l1).copy()
    opt.step()
    assert not np.array_equal(before, _np(m.weight_hh_l1))


# -- dropout between layers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["GRU", "LSTM", "RNN_TANH"])
def test_dropout_only_between_layers_in_training(key):
    """dropout=1 zeroes the input of layer 1 (the output of layer 0) in training, and nothing else: the output is
    layer 1 run on zeros, not zeros; in eval nothing is dropped."""
    m, P, mode = _build(key, 2, True, dropout=1.0)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((L, N, H_IN))
    h0, c0 = _states(key, 2, True, rng)
    hx = (hp.tensor(h0), hp.tensor(c0)) if mode == "LSTM" else hp.tensor(h0)
    out, _ = m(hp.tensor(x), hx)
    want, _, _ = np_rnn(mode, x, h0, c0, P, 2, True, drop_mask={1: 0.0})
    np.testing.assert_allclose(_np(out), want, **TOL[hp.float64])
    assert np.abs(want).min() > 0
    m.eval()
    out, _ = m(hp.tensor(x), hx)
    np.testing.assert_allclose(_np(out), np_rnn(mode, x, h0, c0, P, 2, True)[0], **TOL[hp.float64])


def test_dropout_half_scales_survivors_and_never_follows_the_last_layer():
    m, P, mode = _build("GRU", 2, False, dropout=0.5)
    hp.manual_seed(0)
    x = np.random.default_rng(7).standard_normal((L, N, H_IN))
    a, _ = m(hp.tensor(x))
    b, _ = m(hp.tensor(x))
    assert not np.allclose(_np(a), _np(b))  # a fresh mask each call
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1, but got dropout=0.5 "
                                         "and num_layers=1"):
        one, P1, _ = _build("GRU", 1, True, dropout=0.5)
    out, _ = one(hp.tensor(x))  # one layer: no dropout anywhere, even in training
    zeros = np.zeros((2, N, HID))
    np.testing.assert_allclose(_np(out), np_rnn("GRU", x, zeros, None, P1, 1, True)[0], **TOL[hp.float64])


# -- autocast, errors -----------------------------------------------------------------------------------------------

def test_cpu_autocast_dtypes_are_pytorchs():
    # torch 2.13 on CPU under autocast(bfloat16): (output, h_n[, c_n]) dtypes
    want = {"RNN_TANH": ["bfloat16"] * 2, "GRU": ["float32"] * 2, "LSTM": ["bfloat16"] * 3,
            "LSTM_PROJ": ["bfloat16", "bfloat16", "float32"]}
    for key, dts in want.items():
        m, _, mode = _build(key, 1, False, dtype=hp.float32)
        with hp.autocast("cpu", dtype=hp.bfloat16):
            out, hidden = m(hp.randn(L, N, H_IN))
        got = [out] + (list(hidden) if mode == "LSTM" else [hidden])
        assert [str(t.dtype) for t in got] == dts, key
    cells = {nn.RNNCell: ["bfloat16"], nn.GRUCell: ["float32"], nn.LSTMCell: ["float32", "float32"]}
    for cls, dts in cells.items():
        with hp.autocast("cpu", dtype=hp.bfloat16):
            out = cls(H_IN, HID)(hp.randn(N, H_IN))
        assert [str(t.dtype) for t in (out if isinstance(out, tuple) else (out,))] == dts, cls


def test_module_errors():
    lstm, gru, rnn = nn.LSTM(3, 4), nn.GRU(3, 4), nn.RNN(3, 4)
    cases = [
        (lambda: lstm(hp.randn(3)), ValueError, "LSTM: Expected input to be 2D or 3D, got 1D instead"),
        (lambda: gru(hp.randn(1, 2, 3, 3)), ValueError, "GRU: Expected input to be 2D or 3D, got 4D instead"),
        (lambda: rnn(hp.randn(3)), ValueError, "RNN: Expected input to be 2D or 3D, got 1D tensor instead"),
        (lambda: lstm(hp.randn(5, 2, 2)), RuntimeError,
         r"input.size\(-1\) must be equal to input_size. Expected 3, got 2"),
        (lambda: lstm(hp.randn(5, 2, 3), (hp.randn(2, 4), hp.randn(1, 2, 4))), RuntimeError,
         r"For batched 3-D input, hx and cx should also be 3-D but got \(2-D, 3-D\) tensors"),
        (lambda: lstm(hp.randn(5, 3), (hp.randn(1, 1, 4), hp.randn(1, 1, 4))), RuntimeError,
         r"For unbatched 2-D input, hx and cx should also be 2-D but got \(3-D, 3-D\) tensors"),
        (lambda: lstm(hp.randn(5, 2, 3), (hp.randn(1, 3, 4), hp.randn(1, 2, 4))), RuntimeError,
         r"Expected hidden\[0\] size \(1, 2, 4\), got \[1, 3, 4\]"),
        (lambda: lstm(hp.randn(5, 2, 3), (hp.randn(1, 2, 4), hp.randn(1, 2, 5))), RuntimeError,
         r"Expected hidden\[1\] size \(1, 2, 4\), got \[1, 2, 5\]"),
        (lambda: lstm(hp.randn(5, 2, 3).double()), ValueError,
         r"RNN input dtype \(float64\) does not match weight dtype \(float32\)"),
        (lambda: gru(hp.randn(5, 2, 3), hp.randn(2, 4)), RuntimeError,
         "For batched 3-D input, hx should also be 3-D but got 2-D tensor"),
        (lambda: gru(hp.randn(5, 3), hp.randn(1, 2, 4)), RuntimeError,
         "For unbatched 2-D input, hx should also be 2-D but got 3-D tensor"),
        (lambda: gru(hp.randn(5, 2, 3), hp.randn(2, 2, 4)), RuntimeError,
         r"Expected hidden size \(1, 2, 4\), got \[2, 2, 4\]"),
        (lambda: nn.LSTM(3, 4, proj_size=2)(hp.randn(5, 2, 3), (hp.randn(1, 2, 4), hp.randn(1, 2, 4))),
         RuntimeError, r"Expected hidden\[0\] size \(1, 2, 2\), got \[1, 2, 4\]"),
        (lambda: nn.RNN(3, 4, nonlinearity="gelu"), ValueError, "Unknown nonlinearity 'gelu'. Select from 'tanh' or "
                                                               "'relu'."),
        (lambda: nn.RNN(3, 4, proj_size=2), ValueError, "proj_size argument is only supported for LSTM, not RNN or GRU"),
        (lambda: nn.GRU(3, 4, proj_size=2), ValueError, "proj_size argument is only supported for LSTM"),
        (lambda: nn.LSTM(3, 4, proj_size=4), ValueError, "proj_size has to be smaller than hidden_size"),
        (lambda: nn.LSTM(3, 4, proj_size=-1), ValueError, "proj_size should be a positive integer or zero"),
        (lambda: nn.LSTM(3, 4, dropout=2), ValueError, r"dropout should be a number in range \[0, 1\]"),
        (lambda: nn.LSTM(3, 4, dropout=True), ValueError, r"dropout should be a number in range \[0, 1\]"),
        (lambda: nn.LSTM(3, 4, bias=1), TypeError, "bias should be of type bool, got: int"),
        (lambda: nn.LSTM(3, 4, batch_first=1), TypeError, "batch_first should be of type bool, got: int"),
        (lambda: nn.LSTM(3.0, 4), TypeError, "input_size should be of type int, got: float"),
        (lambda: nn.LSTM(0, 4), ValueError, "input_size must be greater than zero"),
        (lambda: nn.LSTM(3, 0), ValueError, "hidden_size must be greater than zero"),
        (lambda: nn.LSTM(3, 4, 0), ValueError, "num_layers must be greater than zero"),
        (lambda: nn.RNNBase("CELL", 3, 4), ValueError, "Unrecognized RNN mode: CELL"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            fn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no dropout warning with several layers
        nn.LSTM(3, 4, num_layers=2, dropout=0.3)


# -- devices --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["GRU", "LSTM_PROJ"])
def test_module_on_device_matches_reference(key, device):
    """The same module on every array backend (CuPy with ``cuda``: real or simulated): values, gradients reach every
    weight, and CUDA autocast runs the whole recurrence in float16 (PyTorch's cuDNN path casts every argument)."""
    m, P, mode = _build(key, 2, True, dtype=hp.float32)
    m = m.to(device)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((L, N, H_IN))
    packed = pack_padded_sequence(hp.tensor(x, dtype=hp.float32, device=device), [4, 2])
    out, hidden = m(hp.tensor(x, dtype=hp.float32, device=device))
    assert out.device.type == device
    zeros_h, zeros_c = _states(key, 2, True, rng)
    zeros_h, zeros_c = np.zeros_like(zeros_h), (None if zeros_c is None else np.zeros_like(zeros_c))
    want, _, _ = np_rnn(mode, x, zeros_h, zeros_c, P, 2, True)
    np.testing.assert_allclose(out.detach().cpu().numpy(), want, **TOL[hp.float32])
    out.sum().backward()
    assert all(p.grad is not None and p.grad.device.type == device for p in m.parameters())
    p_out, _ = m(packed)
    assert p_out.data.device.type == device and tuple(p_out.data.shape) == (6, out.shape[-1])
    if device == "cuda":
        with hp.autocast("cuda", dtype=hp.float16):
            out, hidden = m(hp.tensor(x, dtype=hp.float32, device=device))
        assert {str(t.dtype) for t in [out] + (list(hidden) if mode == "LSTM" else [hidden])} == {"float16"}
