"""hpcfsdp.backends.cuda: ``torch.backends.cuda`` (``matmul`` switches, SDPA kernel switches), recorded only.

See [Note: Backend switches] in hpcfsdp/backends/__init__.py.
"""
from .. import _backend, _runtime

__all__ = ["matmul", "is_built", "enable_flash_sdp", "flash_sdp_enabled", "enable_mem_efficient_sdp",
           "mem_efficient_sdp_enabled", "enable_math_sdp", "math_sdp_enabled", "enable_cudnn_sdp",
           "cudnn_sdp_enabled"]


class _CuBLASModule:
    """``torch.backends.cuda.matmul``: cuBLAS switches; an unknown attribute raises, as in PyTorch.

    ``allow_tf32`` is the float32 matmul precision seen as a bool (True unless "highest"); the reduced
    precision reductions default to True, ``allow_fp16_accumulation`` to False. None changes a kernel.
    """

    _BOOLS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
              "allow_fp16_accumulation")

    def __init__(self):
        object.__setattr__(self, "_values", {"allow_fp16_reduced_precision_reduction": True,
                                             "allow_bf16_reduced_precision_reduction": True,
                                             "allow_fp16_accumulation": False})

    def __getattr__(self, name):
        if name == "allow_tf32":
            return _runtime._allow_tf32()
        if name in self._BOOLS:
            return self._values[name]
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name, value):
        if name == "allow_tf32":
            return _runtime._set_allow_tf32(value)
        if name in self._BOOLS:
            if isinstance(value, (tuple, list)) and name != "allow_fp16_accumulation" and 1 <= len(value) <= 2:
                value = value[0]  # (allow_reduced_precision, allow_splitk): split-K is meaningless here
            if not isinstance(value, bool):
                raise TypeError(f"{name} expects a bool, but got {type(value)!r}")
            self._values[name] = value
            return None
        raise AttributeError("Unknown attribute " + name)


matmul = _CuBLASModule()

_sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def is_built() -> bool:
    """True when CuPy is importable (PyTorch: built with CUDA)."""
    return _backend.cupy_available()


def enable_flash_sdp(enabled: bool) -> None:
    """Record the flash-attention switch of scaled_dot_product_attention (hpcfsdp has one SDPA kernel)."""
    _sdp["flash"] = bool(enabled)


def flash_sdp_enabled() -> bool:
    """The flash-attention switch (True by default)."""
    return _sdp["flash"]


def enable_mem_efficient_sdp(enabled: bool) -> None:
    """Record the memory-efficient-attention switch (changes nothing)."""
    _sdp["mem_efficient"] = bool(enabled)


def mem_efficient_sdp_enabled() -> bool:
    """The memory-efficient-attention switch (True by default)."""
    return _sdp["mem_efficient"]


def enable_math_sdp(enabled: bool) -> None:
    """Record the math-attention switch (changes nothing: hpcfsdp's SDPA is always the math kernel)."""
    _sdp["math"] = bool(enabled)


def math_sdp_enabled() -> bool:
    """The math-attention switch (True by default)."""
    return _sdp["math"]


def enable_cudnn_sdp(enabled: bool) -> None:
    """Record the cuDNN-attention switch (changes nothing)."""
    _sdp["cudnn"] = bool(enabled)


def cudnn_sdp_enabled() -> bool:
    """The cuDNN-attention switch (True by default)."""
    return _sdp["cudnn"]
