"""Parameter and Buffer: Tensors that a Module registers, on assignment, as a learnable weight or as a buffer
(``torch.nn.Parameter`` / ``torch.nn.Buffer`` semantics)."""
import copy

from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor

__all__ = ["Buffer", "Parameter"]


# Per-instance autograd fields of Tensor (class attributes hold their defaults): dropping them from an
# instance dict makes it a fresh leaf with no grad, no graph and no hooks.
_AUTOGRAD_FIELDS = ("_requires_grad", "_grad", "grad_fn", "_output_nr", "_hooks", "_post_acc_hooks", "_accum_ref")


# [Note: Parameter of a Tensor subclass]
# ``Parameter(t)`` shares ``t``'s storage (``_data``) and is a fresh leaf. When ``t`` is an instance of a
# Tensor subclass (DTensor: a local shard plus a sharding spec), the result must stay an instance of
# that subclass, so that code testing ``isinstance(p, DTensor)`` and DTensor methods keep working on
# module parameters. As PyTorch does for tensor subclasses, we build (and cache) one class per subclass,
# ``Parameter<Sub>(Parameter, Sub)``, and copy the instance fields of ``t`` into the new object; then
# clear the autograd fields so the result is a leaf that does not share ``t``'s graph or grad.
_SUBCLASS_CACHE = {}


def _parameter_class_for(sub):
    if sub is Tensor or issubclass(sub, Parameter):
        return Parameter if sub is Tensor else sub
    cls = _SUBCLASS_CACHE.get(sub)
    if cls is None:
        cls = type("Parameter" + sub.__name__, (Parameter, sub), {"__module__": Parameter.__module__})
        _SUBCLASS_CACHE[sub] = cls
    return cls


class Parameter(Tensor):
    """A Tensor registered as a module parameter; ``requires_grad=True`` by default.

    ``Parameter(data)`` shares ``data``'s storage; it does not copy.
    """

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            import hpcfsdp

            data = hpcfsdp.empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter expects an hpcfsdp Tensor as data, got {type(data).__name__}")
        base = type(data)
        if issubclass(base, Parameter):  # Parameter(param): find the underlying tensor class
            base = next(c for c in base.__mro__ if issubclass(c, Tensor) and not issubclass(c, Parameter))
        target = cls if cls is not Parameter else _parameter_class_for(base)
        obj = object.__new__(target)
        if base is Tensor:
            obj._data = data._data
        else:
            obj.__dict__.update(data.__dict__)
            for name in _AUTOGRAD_FIELDS:
                obj.__dict__.pop(name, None)
        obj.requires_grad = requires_grad
        return obj

    def __init__(self, *args, **kwargs):  # all work is done in __new__
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = object.__new__(type(self))
        memo[id(self)] = result
        for name, value in self.__dict__.items():
            if name in _AUTOGRAD_FIELDS:
                continue
            if name == "_data":
                # meta storage is read-only and shape-only: share it instead of materialising a copy
                result._data = value if _backend.is_meta_array(value) else value.copy()
            else:
                result.__dict__[name] = copy.deepcopy(value, memo)
        result.requires_grad = self.requires_grad
        return result


class _BufferMeta(type):
    """``isinstance(t, Buffer)`` is True for any tensor marked as a buffer (``Buffer(t)`` returns a plain Tensor)."""

    def __instancecheck__(cls, instance):
        if cls is Buffer and isinstance(instance, Tensor) and getattr(instance, "_is_buffer", False):
            return True
        return super().__instancecheck__(instance)


class Buffer(Tensor, metaclass=_BufferMeta):
    """A tensor that a Module registers as a buffer when assigned as its attribute (``m.running = Buffer(t)``),
    persistent (in ``state_dict``) unless ``persistent=False``. ``Buffer(t)`` returns ``t.detach()`` (keeping its
    ``requires_grad``) marked with ``persistent`` and ``_is_buffer``, as PyTorch's."""

    def __new__(cls, data=None, *, persistent=True):
        if data is None:
            import hpcfsdp

            data = hpcfsdp.empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Buffer expects an hpcfsdp Tensor as data, got {type(data).__name__}")
        t = data.detach().requires_grad_(data.requires_grad)
        t.persistent = persistent
        t._is_buffer = True
        return t
