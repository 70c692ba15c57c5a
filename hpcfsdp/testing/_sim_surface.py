"""The simulated cupy modules' gate: only the installed CuPy's names, flags and dtype rules, and the record of names used."""
from __future__ import annotations

import atexit
import os
import socket
import threading
import types

import numpy as np

from ._cupy_surface import SCATTER_ADD, char_dtype, surface

__all__ = ["SimModule", "Flags", "resolve", "nin", "check_out", "check_reduction", "check_scatter_add", "start_recording", "record",
           "recorded", "ndarray_attr_error"]

# See [Note: The real CuPy surface] in _cupy_surface.py.

# -- the record of names (HPCFSDP_CUDA_SIM_RECORD) ----------------------------------------------------------
_REC: set | None = None
_REC_LOCK = threading.Lock()


def start_recording(dirname: str) -> None:
    """Record every cupy name this process uses; write them to ``dirname`` (one file per process) at exit."""
    global _REC
    if _REC is None:
        _REC = set()
        atexit.register(_write, dirname)


def record(name: str) -> None:
    if _REC is not None:
        _REC.add(name)  # set.add is atomic under the GIL


def recorded() -> set:
    return set(_REC or ())


def _write(dirname: str) -> None:
    os.makedirs(dirname, exist_ok=True)
    path = os.path.join(dirname, f"cupy_names.{socket.gethostname()}.{os.getpid()}.txt")
    with open(path + ".tmp", "w") as f:
        f.write("".join(n + "\n" for n in sorted(_REC or ())))
    os.replace(path + ".tmp", path)


# -- modules ---------------------------------------------------------------------------------------------------
class SimModule(types.ModuleType):
    """A simulated cupy module: the names the installed CuPy's module has, from this module's own attributes, then
    ``impl``'s, then ``fallback(name)``; any other name raises AttributeError as CuPy's module does. Assignments
    (monkeypatch) land in this module's own namespace and shadow ``impl``'s until deleted."""

    def __init__(self, name, impl=None, fallback=None):
        super().__init__(name)
        self.__dict__["__sim_impl__"] = (impl, fallback)
        self.__dict__["__hpcfsdp_sim__"] = True

    def __getattribute__(self, name):
        if name[:2] == "__":
            return super().__getattribute__(name)
        d = super().__getattribute__("__dict__")
        mod = d["__name__"]
        if name not in surface().modules[mod]:
            raise AttributeError(f"module '{mod}' has no attribute '{name}'")
        if _REC is not None:
            _REC.add(f"{mod}.{name}")
        if name in d:
            return d[name]
        impl, fallback = d["__sim_impl__"]
        if impl is not None:
            try:
                return getattr(impl, name)
            except AttributeError:
                pass
        if fallback is not None:
            try:
                return fallback(name)
            except AttributeError:
                pass
        raise AttributeError(f"the simulated {mod} does not implement {name!r} (CuPy {surface().version} has it): "
                             "add it to hpcfsdp/testing/cuda_sim.py")

    def __dir__(self):
        return sorted(surface().modules[self.__dict__["__name__"]])


def ndarray_attr_error(name: str) -> AttributeError:
    return AttributeError(f"'cupy.ndarray' object has no attribute '{name}'")


# -- ndarray.flags ---------------------------------------------------------------------------------------------
class Flags:
    """ndarray.flags as CuPy has it (cupy/_core/flags.pyx): c_contiguous, f_contiguous, owndata; fnc, forc."""

    __slots__ = ("_c", "_f", "_own")

    def __init__(self, c_contiguous, f_contiguous, owndata):
        self._c, self._f, self._own = bool(c_contiguous), bool(f_contiguous), bool(owndata)

    def __getattr__(self, name):  # only names outside the class reach here
        raise AttributeError(f"'cupy._core.flags.Flags' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        if name in Flags.__slots__:
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"'cupy._core.flags.Flags' object attribute '{name}' is read-only"
                                 if name in surface().flags else
                                 f"'cupy._core.flags.Flags' object has no attribute '{name}'")

    @property
    def c_contiguous(self):
        record("ndarray.flags.c_contiguous")
        return self._c

    @property
    def f_contiguous(self):
        record("ndarray.flags.f_contiguous")
        return self._f

    @property
    def owndata(self):
        record("ndarray.flags.owndata")
        return self._own

    @property
    def fnc(self):
        record("ndarray.flags.fnc")
        return self._f and not self._c

    @property
    def forc(self):
        record("ndarray.flags.forc")
        return self._f or self._c

    def __getitem__(self, key):
        if key == "C_CONTIGUOUS":
            return self.c_contiguous
        if key == "F_CONTIGUOUS":
            return self.f_contiguous
        if key == "OWNDATA":
            return self.owndata
        raise KeyError(f"{key} is not defined for cupy.ndarray.flags")

    def __repr__(self):
        return "\n".join(f"  {k} : {self[k]}" for k in surface().flag_keys)


# -- dtype rules -----------------------------------------------------------------------------------------------
def _kind_score(t) -> int:
    if issubclass(t, np.bool_):
        return 0
    if issubclass(t, (np.integer, int)):
        return 1
    if issubclass(t, (np.inexact, float, complex)):
        return 2
    return 3  # bfloat16 (not a NumPy inexact type), and any other unknown type


def _arg_type(x):
    """(dtype, weak Python type or False) of a ufunc input, as CuPy's CScalar / ndarray arguments have them."""
    if type(x) is bool:
        return np.dtype(np.bool_), False
    if type(x) is int:
        return np.dtype(np.uint64 if x >= 0x8000000000000000 else np.int64), int
    if type(x) is float:
        return np.dtype(np.float64), float
    if type(x) is complex:
        return np.dtype(np.complex128), complex
    return np.dtype(x.dtype), False  # a device array, a NumPy scalar or a 0-d host array


_OPS: dict = {}  # signature tuple -> ((in dtypes, out dtypes), ...)
_CACHE: dict = {}


def _ops(sigs):
    ops = _OPS.get(sigs)
    if ops is None:
        ops = _OPS[sigs] = tuple((tuple(char_dtype(c) for c in s.split("->")[0]),
                                  tuple(char_dtype(c) for c in s.split("->")[1])) for s in sigs)
    return ops


def _guess(name, sigs, in_types, weaks, dtype):
    """CuPy's _Ops.guess_routine (cupy/_core/_kernel.pyx): the first signature every input casts to safely (a
    Python scalar may also take the signature's type when that does not promote); with ``dtype``, the first whose
    outputs are all ``dtype``. None when no signature fits."""
    ops = _ops(sigs)
    if dtype is not None:
        return next((op for op in ops if all(t == dtype for t in op[1])), None)
    if any(weaks):  # weak scalars only when no scalar is of a higher kind than the arrays (uint8(1) + 0.)
        arr = [_kind_score(t.type) for t, w in zip(in_types, weaks) if not w]
        sca = [_kind_score(w) for w in weaks if w]
        if not arr or max(arr) < max(sca):
            weaks = (False,) * len(weaks)
    for op in ops:
        for it, w, ot in zip(in_types, weaks, op[0]):
            if np.can_cast(it, ot):
                continue
            if not w:
                break
            try:
                if np.result_type(w(0), ot) != ot:
                    break
            except TypeError:
                break
        else:
            return op
    return None


def resolve(name: str, args, dtype=None):
    """The (in dtypes, out dtypes) CuPy's ufunc ``name`` runs for inputs ``args``, or TypeError as CuPy raises it."""
    sigs = surface().ufuncs[name]
    infos = [_arg_type(a) for a in args]
    in_types = tuple(t for t, _ in infos)
    weaks = tuple(w for _, w in infos)
    dt = None if dtype is None else np.dtype(dtype)
    key = (name, in_types, weaks, dt)
    op = _CACHE.get(key, ())
    if op == ():
        op = _CACHE[key] = _guess(name, sigs, in_types, weaks, dt)
    if op is None:
        shown = dt if dt is not None else in_types
        raise TypeError(f"Wrong type ({shown}) of arguments for cupy_{name}")
    return op


def nin(name: str) -> int:
    """Number of inputs of CuPy's ufunc ``name``."""
    return len(surface().ufuncs[name][0].split("->")[0])


def check_out(name: str, loop, out_dtype, casting="same_kind") -> None:
    """TypeError as CuPy raises it when the loop's output cannot be cast into ``out`` under ``casting``."""
    if not np.can_cast(loop[1][0], out_dtype, casting):
        raise TypeError(f"output (typecode '{loop[1][0].char}') could not be coerced to provided output parameter "
                        f"(typecode '{np.dtype(out_dtype).char}') according to the casting rule \"{casting}\" "
                        f"(cupy_{name})")


def check_reduction(name: str, a_dtype, dtype=None) -> None:
    """TypeError as CuPy's reduction kernel ``name`` (sum, prod, max, min) raises it for an input of ``a_dtype``."""
    sigs = surface().reductions.get(name)
    if sigs is None:  # this CuPy keeps the table elsewhere: nothing to hold the simulation to
        return
    in_t = (np.dtype(a_dtype),)
    dt = None if dtype is None else np.dtype(dtype)
    key = ("reduce." + name, in_t, (False,), dt)
    op = _CACHE.get(key, ())
    if op == ():
        op = _CACHE[key] = _guess(name, sigs, in_t, (False,), dt)
    if op is None:
        raise TypeError(f"Wrong type ({dt if dt is not None else in_t}) of arguments for cupy_{name}")


def check_scatter_add(dtype) -> None:
    """TypeError as cupyx.scatter_add raises it for an array of ``dtype`` (cupy/_core/_routines_indexing.pyx)."""
    ok, msg = SCATTER_ADD
    if np.dtype(dtype) not in ok:
        raise TypeError(msg)
