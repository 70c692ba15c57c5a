"""Utilities (PyTorch's torch.utils): activation checkpointing."""
from hpcfsdp.utils import checkpoint

__all__ = ["checkpoint"]
