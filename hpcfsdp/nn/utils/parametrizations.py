"""Weight and spectral normalization as parametrizations (see ``parametrize``): the current API.

``weight_norm`` stores ``parametrizations.<name>.original0`` (the magnitude g) and ``original1`` (the
direction v); ``spectral_norm`` stores ``parametrizations.<name>.original`` and its power-iteration vectors as
the buffers ``parametrizations.<name>.0._u`` and ``._v``. The hook-based versions of both live in
``weight_norm.py`` and ``spectral_norm.py``, which hold the math shared with this file.
"""
from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.grad_mode import no_grad
from hpcfsdp.nn._functional.normalization import normalize
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.utils import parametrize
from hpcfsdp.nn.utils.spectral_norm import _as_matrix, _default_dim, _random_unit
from hpcfsdp.nn.utils.weight_norm import _norm_keeping, _scaled_direction

__all__ = ["spectral_norm", "weight_norm"]

_WARM_UP_STEPS = 15  # power iterations run once at registration, so the first sigma is already close


class _WeightNorm(Module):
    """``(g, v) -> g * v / ||v||``; its right inverse splits a weight into ``(||w||, w)``. ``dim`` as in
    :func:`weight_norm` (``None`` is stored as -1)."""

    def __init__(self, dim=0):
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, magnitude, direction):
        return _scaled_direction(direction, magnitude, self.dim)

    def right_inverse(self, weight):
        return _norm_keeping(weight, self.dim), weight


class _OldWeightNormKeys:
    """load_state_dict pre-hook: renames the hook API's ``<name>_g`` / ``<name>_v`` keys to this API's
    ``parametrizations.<name>.original0`` / ``original1`` (only when both are present)."""

    def __init__(self, name):
        self.name = name

    def __call__(self, state_dict, prefix, *_):
        old = [f"{prefix}{self.name}_g", f"{prefix}{self.name}_v"]
        if all(key in state_dict for key in old):
            for i, key in enumerate(old):
                state_dict[f"{prefix}parametrizations.{self.name}.original{i}"] = state_dict.pop(key)


def weight_norm(module: Module, name: str = "weight", dim: int = 0) -> Module:
    """Parametrize ``module.<name>`` as ``g * v / ||v||``; returns ``module``.

    ``g`` (``original0``) has one entry per index of ``dim`` (size-1 dims elsewhere), or is a scalar with
    ``dim=None``; ``v`` (``original1``) has the weight's shape. Both start so that the weight is unchanged.
    State dicts of the hook-based :func:`hpcfsdp.nn.utils.weight_norm` (``<name>_g``, ``<name>_v``) load too.

    Raises:
        ValueError: ``module`` has no parameter or buffer ``name``.
    """
    parametrize.register_parametrization(module, name, _WeightNorm(dim), unsafe=True)
    module._register_load_state_dict_pre_hook(_OldWeightNormKeys(name))
    return module


class _SpectralNorm(Module):
    """``w -> w / sigma(w)``, ``sigma`` the largest singular value of ``w`` as a matrix with rows along ``dim``,
    estimated as ``u . (W v)`` with the buffers ``_u`` and ``_v``; a 1-D ``w`` is divided by its 2-norm (no
    buffers). In training mode each call first runs ``n_power_iterations`` steps, updating the buffers in
    place; in eval mode they stay. The right inverse is the identity.

    Raises:
        IndexError: ``dim`` is out of range for ``weight``.
        ValueError: ``n_power_iterations`` is not positive.
    """

    def __init__(self, weight, n_power_iterations=1, dim=0, eps=1e-12):
        super().__init__()
        ndim = weight.ndim
        if not -ndim <= dim < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of [-{ndim}, {ndim - 1}] but got "
                             f"{dim})")
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.dim = dim % ndim
        self.eps = eps
        if ndim == 1:
            return
        self.n_power_iterations = n_power_iterations
        with no_grad():
            mat = _as_matrix(weight, self.dim)
            rows, cols = mat.shape
            self.register_buffer("_u", _random_unit(weight, rows, eps))
            self.register_buffer("_v", _random_unit(weight, cols, eps))
            self._step(mat, _WARM_UP_STEPS)

    def _step(self, mat, count):
        """``count`` power steps on ``mat`` (u first, then v), written into the buffers."""
        with no_grad():
            for _ in range(count):
                self._u.copy_(normalize(mat.mv(self._v), dim=0, eps=self.eps))
                self._v.copy_(normalize(mat.T.mv(self._u), dim=0, eps=self.eps))

    def forward(self, weight):
        if weight.ndim == 1:
            return normalize(weight, dim=0, eps=self.eps)
        mat = _as_matrix(weight, self.dim)
        if self.training:
            self._step(mat.detach(), self.n_power_iterations)
        # u and v are constants of the graph: copies, so the next in-place update leaves this graph alone
        sigma = self._u.clone().dot(mat.mv(self._v.clone()))
        return weight / sigma

    def right_inverse(self, value):
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim=None) -> Module:
    """Parametrize ``module.<name>`` as itself divided by its spectral norm; returns ``module``.

    Args:
        module: the module.
        name: the parameter or buffer to normalize.
        n_power_iterations: power-iteration steps per read of the tensor in training mode.
        eps: the floor of the norms when ``u`` and ``v`` are normalized.
        dim: the dim the matrix rows run along; default 1 for ConvTranspose1d/2d/3d, else 0.

    Raises:
        ValueError: ``module`` has no tensor ``name``, or ``n_power_iterations`` is not positive.
        IndexError: ``dim`` is out of range for the tensor.
    """
    target = getattr(module, name, None)
    if not isinstance(target, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    chosen = _default_dim(module) if dim is None else dim
    parametrize.register_parametrization(module, name, _SpectralNorm(target, n_power_iterations, chosen, eps))
    return module
