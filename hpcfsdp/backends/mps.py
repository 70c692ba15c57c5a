"""hpcfsdp.backends.mps: ``torch.backends.mps``; hpcfsdp has no Metal (MPS) backend."""

__all__ = ["is_available", "is_built"]


def is_available() -> bool:
    """False: hpcfsdp has no MPS device."""
    return False


def is_built() -> bool:
    """False: hpcfsdp is not built with MPS."""
    return False
