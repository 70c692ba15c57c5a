"""The backward engine: reverse topological order, gradient accumulation, hooks, queue_callback.

It works on graph nodes and arrays; gradients handed to hooks and ``.grad`` become Tensors through
function.py or the tensors the engine was given (``t._wrap``), so it does not import Tensor.
"""
import heapq
import sys
import threading

import numpy as np

from .._tensor_base import TensorBase
from .function import _FREED_MSG, AccumulateGrad, _edge, _run_tensor_hooks
from .grad_mode import no_grad

__all__ = ["backward", "grad", "queue_callback", "is_in_backward"]

_tls = threading.local()


def is_in_backward():
    """True while a backward() call is running in this thread."""
    return getattr(_tls, "depth", 0) > 0


def queue_callback(fn):
    """Run ``fn()`` once when the current outermost backward() finishes (FIFO; may queue more)."""
    if not is_in_backward():
        raise RuntimeError("queue_callback can only be called during the backward pass")
    _tls.callbacks.append(fn)


# [Note: Gradient ownership]
# Backward formulas may return views, broadcasts, or the same array for several inputs (add returns g
# twice), and must never write into the gradients they receive. The engine therefore sums incoming
# gradients out of place the first time and in place only into a buffer it allocated itself (`owned`).
# A leaf's first gradient becomes `.grad` without a copy only when nothing else can see the array: it
# owns its memory, is writeable and C-contiguous, and the engine holds the only reference (refcount),
# as PyTorch steals a gradient whose use_count is 1. Otherwise it is copied.
def _writeable(a) -> bool:
    """Whether array ``a`` may be written: NumPy's flag; a CuPy array is always writable (its flags have no field)."""
    return not isinstance(a, np.ndarray) or a.flags.writeable


def _steal_ok(g, expected_refs):
    # +1: getrefcount's own argument
    return (g.base is None and g.flags.c_contiguous and _writeable(g)
            and sys.getrefcount(g) <= expected_refs + 1)


def _accumulate(node, grads):
    """AccumulateGrad: leaf hooks, then ``.grad`` update, then post-accumulate hooks.

    Takes the engine's one-element buffer list and empties it, so that ``g`` is referenced only here.
    """
    var = node.variable
    g = grads[0]
    grads[0] = None
    if var._hooks:
        g = _run_tensor_hooks(var._hooks, g)
    if g.dtype != var._data.dtype:
        g = g.astype(var._data.dtype)
    if g.shape != var._data.shape:
        raise RuntimeError(f"gradient of shape {tuple(g.shape)} does not match its leaf of shape "
                           f"{tuple(var._data.shape)}")
    cur = var._grad
    # a DTensor leaf's gradient is a DTensor of its layout (`__hp_wrap_like__`), as in PyTorch
    wrap = getattr(var, "__hp_wrap_like__", None) or var._wrap
    if cur is None:
        # refs: the local `g` and _steal_ok's parameter
        var._grad = wrap(g if _steal_ok(g, 2) else g.copy())
    elif _writeable(cur._data) and cur._data.shape == g.shape and cur._data.dtype == g.dtype:
        cur._data += g
    else:
        var._grad = wrap(cur._data + g)
    if var._post_acc_hooks:
        for fn in list(var._post_acc_hooks.values()):
            fn(var)


def _roots(tensors, grad_tensors):
    if isinstance(tensors, TensorBase):
        tensors = (tensors,)
    tensors = tuple(tensors)
    if grad_tensors is None:
        grad_tensors = (None,) * len(tensors)
    elif isinstance(grad_tensors, TensorBase):
        grad_tensors = (grad_tensors,)
    grad_tensors = tuple(grad_tensors)
    if len(grad_tensors) != len(tensors):
        raise RuntimeError(f"got {len(tensors)} tensors and {len(grad_tensors)} gradients")
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if not t.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        xp = t._xp()
        if g is None:
            if t._data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            ga = xp.ones(t._data.shape, dtype=t._data.dtype)
        else:
            ga = g._data if isinstance(g, TensorBase) else xp.asarray(g, dtype=t._data.dtype)
            if ga.shape != t._data.shape:
                raise RuntimeError(f"mismatch in shape: grad_output[{i}] has shape {tuple(ga.shape)} and "
                                   f"output[{i}] has shape {tuple(t._data.shape)}")
        roots.append((_edge(t), ga))
    return roots


def _execute(roots, retain_graph, capture=None):
    """Run the graph from roots. ``capture`` maps edge (node, nr) -> slot for autograd.grad."""
    deps = {}
    seen = set()
    stack = []
    for (node, _), _g in roots:
        if node not in seen:
            seen.add(node)
            stack.append(node)
    while stack:
        node = stack.pop()
        for edge in node.next_functions:
            if edge is None:
                continue
            nxt = edge[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)

    buffers = {}
    owned = set()

    def add_grad(node, nr, g):
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * node._n_outputs
        cur = buf[nr]
        if cur is None:
            buf[nr] = g
        elif id(cur) in owned and cur.shape == g.shape:
            cur += g
        else:
            s = cur + g
            if s.shape != cur.shape:
                raise RuntimeError(f"gradients of shapes {cur.shape} and {g.shape} reached one output")
            owned.discard(id(cur))
            owned.add(id(s))
            buf[nr] = s

    for (node, nr), g in roots:
        add_grad(node, nr, g)
    heap = []
    for node in buffers:
        if deps.get(node, 0) == 0:
            heapq.heappush(heap, (-node._seq, id(node), node))

    while heap:
        node = heapq.heappop(heap)[2]
        grads = buffers.pop(node, None) or [None] * node._n_outputs
        owned.difference_update(map(id, grads))
        if capture is not None:
            for nr in range(len(grads)):
                slot = capture.get((node, nr))
                if slot is not None and grads[nr] is not None:
                    slot[0] = grads[nr] if slot[0] is None else slot[0] + grads[nr]
        if type(node) is AccumulateGrad:
            if grads[0] is not None and capture is None:
                _accumulate(node, grads)
            del grads
            continue
        if node._tensor_hooks:
            for nr, hooks in node._tensor_hooks.items():
                if grads[nr] is not None and hooks:
                    grads[nr] = _run_tensor_hooks(hooks, grads[nr])
        if node._retain:
            for nr, ref in node._retain.items():
                t = ref()
                if t is not None and grads[nr] is not None:
                    t._grad = t._wrap(grads[nr].copy() if t._grad is None else t._grad._data + grads[nr])
        if all(g is None for g in grads):
            in_grads = (None,) * len(node.next_functions)
        else:
            if node._freed:
                raise RuntimeError(_FREED_MSG)
            in_grads = node._fn._run_backward(node, grads)
        del grads
        if not retain_graph:
            node._release()
        for i, edge in enumerate(node.next_functions):
            if edge is None:
                continue
            nxt, nr = edge
            if in_grads[i] is not None:
                add_grad(nxt, nr, in_grads[i])
            d = deps[nxt] - 1
            deps[nxt] = d
            if d == 0:
                heapq.heappush(heap, (-nxt._seq, id(nxt), nxt))
        del in_grads


def _run(roots, retain_graph, capture=None):
    depth = getattr(_tls, "depth", 0)
    if depth == 0:
        _tls.callbacks = []
    _tls.depth = depth + 1
    try:
        with no_grad():
            _execute(roots, retain_graph, capture)
            if depth == 0:
                cbs = _tls.callbacks
                i = 0
                while i < len(cbs):  # callbacks may queue further callbacks
                    cbs[i]()
                    i += 1
    finally:
        _tls.depth = depth
        if depth == 0:
            _tls.callbacks = []


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Compute the gradients of ``tensors`` w.r.t. graph leaves, accumulated into their ``.grad``."""
    if create_graph:
        raise RuntimeError("create_graph=True (higher-order gradients) is not supported by hpcfsdp")
    if inputs is not None:
        raise RuntimeError("backward(inputs=...) is not supported by hpcfsdp; use hpcfsdp.autograd.grad")
    _run(_roots(tensors, grad_tensors), bool(retain_graph))


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """Gradients of ``outputs`` w.r.t. ``inputs``, returned (not accumulated into ``.grad``)."""
    if create_graph:
        raise RuntimeError("create_graph=True (higher-order gradients) is not supported by hpcfsdp")
    single = isinstance(inputs, TensorBase)
    inputs = (inputs,) if single else tuple(inputs)
    capture = {}
    slots = []
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"input {i} does not require grad")
        slot = [None]
        capture[_edge(t)] = slot
        slots.append(slot)
    _run(_roots(outputs, grad_outputs), bool(retain_graph), capture)
    res = []
    for i, (t, slot) in enumerate(zip(inputs, slots)):
        if slot[0] is None and not allow_unused:
            raise RuntimeError(f"input {i} was not used in the graph; pass allow_unused=True")
        res.append(t._wrap(slot[0]) if slot[0] is not None else None)
    return tuple(res)
