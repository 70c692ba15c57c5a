"""Random family: the dropout keep mask from the device's generator, and samples whose parameters get zero gradient."""
import numpy as np

from ... import _backend
from ..._array import shape_of
from ..._backend import array_module
from ..function import Op

__all__ = ["Sampled"]


def _random_keep(shape, p, like):
    """A bool mask of ``shape``, True with probability 1 - p, drawn on the device of ``like``."""
    gen = _backend.generator(_backend.device_of_array(like))
    r = gen.random(shape, dtype=np.float32) if isinstance(gen, np.random.Generator) \
        else gen.random_sample(shape, dtype=np.float32)
    return r >= np.float32(p)


class Sampled(Op):
    """A sample drawn with parameters ``params`` (normal's mean and std): their gradients are zero, as PyTorch's."""

    @staticmethod
    def forward(ctx, sample, *params):
        ctx.shapes = [shape_of(p) for p in params]
        return sample

    @staticmethod
    def backward(ctx, g):
        xp = array_module(g)
        return (None,) + tuple(xp.zeros(s, dtype=g.dtype) for s in ctx.shapes)
