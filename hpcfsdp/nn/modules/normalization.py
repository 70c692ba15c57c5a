"""LayerNorm and RMSNorm over the trailing dimensions (and LocalResponseNorm, defined in lp_unpool.py, as in
torch.nn.modules.normalization)."""
import numbers

import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn.modules.lp_unpool import LocalResponseNorm
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["LayerNorm", "RMSNorm", "LocalResponseNorm"]


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over ``normalized_shape`` (biased variance)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        import hpcfsdp

        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(hpcfsdp.empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(hpcfsdp.empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return ("{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)
                + f", bias={self.bias is not None}")


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over ``normalized_shape``; eps None = the dtype's machine epsilon."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        import hpcfsdp

        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(s) for s in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(hpcfsdp.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.elementwise_affine:
            init.ones_(self.weight)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)
