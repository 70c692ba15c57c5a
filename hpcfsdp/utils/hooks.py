"""RemovableHandle: the handle every hook registration returns (tensor, autograd and module hooks)."""

import itertools
import weakref

__all__ = ["RemovableHandle"]


def _ref(d):
    """A weak reference to ``d`` where it allows one (so a handle does not keep its hooks alive), else a
    strong one (plain dicts)."""
    if d is None:
        return lambda: None
    try:
        return weakref.ref(d)
    except TypeError:
        return lambda: d


class RemovableHandle:
    """Handle returned by hook registration; ``remove()`` unregisters the hook (idempotent).

    The hook is stored under ``id`` in ``hooks_dict`` and, for registrations that keep a second table
    (forward hooks with kwargs or always_call), in each of ``extra_dict``; ``remove()`` pops it from all.
    """

    _ids = itertools.count()

    def __init__(self, hooks_dict, *, extra_dict=None):
        self.hooks_dict_ref = _ref(hooks_dict)
        self.id = next(RemovableHandle._ids)
        if extra_dict is None:
            extra_dict = ()
        elif isinstance(extra_dict, dict):
            extra_dict = (extra_dict,)
        self.extra_dict_ref = tuple(_ref(d) for d in extra_dict)

    def remove(self) -> None:
        for ref in (self.hooks_dict_ref,) + self.extra_dict_ref:
            d = ref()
            if d is not None:
                d.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
