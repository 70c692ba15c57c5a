"""Utilities (PyTorch's torch.utils): hook handles shared by every layer; activation checkpointing in
``hpcfsdp.utils.checkpoint`` (imported by ``import hpcfsdp``, once the core is loaded)."""
from hpcfsdp.utils.hooks import RemovableHandle

__all__ = ["RemovableHandle"]
