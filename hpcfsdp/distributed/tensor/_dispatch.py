"""DTensor op dispatch: every op of the registry (hpcfsdp/_registry.py) called on a DTensor goes through the
sharding rule of its entry, or raises; it never computes on the local shard as if it were the whole tensor.

[Note: DTensor op dispatch]
``install(DTensor)`` gives DTensor one dispatching method per Tensor method of the registry (those DTensor
defines itself, such as ``redistribute``-aware ``copy_``, are kept), and the registry's ``hpcfsdp.*``
functions that are not methods (``hp.cat``, ``hp.where``, ``hp.zeros_like``) consult ``_function_hook`` when
this module is loaded. A call becomes an ``OpCall``; ``entry.sharding_rule(call)`` computes the result. An
entry without a rule raises NotImplementedError naming the op and the placements (PyTorch's behaviour).

Rules compute with the entry's own body on plain local tensors: ``local_args`` turns each DTensor operand into
a plain Tensor over its local piece (redistributed first where the rule asks), linked into the autograd graph
by ``_LocalView`` (identity forward and backward), and ``wrap`` turns each local result back into a DTensor of
the placements and global shape the rule gives, sharing the result's graph node. The engine moves gradients
as local arrays, so a gradient is laid out as its tensor (a Partial tensor's gradient as Replicate, which has
the same local shape); a DTensor leaf receives its ``.grad`` as a DTensor of its own layout. Redistributions
inside a rule are differentiable (``_Redistribute``: the backward redistributes the gradient back).

Plain tensors beside DTensors: a Python number, or a plain tensor of one element, is a replicated scalar. A
larger plain tensor raises PyTorch's "mixed torch.Tensor and DTensor" error, unless every DTensor operand is
Replicate on every mesh dim: then the plain tensor is taken as replicated too (each rank holds the whole
value, so the result is unambiguous; PyTorch raises here, hpcfsdp computes, so a buffer replicated by
``distribute_module`` can still be updated from a plain statistic).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

from hpcfsdp import _registry
from hpcfsdp._backend import array_module
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.function import Function
from hpcfsdp.distributed.tensor.placement_types import Partial, Replicate

__all__ = ["OpCall", "install", "register_rule", "local_args", "wrap", "redistribute_local", "no_rule",
           "placements_text"]

_DTENSOR = [None]  # the DTensor class, set by install()
_SPEC = [None]  # DTensorSpec, set by install()


def _is_dt(x) -> bool:
    return isinstance(x, _DTENSOR[0])


class OpCall:
    """One call of a registry op with DTensor operands: the entry, the arguments as given, and the DTensors
    among them (in argument order, lists and tuples searched one level deep). ``via_function``: the call came
    through the op's written-out hpcfsdp.* function, whose arguments may be in another order than the method's
    (``hp.where(condition, input, other)`` against ``input.where(condition, other)``)."""

    __slots__ = ("entry", "args", "kwargs", "dtensors", "via_function")

    def __init__(self, entry, args, kwargs, via_function=False):
        self.entry = entry
        self.args = args
        self.kwargs = kwargs
        self.dtensors = [a for a in _flat(args, kwargs) if _is_dt(a)]
        self.via_function = via_function

    @property
    def mesh(self):
        return self.dtensors[0]._spec.mesh

    def compute(self, *args, **kwargs):
        """The entry's body on (local) arguments: the function's where the call came through a written-out
        function, else its method body, else its function."""
        e = self.entry
        body = getattr(e.function, "__hp_body__", None)
        fn = body if self.via_function and body is not None else e.impl if e.impl is not None else \
            getattr(e.function, "__hp_body__", e.function)
        if isinstance(fn, property):  # t.T, t.mT
            fn = fn.fget
        return fn(*args, **kwargs)


def _flat(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def placements_text(call: OpCall) -> str:
    return ", ".join(f"{tuple(d.shape)} {list(d._spec.placements)}" for d in call.dtensors)


def no_rule(call: OpCall):
    raise NotImplementedError(
        f"Operator {call.entry.name} does not have a sharding strategy registered (hpcfsdp DTensor; operands: "
        f"{placements_text(call)}). Compute on dtensor.full_tensor() or dtensor.to_local() explicitly.")


# ops that read only the other tensor's shape or dtype: a plain ``other`` is fine (PyTorch's are composites)
_METADATA_OF_OTHER = {"view_as": "view", "reshape_as": "reshape", "expand_as": "expand", "type_as": "to"}


def dispatch(entry, args, kwargs, via_function=False):
    via = _METADATA_OF_OTHER.get(entry.name)
    if via is not None and len(args) == 2 and not kwargs and _is_dt(args[0]) and isinstance(args[1], Tensor) \
            and not _is_dt(args[1]):
        return getattr(args[0], via)(args[1].dtype if via == "to" else tuple(args[1].shape))
    call = OpCall(entry, args, kwargs, via_function)
    meshes = {id(d._spec.mesh): d._spec.mesh for d in call.dtensors}
    if len(meshes) > 1:
        raise NotImplementedError(f"{entry.name}: DTensor operands on different device meshes are not supported")
    replicated = _check_plain(call)
    rule = entry.sharding_rule
    if rule is None:
        if not replicated:
            no_rule(call)
        rule = replicated_rule
    return rule(call)


def replicated_rule(call: OpCall):
    """Any op whose DTensor operands are all Replicate: computed on the local values (each the whole tensor),
    each tensor result a Replicate DTensor. The rule of every op without its own (See [Note: DTensor op
    dispatch]); an op with a rule of its own may still call it for replicated operands."""
    args, kwargs = local_args(call)
    out = call.compute(*args, **kwargs)
    if call.entry.inplace and out is args[0]:
        return call.args[0]
    return wrap_all(out, call.mesh, (Replicate(),) * call.mesh.ndim)


def wrap_all(out, mesh, placements):
    """``out`` with every plain tensor in it (tuples and named tuples searched) a DTensor of ``placements`` over
    its local shape (for results that are whole on every rank)."""
    if isinstance(out, Tensor) and not _is_dt(out):
        return wrap(out, mesh, placements, out.shape)
    if isinstance(out, tuple):
        items = [wrap_all(o, mesh, placements) for o in out]
        return tuple(items) if type(out) is tuple else type(out)(*items)  # named tuples, return types
    if isinstance(out, list):
        return [wrap_all(o, mesh, placements) for o in out]
    return out


def _check_plain(call: OpCall) -> bool:
    """Refuse plain tensors beside sharded or partial DTensors; return whether all DTensor operands are
    replicated."""
    replicated = all(isinstance(p, Replicate) for d in call.dtensors for p in d._spec.placements)
    for a in _flat(call.args, call.kwargs):
        if isinstance(a, Tensor) and not _is_dt(a) and a._data.size > 1 and not replicated:
            raise RuntimeError(f"{call.entry.name}: got mixed torch.Tensor and DTensor, need to convert all "
                               "torch.Tensor to DTensor before calling distributed operators!")
    return replicated


def register_rule(rule, *names) -> None:
    """Attach ``rule`` to the registry entries of ``names`` (an op name or any of its aliases)."""
    for n in names:
        entry = _registry.lookup(n)
        if entry.sharding_rule is not None and entry.sharding_rule is not rule:
            raise ValueError(f"DTensor: op {entry.name!r} already has a sharding rule")
        entry.sharding_rule = rule


# -- local views, differentiable ---------------------------------------------------------------------------
class _LocalView(Function):
    """A plain Tensor over a DTensor's local piece, in the graph: identity both ways (See [Note: DTensor op
    dispatch])."""

    @staticmethod
    def forward(ctx, x):
        return Tensor._wrap(x._data)

    @staticmethod
    def backward(ctx, g):
        return g


class _Redistribute(Function):
    """A DTensor's local piece redistributed to other placements; the backward redistributes the gradient
    back (a Partial source's gradient as Replicate, its local shape)."""

    @staticmethod
    def forward(ctx, x, src, dst):
        ctx.src, ctx.dst = src, dst
        ctx.scale = None
        if ctx.needs_input_grad[0]:  # a max/min/norm Partial reduced: its gradient is not the identity
            reduced = [i for i, (s, d) in enumerate(zip(src.placements, dst.placements))
                       if isinstance(s, Partial) and s != d]
            if reduced:
                ctx.scale = _DTENSOR[0]._partial_grad_scale(x._data, src.mesh, src.placements, reduced)
        return Tensor._wrap(_move(x._data, src, dst))

    @staticmethod
    def backward(ctx, g):
        out = _move(g._data, _grad_spec(ctx.dst), _grad_spec(ctx.src))
        if ctx.scale is not None:
            out = out * ctx.scale.astype(out.dtype, copy=False)
        return Tensor._wrap(out), None, None


def _with(spec, placements):
    return dataclasses.replace(spec, placements=tuple(placements))


def _grad_spec(spec):
    """The layout of a gradient of a tensor laid out as ``spec``: Partial mesh dims become Replicate."""
    return _with(spec, (Replicate() if isinstance(p, Partial) else p for p in spec.placements))


def _move(local, src, dst):
    """``local`` (laid out as spec ``src``) laid out as spec ``dst`` (collective when it must be)."""
    dt = _DTENSOR[0]._from_array(local, src)
    return dt.redistribute(src.mesh, dst.placements)._data


def redistribute_local(d, placements):
    """A plain local tensor of DTensor ``d`` laid out with ``placements`` (differentiable; no copy when they are
    ``d``'s own)."""
    placements = tuple(placements)
    if placements == tuple(d._spec.placements):
        return _LocalView.apply(d)
    return _Redistribute.apply(d, d._spec, _with(d._spec, placements))


class _SumGrad(Function):
    """Identity forward; the backward all-reduces (sums) the gradient over the mesh dims ``dims``: the gradient of
    an operand used whole (Replicate) where the result is Shard or Partial, of which each rank computed a part."""

    @staticmethod
    def forward(ctx, x, mesh, dims):
        ctx.mesh, ctx.dims = mesh, dims
        return Tensor._wrap(x._data)

    @staticmethod
    def backward(ctx, g):
        out = array_module(g._data).array(g._data, copy=True, order="C")
        for i in ctx.dims:
            ctx.mesh.get_group(i).all_reduce_(out)
        return Tensor._wrap(out), None, None


def local_args(call: OpCall, placements=None, out_placements=None):
    """``(args, kwargs)`` with every DTensor replaced by a plain local tensor (graph-linked), redistributed to
    ``placements[i]`` for the i-th DTensor where given (None: as it is), and one-element plain tensors kept.

    With the result's ``out_placements``, an operand that is used Replicate on a mesh dim where the result is
    Shard or Partial has its gradient summed over that mesh dim in the backward (``_SumGrad``): each rank's
    local result saw the whole operand but only its own part of the computation."""
    it = iter(range(len(call.dtensors)))

    def conv(a):
        if _is_dt(a):
            i = next(it)
            target = None if placements is None else placements[i]
            local = _LocalView.apply(a) if target is None else redistribute_local(a, target)
            if out_placements is not None and a.requires_grad:
                used = a._spec.placements if target is None else target
                dims = tuple(m for m, (u, o) in enumerate(zip(used, out_placements))
                             if isinstance(u, Replicate) and not isinstance(o, Replicate))
                if dims:
                    local = _SumGrad.apply(local, a._spec.mesh, dims)
            return local
        return a

    def walk(a):
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return conv(a)

    args = tuple(walk(a) for a in call.args)
    kwargs = {k: walk(v) for k, v in call.kwargs.items()}
    return args, kwargs


def _contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def wrap(local, mesh, placements, shape):
    """A DTensor over ``local``'s array (a plain Tensor), sharing its autograd node, laid out as given."""
    shape = tuple(int(s) for s in shape)
    spec = _SPEC[0](mesh, tuple(placements), shape, _contiguous_stride(shape), local._data.dtype)
    out = _DTENSOR[0]._from_array(local._data, spec)
    if local.grad_fn is not None:
        out._set_grad_fn(local.grad_fn, local._output_nr)
    elif local.requires_grad:
        out.requires_grad = True
    return out


# -- installation ------------------------------------------------------------------------------------------
def _method(name, entry):
    def method(self, *args, **kwargs):
        return dispatch(entry, (self, *args), kwargs)

    impl = entry.impl.fget if isinstance(entry.impl, property) else entry.impl
    functools.update_wrapper(method, impl)  # Tensor's signature and doc (PyTorch's DTensor keeps them too)
    method.__name__ = method.__qualname__ = name
    return method


def _function_hook(entry, args, kwargs):
    for a in _flat(args, kwargs):
        if _is_dt(a):
            return dispatch(entry, args, kwargs, via_function=True)
    return NotImplemented


def install(dtensor_cls, spec_cls) -> None:
    """Give ``dtensor_cls`` a dispatching method per registry method it does not define itself, and route the
    registry's functions through ``_function_hook`` (See [Note: DTensor op dispatch])."""
    _DTENSOR[0], _SPEC[0] = dtensor_cls, spec_cls
    own = set(dtensor_cls.__dict__)
    for name, entry in _registry.method_names().items():
        if name in own:
            continue
        m = _method(name, entry)
        if isinstance(inspect.getattr_static(Tensor, name, None), property):  # t.T, t.mT
            m = property(m, doc=m.__doc__)
        setattr(dtensor_cls, name, m)
    _registry.set_function_dispatch(_function_hook)

