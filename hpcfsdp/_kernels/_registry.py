"""The kernel registry: each fused kernel's parameters, its NumPy twin and its launch on CuPy (a ``RawModule``)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

import hpcfsdp._settings as _settings  # a leaf

__all__ = ["use_fused", "KERNELS", "CTYPES", "KernelSpec", "Param", "PointerTable", "kernel", "launch", "name_expressions", "source",
           "FAMILIES"]

# [Note: Fused kernels]
# A step on a GPU costs the larger of its arithmetic and its host work, and every CuPy call is one kernel
# launch of about 10 us of host time: an op composed of NumPy-style passes (GELU's 31, LayerNorm's 10) is
# bound by launches, not by the GPU. The hot ops therefore run one hand-written kernel each on CuPy arrays.
# The CUDA source lives beside this file (<family>.cu); every kernel is a template over its storage type T
# (float, double, __nv_bfloat16, __half) computing in float (double for double), instantiated through
# RawModule's name_expressions ("gelu_fwd<float>"), so one compile per family and device serves every
# dtype. A kernel is declared once here with ``@kernel``: its parameters (pointer in / out / inout, or a
# scalar of a fixed C type) and its NumPy twin, which computes the same result from the unwrapped arrays,
# writing its outputs in place. The simulated device (hpcfsdp/testing/_sim_kernels.py) runs the twin as one
# launch, holding the call to what CUDA needs and would not check: each pointer a C-contiguous device array
# of the declared dtype, each scalar a NumPy scalar of the declared C type (CuPy passes a Python int as a
# 64-bit integer, so a mistyped scalar reads garbage on a GPU), the argument count, the block size.
# Every source compiles for sm_90 with NVRTC in CI (hpcfsdp/_kernels/nvrtc.py), and the tests hold each
# twin equal to the unfused op in float64 and within bf16 tolerance.
# A multi-tensor kernel (an optimizer step over a whole parameter group) takes a "table" parameter: a device
# array of int64 addresses (``const long long*`` in CUDA, each the address of one array of the declared type),
# passed as a ``PointerTable(ptrs, arrays)`` that also names the arrays the addresses are of. ``launch``
# checks the arrays (C-contiguous, the declared dtype, as many as addresses) and hands CuPy ``ptrs``; the
# simulated RawModule (which declares ``takes_tables``) gets the PointerTable, checks that ``ptrs`` holds
# exactly the arrays' ``.data.ptr`` (reading it as the kernel would, ordered after its upload), and gives the
# twin the list of arrays in its place; ``access`` "inout" marks the arrays as written.

CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
          np.dtype(ml_dtypes.bfloat16): "__nv_bfloat16", np.dtype(np.float16): "__half"}
_SCALARS = {"int": np.int32, "long long": np.int64, "float": np.float32, "double": np.float64}
_POINTEES = dict(_SCALARS, **{"unsigned char": np.uint8})  # what a pointer of a fixed C type points to
FAMILIES: set = set()
_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Param:
    """One kernel parameter: ``kind`` is "in", "out" or "inout" (a T* pointer, or a pointer of ``ctype``),
    "scalar" (a value of ``ctype``) or "table" (addresses of arrays of ``ctype``, read or, with ``access``
    "inout", also written: See [Note: Fused kernels])."""

    name: str
    kind: str
    ctype: str = "T"
    access: str = "in"

    def __post_init__(self):
        if self.kind not in ("in", "out", "inout", "scalar", "table"):
            raise ValueError(f"parameter {self.name}: kind {self.kind!r} is not in, out, inout, scalar or table")
        if self.access not in ("in", "inout") or (self.access != "in" and self.kind != "table"):
            raise ValueError(f"parameter {self.name}: access {self.access!r} is for tables, in or inout")
        if self.kind == "scalar" and self.ctype not in _SCALARS:
            raise ValueError(f"parameter {self.name}: scalar C type {self.ctype!r} is not one of {sorted(_SCALARS)}")


@dataclass(frozen=True)
class KernelSpec:
    """A fused kernel: its name in ``family``.cu, its parameters, and ``twin(args, dtype)`` (NumPy, in place)."""

    name: str
    family: str
    params: tuple
    twin: Callable
    block_max: int = 1024

    def expression(self, dtype) -> str:
        """The name expression of this kernel for storage dtype ``dtype`` ("gelu_fwd<float>")."""
        dt = np.dtype(dtype)
        if dt not in CTYPES:
            raise TypeError(f"kernel {self.name}: no instance for dtype {dt.name} (have "
                            f"{', '.join(d.name for d in CTYPES)})")
        return f"{self.name}<{CTYPES[dt]}>"

    def pointer_dtype(self, p: Param, dtype) -> np.dtype:
        """The dtype a pointer parameter must have: T's, or its fixed C type's."""
        if p.ctype == "T":
            return np.dtype(dtype)
        if p.ctype == "A":
            return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)
        return np.dtype(_POINTEES[p.ctype])

    def scalar_type(self, p: Param):
        return _SCALARS[p.ctype]


class PointerTable:
    """A "table" kernel argument: ``ptrs``, a device int64 array holding the addresses of ``arrays`` in order."""

    __slots__ = ("ptrs", "arrays")

    def __init__(self, ptrs, arrays):
        self.ptrs, self.arrays = ptrs, tuple(arrays)


KERNELS: dict[str, KernelSpec] = {}
_ENABLED = _settings.get("HPCFSDP_FUSED_KERNELS")


def use_fused(a) -> bool:
    """Whether an op on array ``a`` runs its fused kernel: ``a`` is a CuPy array and HPCFSDP_FUSED_KERNELS is on."""
    if not _ENABLED:
        return False
    cp = sys.modules.get("cupy")  # (not _backend.is_cupy_array: _backend loads the simulation, which reads this table)
    return cp is not None and isinstance(a, cp.ndarray)


def kernel(name: str, family: str, params, block_max: int = 1024):
    """Declare a kernel of ``family``.cu; decorates its NumPy twin."""
    ps = tuple(Param(*p) if isinstance(p, tuple) else p for p in params)

    def deco(twin):
        if name in KERNELS:
            raise ValueError(f"kernel {name} declared twice")
        KERNELS[name] = KernelSpec(name, family, ps, twin, block_max)
        FAMILIES.add(family)
        return twin
    return deco


def source(family: str) -> str:
    """The CUDA source of ``family``.cu, after the shared common.cuh."""
    parts = []
    for name in ("common.cuh", family + ".cu"):
        with open(os.path.join(_DIR, name), encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts)


def name_expressions(family: str) -> list:
    """Every instance of every kernel of ``family`` (each kernel for each storage dtype)."""
    return [k.expression(dt) for k in KERNELS.values() if k.family == family for dt in CTYPES]


_MODULES: dict = {}
_lock = threading.Lock()
OPTIONS = ("--std=c++17",)


def cuda_include_dir():
    """The include folder of the ``nvidia-cuda-runtime`` wheel (cuda_bf16.h, cuda_fp8.h), or None: CuPy finds the
    headers of a CUDA toolkit itself, and this folder where CUDA came from the package index only."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or ()) if spec else ():
        for sub in sorted(os.listdir(root), reverse=True):  # cu13 before cu12
            inc = os.path.join(root, sub, "include")
            if os.path.isfile(os.path.join(inc, "cuda_bf16.h")):
                return inc
    return None


def _module(family: str):
    cupy = importlib.import_module("cupy")  # the simulated device where it took the name (launch has CuPy arrays)
    dev = cupy.cuda.runtime.getDevice()
    key = (family, dev)
    mod = _MODULES.get(key)
    if mod is None:
        with _lock:
            mod = _MODULES.get(key)
            if mod is None:
                inc = cuda_include_dir()
                mod = _MODULES[key] = cupy.RawModule(code=source(family),
                                                     options=OPTIONS + ((f"-I{inc}",) if inc else ()),
                                                     name_expressions=name_expressions(family))
    return mod


def _checked_args(spec: KernelSpec, dtype, args) -> tuple:
    if len(args) != len(spec.params):
        raise TypeError(f"kernel {spec.name}: {len(args)} arguments for {len(spec.params)} parameters "
                        f"({', '.join(p.name for p in spec.params)})")
    out = []
    for p, a in zip(spec.params, args):
        if p.kind == "scalar":
            out.append(spec.scalar_type(p)(a))
            continue
        want = spec.pointer_dtype(p, dtype)
        if p.kind == "table":
            _check_table(spec, p, want, a)
            out.append(a)
            continue
        if a.dtype != want or not a.flags.c_contiguous:
            raise TypeError(f"kernel {spec.name}: parameter {p.name} needs a C-contiguous {want.name} array, got "
                            f"{a.dtype.name}{'' if a.flags.c_contiguous else ' (not contiguous)'}")
        out.append(a)
    return tuple(out)


def _check_table(spec, p, want, t) -> None:
    if not isinstance(t, PointerTable):
        raise TypeError(f"kernel {spec.name}: parameter {p.name} is a table; pass a PointerTable, got {type(t).__name__}")
    if t.ptrs.dtype != np.int64 or t.ptrs.ndim != 1 or not t.ptrs.flags.c_contiguous or t.ptrs.size != len(t.arrays):
        raise TypeError(f"kernel {spec.name}: table {p.name} needs a contiguous 1-d int64 array of {len(t.arrays)} "
                        f"addresses, got {t.ptrs.dtype.name}{list(t.ptrs.shape)}")
    for i, a in enumerate(t.arrays):
        if a.dtype != want or not a.flags.c_contiguous:
            raise TypeError(f"kernel {spec.name}: table {p.name}[{i}] needs a C-contiguous {want.name} array, got "
                            f"{a.dtype.name}{'' if a.flags.c_contiguous else ' (not contiguous)'}")


def launch(name: str, dtype, grid, block, args, shared_mem: int = 0) -> None:
    """Launch kernel ``name`` for storage dtype ``dtype`` on the current stream: scalars are cast to their declared
    C types, pointers and the arrays of tables checked C-contiguous of the declared dtype (TypeError otherwise)."""
    spec = KERNELS[name]
    fn = _module(spec.family).get_function(spec.expression(dtype))
    args = _checked_args(spec, dtype, args)
    if not getattr(fn, "takes_tables", False):  # a GPU gets the addresses
        args = tuple(a.ptrs if isinstance(a, PointerTable) else a for a in args)
    fn(tuple(grid) if isinstance(grid, tuple) else (int(grid),), tuple(block) if isinstance(block, tuple)
       else (int(block),), args, shared_mem=int(shared_mem))
