"""Recurrent layers: RNN, LSTM, GRU (multi-layer, bidirectional, packed sequences) and their cells, as torch.nn's.

Parameter names, shapes, order and init equal PyTorch's (``weight_ih_l0``, ``bias_hh_l1_reverse``, ``weight_hr_l0``
with ``proj_size``; a cell's ``weight_ih`` ...), so state dicts interchange. The recurrences are compositions of
Tensor ops (see [Note: RNN recurrences] in nn/_functional/rnn.py); there is no cuDNN, so ``flatten_parameters`` does
nothing.
"""
import math
import numbers
import warnings

from hpcfsdp._autocast import is_enabled as _autocast_enabled
from hpcfsdp.nn import init
from hpcfsdp.nn._functional import rnn as _rnn
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter
from hpcfsdp.nn.utils.rnn import PackedSequence

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}

# RNNBase.extra_repr: the settings shown when they differ from these defaults, in this order
_REPR_DEFAULTS = (("proj_size", 0), ("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0),
                  ("bidirectional", False))


def _hp():
    import hpcfsdp

    return hpcfsdp


def _empty(shape, device, dtype):
    return _hp().empty(shape, device=device, dtype=dtype)


def _permute(hx, permutation):
    """``hx`` (or each of an LSTM's (h, c)) with its batch dim (1) reordered by ``permutation``."""
    if permutation is None:
        return hx
    if isinstance(hx, tuple):
        return tuple(h.index_select(1, permutation) for h in hx)
    return hx.index_select(1, permutation)


class RNNBase(Module):
    """The base of RNN, LSTM and GRU: builds the per-layer, per-direction parameters in PyTorch's names and order,
    checks inputs and hidden states, and runs the recurrence of ``mode`` ("RNN_TANH", "RNN_RELU", "LSTM", "GRU").

    Args:
        mode: the recurrence.
        input_size: features of the input, H_in.
        hidden_size: features of the hidden state, H.
        num_layers: stacked recurrent layers.
        bias: whether the layers have ``bias_ih`` and ``bias_hh``.
        batch_first: input and output are (N, L, *) instead of (L, N, *); the hidden states stay (D*layers, N, *).
        dropout: dropout probability on the output of every layer but the last (training only).
        bidirectional: add a reverse-direction layer per layer (parameters ``..._reverse``), D = 2.
        proj_size: LSTM only: project h to this size with ``weight_hr_l{k}`` (0: none).
        device: where the parameters are made.
        dtype: their dtype.

    Raises:
        ValueError: ``dropout`` outside [0, 1] or a bool, a size <= 0, ``proj_size`` < 0 or >= ``hidden_size``,
            or an unknown ``mode``.
        TypeError: ``bias``/``batch_first`` not bool, ``input_size``/``hidden_size`` not int.
    """

    __constants__ = ["mode", "input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
                     "bidirectional", "proj_size"]

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        num_directions = 2 if bidirectional else 1
        if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an element "
                             "being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                          stacklevel=2)
        if not isinstance(bias, bool):
            raise TypeError(f"bias should be of type bool, got: {type(bias).__name__}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first should be of type bool, got: {type(batch_first).__name__}")
        if not isinstance(input_size, int):
            raise TypeError(f"input_size should be of type int, got: {type(input_size).__name__}")
        if input_size <= 0:
            raise ValueError("input_size must be greater than zero")
        if not isinstance(hidden_size, int):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        gate_size = _GATES[mode] * hidden_size
        real_hidden_size = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else real_hidden_size * num_directions
                shapes = [(gate_size, layer_input_size), (gate_size, real_hidden_size)]
                names = ["weight_ih_l{}{}", "weight_hh_l{}{}"]
                if bias:
                    shapes += [(gate_size,), (gate_size,)]
                    names += ["bias_ih_l{}{}", "bias_hh_l{}{}"]
                if proj_size > 0:
                    shapes.append((proj_size, hidden_size))
                    names.append("weight_hr_l{}{}")
                suffix = "_reverse" if direction == 1 else ""
                names = [n.format(layer, suffix) for n in names]
                for name, shape in zip(names, shapes):
                    setattr(self, name, Parameter(_empty(shape, device, dtype)))
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    @property
    def _flat_weights(self) -> list:
        """The parameters in PyTorch's flat order, read afresh (so a replaced parameter, e.g. by FSDP, is used)."""
        return [getattr(self, n, None) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list:
        """The parameters per layer and direction: ``[[weight_ih_l0, weight_hh_l0, ...], ...]``."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """A no-op: PyTorch packs the weights into one cuDNN buffer here; hpcfsdp has no cuDNN RNN."""

    def reset_parameters(self) -> None:
        """Every parameter ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as PyTorch."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    # -- checks (PyTorch's names and messages) ----------------------------------------------------------------------

    def check_input(self, input, batch_sizes) -> None:  # noqa: A002
        """Raises ValueError on a dtype other than the weights' (outside autocast), RuntimeError on a wrong number
        of dims or a last dim other than ``input_size``."""
        w = self._flat_weights[0]
        if input.dtype != w.dtype and not _autocast_enabled(input.device.type):
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype ({w.dtype}). Convert "
                             f"input: input.to({w.dtype}), or convert model: model.to({input.dtype})")
        expected_input_dim = 2 if batch_sizes is not None else 3
        if input.dim() != expected_input_dim:
            raise RuntimeError(f"input must have {expected_input_dim} dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.size(-1)}")

    def _states_and_batch(self, input, batch_sizes) -> tuple:  # noqa: A002
        """(layers x directions, batch): a packed batch's size is its first step's."""
        batch = int(batch_sizes[0]) if batch_sizes is not None else input.size(0 if self.batch_first else 1)
        return self.num_layers * (2 if self.bidirectional else 1), batch

    def get_expected_hidden_size(self, input, batch_sizes) -> tuple:  # noqa: A002
        return (*self._states_and_batch(input, batch_sizes), self.proj_size or self.hidden_size)

    def check_hidden_size(self, hx, expected_hidden_size, msg: str = "Expected hidden size {}, got {}") -> None:
        if tuple(hx.size()) != tuple(expected_hidden_size):
            raise RuntimeError(msg.format(tuple(expected_hidden_size), list(hx.size())))

    def check_forward_args(self, input, hidden, batch_sizes) -> None:  # noqa: A002
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden, self.get_expected_hidden_size(input, batch_sizes))

    def permute_hidden(self, hx, permutation):
        return _permute(hx, permutation)

    def extra_repr(self) -> str:
        # the sizes, then each setting that differs from its default, in PyTorch's order
        shown = [(k, getattr(self, k)) for k, default in _REPR_DEFAULTS if getattr(self, k) != default
                 or (isinstance(default, bool) and getattr(self, k) is not default)]
        return ", ".join([f"{self.input_size}, {self.hidden_size}"] + [f"{k}={v}" for k, v in shown])

    # -- forward ----------------------------------------------------------------------------------------------------

    def _zeros(self, batch, size, input):  # noqa: A002
        num_directions = 2 if self.bidirectional else 1
        return _hp().zeros((self.num_layers * num_directions, batch, size), dtype=input.dtype, device=input.device)

    def _prepare(self, input, hx):  # noqa: A002
        """Unpack a PackedSequence or add the batch dim of an unbatched input; check the input and ``hx`` (given or
        zeros) as PyTorch's forward does. Returns (input, hx, batch_sizes, sorted, unsorted, is_batched)."""
        lstm = self.mode == "LSTM"
        name = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(self.mode, self.mode)
        h_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        if isinstance(input, PackedSequence):
            input, batch_sizes, sorted_indices, unsorted_indices = input  # noqa: A001
            batch_sizes = [int(b) for b in batch_sizes.tolist()]
            is_batched = True
            if hx is not None:
                hx = _permute(tuple(hx) if lstm else hx, sorted_indices)
        else:
            batch_sizes = sorted_indices = unsorted_indices = None
            if input.dim() not in (2, 3):
                extra = " tensor" if name == "RNN" else ""
                raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D{extra} instead")
            is_batched = input.dim() == 3
            if not is_batched:
                input = input.unsqueeze(0 if self.batch_first else 1)  # noqa: A001
            if hx is not None:
                want = 3 if is_batched else 2
                kind = "batched 3-D" if is_batched else "unbatched 2-D"
                if lstm:
                    if hx[0].dim() != want or hx[1].dim() != want:
                        raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D but got "
                                           f"({hx[0].dim()}-D, {hx[1].dim()}-D) tensors")
                    hx = (hx[0], hx[1]) if is_batched else (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
                else:
                    if hx.dim() != want:
                        raise RuntimeError(f"For {kind} input, hx should also be {want}-D but got {hx.dim()}-D "
                                           "tensor")
                    hx = hx if is_batched else hx.unsqueeze(1)
        batch = batch_sizes[0] if batch_sizes is not None else input.size(0 if self.batch_first else 1)
        if hx is None:
            hx = (self._zeros(batch, h_size, input), self._zeros(batch, self.hidden_size, input)) if lstm else \
                self._zeros(batch, h_size, input)
        self.check_forward_args(input, hx, batch_sizes)
        return input, hx, batch_sizes, sorted_indices, unsorted_indices, is_batched

    def _impl(self):
        return {"RNN_TANH": _rnn.rnn_tanh, "RNN_RELU": _rnn.rnn_relu, "LSTM": _rnn.lstm, "GRU": _rnn.gru}[self.mode]

    def forward(self, input, hx=None):  # noqa: A002
        """Run the recurrence over ``input``: (L, N, H_in) ((N, L, H_in) with ``batch_first``), (L, H_in)
        unbatched, or a PackedSequence; ``hx``: (D*num_layers, N, H_out) (unbatched: (D*num_layers, H_out)), for
        an LSTM the pair (h_0, c_0) with c_0 (D*num_layers, N, hidden_size); zeros when None. Returns
        ``(output, h_n)`` (LSTM: ``(output, (h_n, c_n))``); ``output`` is (L, N, D*H_out), or a PackedSequence when
        ``input`` is one, and h_n holds each sequence's state after its own last step.

        Raises:
            ValueError: input not 2-D or 3-D, or of another dtype than the weights (outside autocast).
            RuntimeError: a last dim other than ``input_size``, or ``hx`` of the wrong dims or shape.
        """
        packed = isinstance(input, PackedSequence)
        batch_sizes_t = input.batch_sizes if packed else None
        x, hx, batch_sizes, sorted_indices, unsorted_indices, is_batched = self._prepare(input, hx)
        result = self._impl()(x, hx, self._flat_weights, self.bias, self.num_layers, self.dropout, self.training,
                              self.bidirectional, self.batch_first, batch_sizes)
        output = result[0]
        hidden = (result[1], result[2]) if self.mode == "LSTM" else result[1]
        if packed:
            return PackedSequence(output, batch_sizes_t, sorted_indices, unsorted_indices), \
                _permute(hidden, unsorted_indices)
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            hidden = tuple(h.squeeze(1) for h in hidden) if isinstance(hidden, tuple) else hidden.squeeze(1)
        return output, hidden


class RNN(RNNBase):
    """Elman RNN, h_t = act(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) with act tanh or relu, as ``torch.nn.RNN``.

    ``RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None)``; see RNNBase for the arguments and ``forward``.

    Raises:
        ValueError: ``proj_size`` given, or ``nonlinearity`` neither "tanh" nor "relu" (and RNNBase's errors).
    """

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        # nonlinearity is RNN's fourth positional argument (input_size, hidden_size, num_layers, nonlinearity, ...)
        args = list(args)
        act = args.pop(3) if len(args) > 3 else kwargs.pop("nonlinearity", "tanh")
        modes = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}
        if act not in modes:
            raise ValueError(f"Unknown nonlinearity '{act}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = act
        super().__init__(modes[act], *args, **kwargs)


class LSTM(RNNBase):
    """Long short-term memory over a sequence, gates i, f, g, o (see [Note: RNN recurrences]), optionally with a
    projection of h to ``proj_size`` (``weight_hr_l{k}``), as ``torch.nn.LSTM``.

    ``LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0, bidirectional=False,
    proj_size=0, device=None, dtype=None)``; ``forward(input, (h_0, c_0))`` returns ``(output, (h_n, c_n))``.

    Raises:
        ValueError / TypeError: RNNBase's.
    """

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)

    def get_expected_cell_size(self, input, batch_sizes) -> tuple:  # noqa: A002
        return (*self._states_and_batch(input, batch_sizes), self.hidden_size)

    def check_forward_args(self, input, hidden, batch_sizes) -> None:  # noqa: A002
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden[0], self.get_expected_hidden_size(input, batch_sizes),
                               "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(hidden[1], self.get_expected_cell_size(input, batch_sizes),
                               "Expected hidden[1] size {}, got {}")


class GRU(RNNBase):
    """Gated recurrent unit over a sequence, gates r, z, n (see [Note: RNN recurrences]), as ``torch.nn.GRU``.

    ``GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0, bidirectional=False,
    device=None, dtype=None)``; see RNNBase for the arguments and ``forward``.

    Raises:
        ValueError: ``proj_size`` given (and RNNBase's errors).
    """

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)


# -- cells ----------------------------------------------------------------------------------------------------------

class RNNCellBase(Module):
    """The base of the cells: ``weight_ih`` (chunks*H, H_in), ``weight_hh`` (chunks*H, H), ``bias_ih`` and
    ``bias_hh`` (chunks*H,) (None without ``bias``), all ~ U(-1/sqrt(H), 1/sqrt(H)), as ``torch.nn.RNNCellBase``."""

    __constants__ = ["input_size", "hidden_size", "bias"]

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(_empty((num_chunks * hidden_size, input_size), device, dtype))
        self.weight_hh = Parameter(_empty((num_chunks * hidden_size, hidden_size), device, dtype))
        if bias:
            self.bias_ih = Parameter(_empty((num_chunks * hidden_size,), device, dtype))
            self.bias_hh = Parameter(_empty((num_chunks * hidden_size,), device, dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        parts = [f"{self.input_size}, {self.hidden_size}"]
        if self.__dict__.get("bias", True) is not True:
            parts.append(f"bias={self.bias}")
        if self.__dict__.get("nonlinearity", "tanh") != "tanh":
            parts.append(f"nonlinearity={self.nonlinearity}")
        return ", ".join(parts)

    def reset_parameters(self) -> None:
        """Every parameter uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)] (0 for an empty hidden state)."""
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _batched(self, name, input, hx, n_states):  # noqa: A002
        """Check dims, add the batch dim of an unbatched input (and hx), default hx to zeros, check sizes (the
        messages of PyTorch's cell checks). ``hx`` is one tensor (n_states == 1) or a pair."""
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        states = None if hx is None else ((hx,) if n_states == 1 else tuple(hx))
        if states is not None:
            for idx, value in enumerate(states):
                if value.dim() not in (1, 2):
                    what = "hidden" if n_states == 1 else f"hx[{idx}]"
                    raise ValueError(f"{name}: Expected {what} to be 1D or 2D, got {value.dim()}D instead")
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)  # noqa: A001
        if states is None:
            zeros = _hp().zeros((input.size(0), self.hidden_size), dtype=input.dtype, device=input.device)
            states = (zeros,) * n_states
        elif not is_batched:
            states = tuple(s.unsqueeze(0) for s in states)
        if input.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} expected {self.input_size}")
        for idx, s in enumerate(states):
            if s.size(0) != input.size(0):
                raise RuntimeError(f"Input batch size {input.size(0)} doesn't match hidden{idx} batch size "
                                   f"{s.size(0)}")
            if s.size(1) != self.hidden_size or s.dim() != 2:
                raise RuntimeError(f"hidden{idx} has inconsistent hidden_size: got {s.size(1)}, expected "
                                   f"{self.hidden_size}")
        return input, states, is_batched


class RNNCell(RNNCellBase):
    """One Elman RNN step, h' = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or relu, as ``torch.nn.RNNCell``.

    ``forward(input, hx=None)``: input (N, H_in) or (H_in,), hx (N, H) or (H,) (zeros when None); returns h'.

    Raises:
        ValueError: input or hx not 1-D or 2-D.
        RuntimeError: an unknown ``nonlinearity`` (at forward, as PyTorch), or sizes that do not match.
    """

    __constants__ = ["input_size", "hidden_size", "bias", "nonlinearity"]

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):  # noqa: A002
        x, (h,), is_batched = self._batched("RNNCell", input, hx, 1)
        if self.nonlinearity == "tanh":
            ret = _rnn.rnn_tanh_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        elif self.nonlinearity == "relu":
            ret = _rnn.rnn_relu_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        else:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        return ret if is_batched else ret.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step, gates i, f, g, o (see [Note: RNN recurrences]), as ``torch.nn.LSTMCell``.

    ``forward(input, hx=None)``: input (N, H_in) or (H_in,), hx = (h, c) each (N, H) or (H,) (zeros when None);
    returns (h', c').

    Raises:
        ValueError: input or hx[i] not 1-D or 2-D.
        RuntimeError: sizes that do not match.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input, hx=None):  # noqa: A002
        x, (h, c), is_batched = self._batched("LSTMCell", input, hx, 2)
        h, c = _rnn.lstm_cell(x, (h, c), self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return (h, c) if is_batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step, gates r, z, n (see [Note: RNN recurrences]), as ``torch.nn.GRUCell``.

    ``forward(input, hx=None)``: input (N, H_in) or (H_in,), hx (N, H) or (H,) (zeros when None); returns h'.

    Raises:
        ValueError: input or hx not 1-D or 2-D.
        RuntimeError: sizes that do not match.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device, dtype=dtype)

    def forward(self, input, hx=None):  # noqa: A002
        x, (h,), is_batched = self._batched("GRUCell", input, hx, 1)
        ret = _rnn.gru_cell(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return ret if is_batched else ret.squeeze(0)
