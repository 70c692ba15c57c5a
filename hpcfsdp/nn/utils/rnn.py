"""Variable-length sequences: padded batches (pad_sequence, unpad_sequence) and packed batches (PackedSequence,
pack_padded_sequence, pad_packed_sequence, pack_sequence, unpack_sequence), as torch.nn.utils.rnn.

[Note: Packed sequences]
A PackedSequence holds the steps of B sequences sorted by decreasing length, time-major and without padding:
``data`` is (sum(batch_sizes), *), its first ``batch_sizes[0]`` rows the first step of every sequence, the next
``batch_sizes[1]`` rows the second step of the sequences that have one, and so on. ``batch_sizes`` (int64, on the
CPU) has one entry per step of the longest sequence. ``sorted_indices[i]`` is the original batch index of the i-th
sorted sequence (None when the input was already sorted) and ``unsorted_indices`` its inverse permutation. RNN, LSTM
and GRU read a packed batch step by step (nn/_functional/rnn.py) and return one with the same batch_sizes and
indices. Packing and padding are slices, cats and stacks of Tensor ops, so gradients flow through both.
"""
from collections.abc import Iterable
from typing import NamedTuple

import hpcfsdp
from hpcfsdp._tensor import Tensor

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "unpad_sequence", "pack_sequence", "unpack_sequence"]


class _PackedSequenceBase(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


def _bind(optional, fn):
    return None if optional is None else fn(optional)


class PackedSequence(_PackedSequenceBase):
    """The data and ``batch_sizes`` of a packed batch of sequences, plus the permutation that sorted them (see
    [Note: Packed sequences]), as ``torch.nn.utils.rnn.PackedSequence``: a named tuple
    ``(data, batch_sizes, sorted_indices, unsorted_indices)``. Build one with pack_padded_sequence or pack_sequence.
    ``PackedSequence(data, batch_sizes, sorted_indices)`` fills ``unsorted_indices`` with the inverse permutation;
    ``PackedSequence((data, batch_sizes))`` is accepted too, as PyTorch.

    Raises:
        ValueError: ``batch_sizes`` is not on the CPU.
        TypeError: no ``batch_sizes`` and ``data`` is not a (data, batch_sizes) pair.
    """

    __slots__ = ()

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:
            if not (isinstance(data, (list, tuple)) and len(data) == 2):
                raise TypeError("PackedSequence: without batch_sizes, data must be a (data, batch_sizes) pair, got "
                                f"{type(data).__name__}")
            data, batch_sizes = data
        if batch_sizes.device.type != "cpu":
            raise ValueError("batch_sizes should always be on CPU. Instances of PackedSequence should never be created "
                             "manually. They should be instantiated by functions like pack_sequence and "
                             "pack_padded_sequences in nn.utils.rnn.")
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs) -> "PackedSequence":
        """``data.to(*args, **kwargs)``; the indices follow data's device, ``batch_sizes`` stays on the CPU.
        Returns ``self`` when data is unchanged."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self

        def move(t):
            return t.to(data.device)

        return type(self)(data, self.batch_sizes, _bind(self.sorted_indices, move), _bind(self.unsorted_indices, move))

    def cuda(self, *args, **kwargs) -> "PackedSequence":
        return type(self)(self.data.cuda(*args, **kwargs), self.batch_sizes, *self._moved_indices("cuda"))

    def cpu(self, *args, **kwargs) -> "PackedSequence":
        return type(self)(self.data.cpu(*args, **kwargs), self.batch_sizes, *self._moved_indices("cpu"))

    def _moved_indices(self, device):
        return (_bind(self.sorted_indices, lambda t: getattr(t, device)()),
                _bind(self.unsorted_indices, lambda t: getattr(t, device)()))

    def pin_memory(self) -> "PackedSequence":
        return type(self)(self.data.pin_memory(), self.batch_sizes,
                          _bind(self.sorted_indices, lambda t: t.pin_memory()),
                          _bind(self.unsorted_indices, lambda t: t.pin_memory()))

    def double(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.float64)

    def float(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.float32)

    def half(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.float16)

    def long(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.int64)

    def int(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.int32)

    def short(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.int16)

    def char(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.int8)

    def byte(self) -> "PackedSequence":
        return self.to(dtype=hpcfsdp.uint8)

    @property
    def is_cuda(self) -> bool:
        """Whether ``data`` is on a CUDA device."""
        return self.data.is_cuda

    def is_pinned(self) -> bool:
        """Whether ``data`` is in pinned host memory."""
        return self.data.is_pinned()


def invert_permutation(permutation):
    """The inverse of a permutation tensor (None for None), as ``torch.nn.utils.rnn.invert_permutation``."""
    if permutation is None:
        return None
    return permutation.argsort()


def _lengths_list(lengths):
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.device.type != "cpu":
            raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.dim()}D "
                               f"{lengths.device} {lengths.dtype} tensor")
        return [int(n) for n in lengths.to(hpcfsdp.int64).tolist()]
    return [int(n) for n in lengths]


def pack_padded_sequence(input: Tensor, lengths, batch_first: bool = False,  # noqa: A002
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch (L, B, *) ((B, L, *) with ``batch_first``) of sequences of ``lengths`` (a list or a 1-D
    CPU tensor) into a PackedSequence, as ``torch.nn.utils.rnn.pack_padded_sequence``. With ``enforce_sorted`` the
    lengths must be in decreasing order; otherwise the batch is sorted first (stably) and the permutation kept in
    ``sorted_indices``. Differentiable in ``input``.

    Raises:
        RuntimeError: ``lengths`` not 1-D / not on the CPU, not one per sequence, one <= 0 or longer than the input,
            or not decreasing with ``enforce_sorted``.
    """
    lengths = _lengths_list(lengths)
    batch_dim = 0 if batch_first else 1
    if input.dim() < 2:
        raise IndexError(f"Dimension out of range (expected to be in range of [-{max(input.dim(), 1)}, "
                         f"{max(input.dim(), 1) - 1}], but got 1)")
    sorted_indices = None
    if not enforce_sorted:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable, as torch.sort on the CPU
        lengths = [lengths[i] for i in order]
        sorted_indices = hpcfsdp.tensor(order, dtype=hpcfsdp.int64, device=input.device)
        input = input.index_select(batch_dim, sorted_indices)  # noqa: A001
    x = input.transpose(0, 1) if batch_first else input  # (L, B, *)
    if len(lengths) != x.size(1):
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} "
                           f"(batch_size={x.size(1)})")
    if lengths[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' that "
                           "is <= 0")
    if any(a < b for a, b in zip(lengths, lengths[1:])):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can "
                           "pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this "
                           "requirement if you do not need ONNX exportability.")
    if lengths[0] > x.size(0):
        raise RuntimeError(f"pack_padded_sequence: a sequence of length {lengths[0]} in an input of {x.size(0)} steps")
    batch_sizes = [sum(1 for n in lengths if n > t) for t in range(lengths[0])]
    data = hpcfsdp.cat([x[t, :b] for t, b in enumerate(batch_sizes)], 0)  # (sum(batch_sizes), *)
    return PackedSequence(data, hpcfsdp.tensor(batch_sizes, dtype=hpcfsdp.int64), sorted_indices, None)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple:
    """Unpack a PackedSequence into a padded batch (T, B, *) ((B, T, *) with ``batch_first``), T the longest length
    or ``total_length``, in the original batch order; returns it and the lengths (int64, on the CPU), as
    ``torch.nn.utils.rnn.pad_packed_sequence``. Differentiable in ``sequence.data``.

    Raises:
        ValueError: ``total_length`` is shorter than the longest sequence.
    """
    batch_sizes = [int(b) for b in sequence.batch_sizes.tolist()]
    max_seq_length = len(batch_sizes)
    if total_length is not None:
        if total_length < max_seq_length:
            raise ValueError("Expected total_length to be at least the length of the longest sequence in input, but "
                             f"got total_length={total_length} and max sequence length being {max_seq_length}")
        max_seq_length = total_length
    data = sequence.data
    batch = batch_sizes[0]
    trailing = tuple(data.shape[1:])
    steps, start = [], 0
    for b in batch_sizes:
        piece = data[start:start + b]  # (b, *)
        if b < batch:
            fill = hpcfsdp.full((batch - b,) + trailing, padding_value, dtype=data.dtype, device=data.device)
            piece = hpcfsdp.cat([piece, fill], 0)
        steps.append(piece)
        start += b
    padded = hpcfsdp.stack(steps, 0)  # (T, B, *)
    if max_seq_length > len(batch_sizes):
        fill = hpcfsdp.full((max_seq_length - len(batch_sizes), batch) + trailing, padding_value, dtype=data.dtype,
                            device=data.device)
        padded = hpcfsdp.cat([padded, fill], 0)
    if batch_first:
        padded = padded.transpose(0, 1)
    lengths = [sum(1 for b in batch_sizes if b > i) for i in range(batch)]
    if sequence.unsorted_indices is not None:
        order = [int(i) for i in sequence.unsorted_indices.tolist()]
        padded = padded.index_select(0 if batch_first else 1, sequence.unsorted_indices)
        lengths = [lengths[i] for i in order]
    return padded, hpcfsdp.tensor(lengths, dtype=hpcfsdp.int64)


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of tensors (L_i, *) into a PackedSequence (pad_sequence, then pack_padded_sequence), as
    ``torch.nn.utils.rnn.pack_sequence``.

    Raises:
        RuntimeError: pad_sequence's and pack_padded_sequence's errors (unsorted lengths with ``enforce_sorted``).
    """
    lengths = [int(v.size(0)) for v in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list:
    """The list of tensors (L_i, *) a PackedSequence holds, in the original order, as
    ``torch.nn.utils.rnn.unpack_sequence``."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)


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
