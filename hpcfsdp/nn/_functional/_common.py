"""Argument checks shared by the functional implementation modules."""
import functools
import warnings

import numpy as np

from ..._array import dtype_category
from ..._tensor import Tensor

__all__ = ["check_tensor", "check_float", "check_reduction", "legacy_reduction", "reduce_loss", "expand_param",
           "elementwise", "DTENSOR_ELEMENTWISE", "dtensor_rule", "DTENSOR_FUNCTIONAL"]

REDUCTIONS = ("mean", "sum", "none")

# [Note: Element-wise functionals on DTensors]
# The functional activations apply their autograd Functions directly (not ops of the registry), so on a DTensor
# they would return a plain tensor of the local piece. Those marked @elementwise hand a DTensor input (the one
# tensor argument) to DTENSOR_ELEMENTWISE[0], which hpcfsdp.distributed.tensor installs when loaded: it
# computes on the local piece (a Partial input reduced first) and returns a DTensor of the input's layout.
DTENSOR_ELEMENTWISE = [None]


def elementwise(fn):
    """Mark functional ``fn(input, ...)`` as element-wise in ``input``: See [Note: Element-wise functionals on
    DTensors]."""
    @functools.wraps(fn)
    def f(input, *args, **kwargs):  # noqa: A002
        hook = DTENSOR_ELEMENTWISE[0]
        if hook is not None and type(input) is not Tensor and isinstance(input, Tensor):
            out = hook(fn, input, args, kwargs)
            if out is not NotImplemented:
                return out
        return fn(input, *args, **kwargs)

    return f


# [Note: Functionals on DTensors]
# The other functionals that apply fused primitives (linear, layer_norm, embedding, the losses) have a sharding
# rule each in DTENSOR_FUNCTIONAL (filled by hpcfsdp.distributed.tensor._rules.functional when it is loaded),
# keyed by the function's name. Those marked @dtensor_rule hand a call whose first argument is a DTensor to
# the rule, as ``rule(fn, *args, **kwargs)`` with ``fn`` the undecorated function (which the rule applies to
# local pieces). A plain first argument costs one attribute test: tensor parallelism's modules call these on
# plain activations beside DTensor parameters (their styles placed the inputs), and keep doing so.
DTENSOR_FUNCTIONAL = {}


def dtensor_rule(fn):
    """Route ``fn(input, ...)`` with a DTensor ``input`` to its rule: See [Note: Functionals on DTensors]."""
    name = fn.__name__

    @functools.wraps(fn)
    def f(input, *args, **kwargs):  # noqa: A002
        if getattr(type(input), "_hp_is_dtensor", False):
            rule = DTENSOR_FUNCTIONAL.get(name)
            if rule is not None:
                return rule(fn, input, *args, **kwargs)
        return fn(input, *args, **kwargs)

    return f


def check_tensor(x, name, argname="input"):
    """x itself; TypeError when it is not a Tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{argname}' must be Tensor, not {type(x).__name__}")
    return x


def check_float(x, name, argname="input"):
    """x itself; TypeError when it is not a Tensor, RuntimeError when it is not floating point."""
    check_tensor(x, name, argname)
    if dtype_category(x.dtype) != 2:
        raise RuntimeError(f"{name}(): expected a floating point {argname}, got dtype {x.dtype}")
    return x


def check_reduction(reduction, extra=()):
    """ValueError unless ``reduction`` is 'mean', 'sum', 'none' (or one of ``extra``), in PyTorch's words."""
    if reduction not in REDUCTIONS + tuple(extra):
        raise ValueError(f"{reduction} is not a valid value for reduction")


def legacy_reduction(size_average, reduce, reduction):
    """PyTorch's mapping of the deprecated size_average/reduce flags onto ``reduction`` (with its warning)."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    new = "mean" if size_average and reduce else "sum" if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{new}' instead.",
                  stacklevel=3)
    return new


def reduce_loss(loss, reduction):
    """The mean, the sum or ``loss`` itself."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def expand_param(value, n, name, what="expected {name} to be a single integer value or a list of {n} values"):
    """An int or a sequence of ``n`` ints as a tuple of ``n`` ints (a 1-sequence is repeated)."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    try:
        vals = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{name} must be an int or a tuple of ints, got {value!r}") from None
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise RuntimeError(what.format(name=name, n=n) + f", but got {name}={list(vals)}")
    return vals
