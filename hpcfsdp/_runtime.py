"""PyTorch's runtime switches as ``hp.*``: BLAS threads, matmul precision, determinism, ``compile``."""
import ctypes
import os
import sys
import warnings

import numpy as np

__all__ = [
    "set_num_threads", "get_num_threads", "set_num_interop_threads", "get_num_interop_threads",
    "set_float32_matmul_precision", "get_float32_matmul_precision", "use_deterministic_algorithms",
    "are_deterministic_algorithms_enabled", "is_deterministic_algorithms_warn_only_enabled", "compile",
    "blas_library",
]

# [Note: Runtime switches]
# PyTorch scripts set a handful of process-wide switches before training. hpcfsdp honours what it can:
#  - set_num_threads sets the thread count of the BLAS NumPy loaded (OpenBLAS, found below), the only
#    intra-op parallelism hpcfsdp has on the CPU; without OpenBLAS the value is recorded and returned.
#  - set_num_interop_threads is recorded only: hpcfsdp runs no inter-op thread pool (its one extra thread
#    per process is the MPI communication thread). Unlike PyTorch it may be called more than once.
#  - the float32 matmul precision and the determinism switches are recorded and validated as PyTorch does
#    them; they change no kernel: NumPy has no TF32 or reduced-precision GEMM, and hpcfsdp's CPU kernels
#    are deterministic. backends.cuda.matmul.allow_tf32 reads and writes the same precision, as in PyTorch.
#  - compile returns its argument unchanged: hpcfsdp runs eagerly and compiles nothing.

_state = {"threads": None, "interop": None, "precision": "highest", "deterministic": False, "warn_only": False}
_PRECISIONS = ("highest", "high", "medium")


def _default_threads() -> int:
    """PyTorch's default thread count: OMP_NUM_THREADS when set, else the CPUs this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _check_count(fn: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise RuntimeError(f"{fn} expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError(f"{fn} expects a positive integer, got {n}")
    return int(n)


# ---------------------------------------------------------------------------------------------
# OpenBLAS threads
# [Note: Finding OpenBLAS]
# NumPy's wheels bundle OpenBLAS as scipy-openblas (libscipy_openblas64_-<hash>.so in numpy.libs, or
# numpy/.dylibs on macOS) with prefixed symbols such as scipy_openblas_set_num_threads64_; a NumPy built
# against a system OpenBLAS exports openblas_set_num_threads. We look first among the libraries already
# mapped into this process (/proc/self/maps), so the handle is the very library NumPy calls, then in
# NumPy's bundle directories, opening with RTLD_NOLOAD where the platform has it (never a second copy).
_SYMBOL_PREFIXES = ("scipy_openblas", "openblas")
_SYMBOL_SUFFIXES = ("64_", "_64_", "")
_blas = None  # (set, get) ctypes functions, or False when none was found
_blas_path = None


def _openblas_candidates() -> list[str]:
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split(maxsplit=5)[-1].strip()
                if p.startswith("/") and "openblas" in os.path.basename(p).lower() and p not in paths:
                    paths.append(p)
    except OSError:  # no /proc (not Linux): the library is looked for next to NumPy below
        pass
    root = os.path.dirname(os.path.abspath(np.__file__))
    for d in (os.path.join(os.path.dirname(root), "numpy.libs"), os.path.join(root, ".dylibs")):
        if os.path.isdir(d):
            paths += [os.path.join(d, f) for f in sorted(os.listdir(d)) if "openblas" in f.lower()]
    return paths


def _find_openblas():
    global _blas, _blas_path
    if _blas is not None:
        return _blas or None
    _blas = False
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 0) if sys.platform != "win32" else 0
    for path in _openblas_candidates():
        try:
            lib = ctypes.CDLL(path, mode=mode) if mode else ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _SYMBOL_PREFIXES:
            for suffix in _SYMBOL_SUFFIXES:
                try:
                    set_fn = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                    get_fn = getattr(lib, f"{prefix}_get_num_threads{suffix}")
                except AttributeError:
                    continue
                set_fn.argtypes, set_fn.restype = (ctypes.c_int,), None
                get_fn.argtypes, get_fn.restype = (), ctypes.c_int
                _blas, _blas_path = (set_fn, get_fn), path
                return _blas
    return None


def blas_library():
    """The path of the OpenBLAS whose threads set_num_threads sets, or None (not exported as torch.*)."""
    _find_openblas()
    return _blas_path


def set_num_threads(n: int) -> None:
    """Set the number of threads of intra-op parallelism: the thread count of NumPy's OpenBLAS.

    See [Note: Runtime switches]. Raises RuntimeError for a non-int or a count below 1, as PyTorch.
    """
    n = _check_count("set_num_threads", n)
    _state["threads"] = n
    blas = _find_openblas()
    if blas is not None:
        blas[0](n)


def get_num_threads() -> int:
    """The number of threads of intra-op parallelism: what NumPy's OpenBLAS reports, else the value set."""
    blas = _find_openblas()
    if blas is not None:
        return int(blas[1]())
    return _state["threads"] if _state["threads"] is not None else _default_threads()


def set_num_interop_threads(n: int) -> None:
    """Record the number of inter-op threads (hpcfsdp has no inter-op pool; See [Note: Runtime switches])."""
    _state["interop"] = _check_count("set_num_interop_threads", n)


def get_num_interop_threads() -> int:
    """The number of inter-op threads last set, else PyTorch's default (the CPUs this process may use)."""
    return _state["interop"] if _state["interop"] is not None else _default_threads()


# ---------------------------------------------------------------------------------------------
# float32 matmul precision and determinism
def set_float32_matmul_precision(precision: str) -> None:
    """Record the float32 matmul precision: "highest", "high" or "medium" (changes no NumPy kernel).

    Another string warns and changes nothing, a non-string raises RuntimeError, as in PyTorch.
    """
    if not isinstance(precision, str):
        raise RuntimeError(f"set_float32_matmul_precision expects a str, but got {type(precision).__name__}")
    if precision not in _PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "set_float32_matmul_precision call has no effect.", UserWarning, stacklevel=2)
        return
    _state["precision"] = precision


def get_float32_matmul_precision() -> str:
    """The float32 matmul precision last set ("highest" by default)."""
    return _state["precision"]


def _allow_tf32() -> bool:
    """backends.cuda.matmul.allow_tf32: true unless the precision is "highest"."""
    return _state["precision"] != "highest"


def _set_allow_tf32(value: bool) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"allow_tf32 expects a bool, got {value!r}")
    _state["precision"] = "high" if value else "highest"


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Record whether deterministic algorithms are required (hpcfsdp's CPU kernels always are)."""
    if not isinstance(mode, bool):
        raise TypeError(f"use_deterministic_algorithms(): argument 'mode' must be bool, not {type(mode).__name__}")
    if not isinstance(warn_only, bool):
        raise TypeError("use_deterministic_algorithms(): argument 'warn_only' must be bool, "
                        f"not {type(warn_only).__name__}")
    _state["deterministic"], _state["warn_only"] = mode, warn_only


def are_deterministic_algorithms_enabled() -> bool:
    """Whether use_deterministic_algorithms(True) is in effect."""
    return _state["deterministic"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    """Whether use_deterministic_algorithms was last called with warn_only=True."""
    return _state["warn_only"]


# ---------------------------------------------------------------------------------------------
# compile
_COMPILE_MODES = ("default", "lite", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,  # noqa: A001
            disable=False, **kwargs):
    """PyTorch's ``torch.compile``, which compiles nothing here: returns ``model`` itself, unchanged.

    hpcfsdp runs eagerly on NumPy/CuPy. ``compile(fn)``, ``@compile`` and ``@compile(...)`` all work; the
    arguments are validated as PyTorch does (mode, mode with options) and otherwise ignored. A compiled
    module is the module itself, so its ``state_dict`` keys carry no ``_orig_mod.`` prefix.
    """
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    if mode is not None and mode not in _COMPILE_MODES:
        raise RuntimeError(f"Unrecognized mode={mode}, should be one of: {', '.join(_COMPILE_MODES)}")
    if model is None:
        def decorate(fn):
            return compile(fn, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                           disable=disable, **kwargs)
        return decorate
    if not callable(model):
        raise TypeError(f"compile expects a callable (a Module or a function), but got {type(model).__name__}")
    return model
