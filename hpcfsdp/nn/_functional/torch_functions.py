"""The nn.functional ops PyTorch also exposes as torch.* functions (torch.dropout, torch.layer_norm, torch.conv2d,
torch.embedding, ...), declared in the op registry with PyTorch's torch-level signatures and calling the
nn.functional function: torch.dropout's ``train`` has no default, torch.embedding takes (weight, indices) and
padding_idx -1 for none, torch.selu and torch.celu have no ``inplace``. hpcfsdp/__init__.py loads this module with
nn and adds the functions to the hpcfsdp namespace."""
from ..._registry import function_op
import hpcfsdp.nn.functional as F

__all__ = []


@function_op("nn")
def dropout(input, p, train):  # noqa: A002
    """torch.dropout: nn.functional.dropout(input, p, training=train)."""
    return F.dropout(input, p, train)


@function_op("nn")
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05, cudnn_enable=True):  # noqa: A002
    """torch.layer_norm: nn.functional.layer_norm (``cudnn_enable`` is accepted and ignored)."""
    return F.layer_norm(input, normalized_shape, weight, bias, eps)


@function_op("nn")
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-05, cudnn_enabled=True):  # noqa: A002
    """torch.group_norm: nn.functional.group_norm (``cudnn_enabled`` is accepted and ignored)."""
    return F.group_norm(input, num_groups, weight, bias, eps)


@function_op("nn")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """torch.embedding: the rows of ``weight`` at ``indices`` (nn.functional.embedding's arguments reversed);
    ``padding_idx`` -1 for none, else the row that gets no gradient."""
    return F.embedding(indices, weight, None if padding_idx == -1 else padding_idx,
                       scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


@function_op("conv")
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """torch.conv1d: nn.functional.conv1d."""
    return F.conv1d(input, weight, bias, stride, padding, dilation, groups)


@function_op("conv")
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """torch.conv2d: nn.functional.conv2d."""
    return F.conv2d(input, weight, bias, stride, padding, dilation, groups)


@function_op("conv")
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """torch.conv3d: nn.functional.conv3d."""
    return F.conv3d(input, weight, bias, stride, padding, dilation, groups)


@function_op("conv")
def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                     dilation=1):
    """torch.conv_transpose1d: nn.functional.conv_transpose1d."""
    return F.conv_transpose1d(input, weight, bias, stride, padding, output_padding, groups, dilation)


@function_op("conv")
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: A002
                     dilation=1):
    """torch.conv_transpose2d: nn.functional.conv_transpose2d."""
    return F.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)


@function_op("activation")
def selu(input):  # noqa: A002
    """torch.selu: nn.functional.selu."""
    return F.selu(input)


@function_op("activation")
def celu(input, alpha=1.0):  # noqa: A002
    """torch.celu: nn.functional.celu."""
    return F.celu(input, alpha)


@function_op("activation")
def threshold(input, threshold, value):  # noqa: A002
    """torch.threshold: nn.functional.threshold (x where x > threshold, else value)."""
    return F.threshold(input, threshold, value)


@function_op("nn")
def pixel_shuffle(input, upscale_factor):  # noqa: A002
    """torch.pixel_shuffle: nn.functional.pixel_shuffle."""
    return F.pixel_shuffle(input, upscale_factor)


@function_op("nn")
def pixel_unshuffle(input, downscale_factor):  # noqa: A002
    """torch.pixel_unshuffle: nn.functional.pixel_unshuffle."""
    return F.pixel_unshuffle(input, downscale_factor)


@function_op("nn")
def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """torch.cosine_similarity: nn.functional.cosine_similarity."""
    return F.cosine_similarity(x1, x2, dim, eps)


@function_op("nn")
def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """torch.pairwise_distance: nn.functional.pairwise_distance."""
    return F.pairwise_distance(x1, x2, p, eps, keepdim)


@function_op("nn")
def pdist(input, p=2):  # noqa: A002
    """torch.pdist: nn.functional.pdist."""
    return F.pdist(input, p)
