"""nn.utils.rnn: pad_sequence / unpad_sequence against NumPy padding, their gradients and PyTorch's errors."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.nn.utils.rnn import pad_sequence, unpad_sequence

LENGTHS = (3, 1, 4)


def _seqs(trailing=(2,)):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((n,) + trailing) for n in LENGTHS]


def _reference(arrays, batch_first, value, side):
    """(L_max, B, *) padded with ``value`` on ``side``, written out element by element."""
    max_len = max(a.shape[0] for a in arrays)
    out = np.full((max_len, len(arrays)) + arrays[0].shape[1:], value, dtype=np.float64)
    for b, a in enumerate(arrays):
        start = max_len - a.shape[0] if side == "left" else 0
        for t in range(a.shape[0]):
            out[start + t, b] = a[t]
    return out.swapaxes(0, 1) if batch_first else out


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("trailing", [(), (2,), (2, 3)])
def test_pad_sequence_matches_reference(batch_first, side, trailing):
    arrays = _seqs(trailing)
    out = pad_sequence([hp.tensor(a) for a in arrays], batch_first=batch_first, padding_value=-7.5,
                       padding_side=side)
    np.testing.assert_array_equal(out.numpy(), _reference(arrays, batch_first, -7.5, side))
    assert out.dtype == hp.float64


def test_pad_sequence_defaults_and_dtype_of_the_first():
    a, b = hp.arange(3), hp.arange(1)
    out = pad_sequence([a, b], padding_value=0.5)  # int64: the fill is cast as PyTorch casts it
    assert out.dtype == hp.int64 and out.shape == (3, 2)
    np.testing.assert_array_equal(out.numpy(), [[0, 0], [1, 0], [2, 0]])
    mixed = pad_sequence([hp.ones(2, dtype=hp.float32), hp.ones(1, dtype=hp.float64)])
    assert mixed.dtype == hp.float32
    np.testing.assert_array_equal(mixed.numpy(), [[1, 1], [1, 0]])
    rows = pad_sequence(hp.ones(2, 3))  # a tensor is iterated: its rows are the sequences
    assert rows.shape == (3, 2)


def test_pad_sequence_gradient_reaches_every_sequence():
    arrays = _seqs()
    seqs = [hp.tensor(a, requires_grad=True) for a in arrays]
    out = pad_sequence(seqs, batch_first=True, padding_side="left")
    weights = np.random.default_rng(1).standard_normal(out.shape)
    (out * hp.tensor(weights)).sum().backward()
    max_len = max(LENGTHS)
    for b, s in enumerate(seqs):  # d(sum w * out)/d seq[t] = w at the step it landed on
        n = LENGTHS[b]
        np.testing.assert_allclose(s.grad.numpy(), weights[b, max_len - n:], rtol=0, atol=0)


def test_pad_sequence_errors():
    with pytest.raises(RuntimeError, match="received an empty list of sequences"):
        pad_sequence([])
    with pytest.raises(RuntimeError, match="Expected padding_side to be one of left or right, but got up"):
        pad_sequence([hp.ones(2)], padding_side="up")
    with pytest.raises(RuntimeError, match="trailing shape"):
        pad_sequence([hp.ones(3, 2), hp.ones(2, 3)])
    with pytest.raises(RuntimeError, match="0-d"):
        pad_sequence([hp.ones(())])
    with pytest.raises(RuntimeError, match="Expected iterable"):
        pad_sequence(3)


@pytest.mark.parametrize("batch_first", [False, True])
def test_unpad_sequence_round_trip(batch_first):
    arrays = _seqs((2,))
    padded = pad_sequence([hp.tensor(a) for a in arrays], batch_first=batch_first)
    back = unpad_sequence(padded, hp.tensor(list(LENGTHS)), batch_first=batch_first)
    assert len(back) == len(arrays)
    for a, t in zip(arrays, back):
        np.testing.assert_array_equal(t.numpy(), a)
    if not batch_first:  # PyTorch transposes the input in place
        assert padded.shape == (len(LENGTHS), max(LENGTHS), 2)
    with pytest.raises(ValueError, match="2 lengths for a batch of 3"):
        unpad_sequence(pad_sequence([hp.tensor(a) for a in arrays], batch_first=True), [1, 2], batch_first=True)
