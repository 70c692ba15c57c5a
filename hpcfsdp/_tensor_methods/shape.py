"""Shape ops: reshape and view, flatten/unflatten, permute/transpose/movedim, squeeze/unsqueeze, expand and
broadcasting, split/chunk/unbind/tensor_split, iteration, contiguous/clone, roll/flip, repeat/tile/
repeat_interleave; the functions cat/stack, meshgrid, broadcast_tensors and atleast_1d/2d/3d. Views where NumPy/CuPy
give them; each records its op for autograd."""
import builtins
import operator

import numpy as np

from .. import _backend
from .._array import dtype_category, promote_types, wrap_dim
from .._registry import function_op, mixin, op
from .._tensor_base import broadcast_shapes
from ..autograd import ops
from ._common import TensorBase, _dim_slice, _tensor_arg

__all__ = ["ShapeMixin"]


def _shape_args(args, as_int=int):
    """Sizes or dims given as ints or as one tuple/list of them (``view(2, 3)``, ``view((2, 3))``), each through
    ``as_int`` (``operator.index`` where a float must be refused)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(as_int(a) for a in args)


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


# -- reshape and view --------------------------------------------------------------------------------------
@op("shape", function=True, functions=(ops.Reshape,))
def reshape(self, *shape):
    shape = _infer_shape(_shape_args(shape), self._data.size, self._data.shape)
    if shape == self._data.shape:
        return ops.Reshape.apply(self, shape) if self.requires_grad else self._wrap(self._data)
    return ops.Reshape.apply(self, shape)


@op("shape", functions=(ops.Reshape,))
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


@op("shape")
def view_as(self, other):
    return self.view(other.shape)


@op("shape")
def reshape_as(self, other):
    return self.reshape(other.shape)


@op("shape", function=True)
def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return self.reshape(1)
    s, e = wrap_dim(start_dim, self.ndim), wrap_dim(end_dim, self.ndim)
    shp = self._data.shape
    return self.reshape(shp[:s] + (-1,) + shp[e + 1:]) if s <= e else self


@op("shape", function=True)
def unflatten(self, dim, sizes):
    d = wrap_dim(dim, self.ndim)
    shp = self._data.shape
    return self.reshape(shp[:d] + tuple(sizes) + shp[d + 1:])


@op("shape", function=True, functions=(ops.Reshape,))
def unsqueeze(self, dim):
    d = wrap_dim(dim, self.ndim + 1)
    shp = self._data.shape
    return ops.Reshape.apply(self, shp[:d] + (1,) + shp[d:])


@op("shape", function=True, functions=(ops.Reshape,))
def squeeze(self, dim=None):
    shp = self._data.shape
    if dim is None:
        new = tuple(s for s in shp if s != 1)
    else:
        dims = {wrap_dim(d, self.ndim) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        new = tuple(s for i, s in enumerate(shp) if not (i in dims and s == 1))
    return ops.Reshape.apply(self, new)


# -- permutations ------------------------------------------------------------------------------------------
@op("shape", function=True, functions=(ops.Permute,))
def permute(self, *dims):
    dims = _shape_args(dims)
    if len(dims) != self.ndim:
        raise RuntimeError(f"permute: number of dims {len(dims)} doesn't match the tensor's {self.ndim}")
    return ops.Permute.apply(self, tuple(wrap_dim(d, self.ndim) for d in dims))


@op("shape", aliases=("swapaxes", "swapdims"), function=True, function_aliases=("swapaxes", "swapdims"),
    functions=(ops.Reshape, ops.Permute))
def transpose(self, dim0, dim1):
    n = self.ndim
    if n < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return ops.Reshape.apply(self, self._data.shape)
    d0, d1 = wrap_dim(dim0, n), wrap_dim(dim1, n)
    perm = list(range(n))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ops.Permute.apply(self, tuple(perm))


@op("shape", function=True)
def t(self):
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return self.transpose(0, 1) if self.ndim == 2 else self


op("shape", name="T")(property(lambda self: self.permute(*reversed(range(self.ndim)))))
op("shape", name="mT")(property(lambda self: self.transpose(-2, -1)))


@op("shape", aliases=("moveaxis",), function=True, function_aliases=("moveaxis",))
def movedim(self, source, destination):
    src = (source,) if isinstance(source, (int, np.integer)) else tuple(source)
    dst = (destination,) if isinstance(destination, (int, np.integer)) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
                           f"contain the same number of dims as destination ({list(dst)} dims)")
    src = [wrap_dim(i, self.ndim) for i in src]
    dst = [wrap_dim(i, self.ndim) for i in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise RuntimeError(f"movedim: repeated dim in source {list(source)} or destination {list(destination)}")
    perm = [None] * self.ndim
    for i, j in zip(src, dst):
        perm[j] = i
    rest = iter(i for i in range(self.ndim) if i not in src)
    perm = [next(rest) if p is None else p for p in perm]
    return self.permute(*perm) if self.ndim else self


# -- broadcasting ------------------------------------------------------------------------------------------
@op("shape", functions=(ops.Expand,))
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


@op("shape")
def expand_as(self, other):
    return self.expand(other.shape)


@op("shape", function=True)
def broadcast_to(self, shape):
    return self.expand(shape)


def _tensor_list(tensors, fn):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    for i, t in enumerate(tensors):
        _tensor_arg(t, fn, f"tensors[{i}]")
    return tensors


@function_op("shape")
def broadcast_tensors(*tensors):
    """The tensors expanded to their common broadcast shape (differentiable views)."""
    tensors = _tensor_list(tensors, "broadcast_tensors")
    shape = broadcast_shapes(*(t.shape for t in tensors))
    return tuple(t.expand(shape) for t in tensors)


@function_op("shape")
def meshgrid(*tensors, indexing=None):
    """Coordinate grids of 0-D or 1-D tensors; indexing 'ij' (the default, without PyTorch's warning) or 'xy'
    (the first two dims swapped). Each grid is a broadcast view, differentiable."""
    tensors = _tensor_list(tensors, "meshgrid")
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise ValueError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but received: {indexing}")
    if not tensors:
        raise RuntimeError("torch.meshgrid expects a non-empty TensorList")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t.ndim}D")
        if t.dtype != tensors[0].dtype or t.device != tensors[0].device:
            raise RuntimeError("torch.meshgrid: Expected all tensors in the tensor list to have the same dtype and "
                               "device")
    flat = [t.reshape(-1) for t in tensors]
    order = list(range(len(flat)))
    if indexing == "xy" and len(flat) >= 2:
        order[0], order[1] = 1, 0
    shape = tuple(flat[i].shape[0] for i in order)
    out = []
    for i, t in enumerate(flat):
        view = [1] * len(flat)
        view[order.index(i)] = -1
        out.append(t.reshape(view).expand(shape))
    return tuple(out)


def _atleast(n, tensors, fn):
    single = len(tensors) == 1 and isinstance(tensors[0], TensorBase)
    tensors = _tensor_list(tensors, fn)
    out = []
    for t in tensors:
        if t.ndim >= n:
            out.append(t)
        elif n == 3 and t.ndim == 2:
            out.append(t.unsqueeze(-1))
        elif n == 3 and t.ndim == 1:
            out.append(t.reshape(1, -1, 1))
        else:
            out.append(t.reshape((1,) * (n - t.ndim) + tuple(t.shape)))
    return out[0] if single else tuple(out)


@function_op("shape")
def atleast_1d(*tensors):
    """Each tensor with at least 1 dim (a 0-d tensor becomes shape (1,)); one tensor in, one out."""
    return _atleast(1, tensors, "atleast_1d")


@function_op("shape")
def atleast_2d(*tensors):
    """Each tensor with at least 2 dims, new dims in front; one tensor in, one out."""
    return _atleast(2, tensors, "atleast_2d")


@function_op("shape")
def atleast_3d(*tensors):
    """Each tensor with at least 3 dims: (n,) -> (1, n, 1), (m, n) -> (m, n, 1); one tensor in, one out."""
    return _atleast(3, tensors, "atleast_3d")


# -- splitting and joining ---------------------------------------------------------------------------------
@op("shape", function=True, functions=(ops.Split,))
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


@op("shape", function=True)
def chunk(self, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = wrap_dim(dim, self.ndim)
    n = self._data.shape[d]
    size = -(-n // chunks) if n else 1
    return self.split(builtins.max(size, 1), d)


@op("shape", function=True)
def unbind(self, dim=0):
    d = wrap_dim(dim, self.ndim)
    parts = self.split(1, d)
    return tuple(p.squeeze(d) for p in parts)


@op("shape", function=True, functions=(ops.Split,))
def tensor_split(self, indices_or_sections, dim=0):
    """Sections (an int: the first size % n parts one longer) or split indices (slices between them)."""
    d = wrap_dim(dim, self.ndim)
    n = self._data.shape[d]
    ios = indices_or_sections
    if isinstance(ios, TensorBase):
        if ios.ndim > 1 or dtype_category(ios._data.dtype) != 1:
            raise RuntimeError(f"tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                               f"one-dimensional integer tensor, but got a {ios.ndim}-D {ios.dtype} tensor")
        ios = ios.item() if ios.ndim == 0 else ios.tolist()
    if isinstance(ios, (int, np.integer)):
        if ios <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {ios}")
        q, r = divmod(n, int(ios))
        return ops.Split.apply(self, [q + 1] * r + [q] * (int(ios) - r), d)
    bounds = [None, *(operator.index(i) for i in ios), None]
    return tuple(self[_dim_slice(d, slice(a, b))] for a, b in zip(bounds[:-1], bounds[1:]))


@op("shape")
def __iter__(self):
    if self._data.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return iter(self.unbind(0))


def _promoted(tensors, name):
    """The tensors of cat/stack, checked and cast to their common dtype."""
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError(f"{name}(): expected a non-empty list of Tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, TensorBase):
            raise TypeError(f"{name}(): expected a sequence of Tensors, but element {i} is {type(t).__name__}")
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = promote_types(dt, t.dtype)
    return [t if t.dtype == dt else t.to(dt) for t in tensors]


@function_op("shape", aliases=("concat", "concatenate"), functions=(ops.Cat,))
def cat(tensors, dim=0):
    tensors = _promoted(tensors, "cat")
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    d = wrap_dim(dim, tensors[0].ndim)
    ref = tensors[0].shape
    for t in tensors[1:]:
        if t.ndim != len(ref) or builtins.any(a != b for i, (a, b) in enumerate(zip(t.shape, ref)) if i != d):
            raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected {tuple(ref)} "
                               f"but got {tuple(t.shape)}")
    return ops.Cat.apply(d, *tensors)


@function_op("shape", functions=(ops.Stack,))
def stack(tensors, dim=0):
    tensors = _promoted(tensors, "stack")
    ref = tensors[0].shape
    for t in tensors[1:]:
        if t.shape != ref:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {tuple(ref)} and {tuple(t.shape)}")
    d = wrap_dim(dim, tensors[0].ndim + 1)
    return ops.Stack.apply(d, *tensors)


# -- copies ------------------------------------------------------------------------------------------------
@op("shape", functions=(ops.Contiguous,))
def contiguous(self):
    if self._data.flags.c_contiguous:
        return self
    return ops.Contiguous.apply(self)


def _clone_function(input, *, memory_format=None):  # noqa: A002
    """torch.clone(input): a differentiable copy (every tensor here is contiguous: memory_format is ignored)."""
    if not isinstance(input, TensorBase):
        raise TypeError(f"clone(): argument 'input' must be Tensor, not {type(input).__name__}")
    return input.clone()


_clone_function.__name__ = _clone_function.__qualname__ = "clone"


@op("shape", function=_clone_function, functions=(ops.Clone,))
def clone(self, *, memory_format=None):
    """A copy in new memory, in the graph (``memory_format`` is accepted as PyTorch's; layouts are always
    row-major here)."""
    return ops.Clone.apply(self)


# -- rolls, flips and repeats ------------------------------------------------------------------------------
@op("shape", function=True, functions=(ops.Roll,))
def roll(self, shifts, dims=None):
    sh = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    if dims is None:
        if len(sh) != 1:
            raise RuntimeError(f"roll(): shifts {list(sh)} need dims of the same length when dims is not given")
        return ops.Roll.apply(self.flatten(), (int(sh[0]),), (0,)).reshape(self.shape)
    dm = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if len(sh) != len(dm):
        raise RuntimeError(f"roll(): shifts and dimensions must align. shifts: {len(sh)}, dims:{len(dm)}")
    return ops.Roll.apply(self, tuple(int(s) for s in sh), tuple(wrap_dim(d, self.ndim) for d in dm))


@op("shape", function=True, functions=(ops.Flip,))
def flip(self, *dims):
    dm = _shape_args(dims, operator.index)
    wrapped = tuple(wrap_dim(d, self.ndim) for d in dm)
    if len(set(wrapped)) != len(wrapped):
        raise RuntimeError(f"flip(): dims has a repeated dim: {list(dm)}")
    if self.ndim == 0:
        return self.clone()
    return ops.Flip.apply(self, wrapped)


@op("shape", function=True)
def fliplr(self):
    if self.ndim < 2:
        raise RuntimeError(f"Input must be >= 2-d, got a {self.ndim}-d tensor")
    return self.flip(1)


@op("shape", function=True)
def flipud(self):
    if self.ndim < 1:
        raise RuntimeError("Input must be >= 1-d, got a 0-d tensor")
    return self.flip(0)


@op("shape", functions=(ops.Repeat,))
def repeat(self, *sizes):
    reps = _shape_args(sizes, operator.index)
    if len(reps) < self.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of "
                           f"tensor (got {list(reps)} for a {self.ndim}-d tensor)")
    if builtins.any(r < 0 for r in reps):
        raise RuntimeError(f"Trying to create tensor with negative dimension: repeats {list(reps)}")
    return ops.Repeat.apply(self, reps)


@op("shape", function=True)
def tile(self, *dims):
    reps = _shape_args(dims, operator.index)
    return self.repeat((1,) * (self.ndim - len(reps)) + reps)


def _repeat_interleave_function(input, repeats=None, dim=None, *, output_size=None):  # noqa: A002
    """torch.repeat_interleave(input, repeats, dim=None) or repeat_interleave(repeats): the indices 0, 1, ...
    each repeated repeats[i] times."""
    _tensor_arg(input, "repeat_interleave")
    if repeats is None:
        idx = input._wrap(input._xp().arange(input.shape[0] if input.ndim else 1, dtype=np.int64))
        return idx.repeat_interleave(input, output_size=output_size)
    return input.repeat_interleave(repeats, dim, output_size=output_size)


_repeat_interleave_function.__name__ = _repeat_interleave_function.__qualname__ = "repeat_interleave"


@op("shape", function=_repeat_interleave_function, functions=(ops.GetItem,))
def repeat_interleave(self, repeats, dim=None, *, output_size=None):
    src = self.flatten() if dim is None else self
    d = 0 if dim is None else wrap_dim(dim, self.ndim)
    n = src.shape[d] if src.ndim else 1
    xp = self._xp()
    if isinstance(repeats, TensorBase):
        r = repeats._data
        if r.ndim > 1 or r.dtype.kind not in "iu":
            raise RuntimeError(f"repeat_interleave(): repeats must be a 0-d or 1-d integer tensor, got a "
                               f"{r.ndim}-d {repeats.dtype} tensor")
        if r.ndim == 1 and r.shape[0] != n:
            raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                               f"{r.shape[0]} and input.size({d}) = {n}")
        r = xp.asarray(r)
    else:
        r = operator.index(repeats)
    if bool((xp.asarray(r) < 0).any()):
        raise RuntimeError("repeats can not be negative")
    idx = xp.repeat(xp.arange(n), r)
    if output_size is not None and idx.shape[0] != output_size:
        raise RuntimeError(f"repeat_interleave(): output_size {output_size} does not match the sum of repeats "
                           f"{idx.shape[0]}")
    src = src if src.ndim else src.reshape(1)
    return ops.GetItem.apply(src, _dim_slice(d, idx))


from . import views  # noqa: E402,F401  (the family's other ops, registered before its mixin is made)
from . import stacking  # noqa: E402,F401  (hstack, tensordot, block_diag, ...: the same)
from . import real_views  # noqa: E402,F401  (real, conj, angle, H, mH, adjoint, sum_to_size: the same)

ShapeMixin = mixin("shape")
