"""Instance normalisation: InstanceNorm1d, InstanceNorm2d, InstanceNorm3d (PyTorch's defaults: no affine, no running stats)."""
import warnings

from hpcfsdp.nn._functional.normalization import instance_norm
from hpcfsdp.nn.modules.batchnorm import _NormBase

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


class _InstanceNorm(_NormBase):
    """Normalise each (sample, channel) over its spatial dims; unbatched input has one dim less."""

    _spatial = 1

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device=None, dtype=None, *, bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)

    def _check_input_dim(self, input):  # noqa: A002
        nb = self._spatial + 1
        if input.ndim not in (nb, nb + 1):
            raise ValueError(f"expected {nb}D or {nb + 1}D input (got {input.ndim}D input)")

    def forward(self, input):  # noqa: A002
        self._check_input_dim(input)
        no_batch = self._spatial + 1
        feature_dim = input.ndim - no_batch
        if input.shape[feature_dim] != self.num_features:
            if self.affine:
                raise ValueError(f"expected input's size at dim={feature_dim} to match num_features "
                                 f"({self.num_features}), but got: {input.shape[feature_dim]}.")
            warnings.warn(f"input's size at dim={feature_dim} does not match num_features. You can silence this "
                          f"warning by not passing in num_features, which is not used because affine=False",
                          stacklevel=2)
        x = input.unsqueeze(0) if input.ndim == no_batch else input
        y = instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                          self.training or not self.track_running_stats,
                          self.momentum if self.momentum is not None else 0.0, self.eps)
        return y.squeeze(0) if input.ndim == no_batch else y


class InstanceNorm1d(_InstanceNorm):
    """Instance norm over (N, C, L) or (C, L) (See ``hpcfsdp.nn.functional.instance_norm``).

    Args:
        num_features: C.
        eps: added to the variance.
        momentum: the running statistics' update factor (None counts as 0).
        affine: learn a per-channel scale and shift (default False).
        track_running_stats: keep running statistics and use them in eval mode (default False).
    """

    _spatial = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance norm over (N, C, H, W) or (C, H, W); arguments as ``InstanceNorm1d``."""

    _spatial = 2


class InstanceNorm3d(_InstanceNorm):
    """Instance norm over (N, C, D, H, W) or (C, D, H, W); arguments as ``InstanceNorm1d``."""

    _spatial = 3
