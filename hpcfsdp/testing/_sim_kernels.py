"""cupy.RawModule on the simulated device: a fused kernel of hpcfsdp/_kernels runs as one launch of its NumPy twin,
held to what CUDA needs of its arguments (See [Note: Fused kernels] in hpcfsdp/_kernels/_registry.py)."""
from __future__ import annotations

import re
import types

import numpy as np

from . import _sim_runtime as _rt
from ._sim_runtime import CudaSimError, _stack

__all__ = ["RawModule", "wire"]

_rt.SIM_FILES.add(__file__)
_EXPR = re.compile(r"^\s*([A-Za-z_]\w*)\s*<\s*([^<>]+?)\s*>\s*$")
_SHARED_STATIC_MAX = 48 * 1024  # bytes of dynamic shared memory a launch gets without an opt-in attribute


_SIM = {}  # "ndarray" and "Ctx" of cuda_sim, which wires them in as it loads


def wire(ndarray, ctx) -> None:
    """cuda_sim's array type and kernel context (``_Ctx``), for the launches."""
    _SIM.update(ndarray=ndarray, Ctx=ctx)


def _sim():
    """cuda_sim's ``ndarray`` and ``_Ctx`` as attributes."""
    return types.SimpleNamespace(ndarray=_SIM["ndarray"], _Ctx=_SIM["Ctx"])


class RawModule:
    """cupy.RawModule(code=..., options=..., name_expressions=...): kernels looked up by name expression."""

    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        if code is None:
            raise CudaSimError("RawModule: the simulation compiles source code only (code=...), not a cubin path")
        self.code = code
        self.options = tuple(options)
        self.name_expressions = tuple(name_expressions or ())

    def get_function(self, name: str):
        from hpcfsdp._kernels._registry import CTYPES, KERNELS  # (not the families: no cycle through _backend)
        m = _EXPR.match(name)
        if not m:
            raise CudaSimError(f"RawModule.get_function({name!r}): the simulation runs template instances "
                               "(name<type>) of hpcfsdp's fused kernels only")
        if name not in self.name_expressions:
            raise CudaSimError(f"RawModule.get_function({name!r}): not among the module's name_expressions "
                               "(a template instance must be named at compile time)")
        base, ctype = m.groups()
        spec = KERNELS.get(base)
        if spec is None:
            raise CudaSimError(f"RawModule.get_function({name!r}): no NumPy twin is declared for kernel {base}")
        if not re.search(r"__global__\s+void\s+" + re.escape(base) + r"\s*\(", self.code):
            raise CudaSimError(f"RawModule.get_function({name!r}): the module's source has no __global__ {base}")
        dtype = next((d for d, c in CTYPES.items() if c == ctype), None)
        if dtype is None:
            raise CudaSimError(f"RawModule.get_function({name!r}): unknown storage type {ctype}")
        return _Function(spec, dtype, name)


def _dims(v, what, name):
    d = tuple(int(x) for x in (v if isinstance(v, tuple) else (v,)))
    if not 1 <= len(d) <= 3 or any(x < 1 for x in d):
        raise CudaSimError(f"{name}: {what} {v!r} must be 1 to 3 positive dimensions")
    return d


class _Function:
    """One template instance: ``f(grid, block, args, shared_mem=0, stream=None)`` is one launch of its twin."""

    takes_tables = True  # a "table" argument arrives as its PointerTable (See [Note: Fused kernels])

    def __init__(self, spec, dtype, name):
        self.spec, self.dtype, self.name = spec, np.dtype(dtype), name

    def __call__(self, grid, block, args, shared_mem=0, stream=None, enable_cooperative_groups=False):
        spec, op = self.spec, f"kernel {self.name}"
        _dims(grid, "grid", op)
        threads = int(np.prod(_dims(block, "block", op)))
        if threads > min(1024, spec.block_max):
            raise CudaSimError(f"{op}: {threads} threads per block; at most {min(1024, spec.block_max)}")
        if not 0 <= int(shared_mem) <= _SHARED_STATIC_MAX:
            raise CudaSimError(f"{op}: {shared_mem} bytes of dynamic shared memory; at most {_SHARED_STATIC_MAX} "
                               "without cudaFuncAttributeMaxDynamicSharedMemorySize")
        args = tuple(args)
        if len(args) != len(spec.params):
            raise CudaSimError(f"{op}: {len(args)} arguments for {len(spec.params)} parameters "
                               f"({', '.join(p.name for p in spec.params)})")
        if stream is not None:
            with stream:
                return self._run(op, args)
        return self._run(op, args)

    def _run(self, op, args):
        spec, ndarray = self.spec, _SIM["ndarray"]
        c = _SIM["Ctx"](op)
        vals, written, pure = [], [], []
        for p, a in zip(spec.params, args):
            if p.kind == "scalar":
                want = spec.scalar_type(p)
                if type(a) is not want:
                    raise CudaSimError(f"{op}: parameter {p.name} is a {p.ctype}; pass a NumPy {want.__name__}, not "
                                       f"{type(a).__name__} (CuPy passes a Python int as long long and a float as "
                                       f"double: the kernel would read the wrong bytes).\nAt:\n{_stack()}")
                vals.append(a)
                continue
            if p.kind == "table":
                vals.append(self._table(op, c, p, a, written))
                continue
            if not isinstance(a, ndarray):
                raise CudaSimError(f"{op}: parameter {p.name} needs a device array, got {type(a).__name__}")
            want = spec.pointer_dtype(p, self.dtype)
            if a.dtype != want or not a._a.flags.c_contiguous:
                raise CudaSimError(f"{op}: parameter {p.name} needs a C-contiguous {want.name} device array, got "
                                   f"{a.dtype.name}{list(a.shape)}{'' if a._a.flags.c_contiguous else ' (strided)'}"
                                   f" (a kernel indexes the raw pointer).\nAt:\n{_stack()}")
            vals.append(c.un(a))
            if p.kind != "in":
                written.append(a)
                if p.kind == "out":
                    pure.append(a)
        c.check(op, pure)
        for o in written:
            o._buf.check_write(c.stream, op, o)
        spec.twin(vals, self.dtype)
        for o in written:
            c.wrote(o, op)

    def _table(self, op, c, p, t, written):
        """A "table" argument: its addresses must be its arrays' (read from the device as the kernel reads them);
        the twin gets the arrays."""
        from hpcfsdp._kernels import PointerTable

        sim = _sim()
        if not isinstance(t, PointerTable) or not isinstance(t.ptrs, sim.ndarray):
            raise CudaSimError(f"{op}: table {p.name} needs a PointerTable of a device int64 array, got "
                               f"{type(t).__name__}")
        want = self.spec.pointer_dtype(p, self.dtype)
        for i, a in enumerate(t.arrays):
            if not isinstance(a, sim.ndarray) or a.dtype != want or not a._a.flags.c_contiguous:
                raise CudaSimError(f"{op}: table {p.name}[{i}] needs a C-contiguous {want.name} device array, got "
                                   f"{getattr(a, 'dtype', type(a).__name__)}.\nAt:\n{_stack()}")
        addrs = c.un(t.ptrs)
        have = [int(x) for x in addrs.reshape(-1)] if t.ptrs.dtype == np.int64 else None
        if have != [a.data.ptr for a in t.arrays]:
            raise CudaSimError(f"{op}: table {p.name} holds addresses {have} but its arrays are at "
                               f"{[a.data.ptr for a in t.arrays]} (a stale or mistyped pointer table).\nAt:\n{_stack()}")
        if p.access == "inout":
            written.extend(t.arrays)
        return [c.un(a) for a in t.arrays]
