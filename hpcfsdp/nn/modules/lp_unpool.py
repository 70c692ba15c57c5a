"""Power-average pooling and max unpooling layers (torch.nn.modules.pooling): LPPool1d/2d/3d, MaxUnpool1d/2d/3d,
and LocalResponseNorm (torch.nn.modules.normalization), each over its functional in lp_unpool.py and
normalization.py."""
from hpcfsdp.nn._functional import lp_unpool as _pool
from hpcfsdp.nn._functional.normalization import local_response_norm
from hpcfsdp.nn.modules.module import Module

__all__ = ["LPPool1d", "LPPool2d", "LPPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d", "LocalResponseNorm"]


class _LPPoolNd(Module):
    _fn = None

    def __init__(self, norm_type: float, kernel_size, stride=None, ceil_mode: bool = False) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def forward(self, input):  # noqa: A002
        return type(self)._fn(input, float(self.norm_type), self.kernel_size, self.stride, self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"ceil_mode={self.ceil_mode}")


class LPPool1d(_LPPoolNd):
    """(sum over each window of x^p)^(1/p) over (N, C, L) (``F.lp_pool1d``)."""

    _fn = staticmethod(_pool.lp_pool1d)


class LPPool2d(_LPPoolNd):
    """(sum over each window of x^p)^(1/p) over (N, C, H, W) (``F.lp_pool2d``)."""

    _fn = staticmethod(_pool.lp_pool2d)


class LPPool3d(_LPPoolNd):
    """(sum over each window of x^p)^(1/p) over (N, C, D, H, W) (``F.lp_pool3d``)."""

    _fn = staticmethod(_pool.lp_pool3d)


def _ntuple(value, n):
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * n


class _MaxUnpoolNd(Module):
    _n = 2
    _fn = None

    def __init__(self, kernel_size, stride=None, padding=0) -> None:
        super().__init__()
        self.kernel_size = _ntuple(kernel_size, self._n)
        self.stride = _ntuple(stride if stride is not None else kernel_size, self._n)
        self.padding = _ntuple(padding, self._n)

    def forward(self, input, indices, output_size=None):  # noqa: A002
        return type(self)._fn(input, indices, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    """The partial inverse of MaxPool1d (``F.max_unpool1d``)."""

    _n = 1
    _fn = staticmethod(_pool.max_unpool1d)


class MaxUnpool2d(_MaxUnpoolNd):
    """The partial inverse of MaxPool2d (``F.max_unpool2d``)."""

    _n = 2
    _fn = staticmethod(_pool.max_unpool2d)


class MaxUnpool3d(_MaxUnpoolNd):
    """The partial inverse of MaxPool3d (``F.max_unpool3d``)."""

    _n = 3
    _fn = staticmethod(_pool.max_unpool3d)


class LocalResponseNorm(Module):
    """Normalise each channel by the squares of its ``size`` neighbours (``F.local_response_norm``)."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> None:
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def forward(self, input):  # noqa: A002
        return local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
