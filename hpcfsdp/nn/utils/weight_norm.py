"""Weight normalization with a forward pre-hook, the deprecated API: ``w = g * v / ||v||``.

The module's parameter ``<name>`` is replaced by two parameters, ``<name>_g`` (the magnitude, one value per
index of ``dim``) and ``<name>_v`` (the direction), and ``module.<name>`` becomes a plain attribute that the
hook recomputes before each forward. :func:`hpcfsdp.nn.utils.parametrizations.weight_norm` does the same
through a parametrization and is the one to use in new code; it shares the two math helpers below.
"""
import warnings

from hpcfsdp._array import wrap_dim
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["WeightNorm", "weight_norm", "remove_weight_norm"]

_DEPRECATED = ("`torch.nn.utils.weight_norm` is deprecated in favor of "
               "`torch.nn.utils.parametrizations.weight_norm`.")


def _norm_keeping(v, dim, p=2):
    """||v||_p over every dim of ``v`` but ``dim``, which is kept (the other dims stay, with size 1); with
    ``dim == -1`` the norm of the whole tensor, 0-d. (torch.norm_except_dim's convention.)"""
    if dim == -1:
        return v.norm(p)
    kept = wrap_dim(dim, v.ndim)
    reduced = tuple(d for d in range(v.ndim) if d != kept)
    if not reduced:  # a norm over no dims is the absolute value
        return v.abs()
    return v.norm(p, dim=reduced, keepdim=True)


def _scaled_direction(v, g, dim):
    """The weight that magnitude ``g`` and direction ``v`` stand for: ``v * (g / ||v||)``, the norm as in
    :func:`_norm_keeping` (differentiable in both)."""
    return v * (g / _norm_keeping(v, dim))


def _first_key(hooks, matches):
    """The first key of the hook dict ``hooks`` whose hook satisfies ``matches``; None when there is none."""
    return next((key for key, hook in hooks.items() if matches(hook)), None)


class WeightNorm:
    """The forward pre-hook that :func:`weight_norm` registers, holding its settings.

    Attributes:
        name: the normalized tensor's name.
        dim: the dim that keeps one magnitude per index; -1 (given as ``None``) for one magnitude in all.
    """

    def __init__(self, name, dim):
        self.name = name
        self.dim = -1 if dim is None else dim

    def compute_weight(self, module):
        """The weight from the module's current ``<name>_g`` and ``<name>_v``."""
        g = getattr(module, f"{self.name}_g")
        v = getattr(module, f"{self.name}_v")
        return _scaled_direction(v, g, self.dim)

    def _refresh(self, module):
        setattr(module, self.name, self.compute_weight(module))

    @staticmethod
    def apply(module, name, dim):
        """Split ``module.<name>`` into ``<name>_g`` and ``<name>_v`` and register the hook, which is returned.

        Warns FutureWarning (the API is deprecated).

        Raises:
            RuntimeError: ``name`` already has a weight_norm hook on ``module``.
        """
        warnings.warn(_DEPRECATED, FutureWarning, stacklevel=3)
        already = _first_key(module._forward_pre_hooks, lambda h: isinstance(h, WeightNorm) and h.name == name)
        if already is not None:
            raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
        hook = WeightNorm(name, dim)
        weight = getattr(module, name).detach()
        del module._parameters[name]
        module.register_parameter(f"{name}_g", Parameter(_norm_keeping(weight, hook.dim)))
        module.register_parameter(f"{name}_v", Parameter(weight))
        hook._refresh(module)
        module.register_forward_pre_hook(hook)
        return hook

    def remove(self, module):
        """Replace ``<name>_g`` and ``<name>_v`` by one Parameter ``<name>`` with the weight they give now."""
        final = self.compute_weight(module).detach()
        delattr(module, self.name)
        for part in ("_g", "_v"):
            del module._parameters[self.name + part]
        module.register_parameter(self.name, Parameter(final))

    def __call__(self, module, inputs):
        self._refresh(module)


def weight_norm(module: Module, name: str = "weight", dim: int = 0) -> Module:
    """Reparametrize ``module.<name>`` as ``g * v / ||v||`` with a forward pre-hook; returns ``module``.

    Deprecated (a FutureWarning): use :func:`hpcfsdp.nn.utils.parametrizations.weight_norm`. ``dim`` is the
    dim along which each slice gets its own magnitude (0: one per output channel of a Linear or Conv);
    ``None`` gives one magnitude for the whole tensor. The state dict holds ``<name>_g`` and ``<name>_v``.

    Raises:
        RuntimeError: ``name`` is already weight-normalized by this API.
    """
    WeightNorm.apply(module, name, dim=dim)
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """Undo :func:`weight_norm`: ``module.<name>`` becomes a Parameter again, holding the current weight.

    Raises:
        ValueError: ``module`` has no weight_norm hook for ``name``.
    """
    _remove_norm_hook(module, WeightNorm, name, "weight_norm")
    return module


def _remove_norm_hook(module, kind, name, label) -> None:
    """Take ``module``'s forward pre-hook of type ``kind`` for ``name`` off, undoing it (ValueError naming
    ``label`` when there is none)."""
    hooks = module._forward_pre_hooks
    key = _first_key(hooks, lambda h: isinstance(h, kind) and h.name == name)
    if key is None:
        raise ValueError(f"{label} of '{name}' not found in {module}")
    hooks[key].remove(module)
    del hooks[key]
