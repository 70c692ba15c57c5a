"""TensorBase: a Tensor's storage, autograd fields, metadata and host conversions (no math, no graph)."""
import builtins
import copy
import weakref

import numpy as np

from . import _backend
from ._printing import format_array
from ._array import dtype_category, wrap_dim
from ._backend import bfloat16, int64

__all__ = ["TensorBase", "Size", "as_array", "broadcast_shapes", "parse_shape"]


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


class TensorBase:
    """The part of Tensor that needs neither ops nor the graph (PyTorch's ``torch._C.TensorBase``).

    Storage is ``_data`` (a NumPy, CuPy or meta array). Never instantiated alone: ``Tensor`` adds the
    op families' mixins (hpcfsdp/_tensor_methods/) and the graph-facing methods, among them ``_wrap``, which
    code below ``Tensor`` reaches through a tensor it holds (``self._wrap(array)`` is always a plain Tensor).
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

    # -- autograd fields ---------------------------------------------------------------------------
    def _set_grad_fn(self, node, nr):
        self.grad_fn = node
        self._output_nr = nr
        self._requires_grad = True

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
        if value and dtype_category(self._data.dtype) != 2:
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
            if not isinstance(value, TensorBase):
                raise TypeError(f"assigned grad must be a Tensor or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"assigned grad has shape {value.shape} but the tensor has shape {self.shape}")
            if value.dtype != self.dtype:
                raise RuntimeError(f"assigned grad has dtype {value.dtype} but the tensor has dtype {self.dtype}")
        self._grad = value

    @property
    def data(self):
        return self._wrap(self._data)

    @data.setter
    def data(self, other):
        self._data = other._data if isinstance(other, TensorBase) else other

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
    def is_cpu(self):
        return self.device.type == "cpu"

    @property
    def is_meta(self):
        return _backend.is_meta_array(self._data)

    @property
    def ndim(self):
        return self._data.ndim

    @property
    def is_floating_point_(self):
        return dtype_category(self._data.dtype) == 2

    def is_floating_point(self):
        return dtype_category(self._data.dtype) == 2

    def _xp(self):
        return _backend.array_module(self._data)

    def size(self, dim=None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[wrap_dim(dim, self._data.ndim)]

    def dim(self):
        return self._data.ndim

    ndimension = dim

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
        return st if dim is None else st[wrap_dim(dim, self._data.ndim)]

    def storage_offset(self):
        return 0

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

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
        if dtype_category(self._data.dtype) == 2 or self._data.size != 1:
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

    def __format__(self, format_spec):
        """A 0-dim tensor formats as its Python number (f"{loss:.4f}"), as PyTorch's; others as objects."""
        if self.ndim == 0 and not self.is_meta:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self):
        if self.is_meta:
            body = f"..., size={tuple(self.shape)}"
        else:
            a = _backend.to_numpy(self._data)
            if a.dtype == bfloat16:
                a = a.astype(np.float32)
            body = format_array(a, "tensor(")
        extras = []
        dev = self.device
        if dev.type != "cpu":
            extras.append(f"device='{dev}'")
        if self._data.dtype not in (_backend.default_float_dtype(), _backend.int64, _backend.bool):
            extras.append(f"dtype={_dtype_name(self._data.dtype)}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    __str__ = __repr__

    def __deepcopy__(self, memo):
        if self.grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment")
        if id(self) in memo:
            return memo[id(self)]
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            if k in ("_hooks", "_post_acc_hooks", "_accum_ref", "_hp_fsdp_orig_uid"):
                continue  # hooks, the graph node and fully_shard's name for the object belong to the original
            if k == "_data":
                new._data = v if _backend.is_meta_array(v) else v.copy()
            else:
                new.__dict__[k] = copy.deepcopy(v, memo)
        return new


def _dtype_name(dt):
    return "hp." + ("bfloat16" if dt == bfloat16 else str(dt))


# -- arrays from Python data -------------------------------------------------------------------------------
def parse_shape(size):
    """A shape tuple from sizes given as ints, a tuple/list of ints, or 1-element integer tensors."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, TensorBase):
            s = s.item()
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise TypeError(f"size must be a sequence of ints, got {s!r} in {size!r}")
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
        out.append(int(s))
    return tuple(out)


def broadcast_shapes(*shapes):
    """The shape that tensors of ``shapes`` broadcast to (RuntimeError if they do not)."""
    try:
        return Size(np.broadcast_shapes(*((s,) if isinstance(s, int) else tuple(s) for s in shapes)))
    except ValueError:
        raise RuntimeError(f"Shape mismatch: objects cannot be broadcast to a single shape: "
                           f"{[list(s) if not isinstance(s, int) else s for s in shapes]}") from None


def _infer_dtype(a):
    """PyTorch's dtype for Python data (floats -> float32, ints -> int64) or an unsupported array dtype."""
    k = a.dtype.kind
    if k == "f":
        return _backend.default_float_dtype() if a.dtype.itemsize >= 4 else _backend.float16
    if k in "iu":
        return int64
    if k == "b":
        return _backend.bool
    raise TypeError(f"can't convert data of dtype {a.dtype} to a tensor; supported: "
                    f"{sorted(str(d) for d in _backend._SUPPORTED)}")


def as_array(data, dtype, device, copy):
    """An array of ``data`` (Python numbers/lists, NumPy/CuPy arrays, Tensors) with PyTorch's dtype rules."""
    dev = _backend.to_device(device)
    dt = _backend.to_dtype(dtype) if dtype is not None else None
    if isinstance(data, TensorBase):
        data = data._data
    if dev.type == "meta":
        a = np.asarray(data) if not hasattr(data, "shape") else data
        return _backend.meta_array(a.shape, dt or _infer_dtype(np.asarray(np.zeros((), a.dtype))))
    xp = _backend.array_module(dev)
    if isinstance(data, np.ndarray) or _backend.is_cupy_array(data):
        a = data  # arrays keep their dtype (torch.tensor(np.float64 array) is float64)
        if dt is None:
            dt = a.dtype if a.dtype in _backend._SUPPORTED else _infer_dtype(a)
    else:
        a = np.asarray(_listify(data))
        if a.dtype == object:
            raise TypeError(f"could not build a tensor from {type(data).__name__} data")
        if dt is None:
            dt = _infer_dtype(a)
    if dt.kind not in "fiub" and dt != _backend.bfloat16:
        raise TypeError(f"unsupported dtype {dt}")
    if xp is np:
        a = _backend.to_numpy(a)
        return np.array(a, dtype=dt, copy=True) if copy else np.asarray(a, dtype=dt)
    with xp.cuda.Device(dev.index):
        return xp.array(a, dtype=dt, copy=copy)


def _listify(data):
    if isinstance(data, (list, tuple)):
        return [_listify(d) for d in data]
    if isinstance(data, TensorBase):
        return _backend.to_numpy(data._data)
    return data
