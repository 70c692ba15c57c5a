"""save/load of state dicts without pickle: one safetensors file whose metadata holds a typed JSON skeleton.

[Note: Serialization format]
``save(obj, f)`` writes a standard safetensors file: every tensor (and ndarray) leaf of ``obj`` is one
safetensors tensor named by its index ("0", "1", ...), and ``__metadata__["hpcfsdp.skeleton"]`` is a JSON
document that rebuilds ``obj`` around them, preserving what JSON alone would lose:

    dict / OrderedDict   {"$dict": [[key, value], ...]} / {"$odict": [...], "$meta": state-dict _metadata}
    tuple / list         {"$tuple": [...]} / [...]
    float nan/inf        {"$float": "nan" | "inf" | "-inf"}   (finite floats, ints, bools, str, None as JSON)
    tensor               {"$tensor": name, "device": "cpu" | "cuda:N", "param": bool, "requires_grad": bool}
    ndarray / np scalar  {"$ndarray": name} / {"$scalar": [dtype, value]}
    dtype                {"$dtype": name}

Keys are encoded like values, so int, tuple and None keys survive. Tensors that share one array are
stored once and come back sharing one array (tied weights). Tensors are laid out largest element first,
so every tensor's bytes are aligned to its element size in the file, which ``mmap=True`` maps
copy-on-write. Nothing on disk is ever executed: ``weights_only`` is accepted for PyTorch compatibility
and both values load the same way. DTensors are refused: a sharded tensor belongs in a distributed
checkpoint (``hpcfsdp.distributed.checkpoint.save``) or is gathered first with ``full_tensor()``.
"""

import io
import json
import math
import os
import struct
from collections import OrderedDict

import ml_dtypes
import numpy as np

from . import _backend
from ._tensor import Tensor

__all__ = ["save", "load"]

_SKELETON = "hpcfsdp.skeleton"
_CODES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
}
_DTYPES = {code: np.dtype(getattr(ml_dtypes, name, None) or name) for name, code in _CODES.items()}
_MAX_HEADER = 100 * 1024 * 1024


class _Writer:
    """Walks an object into (skeleton, arrays); see [Note: Serialization format]."""

    def __init__(self):
        self.arrays = []  # host arrays, by tensor index
        self._by_key = {}  # (data pointer, shape, strides, dtype) -> index: shared arrays are stored once

    def array(self, arr, path) -> str:
        if _backend.is_meta_array(arr):
            raise TypeError(f"cannot save the meta tensor at {path}: it has no data")
        host = np.asarray(_backend.to_numpy(arr))
        if host.dtype.name not in _CODES:
            raise TypeError(f"cannot save the tensor at {path}: dtype {host.dtype} is not one of {sorted(_CODES)}")
        key = (host.__array_interface__["data"][0], host.shape, host.strides, host.dtype.str)
        if key not in self._by_key:
            self._by_key[key] = len(self.arrays)
            self.arrays.append(host)
        return str(self._by_key[key])

    def walk(self, obj, path):
        from .distributed.tensor import DTensor
        from .nn import Parameter

        if obj is None or isinstance(obj, (bool, str)) or type(obj) is int:
            return obj
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"$float": repr(obj)}
        if isinstance(obj, DTensor):
            raise TypeError(f"cannot save the DTensor at {path}: save sharded state with "
                            "hpcfsdp.distributed.checkpoint.save, or gather it with full_tensor() first")
        if isinstance(obj, Tensor):
            dev = obj.device
            return {"$tensor": self.array(obj._data, path), "device": str(dev) if dev.type != "cpu" else "cpu",
                    "param": isinstance(obj, Parameter), "requires_grad": bool(obj.requires_grad)}
        if isinstance(obj, np.ndarray) or _backend.is_cupy_array(obj):
            return {"$ndarray": self.array(obj, path)}
        if isinstance(obj, np.generic):
            if obj.dtype.name not in _CODES:
                raise TypeError(f"cannot save the NumPy scalar at {path}: dtype {obj.dtype}")
            return {"$scalar": [obj.dtype.name, self.walk(obj.item(), path)]}
        if isinstance(obj, np.dtype):
            return {"$dtype": obj.name}
        if isinstance(obj, tuple) and type(obj) is tuple:
            return {"$tuple": [self.walk(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
        if type(obj) is list:
            return [self.walk(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        if type(obj) in (dict, OrderedDict):
            pairs = [[self.walk(k, f"{path} key {k!r}"), self.walk(v, f"{path}[{k!r}]")] for k, v in obj.items()]
            if type(obj) is dict:
                return {"$dict": pairs}
            out = {"$odict": pairs}
            meta = getattr(obj, "_metadata", None)
            if meta is not None:
                out["$meta"] = self.walk(meta, f"{path}._metadata")
            return out
        raise TypeError(f"cannot save {type(obj).__name__} at {path}: hpcfsdp.save holds tensors, ndarrays, dtypes "
                        "and None/bool/int/float/str in dicts, lists and tuples (no pickle)")


def save(obj, f) -> None:
    """Write ``obj`` (a state dict: tensors and plain values in dicts/lists/tuples) to path or binary file ``f``."""
    w = _Writer()
    skeleton = w.walk(obj, "<root>")
    order = sorted(range(len(w.arrays)), key=lambda i: -w.arrays[i].dtype.itemsize)  # aligned offsets
    header, pos = {}, 0
    for i in order:
        a = w.arrays[i]
        header[str(i)] = {"dtype": _CODES[a.dtype.name], "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        pos += a.nbytes
    header["__metadata__"] = {"format": "hpcfsdp", _SKELETON: json.dumps(skeleton, separators=(",", ":"))}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    own = isinstance(f, (str, os.PathLike))
    fh = open(f, "wb") if own else f
    try:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for i in order:
            a = w.arrays[i]
            fh.write(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
    finally:
        if own:
            fh.close()


def _parse_header(buf, source):
    if len(buf) < 8:
        raise ValueError(f"{source} is not a safetensors file: {len(buf)} bytes")
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    if n > min(_MAX_HEADER, len(buf) - 8):
        raise ValueError(f"{source} is not a safetensors file (header length {n} does not fit the file of "
                         f"{len(buf)} bytes): hpcfsdp.load reads files written by hpcfsdp.save")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{source} is not a safetensors file (its header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{source}: safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or not isinstance(meta.get(_SKELETON), str):
        raise ValueError(f"{source} is a safetensors file without an hpcfsdp skeleton (not written by hpcfsdp.save); "
                         "read its tensors with safetensors.numpy.load_file")
    data_len = len(buf) - 8 - n
    tensors = {}
    for name, v in header.items():
        ok = isinstance(v, dict) and set(v) == {"dtype", "shape", "data_offsets"} and v["dtype"] in _DTYPES
        ok = ok and isinstance(v["shape"], list) and all(type(s) is int and s >= 0 for s in v["shape"])
        ok = ok and isinstance(v["data_offsets"], list) and len(v["data_offsets"]) == 2
        ok = ok and all(type(s) is int for s in v["data_offsets"])
        if not ok:
            raise ValueError(f"{source}: malformed safetensors entry {name!r}: {v!r:.200}")
        dt = _DTYPES[v["dtype"]]
        b, e = v["data_offsets"]
        if not 0 <= b <= e <= data_len or e - b != math.prod(v["shape"]) * dt.itemsize:
            raise ValueError(f"{source}: entry {name!r} has data offsets {[b, e]} that do not match its shape "
                             f"{v['shape']} and dtype, or lie outside the {data_len} data bytes (truncated file?)")
        tensors[name] = (dt, tuple(v["shape"]), 8 + n + b)
    try:
        skeleton = json.loads(meta[_SKELETON])
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: the hpcfsdp skeleton is not valid JSON: {e}") from None
    return skeleton, tensors


def _location(map_location, saved: str):
    if map_location is None:
        return saved
    if isinstance(map_location, dict):
        return map_location.get(saved, saved)
    if isinstance(map_location, (str, _backend.device)):
        return str(map_location)
    raise TypeError(f"map_location must be None, a device, a string or a dict, got {type(map_location).__name__}")


class _Reader:
    def __init__(self, buf, tensors, source, map_location):
        self.buf, self.tensors, self.source, self.map_location = buf, tensors, source, map_location
        self.cache = {}

    def array(self, name):
        if name not in self.tensors:
            raise ValueError(f"{self.source}: the skeleton refers to tensor {name!r}, which the file does not hold")
        if name not in self.cache:
            dt, shape, off = self.tensors[name]
            self.cache[name] = np.ndarray(shape, dtype=dt, buffer=self.buf, offset=off)
        return self.cache[name]

    def build(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.build(v) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise ValueError(f"{self.source}: malformed skeleton node {node!r:.200}")
        tag = next(iter(node))
        if tag == "$dict":
            return {self.build(k): self.build(v) for k, v in node["$dict"]}
        if tag == "$odict":
            out = OrderedDict((self.build(k), self.build(v)) for k, v in node["$odict"])
            if "$meta" in node:
                out._metadata = self.build(node["$meta"])
            return out
        if tag == "$tuple":
            return tuple(self.build(v) for v in node["$tuple"])
        if tag == "$float":
            return float(node["$float"])
        if tag == "$ndarray":
            return self.array(node["$ndarray"])
        if tag == "$scalar":
            dt, v = node["$scalar"]
            return self.dtype(dt).type(v)
        if tag == "$dtype":
            return self.dtype(node["$dtype"])
        if tag == "$tensor":
            return self.tensor(node)
        raise ValueError(f"{self.source}: unknown skeleton tag {tag!r}")

    def dtype(self, name):
        if name not in _CODES:
            raise ValueError(f"{self.source}: unknown dtype {name!r} in the skeleton")
        return _DTYPES[_CODES[name]]

    def tensor(self, node):
        from .nn import Parameter

        arr = self.array(node["$tensor"])
        loc = _location(self.map_location, node.get("device", "cpu"))
        key = (node["$tensor"], loc)
        if key not in self.cache:  # tensors that shared an array share it again
            self.cache[key] = Tensor._wrap(arr).to(loc) if loc != "cpu" else Tensor._wrap(arr)
        t = Tensor._wrap(self.cache[key]._data)
        if node.get("param"):
            return Parameter(t, requires_grad=bool(node.get("requires_grad", True)))
        return t.requires_grad_(True) if node.get("requires_grad") else t


def load(f, map_location=None, *, weights_only: bool = True, mmap: bool = False, **kwargs):
    """Read what ``save`` wrote. ``map_location``: a device/str for every tensor, or a dict {saved: new};
    ``mmap``: map the file copy-on-write instead of reading it (needs a path). See [Note: Serialization format]."""
    if kwargs:
        raise TypeError(f"load() got unexpected keyword arguments {sorted(kwargs)}")
    if not isinstance(weights_only, bool):
        raise TypeError(f"weights_only must be a bool, got {weights_only!r}")
    if isinstance(f, (str, os.PathLike)):
        source = os.fspath(f)
        if mmap:
            buf = np.memmap(source, dtype=np.uint8, mode="c") if os.path.getsize(source) else np.zeros(0, np.uint8)
        else:
            with open(source, "rb") as fh:
                buf = np.frombuffer(bytearray(fh.read()), dtype=np.uint8)
    else:
        if mmap:
            raise TypeError("load(mmap=True) needs a file path, not a file object")
        source = getattr(f, "name", "<file object>")
        data = f.getvalue() if isinstance(f, io.BytesIO) else f.read()
        buf = np.frombuffer(bytearray(data), dtype=np.uint8)
    skeleton, tensors = _parse_header(buf, source)
    return _Reader(buf, tensors, source, map_location).build(skeleton)
