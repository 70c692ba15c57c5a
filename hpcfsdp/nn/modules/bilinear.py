"""Bilinear: y = x1^T A x2 + b (torch.nn.Bilinear)."""
import math

from hpcfsdp.nn import init
from hpcfsdp.nn._functional.bilinear import bilinear
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["Bilinear"]


class Bilinear(Module):
    """weight (out, in1, in2) and bias (out,), both U(-1/sqrt(in1), 1/sqrt(in1)) as PyTorch's.

    Raises:
        ValueError: ``in1_features`` is not positive.
    """

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        import hpcfsdp

        self.in1_features = in1_features
        self.in2_features = in2_features
        self.out_features = out_features
        self.weight = Parameter(hpcfsdp.empty((out_features, in1_features, in2_features), device=device,
                                              dtype=dtype))
        if bias:
            self.bias = Parameter(hpcfsdp.empty((out_features,), device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.in1_features <= 0:
            raise ValueError(f"in1_features must be > 0, but got (in1_features={self.in1_features})")
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
