"""Sparse functions of torch.nn.functional: one_hot (embedding itself is in nn/functional.py)."""
import numpy as np

from ..._tensor import Tensor
from ._common import check_tensor

__all__ = ["one_hot"]


def one_hot(tensor, num_classes=-1):
    """(*, num_classes) int64 with 1 at each value of the int64 ``tensor``; num_classes=-1 means max + 1.

    Raises:
        RuntimeError: a non-int64 tensor, a negative value, a value >= num_classes, or an empty tensor
            with num_classes=-1, with PyTorch's messages.
    """
    check_tensor(tensor, "one_hot", "tensor")
    if tensor.dtype != np.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    a = tensor._data
    xp = tensor._xp()
    if a.size == 0:
        if num_classes == -1:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
    else:
        if int(a.min()) < 0:
            raise RuntimeError("Class values must be non-negative.")
        hi = int(a.max())
        if num_classes == -1:
            num_classes = hi + 1
        elif hi >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    if num_classes < 0:
        raise RuntimeError("Class values must be smaller than num_classes.")
    return Tensor._wrap((a[..., None] == xp.arange(int(num_classes))).astype(np.int64))
