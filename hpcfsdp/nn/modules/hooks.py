"""Hook handles shared by Module registrations."""
import functools
from typing import TYPE_CHECKING, Callable

from hpcfsdp.utils.hooks import RemovableHandle

if TYPE_CHECKING:
    from .module import Module

__all__ = ["RemovableHandle"]


class _WrappedHook:
    """A hook that is called with its module as first argument (``with_module=True`` registrations)."""

    def __init__(self, hook: Callable, module: "Module"):
        self.hook = hook
        functools.update_wrapper(self, hook)
        self.module = module

    def __call__(self, *args, **kwargs):
        return self.hook(self.module, *args, **kwargs)
