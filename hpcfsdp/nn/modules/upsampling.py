"""Upsample, UpsamplingNearest2d, UpsamplingBilinear2d: modules over ``functional.interpolate``."""
from hpcfsdp.nn._functional.resample import interpolate
from hpcfsdp.nn.modules.module import Module

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class Upsample(Module):
    """Resize (N, C, L), (N, C, H, W) or (N, C, D, H, W) to ``size`` or by ``scale_factor``.

    Args:
        size: the output's spatial size.
        scale_factor: a multiplier or one per spatial dim (stored as floats, as PyTorch).
        mode: ``"nearest"``, ``"nearest-exact"``, ``"linear"``, ``"bilinear"``, ``"trilinear"`` or ``"area"``.
        align_corners: for the linear modes (See ``hpcfsdp.nn.functional.interpolate``).
        recompute_scale_factor: sample with the scale the sizes imply instead of ``scale_factor``.
    """

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, tuple):
            self.scale_factor = tuple(float(f) for f in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):  # noqa: A002
        return interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                           recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour upsampling of (N, C, H, W): ``Upsample(size, scale_factor, mode="nearest")``."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear upsampling of (N, C, H, W) with aligned corners: ``Upsample(..., "bilinear", align_corners=True)``."""

    def __init__(self, size=None, scale_factor=None):
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
