"""Tensor: TensorBase plus the math, shape, in-place and extra mixins and the methods that build the autograd graph."""
import builtins
import weakref

import numpy as np

from . import _backend
from ._array import new_array, promote_types, result_type_scalar
from ._backend import bfloat16, float16, float32
from ._tensor_base import Size, TensorBase, as_array, parse_shape
from ._tensor_extra import TensorExtraMixin
from ._tensor_inplace import TensorInplaceMixin
from ._tensor_math import TensorMathMixin
from ._tensor_more import TensorMoreMixin
from ._tensor_shape import TensorShapeMixin
from .autograd import engine, ops
from .autograd.function import AccumulateGrad, RemovableHandle, _HookDict

__all__ = ["Tensor", "Size", "promote_types", "result_type_scalar"]


# [Note: Tensor and Function]
# Tensor and the autograd graph need each other: Tensor's methods apply Functions (the ops, through the
# mixins), register hooks and make AccumulateGrad nodes (autograd/function.py), and Function.apply wraps
# its outputs in Tensors. That is the one import cycle of the package, as in PyTorch and tinygrad:
# this module imports autograd/function.py, and autograd/function.py imports this module. Everything
# else is layered below or above the pair: _array.py (array and dtype helpers) and _tensor_base.py
# (TensorBase) are below both; the ops import only those and function.py; the engine imports TensorBase
# and function.py and makes tensors through the ones it is given (``t._wrap(array)`` is always a plain
# Tensor); the mixins import the ops; this module combines the mixins; _creation.py is above it.
# Load order: hpcfsdp/__init__.py imports _creation.py, hence this module, before autograd. The mixins
# load the ops and function.py while Tensor is not yet defined, so function.py imports this module as a
# module object and reads ``_tensor.Tensor`` only when called. tests/test_layering.py checks that no
# other cycle exists (See [Note: Import cycles] there).
class Tensor(TensorBase, TensorMathMixin, TensorShapeMixin, TensorInplaceMixin, TensorExtraMixin, TensorMoreMixin):
    """An n-dimensional array on a device with autograd support (PyTorch's torch.Tensor).

    Storage is ``_data`` (a NumPy, CuPy or meta array). Library code builds tensors from arrays with
    ``Tensor._wrap(array)`` (no copy). ``Tensor(data)`` copies data like ``hp.tensor``.
    """

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        if not args and not kwargs:
            self._data = np.empty((0,), dtype=float32)
        elif len(args) == 1 and not isinstance(args[0], int):
            # torch.Tensor(data) is a FloatTensor whatever the data's type
            self._data = as_array(args[0], kwargs.get("dtype") or float32, kwargs.get("device"), copy=True)
        else:
            dev = _backend.to_device(kwargs.get("device"))
            self._data = new_array(dev, parse_shape(args), kwargs.get("dtype") or float32, "empty")
        return self

    @classmethod
    def _wrap(cls, array, requires_grad=False):
        """A plain Tensor over ``array`` (no copy), whichever class or instance it is called on."""
        t = object.__new__(Tensor)
        t._data = np.asarray(array) if isinstance(array, np.generic) else array  # NumPy scalars -> 0-d arrays
        if requires_grad:
            t.requires_grad = True
        return t

    @staticmethod
    def _make_subclass(cls, data, require_grad=False):
        """An instance of Tensor subclass ``cls`` sharing ``data``'s array (PyTorch's helper)."""
        t = object.__new__(cls)
        t._data = data._data if isinstance(data, Tensor) else data
        t.requires_grad = require_grad
        return t

    # -- graph -------------------------------------------------------------------------------------
    def _accumulate_node(self):
        node = self._accum_ref() if self._accum_ref is not None else None
        if node is None:
            node = AccumulateGrad(self)
            self._accum_ref = weakref.ref(node)
        return node

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        engine.backward((self,), None if gradient is None else (gradient,), retain_graph, create_graph, inputs)

    def register_hook(self, hook):
        """hook(grad) -> Tensor or None, run when this tensor's gradient is computed."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is None:
            if self._hooks is None:
                self._hooks = _HookDict()
            d = self._hooks
        else:
            node = self.grad_fn
            if node._tensor_hooks is None:
                node._tensor_hooks = {}
            d = node._tensor_hooks.setdefault(self._output_nr, _HookDict())
        h = RemovableHandle(d)
        d[h.id] = hook
        return h

    def register_post_accumulate_grad_hook(self, hook):
        """hook(tensor), run after this leaf's ``.grad`` was updated by backward."""
        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._post_acc_hooks is None:
            self._post_acc_hooks = _HookDict()
        h = RemovableHandle(self._post_acc_hooks)
        self._post_acc_hooks[h.id] = hook
        return h

    # -- device / dtype conversion -----------------------------------------------------------------
    def to(self, *args, **kwargs):
        """to(device=None, dtype=None, non_blocking=False, copy=False), to(dtype), to(device, dtype), to(tensor)."""
        dev = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        copy = kwargs.pop("copy", False)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dev, dtype = a.device, a.dtype
            elif isinstance(a, (_backend.device, str)) and not (isinstance(a, str) and a in _backend._NAMES):
                dev = a
            elif a is None:
                continue
            else:
                dtype = a
        out = self
        if dtype is not None:
            dtype = _backend.to_dtype(dtype)
            if dtype != self._data.dtype:
                out = ops.Cast.apply(out, dtype)
        if dev is not None:
            dev = _backend.to_device(dev)
            if dev != self.device:
                out = ops.ToDevice.apply(out, dev)
        if copy and out is self:
            out = self.clone()
        return out

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None, non_blocking=False):
        return self.to(_backend.device("cuda", device) if isinstance(device, builtins.int) else (device or "cuda"))

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(_backend.float64)

    def half(self):
        return self.to(float16)

    def bfloat16(self):
        return self.to(bfloat16)

    def long(self):
        return self.to(_backend.int64)

    def int(self):
        return self.to(_backend.int32)

    def bool(self):
        return self.to(_backend.bool)

    def type_as(self, other):
        return self.to(other.dtype)

    def type(self, dtype=None):
        if dtype is None:
            return _TYPE_NAMES.get(self._data.dtype, str(self._data.dtype))
        return self.to(dtype)

    def new_empty(self, size, *, dtype=None, device=None, requires_grad=False):
        return self._new(size, dtype, device, requires_grad, "empty")

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        return self._new(size, dtype, device, requires_grad, "zeros")

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return self._new(size, dtype, device, requires_grad, "ones")

    def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad=False):
        t = self._new(size, dtype, device, requires_grad, "empty")
        if not t.is_meta:
            t._data[...] = fill_value
        return t

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        array = as_array(data, dtype or self.dtype, device or self.device, copy=True)
        return Tensor._wrap(array, requires_grad)

    def _new(self, size, dtype, device, requires_grad, kind):
        shape = parse_shape(size if isinstance(size, tuple) else (size,))
        dt = _backend.to_dtype(dtype) if dtype is not None else self._data.dtype
        dev = _backend.to_device(device) if device is not None else self.device
        return Tensor._wrap(new_array(dev, shape, dt, kind), requires_grad)


_TYPE_NAMES = {float32: "hp.FloatTensor", _backend.float64: "hp.DoubleTensor", float16: "hp.HalfTensor",
               bfloat16: "hp.BFloat16Tensor", _backend.int64: "hp.LongTensor", _backend.int32: "hp.IntTensor",
               _backend.bool: "hp.BoolTensor", _backend.uint8: "hp.ByteTensor"}
