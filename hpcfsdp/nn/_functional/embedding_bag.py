"""embedding_bag of torch.nn.functional: sums, means or maxima of bags of embedding rows, and embedding_renorm
(the ``max_norm`` rescaling that embedding and embedding_bag apply to the rows they read).

[Note: Bags as a padded gather]
The bags (rows of a 2-D input, or the segments of a 1-D input that ``offsets`` start) are laid out as a
(B, L) matrix of positions into the looked-up rows, L the longest bag; the slots past a bag's end and the
entries equal to ``padding_idx`` point at one extra zero row. One differentiable gather of the (M + 1, D)
rows then gives (B, L, D), reduced over L: sum, mean over the counted entries, or max (the padding slots
masked to -inf; an empty bag is 0, as PyTorch's). The weight's gradient comes through the embedding lookup.
"""
from ..._tensor import Tensor
from ...autograd import ops
from ._common import check_tensor

__all__ = ["embedding_bag", "embedding_renorm_"]


def embedding_renorm_(weight, indices, max_norm, norm_type=2.0):
    """Rescale, in place and outside autograd, each row of ``weight`` that ``indices`` name whose ``norm_type``
    norm exceeds ``max_norm`` to norm ``max_norm`` (PyTorch's scale max_norm / (norm + 1e-7))."""
    import hpcfsdp

    xp = weight._xp()
    rows = xp.unique(indices.reshape(-1))
    with hpcfsdp.no_grad():
        w = weight._data
        sel = w[rows]
        norm = hpcfsdp.Tensor._wrap(sel).norm(float(norm_type), dim=1)._data  # (R,)
        scale = xp.where(norm > max_norm, max_norm / (norm + 1e-7), 1.0).astype(w.dtype)
        w[rows] = sel * scale[:, None]
    return weight


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,  # noqa: A002
                  mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """One reduced embedding per bag: (B, D) from ``weight`` (num_embeddings, D).

    Args:
        input: int indices, (B, N) (B bags of N), or 1-D with ``offsets`` (B,) marking where each bag starts.
        weight: the embedding matrix.
        offsets: the bags' starts in a 1-D input; with ``include_last_offset`` it has B + 1 entries, the last
            being the end of the last bag.
        max_norm: rows read whose norm exceeds it are rescaled in place (See ``embedding_renorm_``).
        norm_type: the p of that norm.
        scale_grad_by_freq: accepted; gradients are unscaled.
        sparse: accepted; gradients are dense.
        mode: ``"sum"``, ``"mean"`` or ``"max"``.
        per_sample_weights: a float weight per index of ``input``'s shape (``mode="sum"`` only).
        padding_idx: entries equal to it are left out (and not counted by the mean).

    Raises:
        ValueError: offsets with a 2-D input or none with a 1-D one, an unknown mode, or per_sample_weights of
            another shape.
        RuntimeError: ``offsets[0]`` is not 0.
        NotImplementedError: per_sample_weights with a mode other than ``"sum"``.
    See [Note: Bags as a padded gather].
    """
    import hpcfsdp

    check_tensor(weight, "embedding_bag", "weight")
    check_tensor(input, "embedding_bag")
    if weight.dtype.kind != "f" and weight.dtype.name != "bfloat16":
        raise RuntimeError(f"embedding_bag(): expected a floating point weight, got dtype {weight.dtype}")
    if per_sample_weights is not None and tuple(input.shape) != tuple(per_sample_weights.shape):
        raise ValueError(f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, then it "
                         f"must have the same shape as the input ({input.shape})")
    if weight.ndim != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.ndim}")
    xp = weight._xp()
    idx = input._data
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError(f"if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                             f"fixed length sequences. However, found offsets of type {type(offsets)}")
        b, n = input.shape
        starts = xp.arange(0, b * n, n, dtype=xp.int64) if n else xp.zeros(b, dtype=xp.int64)
        idx = idx.reshape(-1)
        psw = per_sample_weights.reshape(-1) if per_sample_weights is not None else None
    elif input.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.ndim != 1:
            raise ValueError("offsets has to be a 1D Tensor")
        starts = offsets._data.astype(xp.int64)
        psw = per_sample_weights
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim}")
    if mode not in ("sum", "mean", "max"):
        raise ValueError("mode has to be one of sum, mean or max")
    if max_norm is not None:
        embedding_renorm_(weight, idx, max_norm, norm_type)
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
                                  f"GitHub.")
    m = int(idx.shape[0])
    if starts.size and int(starts[0]) != 0:
        raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                           f"position 0. However, got {int(starts[0])}")
    if include_last_offset:
        ends, starts = starts[1:], starts[:-1]
    else:
        ends = xp.concatenate([starts[1:], xp.asarray([m], dtype=xp.int64)])
    ends = xp.minimum(ends, m)
    lens = xp.maximum(ends - starts, 0)  # (B,)
    nb = int(starts.shape[0])
    width = int(lens.max()) if nb else 0
    slot = xp.arange(width, dtype=xp.int64)[None, :]
    pos = starts[:, None] + slot  # (B, L)
    inside = slot < lens[:, None]
    pos = xp.where(inside, pos, 0)
    counted = inside
    if padding_idx is not None and m:
        pad = padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
        counted = inside & (idx[pos] != pad)
    gather = Tensor._wrap(xp.where(counted, pos, m))  # (B, L) into the M rows and the zero row
    d = weight.shape[1]
    rows = ops.Embedding.apply(idx, weight, None) if m else hpcfsdp.zeros(0, d, dtype=weight.dtype,
                                                                      device=weight.device)
    if psw is not None:
        rows = rows * psw.to(rows.dtype).unsqueeze(1)
    rows = hpcfsdp.cat([rows, hpcfsdp.zeros(1, d, dtype=rows.dtype, device=weight.device)])  # (M + 1, D)
    bags = rows[gather]  # (B, L, D)
    if mode == "sum":
        return bags.sum(1)
    count = counted.sum(axis=1)  # (B,)
    if mode == "mean":
        denom = Tensor._wrap(xp.maximum(count, 1).astype(rows.dtype)[:, None])
        return bags.sum(1) / denom
    neg = Tensor._wrap(xp.where(counted, 0.0, -xp.inf).astype(rows.dtype)[:, :, None])
    best = (bags + neg).amax(1) if width else hpcfsdp.zeros(nb, d, dtype=rows.dtype, device=weight.device)
    empty = Tensor._wrap((count == 0)[:, None])
    return hpcfsdp.where(empty, hpcfsdp.zeros_like(best), best)
