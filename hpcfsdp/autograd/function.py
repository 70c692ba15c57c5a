"""Graph nodes: the Function base (PyTorch's torch.autograd.Function API), raw-array ops, AccumulateGrad."""
import itertools

import numpy as np

from .. import _backend, _tensor  # a module object: See [Note: Tensor and Function] in _tensor.py
from .._array import sum_to
from .._tensor_base import TensorBase
from ..utils.hooks import RemovableHandle
from .grad_mode import is_grad_enabled, no_grad

__all__ = ["Function", "FunctionCtx", "Node", "AccumulateGrad", "RemovableHandle", "once_differentiable"]

_seq = itertools.count()
_FREED_MSG = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they "
    "have already been freed). Saved intermediate values of the graph are freed when you call .backward(). "
    "Specify retain_graph=True if you need to backward through the graph a second time or if you need to "
    "access saved tensors after calling backward.")


class _HookDict(dict):
    """A dict that supports weak references (for RemovableHandle)."""

    __slots__ = ("__weakref__",)


def _run_tensor_hooks(hooks, g):
    """Run tensor hooks on gradient array g in order; each may return a replacement gradient Tensor."""
    for fn in list(hooks.values()):
        r = fn(_tensor.Tensor._wrap(g))
        if r is not None:
            if not isinstance(r, TensorBase):
                raise TypeError(f"a tensor hook must return a Tensor or None, got {type(r).__name__}")
            if r.shape != g.shape:
                raise RuntimeError(f"hook changed the gradient shape from {tuple(g.shape)} to {tuple(r.shape)}")
            g = r._data
    return g


# [Note: Graph nodes]
# A node is the context object of one op application. `next_functions[i]` is (node, output_nr) of the
# i-th input (None for inputs that need no gradient); `_n_outputs` counts its outputs. Op-specific saved
# values live in the instance `__dict__` (ctx.x = ...); `_release()` clears that dict after backward
# unless retain_graph, so saved arrays die as soon as the node has run. Tensor hooks registered on a
# non-leaf output live on its grad_fn (`_tensor_hooks[output_nr]`), as in PyTorch.
class Node:
    __slots__ = ("next_functions", "needs_input_grad", "_seq", "_n_outputs", "_out_meta", "_tensor_hooks",
                 "_retain", "_freed", "_saved", "_non_diff", "_materialize", "__dict__", "__weakref__")

    def _init_node(self):
        self.next_functions = ()
        self.needs_input_grad = ()
        self._seq = next(_seq)
        self._n_outputs = 1
        self._out_meta = None
        self._tensor_hooks = None
        self._retain = None
        self._freed = False
        self._saved = None
        self._non_diff = None
        self._materialize = True

    def name(self):
        return type(self).__name__

    def __repr__(self):
        return f"<{self.name()} object>"

    def _release(self):
        self.__dict__.clear()
        self._saved = None
        self._freed = True

    def register_hook(self, fn):
        raise RuntimeError("Node.register_hook is not supported; use Tensor.register_hook")


class FunctionCtx(Node):
    """The ``ctx`` of a Function: save_for_backward, saved_tensors, needs_input_grad, mark_* helpers."""

    __slots__ = ()

    def __init__(self):
        self._init_node()

    def save_for_backward(self, *tensors):
        for t in tensors:
            if t is not None and not isinstance(t, TensorBase):
                raise TypeError(f"save_for_backward takes Tensors or None, got {type(t).__name__}")
        self._saved = tensors

    @property
    def saved_tensors(self):
        if self._freed:
            raise RuntimeError(_FREED_MSG)
        return self._saved if self._saved is not None else ()

    def mark_non_differentiable(self, *tensors):
        self._non_diff = {id(t) for t in tensors}

    def mark_dirty(self, *tensors):
        pass  # in-place outputs are returned as they are; nothing to track without version counters

    def set_materialize_grads(self, value):
        self._materialize = bool(value)


class _FunctionMeta(type):
    """Gives each Function subclass a backward-node class, as PyTorch's FunctionMeta does."""

    def __init__(cls, name, bases, attrs):
        super().__init__(name, bases, attrs)
        if name not in ("Function", "Op") and "_node_cls" not in attrs:
            cls._node_cls = type(name + "Backward", (FunctionCtx,), {"__slots__": (), "_fn": cls})


class Function(metaclass=_FunctionMeta):
    """Custom differentiable operation, as ``torch.autograd.Function``.

    Subclass with ``@staticmethod forward(ctx, *args, **kwargs)`` and ``@staticmethod
    backward(ctx, *grad_outputs)`` and call ``MyFn.apply(*args)``. forward receives the arguments as given
    (Tensors stay Tensors) and runs with grad mode off; backward gets one gradient Tensor per output and
    returns one gradient (Tensor or None) per forward input.
    """

    _node_cls = FunctionCtx

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("Function subclasses must define forward(ctx, *args)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("Function subclasses must define backward(ctx, *grad_outputs)")

    @classmethod
    def apply(cls, *args, **kwargs):
        needs = tuple(isinstance(a, TensorBase) and a.requires_grad for a in args)
        record = is_grad_enabled() and any(needs)
        ctx = cls._node_cls()
        ctx.needs_input_grad = needs
        with no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        fixed = []
        for o in outs:
            if isinstance(o, TensorBase) and any(o is a for a in args):
                o = _tensor.Tensor._wrap(o._data)  # an input returned as is: a new tensor sharing its memory
            fixed.append(o)
        outs = tuple(fixed)
        if record:
            ctx.next_functions = tuple(_edge(a) if n else None for a, n in zip(args, needs))
            ctx._in_meta = [(a._data.shape, a._data.dtype) if n else None for a, n in zip(args, needs)]
            ctx._n_outputs = len(outs)
            ctx._out_meta = [(o._data.shape, o._data.dtype, _backend.array_module(o._data))
                             if isinstance(o, TensorBase) else None for o in outs]
            non_diff = ctx._non_diff or ()
            for i, o in enumerate(outs):
                if isinstance(o, TensorBase) and id(o) not in non_diff and _backend.is_floating_dtype(o.dtype):
                    o._set_grad_fn(ctx, i)
        return outs[0] if single else outs

    @classmethod
    def _run_backward(cls, ctx, grads):
        """Engine entry: grads are arrays or None (one per output); returns arrays or None per input."""
        gts = []
        for g, meta in zip(grads, ctx._out_meta):
            if g is None and ctx._materialize and meta is not None:
                shape, dtype, xp = meta
                g = xp.zeros(shape, dtype=dtype)
            gts.append(_tensor.Tensor._wrap(g) if g is not None else None)
        with no_grad():
            res = cls.backward(ctx, *gts)
        if not isinstance(res, tuple):
            res = (res,)
        n = len(ctx.next_functions)
        if len(res) < n or any(r is not None for r in res[n:]):
            raise RuntimeError(f"function {cls.__name__}.backward returned an incorrect number of gradients "
                               f"(expected {n}, got {len(res)})")
        out = []
        for i, (r, edge) in enumerate(zip(res[:n], ctx.next_functions)):
            if r is None or edge is None:
                out.append(None)
                continue
            if not isinstance(r, TensorBase):
                raise TypeError(f"{cls.__name__}.backward must return Tensors or None, got {type(r).__name__}")
            g = r._data
            shape, dtype = ctx._in_meta[i]
            if g.shape != shape:  # as PyTorch: a gradient that broadcasts to the input is summed down
                try:
                    ok = np.broadcast_shapes(g.shape, shape) == g.shape
                except ValueError:
                    ok = False
                if not ok:
                    raise RuntimeError(f"function {cls.__name__}Backward returned an invalid gradient at index {i} "
                                       f"- got {list(g.shape)} but expected shape compatible with {list(shape)}")
                g = sum_to(g, shape)
            if g.dtype != dtype:
                g = g.astype(dtype)
            out.append(g)
        return out


# [Note: Mixed Tensor and DTensor]
# A DTensor is a Tensor whose storage is this rank's shard, so a primitive given a DTensor and a plain
# tensor would compute on the shard as if it were the whole tensor: a silently wrong result (e.g. a
# submodule of a fully_shard root called outside the root's forward multiplies its input by a slice of its
# weight). PyTorch's DTensor dispatch refuses such calls; so do the primitives here, with PyTorch's words.
# As in PyTorch, a plain tensor of one element counts as a replicated scalar. The check covers the
# parameters FSDP sharded (marked ``_hp_fsdp_shard``) and every DTensor that is not a parameter (an
# activation, a gradient, a user's ``distribute_tensor``): an op on DTensors goes through its sharding rule
# (hpcfsdp.distributed.tensor), which hands the primitives plain local tensors, so a DTensor that reaches a
# primitive has no rule there, and the primitive raises PyTorch's NotImplementedError naming the op and the
# placements. Tensor parallelism computes a module's DTensor parameters' local shards beside the plain
# activations its styles placed (by design), so DTensor parameters beside plain tensors are not refused.
# SHARDING[0] turns the check on when FSDP first shards a parameter or the first DTensor is made
# (DTENSOR[0], the exact DTensor class, is set then), so a program without either pays one list test per op.
SHARDING = [False]
DTENSOR = [None]


def _refuse_mixed(cls, args) -> bool:
    """Raise for a shard beside a plain tensor, or for a DTensor that is not a parameter; return whether a
    shard is among ``args`` (its results are marked too: the transpose of a shard is no more the whole tensor
    than the shard is)."""
    shard = plain = activation = False
    dtensor = DTENSOR[0]
    for a in args:
        if isinstance(a, TensorBase):
            if type(a) is dtensor:
                activation = True
            elif getattr(a, "_hp_fsdp_shard", False):
                shard = True
            elif a._data.size > 1:
                plain = True
    if activation:
        if any(isinstance(a, TensorBase) and not isinstance(a, dtensor) and a._data.size > 1 for a in args):
            raise RuntimeError(f"{cls.__name__}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor "
                               "to DTensor before calling distributed operators!")
        _no_rule(cls, args)
    if shard and plain:
        raise RuntimeError(f"{cls.__name__}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor "
                           f"to DTensor before calling distributed operators! (hpcfsdp: a parameter sharded by "
                           f"fully_shard used outside its module's FSDP forward holds only this rank's shard; call "
                           f"the FSDP root module, or unshard() it, or use .full_tensor())")
    return shard


def _no_rule(cls, args):
    seen = ", ".join(f"{tuple(a.shape)} {list(a.placements)}" for a in args if type(a) is DTENSOR[0])
    raise NotImplementedError(
        f"Operator {cls.__name__} does not have a sharding strategy registered (hpcfsdp DTensor; operands: {seen}). "
        f"Compute on dtensor.full_tensor() or dtensor.to_local() explicitly.")


class Op(Function):
    """Base of the built-in primitives: forward/backward work on raw arrays (NumPy or CuPy).

    ``forward(ctx, *args)`` receives each Tensor argument as its array and returns an array or a tuple of
    arrays; ``backward(ctx, *grads)`` receives arrays (None for an output that got no gradient) and returns
    one array or None per forward argument. Saved values go on ctx as attributes.
    """

    @classmethod
    def apply(cls, *args, **kwargs):
        shard = SHARDING[0] and _refuse_mixed(cls, args)
        raw = [a._data if isinstance(a, TensorBase) else a for a in args]
        ctx = cls._node_cls()
        out = cls.forward(ctx, *raw, **kwargs)
        if is_grad_enabled():
            needs = tuple(isinstance(a, TensorBase) and a.requires_grad for a in args)
            record = True in needs
        else:
            record = False
        if type(out) is tuple:
            outs = tuple(_tensor.Tensor._wrap(o) for o in out)
            if record:
                ctx.needs_input_grad = needs
                ctx.next_functions = tuple(_edge(a) if n else None for a, n in zip(args, needs))
                ctx._n_outputs = len(outs)
                for i, o in enumerate(outs):
                    if o._data.dtype.kind == "f" or o._data.dtype == _backend.bfloat16:
                        o._set_grad_fn(ctx, i)
                _defer_swappable(ctx, args)
            if shard:
                for o in outs:
                    o._hp_fsdp_shard = True
            return outs
        t = _tensor.Tensor._wrap(out)
        if record:
            ctx.needs_input_grad = needs
            ctx.next_functions = tuple(_edge(a) if n else None for a, n in zip(args, needs))
            t._set_grad_fn(ctx, 0)
            _defer_swappable(ctx, args)
        if shard:
            t._hp_fsdp_shard = True
        return t

    @classmethod
    def _run_backward(cls, ctx, grads):
        swaps = ctx.__dict__.get("_hp_swaps")
        if swaps is not None:
            for key, tensor in swaps:
                ctx.__dict__[key] = tensor._data
        res = cls.backward(ctx, *grads)
        if type(res) is not tuple:
            res = (res,)
        return res


# [Note: Swappable storage]
# FSDP's unsharded parameters keep their Parameter object across a step while their storage comes and
# goes: it is freed after forward (reshard) and gathered again before backward. An op that saved such a
# parameter's array for backward would keep the full parameter alive in between. So an op does not hold
# the array of an input marked ``_hp_storage_swaps``: it remembers the tensor instead and reads the
# tensor's storage again when its backward runs (PyTorch gets the same effect by resizing the storage).
def _defer_swappable(ctx, args):
    swaps = None
    for a in args:
        if isinstance(a, TensorBase) and a._hp_storage_swaps:
            arr = a._data
            for key, value in ctx.__dict__.items():
                if value is arr:
                    swaps = swaps or []
                    swaps.append((key, a))
    if swaps:
        for key, _ in swaps:
            ctx.__dict__[key] = None
        ctx.__dict__["_hp_swaps"] = swaps


def _edge(t):
    """(node, output_nr) that receives the gradient of tensor t."""
    fn = t.grad_fn
    if fn is not None:
        return (fn, t._output_nr)
    return (t._accumulate_node(), 0)


class AccumulateGrad(Node):
    """Leaf node: runs the leaf's hooks and accumulates into ``variable.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        self._init_node()
        self._seq = float("inf")  # leaves accumulate as soon as ready (PyTorch gives them top priority)
        self.variable = variable

    def _release(self):
        pass  # never freed: it holds no saved values


def once_differentiable(fn):
    """Decorator accepted for compatibility: backward is never differentiated twice here."""
    return fn

