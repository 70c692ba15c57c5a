"""GroupNorm: normalization over groups of channels."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["GroupNorm"]


class GroupNorm(Module):
    """Normalize (N, C, *) over groups of C / num_groups channels, then scale and shift per channel.

    Args:
        num_groups: groups the channels are split into.
        num_channels: C.
        eps: added to the variance.
        affine: learn a per-channel weight (ones) and bias (zeros).
        device: where the parameters live.
        dtype: the parameters' dtype.
        bias: with ``affine``, whether to learn the bias (keyword only, as PyTorch 2.13).

    Raises:
        ValueError: ``num_channels`` is not divisible by ``num_groups``.
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, *, bias: bool = True) -> None:
        super().__init__()
        import hpcfsdp

        if num_channels % num_groups != 0:
            raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = Parameter(hpcfsdp.empty((num_channels,), device=device, dtype=dtype))
            if bias:
                self.bias = Parameter(hpcfsdp.empty((num_channels,), device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight ones, bias zeros."""
        if self.affine:
            init.ones_(self.weight)
            if self.bias is not None:
                init.zeros_(self.bias)

    def forward(self, input):  # noqa: A002
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")
