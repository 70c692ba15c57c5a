"""Auto-wrap policies: which submodules become their own FSDP unit (PyTorch's `torch.distributed.fsdp.wrap`)."""

from typing import Callable, Iterable

__all__ = ["ModuleWrapPolicy", "size_based_auto_wrap_policy", "always_wrap_policy", "select_units"]


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


def _containers():
    from ...nn import ModuleDict, ModuleList

    return {ModuleList, ModuleDict}


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = set()
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = set()


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
