"""Shape ops beyond shape.py, of the same family: the in-place view ops (unsqueeze_, squeeze_, t_, transpose_ and
its aliases swapdims_/swapaxes_), unfold's sliding windows, select, ravel, rot90, split_with_sizes and
hsplit/vsplit/dsplit. hpcfsdp/_tensor_methods/shape.py loads this module before it makes the family's mixin."""
import operator

import numpy as np

from .._array import wrap_dim
from .._registry import op
from ..autograd import ops
from ..autograd.grad_mode import is_grad_enabled
from ._common import TensorBase, _dim_slice

__all__ = []


# -- in-place views ----------------------------------------------------------------------------------------
# [Note: In-place views]
# ``t.unsqueeze_(0)`` changes t's shape, not its values. PyTorch allows it on a tensor of the graph (the view op
# becomes t's grad_fn) and refuses it on a leaf that requires grad while grad mode is on. So does hpcfsdp: t takes
# the out-of-place view's array and, where that view was recorded, its grad_fn. Other views of t's storage keep
# their shapes, as in PyTorch.
def _rebind(self, view):
    """Make ``self`` the view ``view`` of itself (See [Note: In-place views]) and return self."""
    if is_grad_enabled() and self._requires_grad and self.grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    self._data = view._data
    if view.grad_fn is not None:
        self._set_grad_fn(view.grad_fn, view._output_nr)
    return self


@op("shape")
def unsqueeze_(self, dim):
    return _rebind(self, self.unsqueeze(dim))


@op("shape")
def squeeze_(self, dim=None):
    return _rebind(self, self.squeeze(dim))


@op("shape")
def t_(self):
    return _rebind(self, self.t())


@op("shape", aliases=("swapdims_", "swapaxes_"))
def transpose_(self, dim0, dim1):
    return _rebind(self, self.transpose(dim0, dim1))


# -- windows and slices ------------------------------------------------------------------------------------
@op("shape", functions=(ops.GetItem, ops.Permute))
def unfold(self, dimension, size, step):
    """Every slice of ``size`` elements along ``dimension``, ``step`` apart, as a new last dim: shape
    (..., (n - size) // step + 1, ..., size). A copy here (PyTorch's is a view of self), differentiable."""
    d = wrap_dim(dimension, max(self.ndim, 1))
    n = self._data.shape[d] if self.ndim else 1
    size, step = operator.index(size), operator.index(step)
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if self.ndim == 0:
        return self.reshape(1)
    xp = self._xp()
    starts = xp.arange(0, n - size + 1, step, dtype=np.int64)
    idx = starts[:, None] + xp.arange(size, dtype=np.int64)  # (windows, size)
    out = ops.GetItem.apply(self, _dim_slice(d, idx))  # the window dims at d, d + 1
    perm = tuple(i for i in range(out.ndim) if i != d + 1) + (d + 1,)
    return ops.Permute.apply(out, perm) if perm != tuple(range(out.ndim)) else out


@op("shape", function=True)
def select(self, dim, index):
    """self[..., index, ...] with ``index`` at ``dim`` (that dim removed): a view."""
    if self.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = wrap_dim(dim, self.ndim)
    n = self._data.shape[d]
    i = operator.index(index)
    if not -n <= i < n:
        raise IndexError(f"select(): index {i} out of range for tensor of size {list(self.shape)} at dimension {d}")
    return self[_dim_slice(d, i)]


@op("shape", function=True)
def ravel(self):
    return self.reshape(-1)


@op("shape", function=True)
def rot90(self, k=1, dims=(0, 1)):
    """Rotate by 90 degrees k times in the plane of ``dims``, from the first dim towards the second."""
    dims = tuple(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if self.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {self.ndim}")
    d0, d1 = wrap_dim(dims[0], self.ndim), wrap_dim(dims[1], self.ndim)
    if d0 == d1:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} and dim1 = {d1}")
    k = operator.index(k) % 4
    if k == 1:
        return self.flip(d1).transpose(d0, d1)
    if k == 2:
        return self.flip(d0, d1)
    if k == 3:
        return self.flip(d0).transpose(d0, d1)
    return self.clone()


# -- splits ------------------------------------------------------------------------------------------------
@op("shape", function=True)
def split_with_sizes(self, split_sizes, dim=0):
    if not isinstance(split_sizes, (list, tuple)):
        raise TypeError(f"split_with_sizes(): argument 'split_sizes' must be tuple of ints, not "
                        f"{type(split_sizes).__name__}")
    return self.split(list(split_sizes), dim)


def _split_nd(name, dim, least):
    def f(self, indices_or_sections):
        if self.ndim < least:
            raise RuntimeError(f"torch.{name} requires a tensor with at least {least} dimension, but got a tensor "
                               f"with {self.ndim} dimensions!")
        d = 0 if (name == "hsplit" and self.ndim == 1) else dim
        ios = indices_or_sections
        if isinstance(ios, (int, np.integer)) and not isinstance(ios, bool):
            n = self._data.shape[d]
            if ios <= 0 or n % ios:
                raise RuntimeError(f"torch.{name} attempted to split along dimension {d}, but the size of the "
                                   f"dimension {n} is not divisible by the split_size {ios}!")
        elif not isinstance(ios, (list, tuple)) and not isinstance(ios, TensorBase):
            raise TypeError(f"{name}(): argument 'indices_or_sections' must be an int or a tuple of ints, not "
                            f"{type(ios).__name__}")
        return self.tensor_split(ios, d)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"tensor_split along dim {dim} (hsplit: dim 0 of a 1-D tensor); sections must divide it evenly."
    return f


op("shape", name="hsplit", function=True)(_split_nd("hsplit", 1, 1))
op("shape", name="vsplit", function=True)(_split_nd("vsplit", 0, 2))
op("shape", name="dsplit", function=True)(_split_nd("dsplit", 2, 3))
