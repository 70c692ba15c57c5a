"""hpcfsdp.accelerator: the current accelerator (CUDA through CuPy), as ``torch.accelerator``."""

import contextlib

from . import _backend

__all__ = ["is_available", "device_count", "current_accelerator", "current_device_index", "set_device_index",
           "device_index", "synchronize"]

# [Note: Accelerator]
# hpcfsdp's only accelerator is CUDA, reached through CuPy. Without CuPy or without a visible GPU there
# is no accelerator: is_available() is False, device_count() is 0 and current_accelerator() is None,
# exactly what PyTorch answers on a CPU-only machine. device_index(None) is then a no-op and
# device_index(i) for an int raises, as PyTorch's does.


def _cupy():
    return _backend._try_cupy()


def device_count() -> int:
    """The number of visible accelerator devices (0 when there is none)."""
    cp = _cupy()
    if cp is None:
        return 0
    try:
        return int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # CuPy importable but no driver or no device: no accelerator
        return 0


def is_available() -> bool:
    """True when an accelerator device is visible."""
    return device_count() > 0


def current_accelerator(check_available: bool = False):
    """The accelerator device type as ``hp.device("cuda")``, or None when there is none."""
    return _backend.device("cuda") if is_available() else None


def _need_device(what: str):
    if not is_available():
        raise RuntimeError(f"{what}: Cannot access accelerator device when none is available.")
    return _cupy()


def current_device_index() -> int:
    """The index of the current accelerator device."""
    return int(_need_device("current_device_index").cuda.runtime.getDevice())


def set_device_index(device) -> None:
    """Make ``device`` (an int, ``"cuda:N"`` or an hp.device) the current accelerator device."""
    cp = _need_device("set_device_index")
    idx = _index(device)
    if idx is not None:
        cp.cuda.Device(idx).use()


def synchronize(device=None) -> None:
    """Wait for all work on the accelerator device (the current one by default)."""
    cp = _need_device("synchronize")
    idx = _index(device)
    cp.cuda.Device(idx if idx is not None else cp.cuda.runtime.getDevice()).synchronize()


def _index(device):
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"expected a device index, got {device!r}")
    if isinstance(device, int):
        idx = device
    else:
        d = _backend.device(device)
        if d.type != "cuda":
            raise ValueError(f"{device!r} is not an accelerator device (expected 'cuda' or 'cuda:N')")
        idx = d.index if d.index is not None else None
    if idx is not None and not 0 <= idx < device_count():
        raise ValueError(f"device index {idx} is out of range: {device_count()} accelerator device(s) visible")
    return idx


@contextlib.contextmanager
def device_index(device):
    """Within the context the current accelerator device is ``device`` (an int); None does nothing."""
    if device is None:
        yield
        return
    cp = _need_device("device_index")
    prev = int(cp.cuda.runtime.getDevice())
    set_device_index(device)
    try:
        yield
    finally:
        cp.cuda.Device(prev).use()
