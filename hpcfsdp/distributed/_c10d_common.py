"""What the collectives of torch.distributed (distributed_c10d) share: the array behind a Tensor argument, checked
(TypeError for a non-Tensor, ValueError for wrong list lengths, sizes or dtypes: before any communication), and
a Work that copies results out of a flat buffer once it completed."""

from __future__ import annotations

from typing import Any

from hpcfsdp._backend import is_meta_array
from hpcfsdp._tensor import Tensor
from hpcfsdp.distributed._buffers import check_same_kind
from hpcfsdp.distributed.process_group import Work

__all__ = ["as_array", "tensor_arrays", "check_root_list", "ThenWork", "finish", "copy_out"]


def as_array(t: Any, what: str, *, writable: bool = False):
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a hpcfsdp Tensor, got {type(t).__module__}.{type(t).__qualname__}")
    a = t._data
    if is_meta_array(a):
        raise RuntimeError(f"{what}: a meta tensor has no data to communicate")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what}: expected a contiguous tensor, got shape {tuple(a.shape)} strides {a.strides}")
    return a


def tensor_arrays(fn: str, name: str, lst, n: int, ref, *, writable: bool = False, same_size: bool = True) -> list:
    """The arrays of ``lst``: a list of ``n`` contiguous Tensors of ``ref``'s dtype and device (and its element
    count with ``same_size``)."""
    if not isinstance(lst, (list, tuple)):
        raise TypeError(f"{fn}: {name} must be a list of Tensors, got {type(lst).__name__}")
    if len(lst) != n:
        raise ValueError(f"{fn}: {name} has {len(lst)} entries, expected the group size {n}")
    arrs = []
    for i, t in enumerate(lst):
        a = as_array(t, f"{fn}: {name}[{i}]", writable=writable)
        if a.dtype != ref.dtype:
            raise ValueError(f"{fn}: tensors of different dtypes: {name}[{i}] is {a.dtype.name}, expected "
                             f"{ref.dtype.name}")
        if same_size and a.size != ref.size:
            raise ValueError(f"{fn}: {name}[{i}] has {a.size} elements {list(a.shape)}, expected {ref.size} like "
                             f"the tensor {list(ref.shape)}")
        check_same_kind(a, ref, f"{fn}: {name}[{i}]")
        arrs.append(a)
    return arrs


def check_root_list(fn: str, name: str, lst, here: bool, role: str) -> None:
    """PyTorch's rule: ``lst`` is given on the root rank (``here``) and only there."""
    if here and not lst:
        raise ValueError(f"{fn}: Argument ``{name}`` must be specified on {role} rank.")
    if not here and lst:
        raise ValueError(f"{fn}: Argument ``{name}`` must NOT be specified on non-{role} ranks.")


class ThenWork(Work):
    """Work that runs ``post`` (on the waiting thread) once ``inner`` completed."""

    __slots__ = ("_inner", "_post", "_posted")

    def __init__(self, inner: Work, post):
        super().__init__(inner._desc)
        self._inner, self._post, self._posted = inner, post, False

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def exception(self):
        return self._inner.exception()

    def wait(self, timeout=None) -> bool:
        self._inner.wait(timeout)
        if not self._posted:
            self._posted = True
            self._post()
        return True


def finish(work: Work, post, async_op: bool):
    """``work`` followed by ``post`` (copies out of a flat buffer) when waited for."""
    tw = ThenWork(work, post)
    if async_op:
        return tw
    tw.wait()
    return None


def copy_out(flat, outs) -> None:
    """Consecutive pieces of ``flat`` into the arrays ``outs`` (each its own size and shape)."""
    off = 0
    for o in outs:
        o[...] = flat[off:off + o.size].reshape(o.shape)
        off += o.size
