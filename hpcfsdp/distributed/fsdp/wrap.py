"""Auto-wrap policies: which submodules become their own FSDP unit (PyTorch's `torch.distributed.fsdp.wrap`)."""

import contextlib
from typing import Any, Callable, Iterable

from ... import nn as _nn

__all__ = ["ModuleWrapPolicy", "CustomPolicy", "size_based_auto_wrap_policy", "always_wrap_policy",
           "transformer_auto_wrap_policy", "lambda_auto_wrap_policy", "enable_wrap", "wrap", "select_units"]


def always_wrap_policy(module, recurse: bool, nonwrapped_numel: int) -> bool:
    return True


def size_based_auto_wrap_policy(
    module,
    recurse: bool,
    nonwrapped_numel: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: set | None = None,
    exclude_wrap_modules: set | None = None,
) -> bool:
    """Wrap a module once the parameters not yet wrapped below it reach ``min_num_params``."""
    force_leaf_modules = size_based_auto_wrap_policy.FORCE_LEAF_MODULES if force_leaf_modules is None \
        else force_leaf_modules
    exclude_wrap_modules = size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES if exclude_wrap_modules is None \
        else exclude_wrap_modules
    is_large = nonwrapped_numel >= min_num_params
    if recurse:
        return is_large and not isinstance(module, tuple(force_leaf_modules))
    return is_large and not isinstance(module, tuple(exclude_wrap_modules))


def transformer_auto_wrap_policy(module, recurse: bool, nonwrapped_numel: int, transformer_layer_cls) -> bool:
    """Wrap every instance of the classes in ``transformer_layer_cls`` (bind it with functools.partial)."""
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def lambda_auto_wrap_policy(module, recurse: bool, nonwrapped_numel: int, lambda_fn: Callable) -> bool:
    """Wrap every module for which ``lambda_fn(module)`` is true (bind it with functools.partial)."""
    return True if recurse else lambda_fn(module)


def _or_policy(module, recurse: bool, nonwrapped_numel: int, policies) -> bool:
    """True when any of ``policies`` wraps ``module`` (PyTorch's private name: FSDP1 scripts import it; bind
    ``policies`` with functools.partial)."""
    return any(policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel) for policy in policies)


def _containers():
    from ...nn import ModuleDict, ModuleList

    return {ModuleList, ModuleDict}


# PyTorch's defaults: containers without forward are never units, and MultiheadAttention is never entered (its
# out_proj as a unit of its own would be used outside that unit's forward)
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {_nn.ModuleList, _nn.ModuleDict}
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {_nn.MultiheadAttention}


class ModuleWrapPolicy:
    """Wrap every submodule that is an instance of one of ``module_classes``."""

    def __init__(self, module_classes: Iterable[type]):
        classes = tuple(module_classes)
        for c in classes:
            if not isinstance(c, type):
                raise TypeError(f"ModuleWrapPolicy expects module classes, got {c!r}")
        self._module_classes = classes

    def __call__(self, module, recurse: bool, nonwrapped_numel: int) -> bool:
        return True if recurse else isinstance(module, self._module_classes)

    def __repr__(self) -> str:
        return f"ModuleWrapPolicy({[c.__name__ for c in self._module_classes]})"


class CustomPolicy:
    """Wrap the modules for which ``lambda_fn(module)`` returns True. PyTorch's also takes a non-empty dict of
    per-unit FSDP arguments; one FSDP configuration holds for every unit here, so a dict is refused."""

    def __init__(self, lambda_fn: Callable):
        self._lambda_fn = lambda_fn

    def __call__(self, module, recurse: bool, nonwrapped_numel: int) -> bool:
        if recurse:
            return True
        res = self._lambda_fn(module)
        if not isinstance(res, (dict, bool)):
            raise ValueError("The lambda_fn passed to CustomPolicy should return False/True or a kwarg dict, "
                             f"but it returned {res}")
        if isinstance(res, dict) and res:
            raise NotImplementedError(f"CustomPolicy: per-unit FSDP arguments {sorted(res)} for "
                                      f"{type(module).__name__} are not supported by hpcfsdp; return True to wrap "
                                      "with the root's arguments")
        return bool(res)


class _ConfigAutoWrap:
    """The ``enable_wrap`` context: the wrapper class and arguments ``wrap()`` uses inside it."""

    in_autowrap_context: bool = False
    wrapper_cls: Any = None
    kwargs: dict = {}

    def __init__(self, **kwargs: Any):
        if "wrapper_cls" not in kwargs:
            raise ValueError("Expected to pass in wrapper_cls arg into _ConfigAutoWrap.")
        self._kwargs = kwargs

    def __enter__(self):
        if _ConfigAutoWrap.in_autowrap_context:
            raise NotImplementedError("You are already within an autowrap context and we currently do not "
                                      "supported nested autowrap.")
        kwargs = dict(self._kwargs)
        _ConfigAutoWrap.in_autowrap_context = True
        _ConfigAutoWrap.wrapper_cls = kwargs.pop("wrapper_cls")
        _ConfigAutoWrap.kwargs = kwargs

    def __exit__(self, *exc):
        _ConfigAutoWrap.in_autowrap_context = False
        _ConfigAutoWrap.wrapper_cls = None
        _ConfigAutoWrap.kwargs = {}


@contextlib.contextmanager
def enable_wrap(*, wrapper_cls: Any, **wrapper_kwargs: Any):
    """Inside this context ``wrap(module)`` returns ``wrapper_cls(module, **wrapper_kwargs)``."""
    with _ConfigAutoWrap(wrapper_cls=wrapper_cls, **wrapper_kwargs):
        yield


def wrap(module, **wrap_overrides: Any):
    """``module`` wrapped with the ``enable_wrap`` context's class and arguments (``wrap_overrides`` win);
    outside such a context, ``module`` itself."""
    if not _ConfigAutoWrap.in_autowrap_context:
        return module
    kwargs = {**_ConfigAutoWrap.kwargs, **wrap_overrides, **getattr(module, "_wrap_overrides", {})}
    return _ConfigAutoWrap.wrapper_cls(module, **kwargs)


def _numel(module, ignored: set) -> int:
    return sum(p.numel() for p in module.parameters() if id(p) not in ignored)


def select_units(root, policy: Callable, ignored_params: set | None = None) -> list:
    """Submodules ``policy`` wraps, children before parents (PyTorch's recursive wrap; the root is not
    included: it is always a unit). ``ignored_params`` holds ids of parameters that never count."""
    ignored = ignored_params or set()
    units: list = []
    wrapped_numel: dict = {}

    def visit(module) -> int:
        """Returns the parameter count under ``module`` already wrapped."""
        inside = 0
        for child in module.children():
            total = _numel(child, ignored)
            if policy(child, recurse=True, nonwrapped_numel=total):
                inside_child = visit(child)
                remaining = total - inside_child
                if type(child) not in _containers() and policy(child, recurse=False, nonwrapped_numel=remaining):
                    units.append(child)
                    inside += total
                else:
                    inside += inside_child
        wrapped_numel[id(module)] = inside
        return inside

    visit(root)
    return units
