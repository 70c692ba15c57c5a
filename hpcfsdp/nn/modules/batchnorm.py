"""Batch normalisation: _NormBase, _BatchNorm, BatchNorm1d, BatchNorm2d, BatchNorm3d (PyTorch's semantics)."""

from ... import _backend
from .. import init
from ..parameter import Parameter
from .._functional.normalization import batch_norm
from .module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]

# [Note: Batch norm statistics]
# In training (or with no running statistics), the input is normalised over every dim but the channel
# dim 1 with the batch mean and the biased batch variance. The running statistics are updated as
# running = (1 - f) * running + f * batch, where f is ``momentum``, or 1 / num_batches_tracked when
# momentum is None (a cumulative moving average), and the running variance takes the unbiased batch
# variance (n / (n - 1) times the biased one, n = values per channel). In eval mode with running
# statistics, the input is normalised with them. The forward is a composition of differentiable
# Tensor ops (mean, var, sqrt, ...), so autograd derives the backward; the buffer updates run without
# grad on detached statistics.


class _NormBase(Module):
    """Parameters and running-statistics buffers shared by the batch-norm layers."""

    _version = 2  # version 2 added num_batches_tracked: older state dicts load without it

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        import hpcfsdp

        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"num_features must be a positive int, got {num_features!r}")
        if momentum is not None and not isinstance(momentum, (int, float)):
            raise TypeError(f"momentum must be a float or None, got {momentum!r}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(hpcfsdp.empty((num_features,), device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(hpcfsdp.empty((num_features,), device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", hpcfsdp.zeros((num_features,), device=device, dtype=dtype))
            self.register_buffer("running_var", hpcfsdp.ones((num_features,), device=device, dtype=dtype))
            self.register_buffer("num_batches_tracked",
                                 hpcfsdp.tensor(0, dtype=_backend.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def _check_input_dim(self, input):
        raise NotImplementedError

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        version = local_metadata.get("version", None)
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and key not in state_dict:
            import hpcfsdp

            cur = self.num_batches_tracked
            state_dict[key] = cur if not _backend.is_meta_array(cur._data) else hpcfsdp.tensor(0, dtype=_backend.int64)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    """Normalise over the batch (and spatial) dims per channel; see [Note: Batch norm statistics]."""

    def forward(self, input):
        import hpcfsdp

        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got input of shape "
                             f"{tuple(input.shape)}: expected {self.num_features} channels in dim 1")
        factor = 0.0 if self.momentum is None else float(self.momentum)
        if self.training and self.track_running_stats:
            with hpcfsdp.no_grad():
                self.num_batches_tracked.add_(1)
            factor = 1.0 / int(self.num_batches_tracked.item()) if self.momentum is None else factor
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # the running statistics are updated only in training (in eval, without them, the batch normalises)
        update = not self.training or self.track_running_stats
        return batch_norm(input, self.running_mean if update else None, self.running_var if update else None,
                          self.weight, self.bias, use_batch_stats, factor, self.eps)


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) input."""

    def _check_input_dim(self, input):
        if input.ndim not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {input.ndim}D input)")


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W) input."""

    def _check_input_dim(self, input):
        if input.ndim != 4:
            raise ValueError(f"expected 4D input (got {input.ndim}D input)")


class BatchNorm3d(_BatchNorm):
    """Batch norm over (N, C, D, H, W) input."""

    def _check_input_dim(self, input):
        if input.ndim != 5:
            raise ValueError(f"expected 5D input (got {input.ndim}D input)")
