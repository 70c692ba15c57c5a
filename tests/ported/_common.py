"""Helpers of the ported PyTorch FSDP2 tests (our own, after torch/testing/_internal/common_fsdp.py's roles).

Written only against the names ``_framework`` exports, so they run on hpcfsdp and on PyTorch alike. Data
comes from NumPy generators (identical on every rank and in both frameworks); a reference is an unsharded
replica trained on the global batch in the same process, or a "DDP by hand" replica whose gradients are
all-reduced and averaged explicitly.
"""
import math

import numpy as np

from _framework import DTensor, F, dist, nn, torch

# ---------------------------------------------------------------------------------------------- world / data


def world():
    """(world size, rank) of the default group."""
    return dist.get_world_size(), dist.get_rank()


def randn(*shape, seed=0, dtype=None):
    """A float32 (or ``dtype``) tensor from a NumPy generator: the same on every rank and framework."""
    t = torch.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
    return t if dtype is None else t.to(dtype)


def randint(high, *shape, seed=0):
    return torch.tensor(np.random.default_rng(seed).integers(0, high, shape).astype(np.int64))


def local(t):
    """This rank's slice (dim 0) of a global batch."""
    w, r = world()
    n = t.shape[0] // w
    return t[r * n:(r + 1) * n]


def to_np(t):
    """Float64 NumPy copy of a tensor; a DTensor is gathered first (collective)."""
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().to(torch.float64).cpu().numpy()


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=""):
    a = actual if isinstance(actual, (float, int, np.ndarray)) else to_np(actual)
    e = expected if isinstance(expected, (float, int, np.ndarray)) else to_np(expected)
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=msg)


def global_sum(loss) -> float:
    """Sum over ranks of a per-rank scalar (the global-batch loss of a `.sum()` loss)."""
    t = loss.detach().to(torch.float64).reshape(1).clone()
    dist.all_reduce(t)  # SUM: gloo has no AVG
    return float(t.item())


def allreduce_avg_grads(module) -> None:
    """DDP by hand: average every gradient over the ranks."""
    w, _ = world()
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(w)


def broadcast_params(module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            dist.broadcast(p.data, src=0)


def ref_loss_backward(ref, global_inp, *, loss_fn=None):
    """Reference step on the global batch: returns the global `.sum()` loss; the backward runs on loss / world,
    which is what FSDP's averaged gradients of the per-rank `.sum()` losses equal."""
    w, _ = world()
    loss = (loss_fn or (lambda m, x: m(x).sum()))(ref, global_inp)
    (loss / w).backward()
    return loss


def check_sharded_parity(ref, model, rtol=1e-4, atol=1e-5, prefixes_to_ignore=(), check_grads=True, reshard=False):
    """Each sharded parameter (and gradient) of ``model``, gathered, equals ``ref``'s unsharded one.
    ``reshard``: first reshard every FSDP module (a root with reshard_after_forward=False whose backward
    never ran keeps its parameters unsharded)."""
    if reshard:
        from _framework import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
    ref_params = dict(ref.named_parameters())
    names = []
    for name, p in model.named_parameters():
        clean = name
        for prefix in prefixes_to_ignore:
            clean = clean.replace(prefix, "")
        names.append(clean)
        rp = ref_params[clean]
        assert isinstance(p, DTensor), f"{name} is not sharded: {type(p)}"
        assert tuple(p.shape) == tuple(rp.shape), name
        assert_close(p, rp, rtol=rtol, atol=atol, msg=f"param {name}")
        if not check_grads:
            continue
        if rp.grad is None:
            assert p.grad is None, f"{name}: reference has no gradient, the sharded one has"
        else:
            assert p.grad is not None, f"{name}: the sharded parameter has no gradient"
            assert isinstance(p.grad, DTensor), f"{name}.grad is not a DTensor"
            assert_close(p.grad, rp.grad, rtol=rtol, atol=atol, msg=f"grad {name}")
    assert sorted(names) == sorted(ref_params), (names, list(ref_params))


def copy_model(model):
    import copy

    return copy.deepcopy(model)


# ---------------------------------------------------------------------------------------------- models


class MLP(nn.Module):
    """in_proj -> relu -> out_proj (+ an optional buffer added to the input), as common_fsdp.MLP."""

    def __init__(self, dim, dim_multiplier=4, bias=True, with_buffer=False, device=None):
        super().__init__()
        self.in_proj = nn.Linear(dim, dim * dim_multiplier, bias=bias, device=device)
        self.out_proj = nn.Linear(dim * dim_multiplier, dim, bias=bias, device=device)
        if with_buffer:
            self.register_buffer("buffer", torch.randn((dim,), device=device), persistent=True)
        else:
            self.buffer = None

    def forward(self, x):
        z = self.in_proj(x)  # (B, dim*m)
        z = F.relu(z)
        z = self.out_proj(z)  # (B, dim)
        if self.buffer is not None:
            z = z + self.buffer
        return z

    def reset_parameters(self):
        if self.buffer is not None:
            torch.nn.init.normal_(self.buffer)


class DoubleLinear(nn.Module):
    """Two linears; returns both outputs (or only the first's twice), as common_fsdp.DoubleLinear."""

    def __init__(self, dim, use_second_linear=True):
        super().__init__()
        self.lin1 = nn.Linear(dim, dim)
        self.lin2 = nn.Linear(dim, dim)
        self.relu = nn.ReLU()
        self.use_second_linear = use_second_linear

    def forward(self, x):
        if self.use_second_linear:
            return self.relu(self.lin1(x)), self.relu(self.lin2(x))
        return self.relu(self.lin1(x))


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_heads
        q = self.wq(x).view(B, T, self.n_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.wk(x).view(B, T, self.n_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.wv(x).view(B, T, self.n_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        mask = torch.tensor(np.triu(np.ones((T, T), dtype=bool), k=1))
        att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim, 4 * dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))  # (B, T, C)
        return h + self.feed_forward(self.ffn_norm(h))  # (B, T, C)


class Transformer(nn.Module):
    """A tiny GPT-like model (the role of common_dtensor.Transformer): token + position embeddings, blocks,
    final norm, output projection optionally tied to the token embedding; blocks optionally checkpointed."""

    def __init__(self, vocab_size=17, dim=8, n_layers=2, n_heads=2, max_seq_len=8, weight_tying=False,
                 checkpoint_activations=False):
        super().__init__()
        self.vocab_size = vocab_size
        self.checkpoint_activations = checkpoint_activations
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.pos_embeddings = nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList([TransformerBlock(dim, n_heads) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        if weight_tying:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        from _framework import checkpoint

        B, T = tokens.shape
        pos = torch.arange(0, T, dtype=torch.int64)  # (T,)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(pos)  # (B, T, C)
        for layer in self.layers:
            if self.checkpoint_activations:
                h = checkpoint(layer, h, use_reentrant=False)
            else:
                h = layer(h)
        return self.output(self.norm(h))  # (B, T, vocab)


def train_parity(ref, model, make_global_inp, iters=3, lr=1e-2, rtol=1e-4, atol=1e-5, check_every_iter=True,
                 loss_fn=None, prefixes_to_ignore=()):
    """Train ``model`` (sharded) on each rank's slice and ``ref`` on the global batch with Adam; assert equal
    global losses every iteration and sharded parity (parameters and gradients). Returns the losses."""
    optim = torch.optim.Adam(model.parameters(), lr=lr)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=lr)
    loss_fn = loss_fn or (lambda m, x: m(x).sum())
    losses = []
    for it in range(iters):
        global_inp = make_global_inp(it)
        for o in (optim, ref_optim):
            o.zero_grad(set_to_none=(it % 2 == 0))
        loss = loss_fn(model, local(global_inp))
        loss.backward()
        ref_loss = ref_loss_backward(ref, global_inp, loss_fn=loss_fn)
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=rtol, atol=atol, msg=f"loss at iter {it}")
        if check_every_iter:
            check_sharded_parity(ref, model, rtol=rtol, atol=atol, prefixes_to_ignore=prefixes_to_ignore)
        optim.step()
        ref_optim.step()
        losses.append(float(ref_loss.item()))
    check_sharded_parity(ref, model, rtol=rtol, atol=atol, prefixes_to_ignore=prefixes_to_ignore,
                         check_grads=False)
    return losses


class CheckpointedSequential(nn.Sequential):
    """A Sequential whose children run under activation checkpointing (the composable ``checkpoint(mlp)``
    of PyTorch's tests, expressed with torch.utils.checkpoint)."""

    def forward(self, x):
        from _framework import checkpoint

        for m in self:
            x = checkpoint(m, x, use_reentrant=False)
        return x


def freeze(module, keep=lambda name: "bias" in name):
    """requires_grad_(False) on every parameter whose name ``keep`` rejects (BitFit: train biases only)."""
    for name, p in module.named_parameters():
        if not keep(name):
            p.requires_grad_(False)


# ---------------------------------------------------------------------------------------------- FSDP1 helpers
# The FSDP1 port (tests/ported/test_fsdp1_*.py). PyTorch's FullyShardedDataParallel holds the module as its
# child ``_fsdp_wrapped_module`` and puts that component into parameter names (outside summon_full_params) and
# auto-wrapped children are FSDP instances; hpcfsdp keeps the unwrapped names and makes auto-wrapped children
# fully_shard units (FSDPModule). These helpers compare in the form both share.

FSDP1_WRAPPED = "_fsdp_wrapped_module."


def fsdp1_clean(name: str) -> str:
    """A parameter / state-dict name without FSDP1's wrapper components."""
    return name.replace(FSDP1_WRAPPED, "").replace("_checkpoint_wrapped_module.", "")


def fsdp1_cpu():
    """What every ported FSDP1 test passes as ``device_id``."""
    return torch.device("cpu")


def fsdp1_is_unit(module) -> bool:
    """Whether ``module`` is an FSDP1 unit: a FullyShardedDataParallel instance (PyTorch: also every auto-wrapped
    child), or for hpcfsdp an auto-wrapped child, which is a fully_shard unit."""
    from _framework import IS_TORCH, FSDPModule, FullyShardedDataParallel

    if IS_TORCH:
        return isinstance(module, FullyShardedDataParallel)
    return isinstance(module, (FullyShardedDataParallel, FSDPModule))


def fsdp1_units(model) -> list:
    """The FSDP1 units in ``model`` (a hand-made wrapper and the module it shards count once)."""
    from _framework import IS_TORCH, FSDPModule, FullyShardedDataParallel

    kind = FullyShardedDataParallel if IS_TORCH else FSDPModule
    return [m for m in model.modules() if isinstance(m, kind)]


def fsdp1_inner(module):
    """The module an FSDP1 unit computes with (PyTorch: the wrapper's ``.module``; hpcfsdp: the unit itself
    for an auto-wrapped child)."""
    from _framework import FullyShardedDataParallel

    return module.module if isinstance(module, FullyShardedDataParallel) else module


def fsdp1_full_params(model) -> dict:
    """{clean name: float64 NumPy array} of ``model``'s full parameters (summon_full_params; collective)."""
    from _framework import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(model, writeback=False):
        return {fsdp1_clean(n): to_np(p) for n, p in model.named_parameters()}


def fsdp1_check_params(ref, model, rtol=1e-4, atol=1e-5):
    """``model``'s full parameters equal ``ref``'s, name by name."""
    full = fsdp1_full_params(model)
    ref_params = {n: to_np(p) for n, p in ref.named_parameters()}
    assert sorted(full) == sorted(ref_params), (sorted(full), sorted(ref_params))
    for name, value in ref_params.items():
        assert_close(full[name], value, rtol=rtol, atol=atol, msg=f"param {name}")
    return full


def fsdp1_train_parity(ref, model, make_global_inp, iters=3, lr=1e-2, rtol=1e-4, atol=1e-5, loss_fn=None,
                       optim_cls=None, clip=None):
    """FSDP1 ``model`` on each rank's slice, ``ref`` on the global batch (Adam, or ``optim_cls``): equal global
    losses every iteration and equal full parameters at the end. ``clip``: max norm for
    ``model.clip_grad_norm_`` against ``clip_grad_norm_`` of the reference (the total norms compared too)."""
    from _framework import clip_grad_norm_

    optim_cls = optim_cls or torch.optim.Adam
    optim = optim_cls(model.parameters(), lr=lr)
    ref_optim = optim_cls(ref.parameters(), lr=lr)
    loss_fn = loss_fn or (lambda m, x: m(x).sum())
    losses = []
    for it in range(iters):
        global_inp = make_global_inp(it)
        loss = loss_fn(model, local(global_inp))
        loss.backward()
        ref_loss = ref_loss_backward(ref, global_inp, loss_fn=loss_fn)
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=rtol, atol=atol, msg=f"loss at iter {it}")
        if clip is not None:
            norm = model.clip_grad_norm_(clip)
            ref_norm = clip_grad_norm_(list(ref.parameters()), clip)
            assert_close(norm, ref_norm, rtol=rtol, atol=atol, msg=f"total norm at iter {it}")
        optim.step()
        ref_optim.step()
        optim.zero_grad()
        ref_optim.zero_grad()
        losses.append(float(ref_loss.item()))
    fsdp1_check_params(ref, model, rtol=rtol, atol=atol)
    return losses


# ---------------------------------------------------------------------------------------------- collectives
# torch.distributed's functions FSDP1 calls (on CPU PyTorch 2.13 gathers through ``all_gather`` into a list of
# chunks and reduces through ``reduce_scatter_single``), by the kind hpcfsdp's process group counts
_COLLECTIVE_KINDS = {"all_gather": "all_gather", "all_gather_single": "all_gather",
                     "all_gather_into_tensor": "all_gather", "reduce_scatter_single": "reduce_scatter",
                     "reduce_scatter_tensor": "reduce_scatter", "all_reduce": "all_reduce"}


class CollectiveLog(list):
    """(kind, dtype name) of every all-gather / reduce-scatter / all-reduce this process issued, in order."""

    def num(self, kind) -> int:
        return sum(1 for k, _ in self if k == kind)

    def dtypes(self, kind) -> set:
        return {d for k, d in self if k == kind}


def record_collectives():
    """Context manager yielding a CollectiveLog of the all-gathers, reduce-scatters and all-reduces issued inside
    it (PyTorch's tests patch ``dist.all_gather_into_tensor`` / ``reduce_scatter_tensor`` / ``all_reduce``, which
    FSDP1 calls; on PyTorch this wraps those and the variants 2.13 calls on CPU, on hpcfsdp it reads the process group's bookkeeping of each
    collective, the one ``collective_counts()`` reports). Only the ``dist`` calls of the code under test should
    run inside it."""
    import contextlib

    from _framework import IS_TORCH

    @contextlib.contextmanager
    def _torch():
        import torch.distributed as tdist

        log, saved = CollectiveLog(), {}

        def wrap(name, orig):
            def counted(tensor, *args, **kwargs):
                src = args[0] if name != "all_reduce" and args else tensor
                log.append((_COLLECTIVE_KINDS[name], str(src.dtype).replace("torch.", "")))
                return orig(tensor, *args, **kwargs)
            return counted

        for name in _COLLECTIVE_KINDS:
            if not hasattr(tdist, name):
                continue
            saved[name] = getattr(tdist, name)
            setattr(tdist, name, wrap(name, saved[name]))
        try:
            yield log
        finally:
            for name, orig in saved.items():
                setattr(tdist, name, orig)

    @contextlib.contextmanager
    def _hpcfsdp():
        import numpy as _np

        from hpcfsdp.distributed import process_group as pgmod

        log, orig = CollectiveLog(), pgmod.ProcessGroup._note

        def note(self, kind, nbytes, count=-1, dtype=None, *args, **kwargs):
            if kind in ("all_gather", "reduce_scatter", "all_reduce") and kwargs.get("counted", True):
                log.append((kind, str(_np.dtype(dtype)) if dtype is not None else None))
            return orig(self, kind, nbytes, count, dtype, *args, **kwargs)

        pgmod.ProcessGroup._note = note
        try:
            yield log
        finally:
            pgmod.ProcessGroup._note = orig

    return _torch() if IS_TORCH else _hpcfsdp()
