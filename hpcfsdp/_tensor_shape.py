"""TensorShapeMixin: Tensor's shape ops and indexing (views where NumPy/CuPy give them)."""
import builtins

import numpy as np

from . import _backend
from ._array import wrap_dim
from ._tensor_base import TensorBase
from ._tensor_inplace import check_inplace
from .autograd import ops
from .autograd.grad_mode import is_grad_enabled

__all__ = ["TensorShapeMixin"]


def _shape_args(args):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(int(a) for a in args)


def _infer_shape(shape, numel, src_shape):
    if shape.count(-1) > 1:
        raise RuntimeError(f"only one dimension can be inferred in shape {list(shape)}")
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    n = 1
    for s in shape:
        n *= s
    if n != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel} (shape {list(src_shape)})")
    return shape


def _index_arg(i, xp):
    if isinstance(i, TensorBase):
        a = i._data
    elif isinstance(i, (list,)):
        a = np.asarray(i)
        if a.dtype.kind == "f":
            raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got list of {a.dtype}")
        return xp.asarray(a) if xp is not np else a
    elif isinstance(i, np.ndarray) or _backend.is_cupy_array(i):
        a = i
    else:
        return i
    if a.dtype.kind not in "biu":
        raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors, got {a.dtype}")
    if a.dtype == np.uint8:
        a = a.astype(bool)
    return a


def _normalize_index(self, idx):
    xp = self._xp()
    if isinstance(idx, tuple):
        return tuple(_index_arg(i, xp) for i in idx)
    return _index_arg(idx, xp)


class TensorShapeMixin:
    """Shape, view and indexing methods of Tensor; each records its op for autograd."""

    # -- shape ops -------------------------------------------------------------------------------------
    def reshape(self, *shape):
        shape = _infer_shape(_shape_args(shape), self._data.size, self._data.shape)
        if shape == self._data.shape:
            return ops.Reshape.apply(self, shape) if self.requires_grad else self._wrap(self._data)
        return ops.Reshape.apply(self, shape)

    def view(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list, np.integer)):
            dt = _backend.to_dtype(shape[0])  # view(dtype): reinterpret the bytes
            return self._wrap(self._data.view(dt))
        shape = _infer_shape(_shape_args(shape), self._data.size, self._data.shape)
        if not _backend.is_meta_array(self._data):
            try:
                a = self._data.view()
                a.shape = shape  # raises if a copy would be needed
            except AttributeError:
                raise RuntimeError(f"view size is not compatible with input tensor's size and stride "
                                   f"(shape {list(self.shape)} to {list(shape)}); use .reshape(...) instead") from None
        return ops.Reshape.apply(self, shape)

    def view_as(self, other):
        return self.view(other.shape)

    def reshape_as(self, other):
        return self.reshape(other.shape)

    def flatten(self, start_dim=0, end_dim=-1):
        if self.ndim == 0:
            return self.reshape(1)
        s, e = wrap_dim(start_dim, self.ndim), wrap_dim(end_dim, self.ndim)
        shp = self._data.shape
        return self.reshape(shp[:s] + (-1,) + shp[e + 1:]) if s <= e else self

    def unflatten(self, dim, sizes):
        d = wrap_dim(dim, self.ndim)
        shp = self._data.shape
        return self.reshape(shp[:d] + tuple(sizes) + shp[d + 1:])

    def permute(self, *dims):
        dims = _shape_args(dims)
        if len(dims) != self.ndim:
            raise RuntimeError(f"permute: number of dims {len(dims)} doesn't match the tensor's {self.ndim}")
        return ops.Permute.apply(self, tuple(wrap_dim(d, self.ndim) for d in dims))

    def transpose(self, dim0, dim1):
        n = self.ndim
        if n < 2 and dim0 in (0, -1) and dim1 in (0, -1):
            return ops.Reshape.apply(self, self._data.shape)
        d0, d1 = wrap_dim(dim0, n), wrap_dim(dim1, n)
        perm = list(range(n))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return ops.Permute.apply(self, tuple(perm))

    swapaxes = transpose

    def t(self):
        if self.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
        return self.transpose(0, 1) if self.ndim == 2 else self

    T = property(lambda self: self.permute(*reversed(range(self.ndim))))
    mT = property(lambda self: self.transpose(-2, -1))

    def unsqueeze(self, dim):
        d = wrap_dim(dim, self.ndim + 1)
        shp = self._data.shape
        return ops.Reshape.apply(self, shp[:d] + (1,) + shp[d:])

    def squeeze(self, dim=None):
        shp = self._data.shape
        if dim is None:
            new = tuple(s for s in shp if s != 1)
        else:
            dims = {wrap_dim(d, self.ndim) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
            new = tuple(s for i, s in enumerate(shp) if not (i in dims and s == 1))
        return ops.Reshape.apply(self, new)

    def expand(self, *sizes):
        sizes = _shape_args(sizes)
        shp = self._data.shape
        if len(sizes) < len(shp):
            raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to "
                               f"the number of dimensions in the tensor ({len(shp)})")
        lead = len(sizes) - len(shp)
        out = []
        for i, s in enumerate(sizes):
            cur = shp[i - lead] if i >= lead else 1
            if s == -1:
                if i < lead:
                    raise RuntimeError(f"expand: -1 not allowed in leading, non-existing dimension {i}")
                s = cur
            elif cur != 1 and cur != s:
                raise RuntimeError(f"The expanded size of the tensor ({s}) must match the existing size ({cur}) at "
                                   f"non-singleton dimension {i}.  Target sizes: {list(sizes)}.  "
                                   f"Tensor sizes: {list(shp)}")
            out.append(s)
        return ops.Expand.apply(self, tuple(out))

    def expand_as(self, other):
        return self.expand(other.shape)

    def broadcast_to(self, shape):
        return self.expand(shape)

    def split(self, split_size_or_sections, dim=0):
        d = wrap_dim(dim, self.ndim)
        n = self._data.shape[d]
        if isinstance(split_size_or_sections, (int, np.integer)):
            s = int(split_size_or_sections)
            if s <= 0 and n > 0:
                raise RuntimeError(f"split_size must be positive, got {s}")
            sizes = [s] * (n // s) + ([n % s] if n % s else []) if n else [0]
        else:
            sizes = [int(x) for x in split_size_or_sections]
            if builtins.sum(sizes) != n:
                raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size "
                                   f"at dimension {d}), but got split_sizes={sizes}")
        return ops.Split.apply(self, sizes, d)

    def chunk(self, chunks, dim=0):
        if chunks <= 0:
            raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
        d = wrap_dim(dim, self.ndim)
        n = self._data.shape[d]
        size = -(-n // chunks) if n else 1
        return self.split(builtins.max(size, 1), d)

    def unbind(self, dim=0):
        d = wrap_dim(dim, self.ndim)
        parts = self.split(1, d)
        return tuple(p.squeeze(d) for p in parts)

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def contiguous(self):
        if self._data.flags.c_contiguous:
            return self
        return ops.Contiguous.apply(self)

    def clone(self):
        return ops.Clone.apply(self)

    def __getitem__(self, idx):
        return ops.GetItem.apply(self, _normalize_index(self, idx))

    def __setitem__(self, idx, value):
        check_inplace(self)
        if isinstance(value, TensorBase):
            if is_grad_enabled() and value.requires_grad:
                raise RuntimeError("hpcfsdp does not record setitem of a tensor that requires grad; use torch-style "
                                   "out-of-place ops (e.g. hp.where / hp.cat) or run under hp.no_grad()")
            value = value._data
        if _backend.is_meta_array(self._data):
            return
        self._data[_normalize_index(self, idx)] = value
