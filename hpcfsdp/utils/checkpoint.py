"""Activation checkpointing (PyTorch's torch.utils.checkpoint): recompute a forward in backward instead of storing it."""
import warnings

from .. import _autocast, _backend
from .._tensor import Tensor
from ..autograd import engine
from ..autograd.function import Function
from ..autograd.grad_mode import enable_grad, is_grad_enabled

__all__ = ["checkpoint"]

# What a module hook can ask (fully_shard's): is this forward checkpointed, and will it be recomputed (the
# first number), or is it the recomputation in backward (the second)? See [Note: Recompute under FSDP] in
# distributed/fsdp/_fully_shard/_fsdp_state.py. Depths, so that nested checkpoints count once each.
_DEPTH = {"checkpointed_forward": 0, "recompute": 0}


def in_checkpointed_forward() -> bool:
    """True inside the first run of a checkpointed function whose recomputation backward will run."""
    return _DEPTH["checkpointed_forward"] > 0 and _DEPTH["recompute"] == 0


def in_recompute() -> bool:
    """True while backward recomputes a checkpointed function."""
    return _DEPTH["recompute"] > 0


class _Depth:
    def __init__(self, key, on=True):
        self.key, self.on = key, on

    def __enter__(self):
        if self.on:
            _DEPTH[self.key] += 1

    def __exit__(self, *exc):
        if self.on:
            _DEPTH[self.key] -= 1

# [Note: Activation checkpointing]
# `checkpoint(fn, *args)` runs `fn` under no_grad: none of its intermediate activations are kept, only
# its inputs. The result carries one graph node (_CheckpointFunction) whose backward re-runs `fn` with
# grad enabled on detached copies of the inputs and backpropagates the incoming gradients through that
# fresh graph with a nested `autograd.backward` (the engine supports re-entry; end-of-backward
# callbacks still run once, after the outermost backward). Leaves that `fn` closes over (a module's
# parameters) accumulate their gradients during that nested pass; gradients of the inputs go back to
# the outer graph. Modules hooked by fully_shard see an ordinary forward during recomputation: their
# pre-forward hook unshards again if they were resharded after forward, and their post-backward
# reduce-scatter runs as the nested backward leaves them.
#
# Non-reentrant semantics (use_reentrant=False, the default): gradients reach the parameters even when
# no input requires grad, and keyword arguments are passed to `fn`. An extra empty leaf that requires
# grad is added to the node's inputs so that it is always recorded when grad mode is on; its one cost
# is that the output reports requires_grad=True even if nothing inside `fn` needs a gradient (PyTorch
# can tell; here that would need a forward with grad). use_reentrant=True is the old variant: no
# keyword arguments, and no gradient at all when no input requires grad (with PyTorch's warning).
#
# Random numbers: with preserve_rng_state=True the CPU generator's state (NumPy bit-generator state) is
# saved before the forward and restored for the recomputation, then put back where it was, so dropout
# draws the same masks twice and the stream seen by later code is the one without checkpointing. CuPy's
# RandomState has no state to read, so for CUDA tensors the forward and the recomputation each run on
# a fresh RandomState seeded with one number drawn from the device's generator: both see the same
# stream (identical masks), which differs from the stream without checkpointing.


def _flatten(obj, out):
    if isinstance(obj, Tensor):
        out.append(obj)
        return ("T",)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return ("tuple", [_flatten(x, out) for x in obj])
    if isinstance(obj, list):
        return ("list", [_flatten(x, out) for x in obj])
    if isinstance(obj, dict):
        return ("dict", [(k, _flatten(v, out)) for k, v in obj.items()])
    return ("leaf", obj)


def _unflatten(spec, it):
    kind = spec[0]
    if kind == "T":
        return next(it)
    if kind == "tuple":
        return tuple(_unflatten(s, it) for s in spec[1])
    if kind == "list":
        return [_unflatten(s, it) for s in spec[1]]
    if kind == "dict":
        return {k: _unflatten(s, it) for k, s in spec[1]}
    return spec[1]


class _RngState:
    """The generators the forward may draw from: the CPU one, plus each CUDA device among the tensors."""

    def __init__(self, tensors):
        self.cpu = _backend.generator().bit_generator.state
        self.cuda = {}
        for t in tensors:
            d = _backend.device_of_array(t._data)
            if d.type == "cuda" and d.index not in self.cuda:
                self.cuda[d.index] = int(_backend.generator(d).randint(0, 2 ** 31 - 1))

    def run(self, fn, recompute):
        """Run ``fn()``: the first time from the current CPU state, on recompute from the saved one (and
        put the current one back afterwards); on CUDA devices from the saved seeds both times."""
        gen = _backend.generator()
        now = gen.bit_generator.state
        if recompute:
            gen.bit_generator.state = self.cpu
        swapped = []
        try:
            if self.cuda:
                cp = _backend._need_cupy()
                for idx, seed in self.cuda.items():
                    with cp.cuda.Device(idx):
                        swapped.append((idx, cp.random.get_random_state()))
                        cp.random.set_random_state(cp.random.RandomState(seed))
            return fn()
        finally:
            if recompute:
                gen.bit_generator.state = now
            if swapped:
                cp = _backend._need_cupy()
                for idx, rs in swapped:
                    with cp.cuda.Device(idx):
                        cp.random.set_random_state(rs)


class _CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, run, preserve_rng_state, determinism_check, box, n_args, *inputs):
        ctx.set_materialize_grads(False)
        ctx.run = run
        ctx.determinism_check = determinism_check
        args = inputs[:n_args]
        ctx.is_tensor = [isinstance(a, Tensor) for a in args]
        ctx.save_for_backward(*[a for a in args if isinstance(a, Tensor)])
        ctx.non_tensors = [None if isinstance(a, Tensor) else a for a in args]
        ctx.rng = _RngState([a for a in args if isinstance(a, Tensor)]) if preserve_rng_state else None
        # the recompute runs in the autocast state of this forward, as PyTorch's (backward runs outside it)
        ctx.autocast = {dev: (_autocast.is_enabled(dev), _autocast.get_dtype(dev)) for dev in _autocast.DEFAULT_DTYPES}
        with _Depth("checkpointed_forward", box["recompute"]):
            if ctx.rng is not None:
                out = ctx.rng.run(lambda: run(*args), recompute=False)
            else:
                out = run(*args)
        flat = []
        box["spec"] = _flatten(out, flat)
        ctx.meta = [(tuple(t.shape), t.dtype) for t in flat]
        return tuple(flat)

    @staticmethod
    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        args = []
        for is_t, nt in zip(ctx.is_tensor, ctx.non_tensors):
            if is_t:
                a = next(saved)
                d = a.detach()
                d.requires_grad_(a.requires_grad)
                args.append(d)
            else:
                args.append(nt)
        prev = {dev: _autocast.set_state(dev, *state) for dev, state in ctx.autocast.items()}
        try:
            with enable_grad(), _Depth("recompute"):
                if ctx.rng is not None:
                    out = ctx.rng.run(lambda: ctx.run(*args), recompute=True)
                else:
                    out = ctx.run(*args)
        finally:
            for dev, state in prev.items():
                _autocast.set_state(dev, *state)
        flat = []
        _flatten(out, flat)
        if ctx.determinism_check == "default":
            meta = [(tuple(t.shape), t.dtype) for t in flat]
            if meta != ctx.meta:
                raise RuntimeError(f"checkpoint: the recomputed forward returned tensors {meta}, but the original "
                                   f"forward returned {ctx.meta}; the checkpointed function must be deterministic "
                                   f"in its output shapes and dtypes")
        outs, gs = [], []
        for t, g in zip(flat, grads):
            if g is not None and t.requires_grad:
                outs.append(t)
                gs.append(g)
        if outs:
            engine.backward(outs, gs)
        in_grads = [a.grad if isinstance(a, Tensor) and a.requires_grad else None for a in args]
        n_extra = len(ctx.next_functions) - 5 - len(args)  # the non-reentrant variant's empty leaf
        return (None, None, None, None, None, *in_grads) + (None,) * n_extra


def checkpoint(function, *args, use_reentrant=None, context_fn=None, determinism_check="default", debug=False,
               preserve_rng_state=True, **kwargs):
    """Run ``function(*args, **kwargs)`` without keeping its activations; recompute them in backward.

    As ``torch.utils.checkpoint.checkpoint``: returns what ``function`` returns (Tensors in tuples, lists
    and dicts are supported). ``use_reentrant`` defaults to False here (PyTorch asks for it explicitly).
    See [Note: Activation checkpointing].
    """
    if use_reentrant is None:
        use_reentrant = False
    if context_fn is not None:
        raise NotImplementedError("checkpoint(): context_fn is not supported by hpcfsdp")
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check!r}")
    if debug:
        raise NotImplementedError("checkpoint(): debug=True is not supported by hpcfsdp")
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        if is_grad_enabled() and not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None", stacklevel=2)
        run = function
        extra = ()
    else:
        def run(*a):
            return function(*a, **kwargs)

        extra = ()
        if is_grad_enabled():
            import hpcfsdp

            dev = next((a.device for a in args if isinstance(a, Tensor)), None)
            extra = (hpcfsdp.empty(0, device=dev, requires_grad=True),)
    # forward records the structure of the output here; it is rebuilt around the flat tensors. "recompute":
    # whether backward will run this function again (the output is part of a graph)
    box = {"recompute": is_grad_enabled() and (bool(extra) or any(isinstance(a, Tensor) and a.requires_grad
                                                                  for a in args))}
    flat = _CheckpointFunction.apply(run, bool(preserve_rng_state), determinism_check, box, len(args), *args, *extra)
    if not isinstance(flat, tuple):
        flat = (flat,)
    return _unflatten(box["spec"], iter(flat))

