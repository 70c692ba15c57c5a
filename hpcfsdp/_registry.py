"""The op registry: every public tensor op declared once, with its family, its autograd Functions and
where users reach it (a Tensor method, an ``hpcfsdp.*`` function, in place or not).

The Tensor methods and the ``hpcfsdp.*`` op functions are generated from it: a family's method file
(``hpcfsdp/_tensor_methods/<family>.py``) declares each op with :func:`op` or :func:`function_op` and
ends with ``<Family>Mixin = mixin("<family>")``; ``Tensor`` combines the mixins and
``hpcfsdp/__init__.py`` takes its op functions from :func:`top_level`. So a new op is its ``Function``
in ``hpcfsdp/autograd/ops/<family>.py`` plus one declaration here-by-decorator (see CONTRIBUTING.md).

Each entry has two slots that later layers fill: ``sharding_rule`` (how the op propagates DTensor
placements) and ``gpu_kernel`` (a fused CuPy kernel that replaces the composition on a GPU).
This module imports nothing of hpcfsdp: it is a table, below everything that registers into it.
"""
from __future__ import annotations

import sys
import functools
from typing import Any, Callable

__all__ = ["FAMILIES", "INPLACE_DUNDERS", "OPS", "Op", "expose_functions", "function_op", "lookup", "method_names",
           "mixin", "op",
           "set_function_dispatch", "set_tensor_class", "tensor_class", "top_level"]

# The families, as the files of hpcfsdp/autograd/ops/ and hpcfsdp/_tensor_methods/ are named. "compare"
# (comparisons, predicates, logic) and "convert" (dtype/device conversions, new_* constructors) have
# Tensor methods but no Functions of their own; "creation" is the *_like functions and their kin.
FAMILIES = ("arithmetic", "unary", "reduce", "compare", "shape", "index", "linalg", "random", "activation",
            "nn", "loss", "attention", "conv", "pool", "resample", "pad", "convert", "creation")

# Python's in-place operators: every other dunder (``__radd__``, ``__iter__``, ``__invert__``) computes a new
# result, although its name ends with "_" as an in-place method's does.
INPLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                             "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__"})


def _inplace_name(name):
    """Whether ``name`` is an in-place op's: ``add_``, ``__iadd__``, ``__setitem__``; not ``__radd__``."""
    if name.startswith("__") and name.endswith("__"):
        return name in INPLACE_DUNDERS
    return name.endswith("_")


class Op:
    """One public op.

    ``impl`` is the Tensor method's body (None for a function-only op); ``function`` the
    ``hpcfsdp.<name>`` function (None where PyTorch has no such function); ``functions`` the autograd
    Function classes the op applies (empty for compositions of other ops and for ops that record no
    graph); ``aliases`` other Tensor method names bound to ``impl`` (``clip``, ``__add__``) and
    ``function_aliases`` other ``hpcfsdp.*`` names bound to ``function`` (``arcsin``).

    A plain class with slots, not a dataclass: ``import hpcfsdp`` makes some 230 of them, and the
    dataclass decorator alone would cost about as much as all of them (compared by identity).
    """

    __slots__ = ("name", "family", "impl", "function", "functions", "inplace", "aliases", "function_aliases",
                 "sharding_rule", "gpu_kernel")

    def __init__(self, name: str, family: str, impl: Callable | None = None, function: Callable | None = None,
                 functions: tuple = (), inplace: bool = False, aliases: tuple = (), function_aliases: tuple = (),
                 sharding_rule: Any = None, gpu_kernel: Any = None):
        self.name = name
        self.family = family
        self.impl = impl
        self.function = function
        self.functions = functions
        self.inplace = inplace
        self.aliases = aliases
        self.function_aliases = function_aliases
        self.sharding_rule = sharding_rule  # DTensor: filled by hpcfsdp.distributed.tensor
        self.gpu_kernel = gpu_kernel  # a fused GPU kernel: filled by the GPU kernels

    @property
    def method(self):
        return self.impl is not None

    def __repr__(self):
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"Op({fields})"


OPS: dict[str, Op] = {}
_TENSOR: type | None = None  # hpcfsdp.Tensor, set by set_tensor_class
_METHOD_NAMES: dict[str, Op] = {}  # every Tensor method name (names and aliases) -> its entry
_FUNCTION_NAMES: dict[str, Op] = {}  # every hpcfsdp.* name (names and function aliases) -> its entry


def _method_as_function(name, impl, entry=None):
    """``hpcfsdp.<name>(input, ...)`` as ``input.<name>(...)``, with PyTorch's TypeError for a non-Tensor; the
    entry's body ``impl`` where input's class has no such method (a Tensor class made before the op was
    declared). A plain ``input`` with a DTensor among the other arguments goes to the dispatch hook (See
    [Note: Function dispatch])."""
    def f(input, *args, **kwargs):  # noqa: A002
        if not isinstance(input, _TENSOR):
            raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}")
        hook = _FUNCTION_DISPATCH
        if hook is not None and type(input) is _TENSOR and (args or kwargs):
            out = hook(entry, (input, *args), kwargs)
            if out is not NotImplemented:
                return out
        try:
            method = getattr(input, name)
        except AttributeError:
            return impl(input, *args, **kwargs)
        return method(*args, **kwargs)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"hp.{name}(input, ...) is input.{name}(...)."
    return f


def _claim(table, names, entry, kind):
    for n in names:
        if n in table:
            raise ValueError(f"op registry: {kind} {n!r} is declared twice ({table[n].family} and {entry.family})")
        table[n] = entry


def _register(entry):
    if entry.family not in FAMILIES:
        raise ValueError(f"op registry: unknown family {entry.family!r} for {entry.name!r}; one of {FAMILIES}")
    if entry.name in OPS:
        raise ValueError(f"op registry: op {entry.name!r} is declared twice ({OPS[entry.name].family} and "
                         f"{entry.family})")
    if entry.impl is not None:
        _claim(_METHOD_NAMES, (entry.name, *entry.aliases), entry, "Tensor method")
    if entry.function is not None:
        _claim(_FUNCTION_NAMES, (entry.name, *entry.function_aliases), entry, "hpcfsdp function")
    OPS[entry.name] = entry
    return entry


def op(family, *, name=None, functions=(), function=False, aliases=(), function_aliases=(), inplace=None):
    """Declare a Tensor method (the decorated function is its body, returned unchanged).

    ``function=True`` also makes ``hpcfsdp.<name>(input, ...)`` call the method; a callable is used as
    the ``hpcfsdp.<name>`` function where its arguments differ from the method's (``hp.pow(2, t)``).
    ``inplace`` defaults to whether the name is an in-place one: ends with ``_`` (``add_``) or is one of
    INPLACE_DUNDERS (``__iadd__``). ``name`` is required where the body has none of its own (a property).
    """
    def register(impl):
        n = name or impl.__name__
        entry = Op(n, family, impl, None, tuple(functions), _inplace_name(n) if inplace is None else inplace,
                   tuple(aliases), tuple(function_aliases))
        entry.function = _method_as_function(n, impl, entry) if function is True else (
            _dispatching(entry, function) if function else None)
        _register(entry)
        return impl
    return register


def function_op(family, *, name=None, functions=(), aliases=()):
    """Declare an ``hpcfsdp.*`` function that is not a Tensor method (``einsum``, ``meshgrid``, ``cat``)."""
    def register(fn):
        entry = Op(name or fn.__name__, family, None, None, tuple(functions), False, (), tuple(aliases))
        entry.function = _dispatching(entry, fn)
        _register(entry)
        return entry.function
    return register


def expose_functions(*names):
    """Give declared Tensor methods their ``hpcfsdp.<name>(input, ...)`` function after the fact (the in-place ops
    PyTorch also exposes as functions: ``torch.exp_(t)`` is ``t.exp_()``); an alias (``arccos_``) becomes a function
    alias of its entry."""
    for n in names:
        entry = _METHOD_NAMES[n]
        if entry.function is None:
            entry.function = _method_as_function(entry.name, entry.impl, entry)
        if n != entry.name:
            entry.function_aliases = (*entry.function_aliases, n)
        _claim(_FUNCTION_NAMES, (n,), entry, "hpcfsdp function")


# [Note: Function dispatch]
# A method's hpcfsdp.* function calls the method, so a Tensor subclass that overrides it (DTensor) is reached
# that way. A function written out (``hp.cat``, ``hp.where``, ``hp.pow(2, t)``) is wrapped instead: while a
# layer above has set a hook (hpcfsdp.distributed.tensor, when it is loaded), the hook sees the call first and
# returns its result, or NotImplemented for arguments it does not handle. Without a hook the wrapper costs one
# global read per call.
_FUNCTION_DISPATCH = None


def set_function_dispatch(hook):
    """Install ``hook(entry, args, kwargs)`` (or None) in front of every written-out hpcfsdp.* op function."""
    global _FUNCTION_DISPATCH
    _FUNCTION_DISPATCH = hook


def _dispatching(entry, fn):
    @functools.wraps(fn)
    def f(*args, **kwargs):
        hook = _FUNCTION_DISPATCH
        if hook is not None:
            out = hook(entry, args, kwargs)
            if out is not NotImplemented:
                return out
        return fn(*args, **kwargs)

    f.__hp_body__ = fn  # the undispatched function (rules compute with it on local tensors)
    return f


def lookup(name):
    """The entry of a Tensor method or ``hpcfsdp.*`` function name (aliases included); KeyError if none."""
    e = _METHOD_NAMES.get(name) or _FUNCTION_NAMES.get(name)
    if e is None:
        raise KeyError(f"no op named {name!r} in the registry")
    return e


def method_names():
    """Every Tensor method name the registry generates (aliases included)."""
    return dict(_METHOD_NAMES)


def mixin(family, cls_name=None):
    """The class holding ``family``'s Tensor methods (and their aliases), built from the registry; its module
    is the caller's (the family's method file)."""
    cls_name = cls_name or f"{family.capitalize()}Mixin"
    attrs = {"__slots__": (), "__doc__": f"Tensor's {family} methods, generated from the op registry.",
             "__module__": sys._getframe(1).f_globals.get("__name__", __name__), "__qualname__": cls_name}
    for n, e in _METHOD_NAMES.items():
        if e.family == family:
            attrs[n] = e.impl
    return type(cls_name, (), attrs)


def top_level():
    """``{name: function}`` for every ``hpcfsdp.*`` op function (aliases included)."""
    return {n: e.function for n, e in _FUNCTION_NAMES.items()}


def set_tensor_class(cls):
    """hpcfsdp/_tensor.py names its Tensor class once defined: the generated functions check against it."""
    global _TENSOR
    _TENSOR = cls


def tensor_class():
    """hpcfsdp.Tensor, for the method files (below hpcfsdp/_tensor.py) where a function has no tensor at hand to
    make its result from (``hp.normal(0.0, 1.0, size)``); None until set_tensor_class."""
    return _TENSOR
