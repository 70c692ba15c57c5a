"""bilinear of torch.nn.functional: y = x1^T A x2 + b, as two matmuls of Tensor ops."""
from ._common import check_float

__all__ = ["bilinear"]


def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o].

    Args:
        input1: (*, in1).
        input2: (*, in2), the same leading dims.
        weight: (out, in1, in2).
        bias: optional (out,).

    Raises:
        RuntimeError: sizes that do not match the weight's, or leading dims that differ.
    """
    check_float(input1, "bilinear", "input1")
    check_float(input2, "bilinear", "input2")
    check_float(weight, "bilinear", "weight")
    if weight.ndim != 3:
        raise RuntimeError(f"bilinear(): weight must be three-dimensional, got {weight.ndim}D")
    o, i, j = weight.shape
    if input1.ndim != input2.ndim or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise RuntimeError(f"bilinear(): input batch dimensions do not match: got {list(input1.shape[:-1])} and "
                           f"{list(input2.shape[:-1])}")
    if input1.shape[-1] != i:
        raise RuntimeError(f"bilinear(): input1 size does not match weight size: got {input1.shape[-1]} but "
                           f"expected {i}")
    if input2.shape[-1] != j:
        raise RuntimeError(f"bilinear(): input2 size does not match weight size: got {input2.shape[-1]} but "
                           f"expected {j}")
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != o):
        raise RuntimeError(f"bilinear(): bias size does not match weight size: got {bias.shape[-1]} but expected "
                           f"{o}")
    lead = tuple(input1.shape[:-1])
    x1 = input1.reshape(-1, i)  # (B, in1)
    x2 = input2.reshape(-1, j)  # (B, in2)
    t = (x1 @ weight.permute(1, 0, 2).reshape(i, o * j)).reshape(-1, o, j)  # (B, out, in2)
    y = (t * x2.unsqueeze(1)).sum(2)  # (B, out)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, o)
