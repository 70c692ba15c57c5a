"""Hook handles shared by Module registrations."""
import functools
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .module import Module

__all__ = ["RemovableHandle"]


class RemovableHandle:
    """Handle returned by hook registration; ``remove()`` unregisters the hook (idempotent)."""

    _next_id = 0

    def __init__(self, hooks_dict: dict, *, extra_dict=None):
        self.hooks_dict_ref = hooks_dict
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1
        if extra_dict is None:
            extra_dict = []
        elif isinstance(extra_dict, dict):
            extra_dict = [extra_dict]
        self.extra_dict_ref = tuple(extra_dict)

    def remove(self) -> None:
        self.hooks_dict_ref.pop(self.id, None)
        for d in self.extra_dict_ref:
            d.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class _WrappedHook:
    """A hook that is called with its module as first argument (``with_module=True`` registrations)."""

    def __init__(self, hook: Callable, module: "Module"):
        self.hook = hook
        functools.update_wrapper(self, hook)
        self.module = module

    def __call__(self, *args, **kwargs):
        return self.hook(self.module, *args, **kwargs)
