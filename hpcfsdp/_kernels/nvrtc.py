"""Compile the fused kernels with NVRTC directly, without a GPU: what CI runs to prove every CUDA source builds.

CuPy's RawModule compiles at first use on a GPU (its compile path asks the driver for the device's architecture), so
a source error would surface only there. NVRTC itself needs no GPU: this module loads libnvrtc from the
``nvidia-cuda-nvrtc`` wheel (the ``cuda`` extra) with ctypes, adds the ``nvidia-cuda-runtime`` wheel's headers
(cuda_bf16.h, cuda_fp16.h) to the include path, and compiles each family for a real architecture (cubin), every
template instance named. ``python -m hpcfsdp._kernels.nvrtc [--arch sm_90]`` prints each family's result.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
from dataclasses import dataclass

from . import activation, attention, dropout, embedding, fsdp, quantize, rotary  # noqa: F401 (each family's module declares its kernels)
from . import linear, norm  # noqa: F401
from . import softmax  # noqa: F401
from . import optim  # noqa: F401
from ._registry import FAMILIES, OPTIONS, cuda_include_dir, name_expressions, source

__all__ = ["compile_family", "compile_all", "nvrtc_paths", "CompileResult"]


def nvrtc_paths() -> tuple[str, str]:
    """(libnvrtc path, CUDA include dir) from the installed nvidia wheels; RuntimeError naming the extra if absent."""
    inc = cuda_include_dir()
    libs = sorted(p for p in glob.glob(os.path.join(os.path.dirname(inc), "lib", "libnvrtc.so*"))
                  if "builtins" not in p) if inc else []
    if not libs:
        raise RuntimeError("NVRTC and the CUDA headers are not installed: pip install 'hpcfsdp[cuda]' (the "
                           "nvidia-cuda-nvrtc and nvidia-cuda-runtime wheels)")
    return libs[0], inc


@dataclass
class CompileResult:
    family: str
    ok: bool
    log: str
    cubin_bytes: int
    lowered: dict  # name expression -> mangled name in the cubin


def _lib():
    path, inc = nvrtc_paths()
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib, inc


def _check(lib, rc, what):
    if rc != 0:
        raise RuntimeError(f"NVRTC {what}: {lib.nvrtcGetErrorString(rc).decode()}")


def compile_family(family: str, arch: str = "sm_90") -> CompileResult:
    """Compile ``family``.cu (after common.cuh) for ``arch`` with every template instance; the log and cubin size."""
    lib, inc = _lib()
    prog = ctypes.c_void_p()
    src = source(family).encode()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, f"{family}.cu".encode(), 0, None, None), "create")
    try:
        exprs = name_expressions(family)
        for e in exprs:
            _check(lib, lib.nvrtcAddNameExpression(prog, e.encode()), f"add name expression {e}")
        opts = [f"--gpu-architecture={arch}", f"-I{inc}", *OPTIONS]
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        if rc != 0:
            return CompileResult(family, False, log, 0, {})
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        lowered = {}
        for e in exprs:
            name = ctypes.c_char_p()
            _check(lib, lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(name)), f"lowered name of {e}")
            lowered[e] = name.value.decode()
        return CompileResult(family, True, log, size.value, lowered)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_all(arch: str = "sm_90") -> list:
    return [compile_family(f, arch) for f in sorted(FAMILIES)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcfsdp._kernels.nvrtc", description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90")
    args = p.parse_args(argv)
    bad = 0
    for r in compile_all(args.arch):
        print(f"{r.family}: {'ok' if r.ok else 'FAILED'} ({len(r.lowered)} kernels, {r.cubin_bytes} bytes of cubin)")
        if not r.ok or r.log.strip():
            print(r.log)
        bad += not r.ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
