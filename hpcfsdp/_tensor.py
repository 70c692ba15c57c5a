"""Tensor: TensorBase plus the op families' mixins (hpcfsdp/_tensor_methods/, generated from the op registry) and the
methods that build the autograd graph (backward, hooks, _wrap, _make_subclass)."""
import weakref

import numpy as np

from . import _backend
from ._array import new_array, promote_types, result_type_scalar
from ._registry import set_tensor_class
from ._tensor_base import Size, TensorBase, as_array, parse_shape
from ._tensor_methods import MIXINS
from .autograd import engine
from .autograd.function import AccumulateGrad, RemovableHandle, _HookDict

__all__ = ["Tensor", "Size", "promote_types", "result_type_scalar"]


# [Note: Tensor and Function]
# Tensor and the autograd graph need each other: Tensor's methods apply Functions (the ops, through the
# mixins), register hooks and make AccumulateGrad nodes (autograd/function.py), and Function.apply wraps
# its outputs in Tensors. That is the one import cycle of the package, as in PyTorch and tinygrad:
# this module imports autograd/function.py, and autograd/function.py imports this module. Everything
# else is layered below or above the pair: _array.py (array and dtype helpers), _tensor_base.py
# (TensorBase) and _registry.py (the op table) are below both; the ops import only those and function.py;
# the engine imports TensorBase and function.py and makes tensors through the ones it is given
# (``t._wrap(array)`` is always a plain Tensor); the family files of _tensor_methods/ import the ops and
# register the methods, each family's mixin generated from the registry; this module combines the mixins
# and names Tensor to the registry (set_tensor_class: the generated hpcfsdp.* functions check against it,
# and functions of the family files with no tensor at hand make theirs through it); _creation.py is above it.
# Load order: hpcfsdp/__init__.py imports _creation.py, hence this module, before autograd. The family
# files load the ops and function.py while Tensor is not yet defined, so function.py imports this module
# as a module object and reads ``_tensor.Tensor`` only when called. tests/test_layering.py checks that no
# other cycle exists (See [Note: Import cycles] there).
class Tensor(TensorBase, *MIXINS):
    """An n-dimensional array on a device with autograd support (PyTorch's torch.Tensor).

    Storage is ``_data`` (a NumPy, CuPy or meta array). Library code builds tensors from arrays with
    ``Tensor._wrap(array)`` (no copy). ``Tensor(data)`` copies data like ``hp.tensor``.
    """

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        if not args and not kwargs:
            self._data = np.empty((0,), dtype=_backend.default_float_dtype())
        elif len(args) == 1 and not isinstance(args[0], int):
            # torch.Tensor(data) is a FloatTensor whatever the data's type
            self._data = as_array(args[0], kwargs.get("dtype") or _backend.default_float_dtype(), kwargs.get("device"), copy=True)
        else:
            dev = _backend.to_device(kwargs.get("device"))
            self._data = new_array(dev, parse_shape(args), kwargs.get("dtype") or _backend.default_float_dtype(), "empty")
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


set_tensor_class(Tensor)
