"""SyncBatchNorm: batch norm whose training statistics are those of the batch over every rank of a process group."""
import numpy as np

from ..._array import HALF_DTYPES
from ..._backend import array_module
from ...autograd.function import Op
from .batchnorm import _BatchNorm

__all__ = ["SyncBatchNorm"]

# [Note: Synchronised batch statistics]
# In training with a process group of size > 1, each rank holds a slice of the global batch. The forward
# all-reduces one buffer [sum x (C), sum x^2 (C), count] over the group (sums accumulated in float64) and
# normalises with the global mean and biased variance; the running statistics take the global mean and
# the unbiased global variance (count / (count - 1) times it). The backward is batch norm's:
#   gx = (g - mean(g) - (x - mean) invstd^2 mean(g (x - mean))) invstd weight,
# where the two means are over the global batch: one all-reduce of [sum g, sum g (x - mean)] (C each), done
# only when the input needs a gradient, as PyTorch's SyncBatchNorm. The weight and bias gradients are the
# rank's own (sum g (x - mean) invstd, sum g): data parallelism (FSDP, DDP) reduces them as any gradient.
# Every rank must therefore run the forward and backward of each SyncBatchNorm in the same order.


def _all_reduce(buf, group):
    import hpcfsdp
    import hpcfsdp.distributed as dist

    dist.all_reduce(hpcfsdp.Tensor._wrap(buf), group=group)
    return buf


class _SyncBatchNormFn(Op):
    """y = (x - mean) invstd * w + b with mean/invstd over the whole group; See [Note: Synchronised batch statistics].

    ``stats`` is a list that receives (global mean, global biased var, global count) for the running statistics.
    """

    @staticmethod
    def forward(ctx, x, w, b, eps, group, stats):
        xp = array_module(x)
        dt = x.dtype
        cdt = np.float32 if dt in HALF_DTYPES else dt
        xc = x.astype(cdt, copy=False)
        c = x.shape[1]
        axes = (0,) + tuple(range(2, x.ndim))
        buf = xp.empty(2 * c + 1, dtype=np.float64)
        buf[:c] = xc.sum(axis=axes, dtype=np.float64)
        buf[c:2 * c] = (xc * xc).sum(axis=axes, dtype=np.float64)
        buf[2 * c] = x.size // c if c else 0
        _all_reduce(buf, group)
        cnt = float(buf[2 * c])
        if cnt <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(cnt)} values per channel "
                             f"over the process group (local input size {tuple(x.shape)})")
        mean = buf[:c] / cnt
        var = xp.maximum(buf[c:2 * c] / cnt - mean * mean, 0.0)
        stats.extend([mean, var, cnt])
        shape = (1, c) + (1,) * (x.ndim - 2)
        invstd = (1.0 / xp.sqrt(var + eps)).astype(cdt)
        meanc = mean.astype(cdt)
        xhat = (xc - meanc.reshape(shape)) * invstd.reshape(shape)
        y = xhat * w.astype(cdt).reshape(shape) if w is not None else xhat.copy()
        if b is not None:
            y += b.astype(cdt).reshape(shape)
        ctx.xc, ctx.mean, ctx.invstd, ctx.w, ctx.cnt, ctx.group, ctx.dt = xc, meanc, invstd, w, cnt, group, dt
        ctx.has_b = b is not None
        return y.astype(dt, copy=False)

    @staticmethod
    def backward(ctx, g):
        xc, mean, invstd, w, cnt = ctx.xc, ctx.mean, ctx.invstd, ctx.w, ctx.cnt
        nx, nw, nb = ctx.needs_input_grad[:3]
        xp = array_module(g)
        gc = g.astype(xc.dtype, copy=False)
        c = xc.shape[1]
        axes = (0,) + tuple(range(2, xc.ndim))
        shape = (1, c) + (1,) * (xc.ndim - 2)
        xmu = xc - mean.reshape(shape)
        sum_dy = gc.sum(axis=axes)
        sum_dy_xmu = (gc * xmu).sum(axis=axes)
        gx = gw = gb = None
        if nw and w is not None:
            gw = (sum_dy_xmu * invstd).astype(ctx.dt, copy=False)
        if nb and ctx.has_b:
            gb = sum_dy.astype(ctx.dt, copy=False)
        if nx:
            buf = xp.concatenate([sum_dy, sum_dy_xmu]).astype(np.float64)
            _all_reduce(buf, ctx.group)
            mean_dy = (buf[:c] / cnt).astype(xc.dtype).reshape(shape)
            mean_dy_xmu = (buf[c:] / cnt).astype(xc.dtype).reshape(shape)
            inv = invstd.reshape(shape)
            scale = inv * w.astype(xc.dtype).reshape(shape) if w is not None else inv
            gx = ((gc - mean_dy - xmu * (inv * inv) * mean_dy_xmu) * scale).astype(ctx.dt, copy=False)
        return gx, gw, gb, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch norm over (N, C, *) whose training statistics span every rank of ``process_group``.

    In training with an initialised process group of more than one rank, the mean and variance are those of
    the global batch (every rank's samples), and the running statistics are updated with them; in eval mode,
    or without a process group (or one of size 1), it is ``BatchNorm``. See [Note: Synchronised batch statistics].

    Args:
        num_features: C.
        eps: added to the variance.
        momentum: the running statistics' update factor; None: a cumulative average.
        affine: learn a per-channel scale and shift.
        track_running_stats: keep running statistics (used in eval mode).
        process_group: the group whose ranks share the batch; None: the default group.
        device: where the parameters live.
        dtype: the parameters' dtype.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None, *,
                 bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, input):  # noqa: A002
        if input.ndim < 2:
            raise ValueError(f"expected at least 2D input (got {input.ndim}D input)")

    def _world_size(self):
        """The size of the group to synchronise over, or 1 when there is none (nothing to synchronise)."""
        import hpcfsdp.distributed as dist

        if not dist.is_initialized():
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, input):  # noqa: A002
        import hpcfsdp

        self._check_input_dim(input)
        if input.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        if not (bn_training and self.training) or self._world_size() == 1:
            return super().forward(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got input of shape "
                             f"{tuple(input.shape)}: expected {self.num_features} channels in dim 1")
        factor = 0.0 if self.momentum is None else float(self.momentum)
        if self.track_running_stats:
            with hpcfsdp.no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / int(self.num_batches_tracked.item())
        stats = []
        w = self.weight.to(input.dtype) if self.weight is not None and self.weight.dtype != input.dtype \
            else self.weight
        b = self.bias.to(input.dtype) if self.bias is not None and self.bias.dtype != input.dtype else self.bias
        out = _SyncBatchNormFn.apply(input, w, b, float(self.eps), self.process_group, stats)
        if self.running_mean is not None:
            mean, var, cnt = stats
            xp = self.running_mean._xp()
            rdt = self.running_mean.dtype
            with hpcfsdp.no_grad():
                m = hpcfsdp.Tensor._wrap(xp.asarray(mean).astype(rdt))
                v = hpcfsdp.Tensor._wrap(xp.asarray(var * (cnt / (cnt - 1))).astype(rdt))
                self.running_mean.mul_(1.0 - factor).add_(m * factor)
                self.running_var.mul_(1.0 - factor).add_(v * factor)
        return out

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """``module`` with every BatchNorm*D layer in it (itself included) replaced by a SyncBatchNorm that shares
        its parameters and buffers and keeps its training mode, as PyTorch's classmethod of that name."""
        out = module
        if isinstance(module, _BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                out.weight = module.weight
                out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


