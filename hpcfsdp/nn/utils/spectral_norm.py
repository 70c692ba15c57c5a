"""Spectral normalization with a forward pre-hook, the older API: ``w = w_orig / sigma(w_orig)``.

``sigma`` is the largest singular value of the weight viewed as a matrix (rows along ``dim``), estimated by
power iteration with two vectors kept as buffers: ``<name>_u`` (one entry per row) and ``<name>_v`` (one per
column). In training mode every forward first runs ``n_power_iterations`` steps on them; in eval mode they
stay. The module keeps ``<name>_orig`` as its parameter and ``<name>`` as a plain attribute the hook sets.
:func:`hpcfsdp.nn.utils.parametrizations.spectral_norm` is the parametrization-based version.
"""
from hpcfsdp.autograd.grad_mode import no_grad
from hpcfsdp.nn._functional.normalization import normalize
from hpcfsdp.nn.modules.conv_transpose import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter
from hpcfsdp.nn.utils.weight_norm import _first_key, _remove_norm_hook

__all__ = ["SpectralNorm", "SpectralNormLoadStateDictPreHook", "SpectralNormStateDictHook", "spectral_norm",
           "remove_spectral_norm"]

# [Note: spectral_norm state-dict versions]
# Version 0 saved ``<name>_orig``, ``<name>`` (the normalized weight) and ``<name>_u``; version 1 (this one)
# saves ``<name>_orig``, ``<name>_u`` and ``<name>_v`` and records ``{"<name>.version": 1}`` under the
# module's ``metadata["spectral_norm"]``. Loading a version-0 dict recovers ``sigma`` as the mean ratio of
# ``<name>_orig`` to ``<name>`` and solves for a ``v`` that gives that sigma with the saved ``u``.


def _as_matrix(weight, dim):
    """``weight`` as a 2-D view with ``weight.shape[dim]`` rows (``dim`` moved to the front, the rest flattened)."""
    rows = weight.shape[dim]
    return weight.movedim(dim, 0).reshape(rows, -1)


def _default_dim(module):
    """The dim spectral norm works along by default: 1 for transposed convolutions (their weight is
    (in, out, ...)), else 0."""
    return 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0


def _random_unit(like, size, eps):
    """A random unit vector of ``size`` entries, of ``like``'s dtype and device."""
    return normalize(like.new_empty(size).normal_(0, 1), dim=0, eps=eps)


def _v_for(mat, u, sigma):
    """A ``v`` with ``u . (mat @ v) == sigma``: the least-squares solution of ``mat @ v = u``, rescaled."""
    from hpcfsdp import linalg

    v = linalg.pinv(mat.T @ mat) @ (mat.T @ u)
    return v * (sigma / u.dot(mat.mv(v)))


def _version_of(local_metadata, name):
    return local_metadata.get("spectral_norm", {}).get(f"{name}.version")


class SpectralNorm:
    """The forward pre-hook that :func:`spectral_norm` registers, holding its settings.

    Raises:
        ValueError: ``n_power_iterations`` is not positive.
    """

    _version = 1  # the state-dict format it writes; see the note above

    def __init__(self, name="weight", n_power_iterations=1, dim=0, eps=1e-12):
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.name = name
        self.dim = dim
        self.n_power_iterations = n_power_iterations
        self.eps = eps

    def reshape_weight_to_matrix(self, weight):
        """``weight`` as the matrix whose largest singular value is estimated (rows along ``self.dim``)."""
        return _as_matrix(weight, self.dim)

    def _iterate(self, mat, u, v):
        """``n_power_iterations`` power steps on ``mat``, written into the buffers ``u`` and ``v``."""
        with no_grad():
            for _ in range(self.n_power_iterations):
                v.copy_(normalize(mat.T.mv(u), dim=0, eps=self.eps))
                u.copy_(normalize(mat.mv(v), dim=0, eps=self.eps))

    def compute_weight(self, module, do_power_iteration):
        """``<name>_orig / sigma``, ``sigma = u . (W v)``, after a round of power iteration when asked.

        The gradient flows through ``W`` only; ``u`` and ``v`` enter as constants (copies, so later updates
        of the buffers do not change a graph already built).
        """
        orig = getattr(module, f"{self.name}_orig")
        u = getattr(module, f"{self.name}_u")
        v = getattr(module, f"{self.name}_v")
        mat = self.reshape_weight_to_matrix(orig)
        if do_power_iteration:
            self._iterate(mat.detach(), u, v)
        sigma = u.clone().dot(mat.mv(v.clone()))
        return orig / sigma

    def remove(self, module):
        """Replace ``<name>_orig`` and the buffers by one Parameter ``<name>``, the weight normalized with the
        current ``u`` and ``v``."""
        with no_grad():
            final = self.compute_weight(module, do_power_iteration=False)
        for part in ("", "_u", "_v", "_orig"):
            delattr(module, self.name + part)
        module.register_parameter(self.name, Parameter(final.detach()))

    def __call__(self, module, inputs):
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

    @staticmethod
    def apply(module, name, n_power_iterations, dim, eps):
        """Set up spectral normalization of the parameter ``module.<name>``; returns the registered hook.

        Raises:
            RuntimeError: ``name`` already has a spectral_norm hook on ``module``.
            KeyError: ``module`` has no parameter ``name``.
            ValueError: the parameter is None, or ``n_power_iterations`` is not positive.
        """
        taken = _first_key(module._forward_pre_hooks, lambda h: isinstance(h, SpectralNorm) and h.name == name)
        if taken is not None:
            raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
        hook = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters[name]
        if weight is None:
            raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
        with no_grad():
            rows, cols = hook.reshape_weight_to_matrix(weight).shape
            u = _random_unit(weight, rows, eps)
            v = _random_unit(weight, cols, eps)
        delattr(module, name)
        module.register_parameter(f"{name}_orig", weight)
        setattr(module, name, weight.data)  # a plain attribute until the first forward recomputes it
        module.register_buffer(f"{name}_u", u)
        module.register_buffer(f"{name}_v", v)
        module.register_forward_pre_hook(hook)
        module._register_state_dict_hook(SpectralNormStateDictHook(hook))
        module._register_load_state_dict_pre_hook(SpectralNormLoadStateDictPreHook(hook))
        return hook


class SpectralNormLoadStateDictPreHook:
    """load_state_dict pre-hook of :func:`spectral_norm`: converts a version-0 state dict (see the note above)
    to the current keys; ``fn`` is the :class:`SpectralNorm` hook."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        version = _version_of(local_metadata, self.fn.name)
        if version is not None and version >= 1:
            return
        base = prefix + self.fn.name
        current = [base + part for part in ("_orig", "_u", "_v")]
        if version is None and base not in state_dict and all(k in state_dict for k in current):
            return  # today's keys, saved without metadata
        legacy = [base + part for part in ("_orig", "", "_u")]
        absent = [k for k in legacy if k not in state_dict]
        if absent:
            if strict:
                missing_keys.extend(absent)
            return
        with no_grad():
            orig = state_dict[base + "_orig"]
            sigma = (orig / state_dict.pop(base)).mean()
            mat = self.fn.reshape_weight_to_matrix(orig)
            state_dict[base + "_v"] = _v_for(mat, state_dict[base + "_u"], sigma)


class SpectralNormStateDictHook:
    """state_dict post-hook of :func:`spectral_norm`: writes the format version into the module's metadata;
    ``fn`` is the :class:`SpectralNorm` hook.

    Raises:
        RuntimeError: the metadata already holds a version for this tensor.
    """

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, module, state_dict, prefix, local_metadata):
        versions = local_metadata.setdefault("spectral_norm", {})
        key = f"{self.fn.name}.version"
        if key in versions:
            raise RuntimeError(f"Unexpected key in metadata['spectral_norm']: {key}")
        versions[key] = self.fn._version


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim=None) -> Module:
    """Normalize the parameter ``module.<name>`` by its spectral norm with a forward pre-hook; returns ``module``.

    ``dim`` (default: 1 for ConvTranspose1d/2d/3d, else 0) is the dim the weight's matrix rows run along.
    The state dict holds ``<name>_orig``, ``<name>_u`` and ``<name>_v``; version-0 dicts load too.

    Raises:
        RuntimeError: ``name`` already has a spectral_norm hook.
        ValueError: ``n_power_iterations`` is not positive, or the parameter is None.
    """
    if dim is None:
        dim = _default_dim(module)
    SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """Undo :func:`spectral_norm`: ``module.<name>`` becomes a Parameter with the normalized weight, and the
    hook and its two state-dict hooks are removed.

    Raises:
        ValueError: ``module`` has no spectral_norm hook for ``name``.
    """
    _remove_norm_hook(module, SpectralNorm, name, "spectral_norm")
    for table, kind in ((module._state_dict_hooks, SpectralNormStateDictHook),
                        (module._load_state_dict_pre_hooks, SpectralNormLoadStateDictPreHook)):
        key = _first_key(table, lambda h: isinstance(h, kind) and h.fn.name == name)
        if key is not None:
            del table[key]
    return module
