"""Tensor methods for math, shape and in-place ops, attached to Tensor (kept out of _tensor.py)."""
import builtins

import numpy as np

from . import _backend
from ._tensor import _SCALARS, Tensor, _category, _check_inplace, _MinMax, _wrap_dim, promote_types, result_type_scalar
from .autograd import ops

__all__ = []


def _method(fn):
    """Attach fn to Tensor; the module-level name is left unbound (no shadowing of max, sum, abs...)."""
    setattr(Tensor, fn.__name__, fn)


# -- operands -----------------------------------------------------------------------------------------
def _as_operand(x, like):
    """A Tensor for tensors and arrays; Python/NumPy scalars pass through as they are."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, (list, tuple)) or hasattr(x, "__array__") or _backend.is_cupy_array(x):
        xp = like._xp()
        return Tensor._wrap(xp.asarray(x))
    raise TypeError(f"unsupported operand of type {type(x).__name__}; expected a Tensor or a number")


def _promote2(a, b, op_name):
    """Cast a and b (Tensors or scalars, at least one a Tensor) to their PyTorch result dtype."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        da, db = a._data.dtype, b._data.dtype
        if da != db:
            rd = promote_types(da, db, a._data.ndim == 0, b._data.ndim == 0)
            if da != rd:
                a = a.to(rd)
            if db != rd:
                b = b.to(rd)
        if a.device != b.device and not (a._data.ndim == 0 and a.device.type == "cpu"):
            if not (b._data.ndim == 0 and b.device.type == "cpu"):
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {a.device} and {b.device}! (in {op_name})")
        return a, b
    t, s = (a, b) if isinstance(a, Tensor) else (b, a)
    rd = result_type_scalar(t._data.dtype, s)
    if rd != t._data.dtype:
        t = t.to(rd)
    s = s.item() if isinstance(s, (np.generic,)) else s
    return (t, s) if isinstance(a, Tensor) else (s, t)


def _binary(op, a, b, name):
    a, b = _promote2(a, b, name)
    return op.apply(a, b)


def _to_float(t):
    return t if _category(t._data.dtype) == 2 else t.to(_backend.float32)


# -- arithmetic -----------------------------------------------------------------------------------------
@_method
def __add__(self, other):
    return _binary(ops.Add, self, _as_operand(other, self), "add")


@_method
def __radd__(self, other):
    return _binary(ops.Add, _as_operand(other, self), self, "add")


@_method
def __sub__(self, other):
    return _binary(ops.Sub, self, _as_operand(other, self), "sub")


@_method
def __rsub__(self, other):
    return _binary(ops.Sub, _as_operand(other, self), self, "sub")


@_method
def __mul__(self, other):
    return _binary(ops.Mul, self, _as_operand(other, self), "mul")


@_method
def __rmul__(self, other):
    return _binary(ops.Mul, _as_operand(other, self), self, "mul")


@_method
def __truediv__(self, other):
    other = _as_operand(other, self)
    a = _to_float(self)
    if isinstance(other, Tensor):
        other = _to_float(other)
    elif isinstance(other, (int, np.integer)) and not isinstance(other, bool):
        other = float(other)
    return _binary(ops.Div, a, other, "div")


@_method
def __rtruediv__(self, other):
    other = _as_operand(other, self)
    if isinstance(other, Tensor):
        return other.__truediv__(self)
    return _binary(ops.Div, float(other), _to_float(self), "div")


@_method
def __floordiv__(self, other):
    other = other._data if isinstance(other, Tensor) else other
    return Tensor._wrap(self._data // other)


@_method
def __mod__(self, other):
    other = other._data if isinstance(other, Tensor) else other
    return Tensor._wrap(self._data % other)


@_method
def __pow__(self, exponent):
    if isinstance(exponent, Tensor):
        if exponent._data.ndim == 0 and not exponent.requires_grad:
            return self.__pow__(exponent.item())
        return _binary(ops.Pow, self, exponent, "pow")
    if not isinstance(exponent, _SCALARS):
        raise TypeError(f"unsupported exponent {exponent!r}")
    a = self
    if isinstance(exponent, (float, np.floating)) and _category(a._data.dtype) != 2:
        a = a.to(_backend.float32)
    e = exponent.item() if isinstance(exponent, np.generic) else exponent
    return ops.PowScalar.apply(a, e)


@_method
def __rpow__(self, base):
    if isinstance(base, Tensor):
        return base.__pow__(self)
    a = _to_float(self) if isinstance(base, float) else self
    return ops.RPowScalar.apply(float(base) if _category(a._data.dtype) == 2 else base, a)


@_method
def __neg__(self):
    return ops.Neg.apply(self)


@_method
def __pos__(self):
    return self


@_method
def __matmul__(self, other):
    if not isinstance(other, Tensor):
        other = _as_operand(other, self)
    a, b = _promote2(self, other, "matmul")
    return ops.Matmul.apply(a, b)


@_method
def __rmatmul__(self, other):
    return _as_operand(other, self).__matmul__(self)


Tensor.matmul = Tensor.__matmul__


@_method
def add(self, other, *, alpha=1):
    return self + (other * alpha if alpha != 1 else other)


@_method
def sub(self, other, *, alpha=1):
    return self - (other * alpha if alpha != 1 else other)


Tensor.mul = Tensor.__mul__
Tensor.multiply = Tensor.__mul__
Tensor.div = Tensor.__truediv__
Tensor.divide = Tensor.__truediv__
Tensor.neg = Tensor.__neg__
Tensor.negative = Tensor.__neg__
Tensor.pow = Tensor.__pow__
Tensor.true_divide = Tensor.__truediv__


def _unary(op):
    def f(self):
        return op.apply(_to_float(self))

    return f


for _name, _op in [("exp", ops.Exp), ("log", ops.Log), ("sqrt", ops.Sqrt), ("rsqrt", ops.Rsqrt),
                   ("tanh", ops.Tanh), ("sigmoid", ops.Sigmoid)]:
    f = _unary(_op)
    f.__name__ = _name
    setattr(Tensor, _name, f)


@_method
def abs(self):
    return ops.Abs.apply(self)


Tensor.__abs__ = Tensor.abs


@_method
def relu(self):
    return ops.Relu.apply(self)


@_method
def square(self):
    return ops.PowScalar.apply(self, 2)


@_method
def clamp(self, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    lo, hi = min, max
    a = self
    for v in (lo, hi):
        if isinstance(v, (float, np.floating)) and _category(a._data.dtype) != 2:
            a = a.to(_backend.float32)
    lo = lo if (lo is None or isinstance(lo, Tensor)) else a._data.dtype.type(lo)
    hi = hi if (hi is None or isinstance(hi, Tensor)) else a._data.dtype.type(hi)
    return ops.Clamp.apply(a, lo, hi)


Tensor.clip = Tensor.clamp


@_method
def maximum(self, other):
    return _binary(ops.Maximum, self, _as_operand(other, self), "maximum")


@_method
def minimum(self, other):
    return _binary(ops.Minimum, self, _as_operand(other, self), "minimum")


# -- reductions --------------------------------------------------------------------------------------
def _dims(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return tuple(_wrap_dim(d, ndim) for d in dim)
    return _wrap_dim(dim, ndim)


@_method
def sum(self, dim=None, keepdim=False, *, dtype=None):
    return ops.Sum.apply(self, _dims(dim, self.ndim), keepdim, None if dtype is None else _backend.to_dtype(dtype))


@_method
def mean(self, dim=None, keepdim=False, *, dtype=None):
    a = self if dtype is None else self.to(dtype)
    if _category(a._data.dtype) != 2:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating "
                           f"point or complex dtype. Got: {a.dtype}")
    return ops.Mean.apply(a, _dims(dim, a.ndim), keepdim)


@_method
def amax(self, dim=(), keepdim=False):
    return ops.Amax.apply(self, _dims(dim, self.ndim) or None, keepdim, False)


@_method
def amin(self, dim=(), keepdim=False):
    return ops.Amax.apply(self, _dims(dim, self.ndim) or None, keepdim, True)


def _maxmin(self, dim, keepdim, other, is_min):
    if isinstance(dim, Tensor):
        other = dim
    if other is not None:
        return self.minimum(other) if is_min else self.maximum(other)
    if dim is None:
        return ops.Amax.apply(self, None, False, is_min)
    vals, idx = ops.MaxDim.apply(self, _wrap_dim(dim, self.ndim), keepdim, is_min)
    return _MinMax(vals, idx)


@_method
def max(self, dim=None, keepdim=False, *, other=None):
    return _maxmin(self, dim, keepdim, other, False)


@_method
def min(self, dim=None, keepdim=False, *, other=None):
    return _maxmin(self, dim, keepdim, other, True)


@_method
def argmax(self, dim=None, keepdim=False):
    a = self._data
    if dim is None:
        r = a.reshape(-1).argmax()
        return Tensor._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
    return Tensor._wrap(a.argmax(axis=_wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))


@_method
def argmin(self, dim=None, keepdim=False):
    a = self._data
    if dim is None:
        r = a.reshape(-1).argmin()
        return Tensor._wrap(r.reshape((1,) * a.ndim if keepdim else ()).astype(np.int64))
    return Tensor._wrap(a.argmin(axis=_wrap_dim(dim, a.ndim), keepdims=keepdim).astype(np.int64))


@_method
def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var(unbiased) positional form
        dim, unbiased = None, dim
    if correction is None:
        correction = 0 if unbiased is False else 1
    return ops.Var.apply(_to_float(self), _dims(dim, self.ndim), correction, keepdim)


@_method
def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return self.var(dim, unbiased, keepdim, correction=correction).sqrt()


@_method
def softmax(self, dim, dtype=None):
    a = self.to(dtype) if dtype is not None else _to_float(self)
    return ops.Softmax.apply(a, _wrap_dim(dim, a.ndim))


@_method
def log_softmax(self, dim, dtype=None):
    a = self.to(dtype) if dtype is not None else _to_float(self)
    return ops.LogSoftmax.apply(a, _wrap_dim(dim, a.ndim))


@_method
def all(self, dim=None, keepdim=False):
    return Tensor._wrap(self._xp().asarray(self._data.all(axis=_dims(dim, self.ndim), keepdims=keepdim)))


@_method
def any(self, dim=None, keepdim=False):
    return Tensor._wrap(self._xp().asarray(self._data.any(axis=_dims(dim, self.ndim), keepdims=keepdim)))


@_method
def masked_fill(self, mask, value):
    m = mask._data if isinstance(mask, Tensor) else mask
    if m.dtype != np.bool_:
        raise RuntimeError(f"masked_fill only supports boolean masks, but got mask with dtype {m.dtype}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"masked_fill only supports a 0-dimensional value tensor, but got one with "
                               f"{value.ndim} dimension(s)")
        value = value.item()
    return ops.MaskedFill.apply(self, m, value)


# -- comparisons and logic (no graph) ---------------------------------------------------------------------
def _cmp(ufunc_name):
    def f(self, other):
        o = other._data if isinstance(other, Tensor) else other
        if isinstance(o, (list, tuple)):
            o = self._xp().asarray(o)
        return Tensor._wrap(getattr(self._xp(), ufunc_name)(self._data, o))

    return f


for _names, _uf in [(("__eq__", "eq"), "equal"), (("__ne__", "ne"), "not_equal"), (("__lt__", "lt"), "less"),
                    (("__le__", "le"), "less_equal"), (("__gt__", "gt"), "greater"),
                    (("__ge__", "ge"), "greater_equal"), (("__and__", "logical_and_", "__rand__"), "bitwise_and"),
                    (("__or__", "__ror__"), "bitwise_or"), (("__xor__", "__rxor__"), "bitwise_xor")]:
    for _n in _names:
        setattr(Tensor, _n, _cmp(_uf))
Tensor.__hash__ = lambda self: id(self)


@_method
def __invert__(self):
    return Tensor._wrap(~self._data)


@_method
def logical_not(self):
    return Tensor._wrap(self._xp().logical_not(self._data))


@_method
def isfinite(self):
    return Tensor._wrap(self._xp().isfinite(self._data))


@_method
def isnan(self):
    return Tensor._wrap(self._xp().isnan(self._data))


@_method
def equal(self, other):
    return self.shape == other.shape and builtins.bool((self._data == other._data).all())


@_method
def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return builtins.bool(self._xp().allclose(self._data, other._data, rtol=rtol, atol=atol, equal_nan=equal_nan))


# -- shape ops ---------------------------------------------------------------------------------------
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


@_method
def reshape(self, *shape):
    shape = _infer_shape(_shape_args(shape), self._data.size, self._data.shape)
    if shape == self._data.shape:
        return ops.Reshape.apply(self, shape) if self.requires_grad else Tensor._wrap(self._data)
    return ops.Reshape.apply(self, shape)


@_method
def view(self, *shape):
    if len(shape) == 1 and not isinstance(shape[0], (int, tuple, list, np.integer)):
        dt = _backend.to_dtype(shape[0])  # view(dtype): reinterpret the bytes
        return Tensor._wrap(self._data.view(dt))
    shape = _infer_shape(_shape_args(shape), self._data.size, self._data.shape)
    if not _backend.is_meta_array(self._data):
        try:
            a = self._data.view()
            a.shape = shape  # raises if a copy would be needed
        except AttributeError:
            raise RuntimeError(f"view size is not compatible with input tensor's size and stride "
                               f"(shape {list(self.shape)} to {list(shape)}); use .reshape(...) instead") from None
    return ops.Reshape.apply(self, shape)


@_method
def view_as(self, other):
    return self.view(other.shape)


@_method
def reshape_as(self, other):
    return self.reshape(other.shape)


@_method
def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return self.reshape(1)
    s, e = _wrap_dim(start_dim, self.ndim), _wrap_dim(end_dim, self.ndim)
    shp = self._data.shape
    return self.reshape(shp[:s] + (-1,) + shp[e + 1:]) if s <= e else self


@_method
def unflatten(self, dim, sizes):
    d = _wrap_dim(dim, self.ndim)
    shp = self._data.shape
    return self.reshape(shp[:d] + tuple(sizes) + shp[d + 1:])


@_method
def permute(self, *dims):
    dims = _shape_args(dims)
    if len(dims) != self.ndim:
        raise RuntimeError(f"permute: number of dims {len(dims)} doesn't match the tensor's {self.ndim}")
    return ops.Permute.apply(self, tuple(_wrap_dim(d, self.ndim) for d in dims))


@_method
def transpose(self, dim0, dim1):
    n = self.ndim
    if n < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return ops.Reshape.apply(self, self._data.shape)
    d0, d1 = _wrap_dim(dim0, n), _wrap_dim(dim1, n)
    perm = list(range(n))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ops.Permute.apply(self, tuple(perm))


Tensor.swapaxes = Tensor.transpose


@_method
def t(self):
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return self.transpose(0, 1) if self.ndim == 2 else self


Tensor.T = property(lambda self: self.permute(*reversed(range(self.ndim))))
Tensor.mT = property(lambda self: self.transpose(-2, -1))


@_method
def unsqueeze(self, dim):
    d = _wrap_dim(dim, self.ndim + 1)
    shp = self._data.shape
    return ops.Reshape.apply(self, shp[:d] + (1,) + shp[d:])


@_method
def squeeze(self, dim=None):
    shp = self._data.shape
    if dim is None:
        new = tuple(s for s in shp if s != 1)
    else:
        dims = {_wrap_dim(d, self.ndim) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        new = tuple(s for i, s in enumerate(shp) if not (i in dims and s == 1))
    return ops.Reshape.apply(self, new)


@_method
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
                               f"non-singleton dimension {i}.  Target sizes: {list(sizes)}.  Tensor sizes: {list(shp)}")
        out.append(s)
    return ops.Expand.apply(self, tuple(out))


@_method
def expand_as(self, other):
    return self.expand(other.shape)


@_method
def broadcast_to(self, shape):
    return self.expand(shape)


@_method
def split(self, split_size_or_sections, dim=0):
    d = _wrap_dim(dim, self.ndim)
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


@_method
def chunk(self, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = _wrap_dim(dim, self.ndim)
    n = self._data.shape[d]
    size = -(-n // chunks) if n else 1
    return self.split(builtins.max(size, 1), d)


@_method
def unbind(self, dim=0):
    d = _wrap_dim(dim, self.ndim)
    parts = self.split(1, d)
    return tuple(p.squeeze(d) for p in parts)


@_method
def contiguous(self):
    if self._data.flags.c_contiguous:
        return self
    return ops.Contiguous.apply(self)


@_method
def clone(self):
    return ops.Clone.apply(self)


def _index_arg(i, xp):
    if isinstance(i, Tensor):
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


def _norm_index(self, idx):
    xp = self._xp()
    if isinstance(idx, tuple):
        return tuple(_index_arg(i, xp) for i in idx)
    return _index_arg(idx, xp)


@_method
def __getitem__(self, idx):
    return ops.GetItem.apply(self, _norm_index(self, idx))


@_method
def __setitem__(self, idx, value):
    _check_inplace(self)
    if isinstance(value, Tensor):
        if is_grad_enabled_() and value.requires_grad:
            raise RuntimeError("hpcfsdp does not record setitem of a tensor that requires grad; use torch-style "
                               "out-of-place ops (e.g. hp.where / hp.cat) or run under hp.no_grad()")
        value = value._data
    if _backend.is_meta_array(self._data):
        return
    self._data[_norm_index(self, idx)] = value


def is_grad_enabled_():
    from .autograd.grad_mode import is_grad_enabled

    return is_grad_enabled()


# -- in-place ops (optimizers, init; not recorded) ---------------------------------------------------------
def _raw(x):
    return x._data if isinstance(x, Tensor) else x


def _inplace(fn):
    def wrapper(self, *args, **kwargs):
        _check_inplace(self)
        if _backend.is_meta_array(self._data):
            return self
        fn(self._data, *args, **kwargs)
        return self

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = f"In-place {fn.__name__[:-1]} (not recorded by autograd)."
    setattr(Tensor, fn.__name__, wrapper)


@_inplace
def zero_(a):
    a.fill(0)


@_inplace
def fill_(a, value):
    a.fill(_raw(value).item() if isinstance(value, Tensor) else value)


@_inplace
def copy_(a, src, non_blocking=False):
    s = _raw(src)
    if _backend.is_meta_array(s):
        raise RuntimeError("copy_: cannot copy out of a meta tensor")
    xp = _backend.array_module(a)
    if xp is not _backend.array_module(s):
        s = xp.asarray(s) if xp is not np else _backend.to_numpy(s)
    a[...] = s


@_inplace
def add_(a, other, *, alpha=1):
    o = _raw(other)
    if alpha != 1:
        o = o * alpha
    a += o


@_inplace
def sub_(a, other, *, alpha=1):
    o = _raw(other)
    if alpha != 1:
        o = o * alpha
    a -= o


@_inplace
def mul_(a, other):
    a *= _raw(other)


@_inplace
def div_(a, other):
    a /= _raw(other)


@_inplace
def addcmul_(a, tensor1, tensor2, *, value=1):
    t = _raw(tensor1) * _raw(tensor2)
    if value != 1:
        t *= value
    a += t


@_inplace
def addcdiv_(a, tensor1, tensor2, *, value=1):
    t = _raw(tensor1) / _raw(tensor2)
    if value != 1:
        t *= value
    a += t


@_inplace
def lerp_(a, end, weight):
    w = _raw(weight)
    a += (_raw(end) - a) * w


@_inplace
def clamp_(a, min=None, max=None):  # noqa: A002
    xp = _backend.array_module(a)
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    xp.clip(a, _raw(min), _raw(max), out=a)


@_inplace
def sqrt_(a):
    _backend.array_module(a).sqrt(a, out=a)


@_inplace
def exp_(a):
    _backend.array_module(a).exp(a, out=a)


@_inplace
def neg_(a):
    _backend.array_module(a).negative(a, out=a)


@_inplace
def pow_(a, exponent):
    _backend.array_module(a).power(a, _raw(exponent), out=a)


@_inplace
def maximum_(a, other):
    _backend.array_module(a).maximum(a, _raw(other), out=a)


@_inplace
def masked_fill_(a, mask, value):
    a[_raw(mask)] = _raw(value)


@_inplace
def normal_(a, mean=0.0, std=1.0, *, generator=None):
    gen = generator or _backend.generator(_backend.device_of_array(a))
    a[...] = gen.standard_normal(a.shape, dtype=np.float32 if a.dtype != np.float64 else np.float64) * std + mean


@_inplace
def uniform_(a, from_=0.0, to=1.0, *, generator=None):
    gen = generator or _backend.generator(_backend.device_of_array(a))
    a[...] = gen.random(a.shape, dtype=np.float32 if a.dtype != np.float64 else np.float64) * (to - from_) + from_


Tensor.__iadd__ = lambda self, o: self.add_(o) if not _needs_graph(self, o) else self + o
Tensor.__isub__ = lambda self, o: self.sub_(o) if not _needs_graph(self, o) else self - o
Tensor.__imul__ = lambda self, o: self.mul_(o) if not _needs_graph(self, o) else self * o
Tensor.__itruediv__ = lambda self, o: self.div_(o) if not _needs_graph(self, o) else self / o


def _needs_graph(self, o):
    """`x += y` on tensors in a graph rebinds x to x + y (the recorded result) instead of writing in place."""
    if not is_grad_enabled_():
        return False
    return (self.requires_grad and self.grad_fn is not None) or (isinstance(o, Tensor) and o.requires_grad)
