"""The surface of the installed CuPy that the simulated device is held to: module names, ndarray attributes, type tables."""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["Surface", "surface", "purge_real_cupy", "is_cupy_module_name", "MODULES", "char_dtype", "SCATTER_ADD",
           "INSTALL_HINT"]

# [Note: The real CuPy surface]
# The simulated device computes with NumPy, which accepts far more than CuPy: names CuPy lacks
# (cupy.bfloat16), ndarray attributes it lacks (flags.writeable), dtypes its kernels have no loop for
# (bitwise_and on bfloat16, cupyx.scatter_add on bfloat16). Code that passes on the simulation must run on
# CuPy, so the simulation reads CuPy's surface from the installed wheel (it imports without a GPU) once per
# process, before it takes the names `cupy`/`cupyx` in sys.modules, and refuses the rest with CuPy's own
# errors: the public names of each module below, dir(cupy.ndarray), the fields of ndarray.flags, each
# ufunc's type signatures (ufunc.types, resolved as CuPy's _kernel.pyx does: the first signature every
# input casts to safely) and the reductions' (sum, prod, max, min). What CuPy decides in code rather than in
# a table is written down here by hand, naming the source file it comes from (SCATTER_ADD).

MODULES = ("cupy", "cupyx", "cupy.cuda", "cupy.cuda.runtime", "cupy.random", "cupy.linalg", "cupy.cuda.nccl")
# Modules CuPy loads on first use from a CUDA library this machine may lack (cupy.cuda.cublas needs libcublas, which
# no wheel of the cuda extra brings): their names and signatures are read from the compiled extension itself
# (Cython embeds each function's signature in its docstring), and cupy.cuda gets the name as its __getattr__ gives it.
BINARY_MODULES = {"cupy.cuda.cublas": "cupy_backends.cuda.libs.cublas"}
INSTALL_HINT = 'pip install -e ".[cuda]"'

# cupy/_core/_routines_indexing.pyx, _scatter_op (op == 'add'): the value dtypes scatter_add accepts
# (CUDA's atomicAdd); anything else raises TypeError with this message. CuPy 14.2 has no bfloat16 here.
SCATTER_ADD = (frozenset(np.dtype(t) for t in (np.int32, np.float16, np.float32, np.float64, np.uint32, np.uint64)),
               "scatter_add only supports int32, float16, float32, float64, uint32, uint64, as data type")

# cupy/_core/flags.pyx, Flags.__getitem__: the keys ndarray.flags[...] accepts (else KeyError).
_FLAG_KEYS = ("C_CONTIGUOUS", "F_CONTIGUOUS", "OWNDATA")

# CuPy's private reduction kernels whose type tables the simulation reads (module, attribute) -> public name.
_REDUCTIONS = {("cupy._core._routines_math", "sum_auto_dtype"): "sum",
               ("cupy._core._routines_math", "prod_auto_dtype"): "prod",
               ("cupy._core._routines_statistics", "amax"): "max",
               ("cupy._core._routines_statistics", "amin"): "min"}

_BF16 = np.dtype(ml_dtypes.bfloat16)


def char_dtype(c: str) -> np.dtype:
    """The dtype of a type character of CuPy's signatures ('E' is ml_dtypes' bfloat16, as in CuPy)."""
    return _BF16 if c == _BF16.char else np.dtype(c)


@dataclass(frozen=True)
class Surface:
    """What the installed CuPy has (all read from it, see [Note: The real CuPy surface])."""

    version: str
    modules: dict  # module name -> frozenset of its public names
    ndarray: frozenset  # dir(cupy.ndarray)
    flags: frozenset  # public attributes of ndarray.flags
    flag_keys: tuple  # what flags[...] accepts
    ufuncs: dict  # ufunc name -> tuple of signatures ('EE->E')
    reductions: dict  # sum/prod/max/min -> tuple of signatures
    signatures: dict  # "cupy.cuda.cublas.gemmEx" -> its parameter names, for the BINARY_MODULES


def is_cupy_module_name(name: str) -> bool:
    return name.split(".", 1)[0] in ("cupy", "cupyx", "cupy_backends")


def purge_real_cupy() -> None:
    """Remove every cupy, cupy.*, cupyx, cupyx.*, cupy_backends* entry of sys.modules (the simulation takes the names)."""
    for k in [k for k in sys.modules if is_cupy_module_name(k)]:
        del sys.modules[k]


_CACHE: list = []


def surface() -> Surface:
    """The installed CuPy's surface, read once per process; RuntimeError if CuPy is not importable."""
    if not _CACHE:
        _CACHE.append(_capture())
    return _CACHE[0]


def _capture() -> Surface:
    cur = sys.modules.get("cupy")
    if cur is not None and getattr(cur, "__hpcfsdp_sim__", False):
        raise RuntimeError("the simulated cupy is installed before the real CuPy's surface was read: "
                           "hpcfsdp.testing.cuda_sim.install() reads it first")
    try:
        mods = {n: importlib.import_module(n) for n in MODULES}
    except Exception as e:  # ImportError, or a CUDA library CuPy needs at import
        raise RuntimeError(
            f"the simulated CUDA device is held to the installed CuPy's API, but CuPy is not importable "
            f"({type(e).__name__}: {e}); install the pinned CuPy the simulation reads: {INSTALL_HINT}") from None
    cp = mods["cupy"]
    from cupy._core import _kernel  # noqa: PLC0415  (the ufunc class)
    from cupy._core import flags as _flags  # noqa: PLC0415

    names = {n: frozenset(a for a in dir(m) if not a.startswith("_")) for n, m in mods.items()}
    ufuncs = {}
    for mod_name in ("cupy", "cupyx"):
        for a, f in vars(mods[mod_name]).items():  # type(), not isinstance: no lazy submodule (cupy.testing) loads
            if issubclass(type(f), _kernel.ufunc) and not a.startswith("_"):
                ufuncs.setdefault(a, tuple(f.types))
    reductions = {}
    for (mod_name, attr), public in _REDUCTIONS.items():
        k = getattr(sys.modules.get(mod_name) or importlib.import_module(mod_name), attr, None)
        ops = getattr(getattr(k, "_ops", None), "ops", None)
        if ops:
            reductions[public] = tuple("".join(np.dtype(t).char for t in o.in_types) + "->"
                                       + "".join(np.dtype(t).char for t in o.out_types) for o in ops)
    flags = frozenset(a for a in dir(_flags.Flags) if not a.startswith("_"))
    signatures = {}
    for public, ext in BINARY_MODULES.items():
        funcs, consts = _binary_surface(ext)
        names[public] = frozenset(funcs) | consts
        names["cupy.cuda"] = names["cupy.cuda"] | {public.rsplit(".", 1)[1]}
        signatures.update({f"{public}.{f}": ps for f, ps in funcs.items()})
    return Surface(version=cp.__version__, modules=names, ndarray=frozenset(dir(cp.ndarray)), flags=flags,
                   flag_keys=_FLAG_KEYS, ufuncs=ufuncs, reductions=reductions, signatures=signatures)


_SIGNATURE = re.compile(rb"(?<![\w.])([A-Za-z]\w*)\(((?:(?:intptr_t|size_t|int|long long|float|double|bint|str|object) "
                        rb"\w+(?:, )?)*)\)")


def _binary_surface(ext: str):
    """({function: parameter names}, constant names) of the Cython extension module ``ext``, read from its file."""
    spec = importlib.util.find_spec(ext)
    if spec is None or not spec.origin:
        raise RuntimeError(f"{ext} is not installed")
    with open(spec.origin, "rb") as f:
        data = f.read()
    funcs = {m.group(1).decode(): tuple(p.rsplit(" ", 1)[1] for p in m.group(2).decode().split(", ") if p)
             for m in _SIGNATURE.finditer(data)}
    prefix = ext.split(".")[-1].upper() + "_"  # CUBLAS_OP_N, ...
    consts = {c.decode() for c in re.findall(rb"(?<![\w])(" + prefix.encode() + rb"[A-Z0-9_]+)(?![\w])", data)}
    return funcs, frozenset(consts)
