"""The recurrences behind nn.RNN / LSTM / GRU and their cells (PyTorch's ``_VF.rnn_tanh``, ``lstm``, ``gru``,
``*_cell``), composed of differentiable Tensor ops: no Function of their own, so autograd, CuPy and autocast work
as they do for linear, sigmoid and tanh.

[Note: RNN recurrences]
Gate order and formulas are PyTorch's (W_* row blocks of ``weight_ih`` / ``weight_hh`` in this order):

    RNN   h' = act(W_ih x + b_ih + W_hh h + b_hh)                      act = tanh | relu
    LSTM  i, f, g, o = chunks of (W_ih x + b_ih + W_hh h + b_hh)
          c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')   (then h' = W_hr h' with proj)
    GRU   r, z, n blocks;  r = sigmoid(x_r + h_r);  z = sigmoid(x_z + h_z)
          n = tanh(x_n + r * (W_hn h + b_hn));  h' = (1 - z) * n + z * h

A layer projects its input for every timestep in one linear (W_ih x + b_ih over (L, N, H_in), or over the packed
data), then loops over the timesteps in Python for the recurrent part. A packed batch (``batch_sizes``, sorted by
decreasing length) runs the first ``batch_sizes[t]`` rows at step t: forward, a row that stops is set aside as its
final state; in reverse, a sequence joins (from its own h_0) at its own last step. Dropout applies to the output of
every layer but the last, in training only.

Autocast: PyTorch runs ``lstm_cell``, ``gru_cell``, ``rnn_*_cell`` and the cuDNN modules in float16 under CUDA
autocast (every argument cast), and on CPU the oneDNN LSTM (padded, no projection) in bfloat16; the other CPU cases come out of the
lower-precision linears and type promotion, as here (RNN bfloat16, GRU and the cells LSTMCell/GRUCell float32).
"""
from ..._autocast import LOWER, autocast_op
from ..._tensor_methods.shape import cat, stack
import hpcfsdp.nn.functional as F

__all__ = ["rnn_tanh_cell", "rnn_relu_cell", "lstm_cell", "gru_cell", "rnn_tanh", "rnn_relu", "lstm", "gru"]


# -- one timestep, the input part (W_ih x + b_ih) already computed --------------------------------------------------

def _step_rnn(act, xi, h, w_hh, b_hh, w_hr=None):
    return act(xi + F.linear(h, w_hh, b_hh))  # (N, H)


def _step_lstm(xi, state, w_hh, b_hh, w_hr=None):
    h, c = state
    i, f, g, o = (xi + F.linear(h, w_hh, b_hh)).chunk(4, -1)  # 4 x (N, H)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()  # (N, H)
    h = o.sigmoid() * c.tanh()  # (N, H)
    if w_hr is not None:
        h = F.linear(h, w_hr)  # (N, P)
    return h, c


def _step_gru(xi, h, w_hh, b_hh, w_hr=None):
    x_r, x_z, x_n = xi.chunk(3, -1)  # 3 x (N, H)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, -1)  # 3 x (N, H)
    r = (x_r + h_r).sigmoid()
    z = (x_z + h_z).sigmoid()
    n = (x_n + r * h_n).tanh()
    return (1 - z) * n + z * h  # (N, H)


_STEPS = {
    "RNN_TANH": lambda xi, h, w_hh, b_hh, w_hr=None: _step_rnn(F.tanh, xi, h, w_hh, b_hh),
    "RNN_RELU": lambda xi, h, w_hh, b_hh, w_hr=None: _step_rnn(F.relu, xi, h, w_hh, b_hh),
    "LSTM": _step_lstm,
    "GRU": _step_gru,
}


# -- cells (batched: input (N, H_in), hidden (N, H); the modules check shapes) --------------------------------------

@autocast_op(cuda=LOWER)
def rnn_tanh_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002
    """h' = tanh(W_ih x + b_ih + W_hh h + b_hh) for (N, H_in) ``input`` and (N, H) ``hx``."""
    return _step_rnn(F.tanh, F.linear(input, w_ih, b_ih), hx, w_hh, b_hh)


@autocast_op(cuda=LOWER)
def rnn_relu_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002
    """h' = relu(W_ih x + b_ih + W_hh h + b_hh) for (N, H_in) ``input`` and (N, H) ``hx``."""
    return _step_rnn(F.relu, F.linear(input, w_ih, b_ih), hx, w_hh, b_hh)


@autocast_op(cuda=LOWER)
def lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002
    """(h', c') of one LSTM step for (N, H_in) ``input`` and ``hx`` = (h, c), each (N, H). See [Note: RNN
    recurrences]."""
    return _step_lstm(F.linear(input, w_ih, b_ih), tuple(hx), w_hh, b_hh)


@autocast_op(cuda=LOWER)
def gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):  # noqa: A002
    """h' of one GRU step for (N, H_in) ``input`` and (N, H) ``hx``. See [Note: RNN recurrences]."""
    return _step_gru(F.linear(input, w_ih, b_ih), hx, w_hh, b_hh)


# -- one layer, one direction ---------------------------------------------------------------------------------------

def _split(state, lstm, lo, hi):
    return (state[0][lo:hi], state[1][lo:hi]) if lstm else state[lo:hi]


def _scan(step, xi, state, weights, reverse):
    """Run the steps of padded ``xi`` (L, N, G) from ``state``; returns the (L, N, H_out) output and the state."""
    steps = range(xi.shape[0] - 1, -1, -1) if reverse else range(xi.shape[0])
    outs = [None] * xi.shape[0]
    for t in steps:
        state = step(xi[t], state, *weights)
        outs[t] = state[0] if isinstance(state, tuple) else state
    return stack(outs, 0), state


def _scan_packed(step, xi, state, weights, reverse, batch_sizes):
    """Run the steps of packed ``xi`` (sum(batch_sizes), G) from ``state`` (batch_sizes[0] rows); returns the packed
    output and each sequence's state after its own last step (forward) or its first step (reverse)."""
    lstm = isinstance(state, tuple)
    starts = [0]
    for b in batch_sizes[:-1]:
        starts.append(starts[-1] + b)
    outs = [None] * len(batch_sizes)
    if not reverse:
        done, last = [], batch_sizes[0]
        for t, b in enumerate(batch_sizes):
            if b < last:  # rows b..last-1 ended at step t-1: their final state is set aside
                done.append(_split(state, lstm, b, last))
                state = _split(state, lstm, 0, b)
            last = b
            state = step(xi[starts[t]:starts[t] + b], state, *weights)
            outs[t] = state[0] if lstm else state
        done.append(state)
        done.reverse()  # longest sequences (the first rows) first
        state = (cat([d[0] for d in done]), cat([d[1] for d in done])) if lstm else cat(done)
    else:
        init, last = state, batch_sizes[-1]
        state = _split(init, lstm, 0, last)
        for t in range(len(batch_sizes) - 1, -1, -1):
            b = batch_sizes[t]
            if b > last:  # rows last..b-1 start here, at their own last step, from their h_0
                new = _split(init, lstm, last, b)
                state = (cat([state[0], new[0]]), cat([state[1], new[1]])) if lstm else cat([state, new])
            last = b
            state = step(xi[starts[t]:starts[t] + b], state, *weights)
            outs[t] = state[0] if lstm else state
    return cat(outs, 0), state


def _run(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,  # noqa: A002
         batch_sizes=None):
    """The whole multi-layer (bi)directional recurrence. ``hx``: (D * num_layers, N, H_out) (LSTM: (h_0, c_0));
    ``params``: the flat weights in PyTorch's order (``_flat_weights``). Returns (output, h_n) or (output, h_n, c_n).
    ``batch_sizes`` (a list of ints) marks ``input`` as packed data."""
    lstm = mode == "LSTM"
    step = _STEPS[mode]
    num_dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * num_dirs)
    has_proj = per == (5 if has_biases else 3)
    h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
    x = input.transpose(0, 1) if batch_first and batch_sizes is None else input  # (L, N, H_in) or packed
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(num_dirs):
            k = layer * num_dirs + d
            w = params[k * per:(k + 1) * per]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            rest = (w[1], b_hh, w[-1] if has_proj else None)  # w_hh, b_hh, w_hr
            xi = F.linear(x, w[0], b_ih)  # (L, N, G) or (sum(batch_sizes), G): every timestep in one matmul
            state = (h0[k], c0[k]) if lstm else h0[k]
            if batch_sizes is None:
                out, state = _scan(step, xi, state, rest, reverse=d == 1)
            else:
                out, state = _scan_packed(step, xi, state, rest, d == 1, batch_sizes)
            outs.append(out)
            h_n.append(state[0] if lstm else state)
            if lstm:
                c_n.append(state[1])
        x = outs[0] if num_dirs == 1 else cat(outs, -1)  # (L, N, D * H_out)
        if dropout and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, True)
    if batch_first and batch_sizes is None:
        x = x.transpose(0, 1)
    return (x, stack(h_n, 0), stack(c_n, 0)) if lstm else (x, stack(h_n, 0))


@autocast_op(cuda=LOWER)
def rnn_tanh(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,  # noqa: A002
             batch_sizes=None):
    """Elman RNN (tanh) over a sequence: (output, h_n). See ``_run``."""
    return _run("RNN_TANH", input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                batch_sizes)


@autocast_op(cuda=LOWER)
def rnn_relu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,  # noqa: A002
             batch_sizes=None):
    """Elman RNN (relu) over a sequence: (output, h_n). See ``_run``."""
    return _run("RNN_RELU", input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                batch_sizes)


@autocast_op(cuda=LOWER)
def lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,  # noqa: A002
         batch_sizes=None):
    """LSTM over a sequence: (output, h_n, c_n); ``hx`` = (h_0, c_0). See ``_run``."""
    has_proj = len(params) // (num_layers * (2 if bidirectional else 1)) == (5 if has_biases else 3)
    run = _run if batch_sizes is not None or has_proj else _lstm_onednn
    return run("LSTM", input, tuple(hx), params, has_biases, num_layers, dropout, train, bidirectional,
               batch_first, batch_sizes)


@autocast_op(cpu=LOWER)
def _lstm_onednn(*args):
    """The padded LSTM without projection, which PyTorch runs on oneDNN in bfloat16 under CPU autocast (packed or
    projected LSTMs run its default implementation: lower-precision linears only)."""
    return _run(*args)


@autocast_op(cuda=LOWER)
def gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,  # noqa: A002
        batch_sizes=None):
    """GRU over a sequence: (output, h_n). See ``_run``."""
    return _run("GRU", input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                batch_sizes)
