"""Packed sequences: PackedSequence, pack_padded_sequence / pad_packed_sequence / pack_sequence / unpack_sequence
against a layout written out here, their gradients and errors; RNN / LSTM / GRU on packed input against the NumPy
recurrence run on each sequence alone (h_n at each sequence's own end, the reverse direction from it)."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.nn.utils.rnn import (
    PackedSequence, invert_permutation, pack_padded_sequence, pack_sequence, pad_packed_sequence, unpack_sequence,
)

from _gradcheck import gradcheck
from _rnn_refs import H_IN, HID, MODULES, PROJ, _build, _np, _states, np_rnn

LENGTHS = [2, 5, 1, 3]  # unsorted: enforce_sorted=False sorts them to 5, 3, 2, 1 (order 1, 3, 0, 2)
ORDER = [1, 3, 0, 2]
TOL = dict(rtol=1e-10, atol=1e-12)


def _padded(rng, lengths=LENGTHS, trailing=(H_IN,), value=0.0):
    """(T, B, *) with random steps below each length and ``value`` after it."""
    x = np.full((max(lengths), len(lengths)) + trailing, value)
    for b, n in enumerate(lengths):
        x[:n, b] = rng.standard_normal((n,) + trailing)
    return x


def _packed_layout(x, lengths):
    """Packed data and batch sizes of time-major ``x`` whose sequences are already sorted: step by step, the rows
    of the sequences still running."""
    rows, sizes = [], []
    for t in range(max(lengths)):
        live = [b for b, n in enumerate(lengths) if n > t]
        sizes.append(len(live))
        rows.extend(x[t, b] for b in live)
    return np.stack(rows), sizes


# -- packing and padding --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_padded_sequence_sorted_layout(batch_first):
    lengths = [5, 3, 3, 1]
    x = _padded(np.random.default_rng(0), lengths)
    arg = x.swapaxes(0, 1) if batch_first else x
    p = pack_padded_sequence(hp.tensor(arg), hp.tensor(lengths), batch_first=batch_first)
    data, sizes = _packed_layout(x, lengths)
    assert isinstance(p, PackedSequence) and isinstance(p, tuple) and len(p) == 4
    assert p._fields == ("data", "batch_sizes", "sorted_indices", "unsorted_indices")
    np.testing.assert_array_equal(_np(p.data), data)
    assert p.batch_sizes.tolist() == sizes == [4, 3, 3, 1, 1] and p.batch_sizes.dtype == hp.int64
    assert p.batch_sizes.device.type == "cpu"
    assert p.sorted_indices is None and p.unsorted_indices is None


@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_unsorted_and_pad_back(batch_first):
    x = _padded(np.random.default_rng(1), value=0.0)
    arg = x.swapaxes(0, 1) if batch_first else x
    p = pack_padded_sequence(hp.tensor(arg), LENGTHS, batch_first=batch_first, enforce_sorted=False)
    assert p.sorted_indices.tolist() == ORDER and p.unsorted_indices.tolist() == [2, 0, 3, 1]
    data, sizes = _packed_layout(x[:, ORDER], [LENGTHS[i] for i in ORDER])
    np.testing.assert_array_equal(_np(p.data), data)
    assert p.batch_sizes.tolist() == sizes
    padded, lengths = pad_packed_sequence(p, batch_first=batch_first)
    np.testing.assert_array_equal(_np(padded), arg)  # the original order and padding back
    assert lengths.tolist() == LENGTHS and lengths.dtype == hp.int64
    padded, _ = pad_packed_sequence(p, batch_first=batch_first, padding_value=-3.0, total_length=7)
    want = np.concatenate([_padded(np.random.default_rng(1), value=-3.0), np.full((2, 4, H_IN), -3.0)])
    np.testing.assert_array_equal(_np(padded), want.swapaxes(0, 1) if batch_first else want)


def test_pack_sequence_and_unpack_sequence_round_trip():
    rng = np.random.default_rng(2)
    seqs = [rng.standard_normal((n, 2, 3)) for n in LENGTHS]
    p = pack_sequence([hp.tensor(s) for s in seqs], enforce_sorted=False)
    assert p.batch_sizes.tolist() == [4, 3, 2, 1, 1] and tuple(p.data.shape) == (sum(LENGTHS), 2, 3)
    back = unpack_sequence(p)
    assert [tuple(b.shape) for b in back] == [s.shape for s in seqs]
    for b, s in zip(back, seqs):
        np.testing.assert_array_equal(_np(b), s)
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order when `enforce_sorted` is True"):
        pack_sequence([hp.tensor(s) for s in seqs])


def test_pack_and_pad_are_differentiable():
    def fn(x):
        p = pack_padded_sequence(x, LENGTHS, enforce_sorted=False)
        return pad_packed_sequence(PackedSequence(p.data * p.data, p.batch_sizes, p.sorted_indices,
                                                  p.unsorted_indices), padding_value=1.5, total_length=6)[0]
    grad, = gradcheck(fn, [_padded(np.random.default_rng(3))])
    for b, n in enumerate(LENGTHS):  # padding steps get no gradient
        assert not grad[n:, b].any()


def test_packed_sequence_construction_and_conversion():
    data, sizes = hp.randn(5, 2), hp.tensor([3, 2])
    p = PackedSequence(data, sizes, hp.tensor([2, 0, 1]))
    assert p.unsorted_indices.tolist() == [1, 2, 0]  # the inverse permutation, filled in
    assert invert_permutation(hp.tensor([2, 0, 1])).tolist() == [1, 2, 0] and invert_permutation(None) is None
    q = PackedSequence((data, sizes))
    assert q.data is data and q.batch_sizes is sizes and q.sorted_indices is None
    d, b, s, u = p  # a named tuple
    assert d is data and b is sizes
    assert p.to("cpu") is p and p.to(hp.float32) is p
    p64 = p.to(hp.float64)
    assert p64.data.dtype == hp.float64 and p64.batch_sizes is sizes and p64.batch_sizes.dtype == hp.int64
    assert p.double().data.dtype == hp.float64 and p.half().data.dtype == hp.float16
    assert p.long().data.dtype == hp.int64 and p.is_cuda is False and p.is_pinned() is False
    with pytest.raises(TypeError, match="data must be a \\(data, batch_sizes\\) pair"):
        PackedSequence(data)


def test_pack_errors():
    x = hp.randn(4, 3, 2)
    cases = [
        (lambda: pack_padded_sequence(x, [2, 4, 1]), RuntimeError,
         "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True"),
        (lambda: pack_padded_sequence(x, [4, 0, 0], enforce_sorted=False), RuntimeError,
         "Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0"),
        (lambda: pack_padded_sequence(x, [4, 2]), RuntimeError,
         r"Expected `len\(lengths\)` to be equal to batch_size, but got 2 \(batch_size=3\)"),
        (lambda: pack_padded_sequence(x, hp.tensor([[4, 2, 1]])), RuntimeError,
         "'lengths' argument should be a 1D CPU int64 tensor, but got 2D"),
        (lambda: pack_padded_sequence(x, [5, 2, 1]), RuntimeError, "a sequence of length 5 in an input of 4 steps"),
        (lambda: pad_packed_sequence(pack_padded_sequence(x, [4, 2, 1]), total_length=3), ValueError,
         "Expected total_length to be at least the length of the longest sequence in input, but got total_length=3 "
         "and max sequence length being 4"),
    ]
    for fn, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            fn()
    p = pack_padded_sequence(x, hp.tensor([4.0, 2.0, 1.0]))  # float lengths are cast, as PyTorch
    assert p.batch_sizes.tolist() == [3, 2, 1, 1]


# -- the modules on packed input ------------------------------------------------------------------------------------

def _alone(mode, x, h0, c0, P, num_layers, bidirectional, lengths):
    """The NumPy recurrence run on each sequence alone (its own length, its own h_0 column)."""
    outs, hs, cs = [], [], []
    for b, n in enumerate(lengths):
        o, h, c = np_rnn(mode, x[:n, b:b + 1], h0[:, b:b + 1], None if c0 is None else c0[:, b:b + 1], P,
                         num_layers, bidirectional)
        outs.append(o[:, 0])
        hs.append(h[:, 0])
        cs.append(None if c is None else c[:, 0])
    return outs, np.stack(hs, 1), (None if c0 is None else np.stack(cs, 1))


@pytest.mark.parametrize("given_hx", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("key", list(MODULES))
def test_packed_equals_each_sequence_alone(key, num_layers, bidirectional, given_hx):
    m, P, mode = _build(key, num_layers, bidirectional)
    rng = np.random.default_rng(4)
    x = _padded(rng, value=9.0)  # a padding the packed run must never read
    h0, c0 = _states(key, num_layers, bidirectional, rng, batch=len(LENGTHS))
    if not given_hx:
        h0, c0 = np.zeros_like(h0), (None if c0 is None else np.zeros_like(c0))
    want_o, want_h, want_c = _alone(mode, x, h0, c0, P, num_layers, bidirectional, LENGTHS)
    packed = pack_padded_sequence(hp.tensor(x), LENGTHS, enforce_sorted=False)
    hx = None if not given_hx else ((hp.tensor(h0), hp.tensor(c0)) if mode == "LSTM" else hp.tensor(h0))
    out, hidden = m(packed, hx)
    assert isinstance(out, PackedSequence)
    assert out.batch_sizes is packed.batch_sizes and out.sorted_indices is packed.sorted_indices
    assert out.unsorted_indices is packed.unsorted_indices
    d = 2 if bidirectional else 1
    h_out = PROJ if key == "LSTM_PROJ" else HID
    assert tuple(out.data.shape) == (sum(LENGTHS), d * h_out)
    for got, want in zip(unpack_sequence(out), want_o):
        np.testing.assert_allclose(_np(got), want, **TOL)
    h_n, c_n = hidden if mode == "LSTM" else (hidden, None)
    np.testing.assert_allclose(_np(h_n), want_h, **TOL)  # h_n at each sequence's own end, original order
    if mode == "LSTM":
        np.testing.assert_allclose(_np(c_n), want_c, **TOL)


def test_packed_sorted_batch_first_lengths_tensor():
    lengths = [4, 4, 2]
    m, P, mode = _build("GRU", 2, True, batch_first=True)
    rng = np.random.default_rng(5)
    x = _padded(rng, lengths, value=-4.0)
    packed = pack_padded_sequence(hp.tensor(x.swapaxes(0, 1)), hp.tensor(lengths), batch_first=True)
    out, h_n = m(packed)
    want_o, want_h, _ = _alone(mode, x, np.zeros((4, 3, HID)), None, P, 2, True, lengths)
    padded, got_lengths = pad_packed_sequence(out, batch_first=True)
    assert got_lengths.tolist() == lengths
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(_np(padded[b, :n]), want_o[b], **TOL)
        assert not _np(padded[b, n:]).any()
    np.testing.assert_allclose(_np(h_n), want_h, **TOL)


@pytest.mark.parametrize("key", ["GRU", "LSTM_PROJ"])
def test_packed_gradients(key):
    """d(packed output, h_n[, c_n]) / d(input, h_0[, c_0], every weight), bidirectional over unsorted lengths."""
    lengths = [2, 3, 1]
    m, P, mode = _build(key, 1, True)
    names = list(P)
    rng = np.random.default_rng(6)
    x = _padded(rng, lengths)
    h0, c0 = _states(key, 1, True, rng, batch=len(lengths))
    c0 = np.zeros(1) if c0 is None else c0

    def fn(x, h0, c0, *ws):
        for n, w in zip(names, ws):
            m._parameters[n] = w
        out, hidden = m(pack_padded_sequence(x, lengths, enforce_sorted=False), (h0, c0) if mode == "LSTM" else h0)
        return (out.data, *hidden) if mode == "LSTM" else (out.data, hidden)
    arrays = [x, h0, c0] + [P[n].copy() for n in names]
    grads = gradcheck(fn, arrays, check=[i for i in range(len(arrays)) if i != 2 or mode == "LSTM"])
    for b, n in enumerate(lengths):  # the padding of the input gets no gradient
        assert not grads[0][n:, b].any()


def test_packed_input_errors():
    lstm = nn.LSTM(3, 4)
    p = pack_sequence([hp.randn(3, 3), hp.randn(2, 3)])
    with pytest.raises(RuntimeError, match=r"Expected hidden\[0\] size \(1, 2, 4\), got \[1, 3, 4\]"):
        lstm(p, (hp.randn(1, 3, 4), hp.randn(1, 3, 4)))
    with pytest.raises(RuntimeError, match=r"Expected hidden size \(1, 2, 4\), got \[2, 4\]"):
        nn.GRU(3, 4)(p, hp.randn(2, 4))
    with pytest.raises(RuntimeError, match=r"input.size\(-1\) must be equal to input_size. Expected 2, got 3"):
        nn.RNN(2, 4)(p)
