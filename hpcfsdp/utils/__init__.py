"""Small utilities shared by every layer (hook handles)."""

from hpcfsdp.utils.hooks import RemovableHandle

__all__ = ["RemovableHandle"]
