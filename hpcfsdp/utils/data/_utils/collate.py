"""Collation (PyTorch's torch.utils.data._utils.collate): samples -> batches of hpcfsdp Tensors; pinning."""
import collections.abc
import copy
import re
from typing import Callable

import numpy as np

from hpcfsdp._backend import float64
from hpcfsdp._creation import as_tensor, empty, tensor
from hpcfsdp._tensor_methods.shape import stack
from hpcfsdp._tensor import Tensor

__all__ = ["collate", "default_collate", "default_collate_fn_map", "default_convert", "pin_memory"]

np_str_obj_array_pattern = re.compile(r"[SaUO]")

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}")


def _numpy_to_tensor(a):
    """A NumPy array or scalar as a Tensor of its own dtype (np.int32(3) -> int32, as torch.as_tensor)."""
    return as_tensor(np.asarray(a))


def default_convert(data):
    """Convert each NumPy array or scalar in ``data`` (searched through mappings, namedtuples, tuples and
    sequences) to a Tensor; leave everything else as it is. The DataLoader's collate_fn without batching."""
    elem_type = type(data)
    if isinstance(data, Tensor):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "string_"):
        if elem_type.__name__ == "ndarray" and np_str_obj_array_pattern.search(data.dtype.str) is not None:
            return data
        return _numpy_to_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({key: default_convert(data[key]) for key in data})
                return clone
            return elem_type({key: default_convert(data[key]) for key in data})
        except TypeError:
            return {key: default_convert(data[key]) for key in data}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]  # a list, as PyTorch (backwards compatibility)
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, d in enumerate(data):
                    clone[i] = default_convert(d)
                return clone
            return elem_type([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data


def collate(batch, *, collate_fn_map: dict | None = None):
    """Collate a list of samples by the type of its first element: a function of ``collate_fn_map`` for its
    type (exact, then the first key it is an instance of), else mappings, namedtuples and sequences recurse
    element-wise (tuples become lists, as PyTorch)."""
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = copy.copy(elem)
                clone.update({key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem})
                return clone
            return elem_type({key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem})
        except TypeError:
            return {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return elem_type(*(collate(samples, collate_fn_map=collate_fn_map) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        elem_size = len(next(it))
        if not all(len(e) == elem_size for e in it):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        if isinstance(elem, tuple):
            return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                clone = copy.copy(elem)
                for i, samples in enumerate(transposed):
                    clone[i] = collate(samples, collate_fn_map=collate_fn_map)
                return clone
            return elem_type([collate(samples, collate_fn_map=collate_fn_map) for samples in transposed])
        except TypeError:
            return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
    raise TypeError(default_collate_err_msg_format.format(elem_type))


def collate_tensor_fn(batch, *, collate_fn_map=None):
    """Tensors -> one Tensor with a new leading batch dimension."""
    return stack(list(batch), 0)


def collate_numpy_array_fn(batch, *, collate_fn_map=None):
    """NumPy arrays -> Tensors of their dtype, stacked; string and object arrays are refused."""
    elem = batch[0]
    if np_str_obj_array_pattern.search(elem.dtype.str) is not None:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    return collate([_numpy_to_tensor(b) for b in batch], collate_fn_map=collate_fn_map)


def collate_numpy_scalar_fn(batch, *, collate_fn_map=None):
    """NumPy scalars -> a 1-d Tensor of their (promoted) dtype."""
    return _numpy_to_tensor(list(batch))


def collate_float_fn(batch, *, collate_fn_map=None):
    """Python floats -> float64, as PyTorch (not the default dtype)."""
    return tensor(list(batch), dtype=float64)


def collate_int_fn(batch, *, collate_fn_map=None):
    """Python ints -> int64 (bools -> bool)."""
    return tensor(list(batch))


def collate_str_fn(batch, *, collate_fn_map=None):
    """Strings and bytes stay as they are: the batch itself (a list, or a tuple inside a tuple sample)."""
    return batch


default_collate_fn_map: dict[type | tuple[type, ...], Callable] = {
    Tensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    (np.bool_, np.number, np.object_): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


def default_collate(batch):
    """Put a list of samples together into a batch, as PyTorch's ``default_collate``: Tensors are stacked on
    a new dim 0; NumPy arrays and scalars become Tensors of their dtype; Python ints -> int64, floats ->
    float64, bools -> bool; strings and bytes are kept (a list); mappings, namedtuples and sequences are
    collated element by element (a tuple sample gives a list)."""
    return collate(batch, collate_fn_map=default_collate_fn_map)


def pin_memory(data):
    """``data`` with every CPU Tensor copied into page-locked host memory (the DataLoader's ``pin_memory``),
    through mappings, namedtuples, tuples and sequences; objects with a ``pin_memory()`` method are asked."""
    if isinstance(data, Tensor):
        if data.device.type != "cpu":
            return data
        return empty(tuple(data.shape), dtype=data.dtype, pin_memory=True).copy_(data)
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({k: pin_memory(sample) for k, sample in data.items()})
                return clone
            return type(data)({k: pin_memory(sample) for k, sample in data.items()})
        except TypeError:
            return {k: pin_memory(sample) for k, sample in data.items()}
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*(pin_memory(sample) for sample in data))
        return type(data)(pin_memory(sample) for sample in data)
    if isinstance(data, collections.abc.Sequence):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, item in enumerate(data):
                    clone[i] = pin_memory(item)
                return clone
            return type(data)([pin_memory(sample) for sample in data])
        except TypeError:
            return [pin_memory(sample) for sample in data]
    return data
