"""Embedding: a lookup table of learnable vectors."""
import hpcfsdp.nn.functional as F
from hpcfsdp.nn import init
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["Embedding"]


class Embedding(Module):
    """``weight[input]`` with weight of shape (num_embeddings, embedding_dim), initialised N(0, 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, max_norm=None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight=None, _freeze: bool = False, device=None, dtype=None):
        super().__init__()
        import hpcfsdp

        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        if padding_idx is not None:
            if padding_idx > 0:
                if padding_idx >= num_embeddings:
                    raise ValueError(f"Padding_idx must be within num_embeddings, got {padding_idx}")
            elif padding_idx < 0:
                if padding_idx < -num_embeddings:
                    raise ValueError(f"Padding_idx must be within num_embeddings, got {padding_idx}")
                padding_idx = num_embeddings + padding_idx
        if scale_grad_by_freq or sparse:
            raise ValueError("Embedding: scale_grad_by_freq and sparse are not supported; "
                             f"got scale_grad_by_freq={scale_grad_by_freq}, sparse={sparse}")
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            self.weight = Parameter(hpcfsdp.empty((num_embeddings, embedding_dim), device=device, dtype=dtype),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Shape of weight {tuple(_weight.shape)} does not match num_embeddings and "
                                 f"embedding_dim ({num_embeddings}, {embedding_dim})")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        if self.padding_idx is not None and not _is_meta(self.weight):
            self.weight._data[self.padding_idx] = 0

    def forward(self, input):
        if self.padding_idx is None and self.max_norm is None:
            return F.embedding(input, self.weight)
        return F.embedding(input, self.weight, padding_idx=self.padding_idx, max_norm=self.max_norm,
                           norm_type=self.norm_type)

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            s += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            s += f", norm_type={self.norm_type}"
        return s

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, **kwargs):
        if embeddings.dim() != 2:
            raise ValueError(f"Embeddings parameter is expected to be 2-dimensional, got {embeddings.dim()}")
        rows, cols = tuple(embeddings.shape)
        return cls(rows, cols, _weight=embeddings, _freeze=freeze, padding_idx=padding_idx, **kwargs)


def _is_meta(t):
    from hpcfsdp import _backend

    return _backend.is_meta_array(t._data)
