"""Utilities (PyTorch's torch.utils): activation checkpointing, hook handles shared by every layer."""
from hpcfsdp.utils import checkpoint
from hpcfsdp.utils.hooks import RemovableHandle

__all__ = ["checkpoint", "RemovableHandle"]
