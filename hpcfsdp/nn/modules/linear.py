"""Linear and Identity layers."""
import math

import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["Linear", "Identity"]


def _empty(shape, device, dtype):
    import hpcfsdp

    return hpcfsdp.empty(shape, device=device, dtype=dtype)


class Identity(Module):
    """Returns its input; accepts and ignores any constructor arguments (as PyTorch)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x @ W^T + b with W of shape (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(_empty((out_features, in_features), device, dtype))
        if bias:
            self.bias = Parameter(_empty((out_features,), device, dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # PyTorch's default: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
