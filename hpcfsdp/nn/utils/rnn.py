"""Variable-length sequences as one padded tensor and back (torch.nn.utils.rnn's pad_sequence, unpad_sequence)."""
from collections.abc import Iterable

import hpcfsdp
from hpcfsdp._tensor import Tensor

__all__ = ["pad_sequence", "unpad_sequence"]

# PackedSequence, pack_padded_sequence, pad_packed_sequence and pack_sequence are left out: a packed batch is
# the input format of PyTorch's cuDNN-backed RNN modules, which hpcfsdp does not have.


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack tensors of shapes ``(L_i, *)`` into ``(L_max, B, *)`` (``(B, L_max, *)`` with ``batch_first``),
    filling the missing steps with ``padding_value`` after each sequence (``padding_side="right"``) or before it
    (``"left"``), as ``torch.nn.utils.rnn.pad_sequence``. The result has the first sequence's dtype and is
    differentiable in every sequence.

    Raises:
        RuntimeError: ``sequences`` is not iterable or empty, a sequence is 0-d, the trailing dims differ, or
            ``padding_side`` is neither "left" nor "right".
    """
    if not isinstance(sequences, Iterable):
        raise RuntimeError(f"pad_sequence: Expected iterable for input sequences, but got arg of type: "
                           f"{type(sequences)}")
    sequences = tuple(sequences)
    if len(sequences) == 0:
        raise RuntimeError("received an empty list of sequences")
    if padding_side not in ("left", "right"):
        raise RuntimeError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    first = sequences[0]
    if first.ndim == 0:
        raise RuntimeError("pad_sequence: every sequence needs a length dimension (dim 0), but the first is 0-d")
    trailing = tuple(first.shape[1:])
    max_len = max(int(s.shape[0]) if s.ndim else 0 for s in sequences)
    padded = []
    for s in sequences:
        if s.ndim == 0 or tuple(s.shape[1:]) != trailing:
            raise RuntimeError(f"pad_sequence: every sequence must have the trailing shape {trailing} of the first "
                               f"(shape (L, *trailing)), but one has shape {tuple(s.shape)}")
        if s.dtype != first.dtype:
            s = s.to(first.dtype)
        extra = max_len - int(s.shape[0])
        if extra:
            widths = (extra, 0) if padding_side == "left" else (0, extra)
            s = hpcfsdp.nn.functional.pad(s, (0, 0) * len(trailing) + widths, value=padding_value)
        padded.append(s)
    return hpcfsdp.stack(padded, dim=0 if batch_first else 1)


def unpad_sequence(padded_sequences: Tensor, lengths: Tensor, batch_first: bool = False) -> list:
    """Split a padded batch back into its sequences: the first ``lengths[i]`` steps of sequence ``i``, as
    ``torch.nn.utils.rnn.unpad_sequence`` (which, without ``batch_first``, transposes ``padded_sequences`` in
    place, as here).

    Raises:
        ValueError: ``lengths`` and the batch differ in size.
    """
    if not batch_first:
        padded_sequences.transpose_(0, 1)
    lengths = [int(n) for n in (lengths.tolist() if isinstance(lengths, Tensor) else lengths)]
    if len(lengths) != int(padded_sequences.shape[0]):
        raise ValueError(f"unpad_sequence: {len(lengths)} lengths for a batch of {int(padded_sequences.shape[0])} "
                         "sequences")
    return [seq[:n] for seq, n in zip(padded_sequences, lengths)]
