"""unfold (im2col) and fold (col2im) of torch.nn.functional, on the ops Im2Col and Col2Im (one each other's
backward)."""
from ...autograd.ops.fold import Col2Im, Im2Col
from ._common import check_tensor, expand_param

__all__ = ["unfold", "fold"]


def _geometry(kernel_size, dilation, padding, stride):
    return (expand_param(kernel_size, 2, "kernel_size"), expand_param(dilation, 2, "dilation"),
            expand_param(padding, 2, "padding"), expand_param(stride, 2, "stride"))


def _blocks(size, ks, dil, pad, st):
    return tuple((s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, d, p, t in zip(size, ks, dil, pad, st))


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
    """The sliding blocks of (N, C, H, W) (or unbatched (C, H, W)) as columns (N, C * kh * kw, L), the row
    c * kh * kw + i * kw + j holding tap (i, j) of channel c for each of the L block positions.

    Raises:
        NotImplementedError: an input that is not 3-D or 4-D (PyTorch supports only images).
        RuntimeError: the kernel does not fit in the padded input.
    """
    check_tensor(input, "unfold")
    if input.ndim not in (3, 4):
        raise NotImplementedError(f"Input Error: Only 3D or 4D input Tensors are supported (got {input.ndim}D)")
    ks, dil, pad, st = _geometry(kernel_size, dilation, padding, stride)
    x = input.unsqueeze(0) if input.ndim == 3 else input
    out_size = _blocks(x.shape[2:], ks, dil, pad, st)
    if min(out_size) < 1:
        raise RuntimeError(f"Given input with spatial size {tuple(x.shape[2:])}, kernel_size={ks}, dilation={dil}, "
                           f"padding={pad}, calculated shape of the array of sliding blocks as {out_size}, but its "
                           f"components must be at least one.")
    cols = Im2Col.apply(x, ks, tuple((p, p) for p in pad), st, dil, out_size)
    return cols.squeeze(0) if input.ndim == 3 else cols


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
    """Columns (N, C * kh * kw, L) (or unbatched (C * kh * kw, L)) summed into (N, C, *output_size): the adjoint
    of ``unfold``; overlapping blocks add up.

    Raises:
        NotImplementedError: an input that is not 2-D or 3-D.
        RuntimeError: dim 1 is not a multiple of the kernel's size, or L is not the number of blocks.
    """
    check_tensor(input, "fold")
    if input.ndim not in (2, 3):
        raise NotImplementedError(f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported "
                                  f"(got {input.ndim}D)")
    osize = expand_param(output_size, 2, "output_size")
    ks, dil, pad, st = _geometry(kernel_size, dilation, padding, stride)
    x = input.unsqueeze(0) if input.ndim == 2 else input
    kk = ks[0] * ks[1]
    if x.shape[1] % kk:
        raise RuntimeError(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, "
                           f"but got input.size(1)={x.shape[1]} and kernel_size={ks}.")
    out_size = _blocks(osize, ks, dil, pad, st)
    nblocks = out_size[0] * out_size[1]
    if x.shape[2] != nblocks:
        raise RuntimeError(f"Given output_size={osize}, kernel_size={ks}, dilation={dil}, padding={pad}, "
                           f"stride={st}, expected size of input's dimension 2 to match the calculated number of "
                           f"sliding blocks {out_size[0]} * {out_size[1]} = {nblocks}, but got "
                           f"input.size(2)={x.shape[2]}.")
    shape = (x.shape[0], x.shape[1] // kk) + osize
    out = Col2Im.apply(x, shape, ks, tuple((p, p) for p in pad), st, dil, out_size)
    return out.squeeze(0) if input.ndim == 2 else out
