"""Sharding rules of element-wise ops: arithmetic, unary functions, comparisons, casts, ``*_like``, and their
in-place forms.

[Note: Pointwise placements]
The result has the operands' broadcast global shape. Per mesh dimension: if an operand is sharded along a
dim of the result (one it does not broadcast), the result is sharded there and the other operands are laid
out to match (a Replicate operand is cut locally, no communication; a differently sharded one is
redistributed); else the result is Replicate. A Partial operand stays Partial only where the op is linear in
it: negation and casts; sum or difference of operands all Partial alike; a product with, or quotient by,
operands that are Replicate or numbers. Anywhere else Partial is reduced first (an all-reduce), as PyTorch
does: ``partial + 1`` would add 1 on every rank. An in-place op keeps its tensor's layout: the other operands
are laid out as it, and an op that would have to change it (``replicated.add_(sharded)`` is fine, since the
sharded operand is gathered; ``partial.mul_(other_partial)`` is not) raises.
"""
from __future__ import annotations

import numpy as np

from hpcfsdp._tensor import Tensor
from hpcfsdp.nn._functional import _common
from hpcfsdp.distributed.tensor._dispatch import OpCall, local_args, register_rule, wrap
from hpcfsdp.distributed.tensor.placement_types import Partial, Replicate, Shard

UNARY = ("neg", "__pos__", "abs", "square", "exp", "exp2", "log", "sqrt", "rsqrt", "tanh", "cos", "sin", "erf", "log1p",
         "expm1", "log2", "log10", "sinh", "cosh", "asin", "acos", "atan", "reciprocal", "sign", "floor", "ceil",
         "round", "trunc", "frac", "exp_", "sqrt_", "neg_", "relu", "sigmoid", "isnan", "isinf", "isfinite",
         "logical_not", "__invert__", "clamp_", "zero_", "fill_", "acosh", "asinh", "atanh", "tan", "erfc", "erfinv",
         "digamma", "lgamma", "logit", "sinc", "deg2rad", "rad2deg", "nan_to_num", "signbit", "isposinf", "isneginf",
         "isreal", "mvlgamma", "polygamma", "abs_", "acos_", "acosh_", "asin_", "asinh_", "atan_", "atanh_", "ceil_",
         "cos_", "cosh_", "deg2rad_", "digamma_", "erf_", "erfc_", "erfinv_", "exp2_", "expm1_", "floor_", "frac_",
         "lgamma_", "log10_", "log1p_", "log2_", "log_", "logical_not_", "logit_", "mvlgamma_", "nan_to_num_",
         "polygamma_", "rad2deg_", "reciprocal_", "relu_", "round_", "rsqrt_", "sigmoid_", "sign_", "sin_", "sinc_",
         "sinh_", "square_", "tan_", "tanh_", "trunc_", "i0", "i0_", "hardshrink", "angle")
BINARY = ("add", "__radd__", "sub", "__rsub__", "mul", "__rmul__", "div", "__rtruediv__", "floor_divide",
          "__rfloordiv__", "remainder", "__rmod__", "fmod", "pow", "__rpow__", "maximum", "minimum", "clamp",
          "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv", "atan2", "hypot", "add_", "sub_", "mul_", "div_",
          "pow_", "maximum_", "lerp_", "addcmul_", "addcdiv_", "__iadd__", "__isub__", "__imul__", "__itruediv__",
          "eq", "ne", "lt", "le", "gt", "ge", "__and__", "__or__", "__xor__", "isclose", "logical_and", "logical_or",
          "logical_xor", "logical_and_", "masked_fill", "masked_fill_", "where", "copysign", "float_power", "xlogy",
          "atan2_", "clamp_max_", "clamp_min_", "copysign_", "eq_", "float_power_", "floor_divide_", "fmod_", "ge_",
          "gt_", "hypot_", "le_", "lt_", "ne_", "remainder_", "xlogy_", "gcd", "lcm", "ldexp", "nextafter", "rsub", "gcd_",
          "lcm_", "ldexp_", "nextafter_")
CASTS = ("to", "cpu", "cuda", "float", "double", "half", "bfloat16", "long", "int", "bool", "type_as", "clone",
         "contiguous", "byte", "char", "short")
LIKE = ("zeros_like", "ones_like", "empty_like", "full_like", "randn_like", "rand_like")

# ops linear in their Partial operands (See [Note: Pointwise placements])
_SIGN = {"neg", "__pos__", "neg_"}
_SUM = {"add", "__radd__", "sub", "__rsub__", "add_", "sub_", "__iadd__", "__isub__"}
_SCALE = {"mul", "__rmul__", "mul_", "__imul__", "div", "div_", "__itruediv__"}
_ZEROS = {"zeros_like", "empty_like", "zero_"}


def _shape(x):
    if isinstance(x, Tensor):
        return tuple(x.shape)
    return ()


def _operands(call: OpCall):
    """The tensor-like operands (DTensors, plain tensors, numbers) of an element-wise call, in order."""
    out = []
    for a in (*call.args, *call.kwargs.values()):
        if isinstance(a, Tensor) or isinstance(a, (int, float, bool, complex, np.number)):
            out.append(a)
    return out


_INTEGRAL_CASTS = {"long", "int", "bool", "byte", "char", "short"}


def _casts_to_integral(call) -> bool:
    """Whether a cast's result is integral or bool: rounding each rank's Partial value is not the rounding of the
    sum (nor is bool of one), so such a cast reduces a Partial first."""
    name = call.entry.name
    if name in _INTEGRAL_CASTS:
        return True
    if name not in ("to", "type_as"):
        return False
    for a in (*call.args[1:], *call.kwargs.values()):
        dt = a.dtype if isinstance(a, Tensor) else (a if isinstance(a, np.dtype) else None)
        if dt is not None:
            return np.dtype(dt).kind in "iub"
    return False


def _partial_kept(call, i, partial) -> bool:
    """Whether the op is linear in its operands' Partial values on mesh dim ``i`` (the DTensors in ``partial``)."""
    name = call.entry.name
    ds = call.dtensors
    if name in CASTS and _casts_to_integral(call):
        return False
    if any(type(d._spec.placements[i]) is not Partial for d in partial):  # p-norm partials: casts only
        return name in CASTS or name in _ZEROS
    if name in CASTS or name in _ZEROS:
        return True
    if name in _SIGN:  # -max(x_i) is min(-x_i): negation keeps only a sum or a mean
        return all(d._spec.placements[i].reduce_op in ("sum", "avg") for d in partial)
    if name in _SUM:
        if any(not any(a is d for d in ds) for a in _operands(call)):
            return False  # a number or plain tensor added to a Partial would count once per rank
        kind = {d._spec.placements[i] for d in ds}
        return len(kind) == 1 and partial[0]._spec.placements[i].reduce_op in ("sum", "avg")
    if name in _SCALE:
        if len(partial) != 1 or partial[0]._spec.placements[i].reduce_op not in ("sum", "avg"):
            return False
        if name.startswith("div") or name == "__itruediv__":
            return call.args[0] is partial[0]  # only the numerator may be partial
        return all(isinstance(d._spec.placements[i], (Replicate, Partial)) for d in ds)
    return False


def _layout(call: OpCall, inplace_self=None):
    """(result placements, per-DTensor target placements, result shape) of an element-wise call."""
    ds = call.dtensors
    shapes = [_shape(a) for a in _operands(call)]
    out_shape = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    nd = len(out_shape)
    mesh = call.mesh
    out_pl = []
    for i in range(mesh.ndim):
        pls = [d._spec.placements[i] for d in ds]
        partial = [d for d, p in zip(ds, pls) if isinstance(p, Partial)]
        if partial and _partial_kept(call, i, partial):
            out_pl.append(partial[0]._spec.placements[i])
            continue
        if inplace_self is not None:
            p = inplace_self._spec.placements[i]
            if isinstance(p, Partial):
                raise RuntimeError(f"{call.entry.name}: an in-place op on a Partial DTensor that is not linear in it "
                                   f"(operands {[list(d._spec.placements) for d in ds]}); redistribute it first")
            out_pl.append(Shard(p.dim + nd - inplace_self.ndim) if isinstance(p, Shard) else Replicate())
            continue
        dims = [p.dim + nd - d.ndim for d, p in zip(ds, pls)
                if isinstance(p, Shard) and (d.shape[p.dim] != 1 or out_shape[p.dim + nd - d.ndim] == 1)]
        out_pl.append(Shard(dims[0]) if dims else Replicate())
    targets = []
    for d in ds:
        if d is inplace_self:
            targets.append(tuple(d._spec.placements))
            continue
        tp = []
        for i, p in enumerate(out_pl):
            own = d._spec.placements[i]
            if isinstance(p, Partial):
                tp.append(own if isinstance(own, Partial) else Replicate())
            elif isinstance(p, Shard):
                k = p.dim - (nd - d.ndim)
                tp.append(Shard(k) if k >= 0 and (d.shape[k] != 1 or out_shape[p.dim] == 1) else Replicate())
            else:
                tp.append(Replicate())
        targets.append(tuple(tp))
    return tuple(out_pl), targets, out_shape


def _cast(call: OpCall):
    """``dt.to(other)`` / ``dt.type_as(other)``: ``other`` gives only the dtype, so the layout is ``dt``'s (a Partial
    kept but for an integral or bool result)."""
    d = call.dtensors[0]
    integral = _casts_to_integral(call)
    pl = tuple(Replicate() if isinstance(p, Partial) and integral else p for p in d._spec.placements)
    args, kwargs = local_args(call, [pl] + [None] * (len(call.dtensors) - 1), pl)
    return wrap(call.compute(*args, **kwargs), call.mesh, pl, d.shape)


def pointwise(call: OpCall):
    if call.entry.name in ("to", "type_as") and call.args and call.args[0] is call.dtensors[0]:
        return _cast(call)
    inplace = call.entry.inplace
    self = call.args[0] if inplace else None
    if inplace and self is not call.dtensors[0]:
        raise RuntimeError(f"{call.entry.name}: an in-place op on a plain tensor with DTensor operands")
    out_pl, targets, shape = _layout(call, self)
    if inplace and tuple(targets[0]) != tuple(self._spec.placements):
        raise RuntimeError(f"{call.entry.name}: an in-place op cannot change the layout of its DTensor "
                           f"({list(self._spec.placements)})")
    args, kwargs = local_args(call, targets, out_pl)
    out = call.compute(*args, **kwargs)
    if inplace and out is args[0]:
        return self
    if inplace and tuple(shape) != tuple(self.shape):
        raise RuntimeError(f"{call.entry.name}: output with shape {list(self.shape)} doesn't match the broadcast "
                           f"shape {list(shape)}")
    return wrap(out, call.mesh, out_pl, shape)


def like(call: OpCall):
    """``zeros_like(dt)`` and kin: a DTensor of ``dt``'s layout (a Partial becomes Replicate, except for zeros,
    which are a Partial of zeros as well)."""
    d = call.dtensors[0]
    name = call.entry.name
    pl = tuple(p if not isinstance(p, Partial) or name in _ZEROS else Replicate() for p in d._spec.placements)
    if name in ("randn_like", "rand_like"):
        raise NotImplementedError(f"{name}: random values for a DTensor are drawn per shard here; use "
                                  "distribute_tensor(hp.randn(...)) for the values the unsharded tensor would have")
    args, kwargs = local_args(call, [pl] + [None] * (len(call.dtensors) - 1))
    return wrap(call.compute(*args, **kwargs), call.mesh, pl, d.shape)


def functional(fn, input, args, kwargs):
    """An element-wise nn.functional activation on a DTensor (See [Note: Element-wise functionals on DTensors]):
    computed on the local piece, a DTensor of the input's layout (a Partial input is reduced first: these
    functions are not linear)."""
    from hpcfsdp.distributed.tensor._dispatch import _is_dt, redistribute_local

    if not _is_dt(input) or any(isinstance(a, Tensor) and a._data.size > 1 for a in (*args, *kwargs.values())):
        return NotImplemented
    pl = tuple(Replicate() if isinstance(p, Partial) else p for p in input._spec.placements)
    return wrap(fn(redistribute_local(input, pl), *args, **kwargs), input._spec.mesh, pl, input.shape)


def new_factory(call: OpCall):
    """``dt.new_zeros(size)`` and kin: a Replicate DTensor of ``size`` (PyTorch's); ``new_tensor`` a plain tensor."""
    if call.entry.name == "new_tensor" and len(call.dtensors) > 1:  # its data is a DTensor: not its local piece
        raise NotImplementedError("new_tensor: the data is a DTensor; copy it with data.full_tensor() (the whole "
                                  "tensor) or data.to_local() (this rank's piece)")
    args, kwargs = local_args(call)  # only self's dtype and device are read
    out = call.compute(*args, **kwargs)
    if call.entry.name == "new_tensor":
        return out
    return wrap(out, call.mesh, (Replicate(),) * call.mesh.ndim, out.shape)


register_rule(pointwise, *UNARY, *BINARY, *CASTS)
register_rule(new_factory, "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor")
_common.DTENSOR_ELEMENTWISE[0] = functional
register_rule(like, *LIKE)
