"""hpcfsdp.backends.cudnn: ``torch.backends.cudnn``'s switches, recorded only (hpcfsdp uses no cuDNN).

See [Note: Backend switches] in hpcfsdp/backends/__init__.py. The attributes are plain module attributes
with PyTorch's defaults: ``enabled`` (True), ``benchmark`` (False), ``deterministic`` (False),
``allow_tf32`` (True), ``benchmark_limit`` (None, as PyTorch where cuDNN is unavailable).
"""
import contextlib
import sys

__all__ = ["enabled", "benchmark", "deterministic", "allow_tf32", "benchmark_limit", "is_available", "version",
           "is_acceptable", "flags"]

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True
benchmark_limit = None


def is_available() -> bool:
    """False: hpcfsdp runs no cuDNN kernels (PyTorch's answer where cuDNN is missing)."""
    return False


def version():
    """None: no cuDNN is loaded."""
    return None


def is_acceptable(tensor) -> bool:
    """False: no tensor goes to cuDNN."""
    return False


_FLAGS = ("enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32")


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False, allow_tf32=True):
    """Within the block the switches take these values (PyTorch's defaults of ``flags``); restored after."""
    mod = sys.modules[__name__]
    saved = {k: getattr(mod, k) for k in _FLAGS}
    new = {"enabled": enabled, "benchmark": benchmark, "benchmark_limit": None, "deterministic": deterministic,
           "allow_tf32": allow_tf32}  # benchmark_limit stays None: PyTorch sets it only where cuDNN is available
    for k, v in new.items():
        setattr(mod, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(mod, k, v)
