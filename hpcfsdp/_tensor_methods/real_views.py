"""The complex-number views of real tensors, of the shape family, as PyTorch has them for real dtypes: real and conj
(the tensor itself), imag (refused), angle (0 or pi), the conjugate transposes H, mH and adjoint (transposes); and
sum_to_size (a sum down to a shape the tensor expands from). hpcfsdp/_tensor_methods/shape.py loads this module
before it makes the family's mixin."""
import math

import numpy as np

from .. import _backend
from .._array import dtype_category
from .._registry import op
from ._common import _to_float

__all__ = []


def _real(input):  # noqa: A002
    """A real tensor's real part: the tensor itself."""
    return input


def _imag(input):  # noqa: A002
    """Refused for real tensors, as PyTorch: they have no imaginary part to view."""
    raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")


def _real_function(input):  # noqa: A002
    """torch.real(input): input.real."""
    return input.real


def _imag_function(input):  # noqa: A002
    """torch.imag(input): input.imag."""
    return input.imag


_real_function.__name__, _imag_function.__name__ = "real", "imag"
op("shape", name="real", function=_real_function)(property(_real))
op("shape", name="imag", function=_imag_function)(property(_imag))


@op("shape", function=True, aliases=("conj_physical", "resolve_conj"))
def conj(self):
    """A real tensor's complex conjugate: the tensor itself."""
    return self


@op("shape", function=True)
def angle(self):
    """The argument of each element as a complex number: pi for negative values, 0 otherwise (NaN stays NaN), in
    a floating dtype; not differentiable (its derivative is 0 for real inputs)."""
    x = _to_float(self)
    xp = x._xp()
    a = x._data
    out = xp.where(a < 0, a.dtype.type(math.pi), a.dtype.type(0))
    if dtype_category(a.dtype) == 2:
        out = xp.where(xp.isnan(a.astype(np.float32) if a.dtype == _backend.bfloat16 else a), a, out)
    return x._wrap(out)


@op("shape", name="H")
@property
def H(self):  # noqa: N802  (PyTorch's name)
    """The conjugate transpose of a matrix (2-D tensor): its transpose for real dtypes."""
    if self.ndim != 2:
        raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got {self.ndim}-D tensor."
                           + (" For batches of matrices, consider using tensor.mH" if self.ndim > 2 else ""))
    return self.transpose(0, 1)


@op("shape", name="mH")
@property
def mH(self):  # noqa: N802  (PyTorch's name)
    """The conjugate transpose of the last two dims: mT for real dtypes."""
    if self.ndim < 2:
        raise RuntimeError(f"tensor.mH is only supported on matrices or batches of matrices. Got {self.ndim}-D "
                           "tensor.")
    return self.transpose(-2, -1)


@op("shape", function=True)
def adjoint(self):
    """The conjugate transpose of the last two dims (a view): mT for real dtypes."""
    if self.ndim < 2:
        raise RuntimeError(f"tensor.adjoint() is only supported on matrices or batches of matrices. Got "
                           f"{self.ndim}-D tensor.")
    return self.transpose(-2, -1)


@op("shape")
def sum_to_size(self, *size):
    """The sum of self over the dims that expand from ``size`` to self's shape (``size`` must be expandable to
    it): leading dims summed away, dims of size 1 in ``size`` summed with keepdim; differentiable."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    size = tuple(int(s) for s in size)
    shape = tuple(self.shape)
    lead = len(shape) - len(size)
    if lead < 0 or any(s != 1 and s != n for s, n in zip(size, shape[lead:])):
        raise RuntimeError(f"size {{{', '.join(map(str, size))}}} is not expandable to size "
                           f"{{{', '.join(map(str, shape))}}}.")
    out = self.sum(tuple(range(lead))) if lead else self
    dims = tuple(i for i, (s, n) in enumerate(zip(size, shape[lead:])) if s == 1 and n != 1)
    return out.sum(dims, keepdim=True) if dims else out
