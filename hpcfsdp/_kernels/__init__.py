"""Fused CUDA kernels: CUDA source kept in this package, one ``.cu`` file per op family, compiled by CuPy at first use,
each kernel with a NumPy twin that the simulated device runs in its place (See [Note: Fused kernels] in _registry)."""
from ._registry import KERNELS, CTYPES, KernelSpec, Param, PointerTable, kernel, launch, name_expressions, source, \
    use_fused

__all__ = ["use_fused", "KERNELS", "CTYPES", "KernelSpec", "Param", "PointerTable", "kernel", "launch",
           "name_expressions", "source"]
