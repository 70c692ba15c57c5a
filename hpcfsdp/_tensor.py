"""Tensor: an array (NumPy, CuPy or meta) plus autograd fields; math is delegated to autograd ops."""
import builtins
import weakref

import numpy as np

from . import _backend
from ._backend import bfloat16, float16, float32

__all__ = ["Tensor", "promote_types", "result_type_scalar"]

_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}


def _category(dt):
    return 2 if dt == bfloat16 else _CATEGORY[dt.kind]


def promote_types(da, db, a_scalar_like=False, b_scalar_like=False):
    """PyTorch's promotion for two tensors; a 0-d tensor does not raise the dtype within its category."""
    if da == db:
        return da
    ca, cb = _category(da), _category(db)
    if ca != cb:
        return da if ca > cb else db
    if a_scalar_like != b_scalar_like:
        return db if a_scalar_like else da
    if ca == 2:
        if {da, db} == {float16, bfloat16}:
            return float32
        return da if da.itemsize >= db.itemsize else db
    return np.result_type(da, db)


def result_type_scalar(dt, s):
    """Dtype of (tensor of dtype dt) op (Python scalar s), as PyTorch."""
    if isinstance(s, (bool, np.bool_)):
        return dt
    if isinstance(s, (int, np.integer)):
        return _backend.int64 if dt.kind == "b" else dt
    if isinstance(s, (float, np.floating)):
        return dt if _category(dt) == 2 else float32
    raise TypeError(f"unsupported scalar {s!r} of type {type(s).__name__}; expected bool, int or float")


_SCALARS = (int, float, bool, np.number, np.bool_)


class _MinMax(tuple):
    """(values, indices) result of max(dim)/min(dim), as torch.return_types."""

    __slots__ = ()

    def __new__(cls, values, indices):
        return super().__new__(cls, (values, indices))

    values = property(lambda self: self[0])
    indices = property(lambda self: self[1])


class Tensor:
    """An n-dimensional array on a device with autograd support (PyTorch's torch.Tensor).

    Storage is ``_data`` (a NumPy, CuPy or meta array). Library code builds tensors from arrays with
    ``Tensor._wrap(array)`` (no copy). ``Tensor(data)`` copies data like ``hp.tensor``.
    """

    # class-level defaults keep Tensor._wrap cheap; instances set what differs
    _requires_grad = False
    _grad = None
    grad_fn = None
    _output_nr = 0
    _hooks = None
    _post_acc_hooks = None
    _accum_ref = None
    _hp_storage_swaps = False  # FSDP's unsharded parameters: see [Note: Swappable storage]
    __array_priority__ = 1000  # numpy scalars/arrays on the left defer to Tensor's reflected ops

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        if not args and not kwargs:
            self._data = np.empty((0,), dtype=float32)
        elif len(args) == 1 and not isinstance(args[0], int):
            from ._creation import _as_array

            # torch.Tensor(data) is a FloatTensor whatever the data's type
            self._data = _as_array(args[0], kwargs.get("dtype") or float32, kwargs.get("device"), copy=True)
        else:
            from ._creation import _parse_shape

            dev = _backend.to_device(kwargs.get("device"))
            self._data = _new_array(dev, _parse_shape(args), kwargs.get("dtype") or float32, "empty")
        return self

    @classmethod
    def _wrap(cls, array, requires_grad=False):
        """A Tensor over ``array`` (no copy)."""
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

    # -- autograd fields ---------------------------------------------------------------------------
    def _set_grad_fn(self, node, nr):
        self.grad_fn = node
        self._output_nr = nr
        self._requires_grad = True

    def _accumulate_node(self):
        from .autograd.function import AccumulateGrad

        node = self._accum_ref() if self._accum_ref is not None else None
        if node is None:
            node = AccumulateGrad(self)
            self._accum_ref = weakref.ref(node)
        return node

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        value = bool(value)
        if self.grad_fn is not None:
            if value:
                return
            raise RuntimeError("you can only change requires_grad flags of leaf variables; use detach()")
        if value and _category(self._data.dtype) != 2:
            raise RuntimeError(f"only Tensors of floating point dtype can require gradients, got {self.dtype}")
        self._requires_grad = value

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad must be a Tensor or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"assigned grad has shape {value.shape} but the tensor has shape {self.shape}")
            if value.dtype != self.dtype:
                raise RuntimeError(f"assigned grad has dtype {value.dtype} but the tensor has dtype {self.dtype}")
        self._grad = value

    @property
    def data(self):
        return Tensor._wrap(self._data)

    @data.setter
    def data(self, other):
        self._data = other._data if isinstance(other, Tensor) else other

    def detach(self):
        return Tensor._wrap(self._data)

    def detach_(self):
        self.grad_fn = None
        self._requires_grad = False
        return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from .autograd.engine import backward

        backward((self,), None if gradient is None else (gradient,), retain_graph, create_graph, inputs)

    def register_hook(self, hook):
        """hook(grad) -> Tensor or None, run when this tensor's gradient is computed."""
        from .autograd.function import RemovableHandle, _HookDict

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
        from .autograd.function import RemovableHandle, _HookDict

        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._post_acc_hooks is None:
            self._post_acc_hooks = _HookDict()
        h = RemovableHandle(self._post_acc_hooks)
        self._post_acc_hooks[h.id] = hook
        return h

    def retain_grad(self):
        if self.grad_fn is None:
            if not self.requires_grad:
                raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
            return
        node = self.grad_fn
        if node._retain is None:
            node._retain = {}
        node._retain[self._output_nr] = weakref.ref(self)

    @property
    def retains_grad(self):
        node = self.grad_fn
        return node is not None and bool(node._retain) and self._output_nr in node._retain

    # -- metadata ----------------------------------------------------------------------------------
    @property
    def shape(self):
        return Size(self._data.shape)

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def device(self):
        return _backend.device_of_array(self._data)

    @property
    def is_cuda(self):
        return _backend.is_cupy_array(self._data)

    @property
    def is_meta(self):
        return _backend.is_meta_array(self._data)

    @property
    def ndim(self):
        return self._data.ndim

    @property
    def is_floating_point_(self):
        return _category(self._data.dtype) == 2

    def is_floating_point(self):
        return _category(self._data.dtype) == 2

    def _xp(self):
        return _backend.array_module(self._data)

    def size(self, dim=None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_wrap_dim(dim, self._data.ndim)]

    def dim(self):
        return self._data.ndim

    def numel(self):
        return builtins.int(self._data.size)

    nelement = numel

    def element_size(self):
        return self._data.dtype.itemsize

    @property
    def itemsize(self):
        return self._data.dtype.itemsize

    @property
    def nbytes(self):
        return builtins.int(self._data.size) * self._data.dtype.itemsize

    def data_ptr(self):
        if _backend.is_cupy_array(self._data):
            return self._data.data.ptr
        return self._data.__array_interface__["data"][0]

    def is_contiguous(self):
        return builtins.bool(self._data.flags.c_contiguous)

    def stride(self, dim=None):
        st = tuple(s // self._data.dtype.itemsize for s in self._data.strides)
        return st if dim is None else st[_wrap_dim(dim, self._data.ndim)]

    def storage_offset(self):
        return 0

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __hash__(self):
        return id(self)

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self._data.size} values is ambiguous")
        return builtins.bool(self.item())

    def __float__(self):
        return builtins.float(self.item())

    def __int__(self):
        return builtins.int(self.item())

    def __index__(self):
        if _category(self._data.dtype) == 2 or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return builtins.int(self.item())

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted to Scalar")
        v = _backend.to_numpy(self._data).reshape(()).item()
        if self._data.dtype in (bfloat16,):
            v = builtins.float(v)
        return v

    def tolist(self):
        a = _backend.to_numpy(self._data)
        if a.dtype == bfloat16:
            a = a.astype(np.float32)
        return a.tolist()

    def numpy(self, *, force=False):
        """The host ndarray (shares memory on cpu)."""
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self.is_meta:
            raise RuntimeError("Can't call numpy() on a meta tensor: it holds no data")
        if _backend.is_cupy_array(self._data):
            if not force:
                raise TypeError("can't convert cuda tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
            return self._data.get()
        return self._data

    def __array__(self, dtype=None, copy=None):
        if _backend.is_cupy_array(self._data):
            raise TypeError("can't convert cuda tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")
        if self.is_meta:
            raise RuntimeError("a meta tensor holds no data")
        a = self._data
        if dtype is not None and a.dtype != dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __dlpack__(self, *args, **kwargs):
        if self.requires_grad:
            raise RuntimeError("Can't export a tensor that requires grad via DLPack; use detach() first")
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __repr__(self):
        if self.is_meta:
            body = f"..., size={tuple(self.shape)}"
        else:
            a = _backend.to_numpy(self._data)
            if a.dtype == bfloat16:
                a = a.astype(np.float32)
            body = np.array2string(a, separator=", ", prefix="tensor(", precision=4, floatmode="maxprec_equal")
        extras = []
        dev = self.device
        if dev.type != "cpu":
            extras.append(f"device='{dev}'")
        if self._data.dtype not in (float32, _backend.int64, _backend.bool):
            extras.append(f"dtype={_dtype_name(self._data.dtype)}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    __str__ = __repr__

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
        from .autograd import ops

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

    def __deepcopy__(self, memo):
        if self.grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment")
        if id(self) in memo:
            return memo[id(self)]
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k in ("_hooks", "_post_acc_hooks", "_accum_ref"):
                continue  # hooks and the graph node belong to the original
            if k == "_data":
                new._data = v if _backend.is_meta_array(v) else v.copy()
            else:
                new.__dict__[k] = copy.deepcopy(v, memo)
        return new

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        from ._creation import tensor

        return tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def _new(self, size, dtype, device, requires_grad, kind):
        from ._creation import _parse_shape

        shape = _parse_shape(size if isinstance(size, tuple) else (size,))
        dt = _backend.to_dtype(dtype) if dtype is not None else self._data.dtype
        dev = _backend.to_device(device) if device is not None else self.device
        return Tensor._wrap(_new_array(dev, shape, dt, kind), requires_grad)


class Size(tuple):
    """torch.Size: a tuple of ints with numel()."""

    __slots__ = ()

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"hp.Size({list(self)})"


_TYPE_NAMES = {float32: "hp.FloatTensor", _backend.float64: "hp.DoubleTensor", float16: "hp.HalfTensor",
               bfloat16: "hp.BFloat16Tensor", _backend.int64: "hp.LongTensor", _backend.int32: "hp.IntTensor",
               _backend.bool: "hp.BoolTensor", _backend.uint8: "hp.ByteTensor"}


def _dtype_name(dt):
    return "hp." + ("bfloat16" if dt == bfloat16 else str(dt))


def _wrap_dim(dim, ndim):
    if not isinstance(dim, (builtins.int, np.integer)):
        raise TypeError(f"dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return builtins.int(dim) % n


def _new_array(dev, shape, dtype, kind):
    """A fresh array on dev: kind is 'empty', 'zeros' or 'ones' (meta: no memory)."""
    dtype = _backend.to_dtype(dtype)
    if dev.type == "meta":
        return _backend.meta_array(shape, dtype)
    xp = _backend.array_module(dev)
    if xp is np:
        return getattr(np, kind)(shape, dtype=dtype)
    with xp.cuda.Device(dev.index):
        return getattr(xp, kind)(shape, dtype=dtype)


def _check_inplace(t):
    """In-place writes are not recorded; refuse them where autograd would be silently wrong."""
    if is_grad_enabled() and t._requires_grad:
        if t.grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
        raise RuntimeError("in-place operation on a tensor that is part of an autograd graph is not supported "
                           "by hpcfsdp; use the out-of-place operation or run it under hp.no_grad()")


# Imported last: autograd's modules import Tensor from here. Methods for math, shape and in-place ops
# are attached by _tensor_math (keeps this file small).
from .autograd.grad_mode import is_grad_enabled  # noqa: E402
from . import _tensor_math  # noqa: E402,F401
