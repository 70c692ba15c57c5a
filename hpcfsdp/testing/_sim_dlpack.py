"""DLPack capsules of simulated device arrays: NumPy's capsule of the host data, its device set to (kDLCUDA, device)."""
from __future__ import annotations

import ctypes

__all__ = ["export"]

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]

# dlpack.h: DLTensor {void *data; DLDevice device; ...}; DLManagedTensor starts with its DLTensor;
# DLManagedTensorVersioned {DLPackVersion version; void *manager_ctx; void (*deleter)(...); uint64_t flags;
# DLTensor dl_tensor}.
_DEVICE_AT = {b"dltensor": 8, b"dltensor_versioned": 8 + 8 + 8 + 8 + 8}
_KDLCUDA = 2


def export(a, device: int, max_version=None):
    """A DLPack capsule of host array ``a`` that says it lies in CUDA memory of ``device`` (the simulation's memory
    is host memory, so a consumer that reads it from the host, as MPI does, reads the right bytes)."""
    cap = a.__dlpack__() if max_version is None or max_version[0] < 1 else a.__dlpack__(max_version=max_version)
    for name, off in _DEVICE_AT.items():
        if _api.PyCapsule_IsValid(cap, name):
            p = _api.PyCapsule_GetPointer(cap, name)
            ctypes.c_int32.from_address(p + off).value = _KDLCUDA
            ctypes.c_int32.from_address(p + off + 4).value = int(device)
            return cap
    raise BufferError("__dlpack__: NumPy gave no DLPack capsule")  # pragma: no cover (NumPy >= 2.1 always does)
