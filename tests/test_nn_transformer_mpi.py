"""A TransformerEncoder with fully_shard on each layer and on the root (as PyTorch's FSDP tests and tutorials shard
it) trains as the unsharded model on the global batch."""
import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import FSDPModule, fully_shard

from _fsdp_util import train_parity, world

pytestmark = pytest.mark.mpi(min_size=2)

D, NHEAD, FF, T = 8, 2, 12, 5  # odd sizes: uneven shards of every (3D, D), (FF, D) and (D,) parameter


# [Note: key bias under Adam] The key part of in_proj_bias adds the same q . b_k to every score of a query, which
# softmax ignores: its true gradient is 0 and what backward returns is rounding noise, different in the sharded and
# the unsharded sums. Adam scales noise to full-size steps, so in float32 those 8 entries drift apart; float64 keeps
# the noise below Adam's eps. The float32 case therefore runs without biases (as tests/_fsdp_util.tiny_gpt does).
def _encoder(norm_first, bias, dtype):
    def make():
        hp.manual_seed(3)
        layer = nn.TransformerEncoderLayer(D, NHEAD, FF, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=norm_first, bias=bias, dtype=dtype)
        return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D, bias=bias, dtype=dtype), enable_nested_tensor=False)
    return make


def _shard(model):
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)


def _batches(steps, dtype, rows_per_rank=2, seed=5):
    w, _ = world()
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((w * rows_per_rank, T, D)).astype(dtype),
             rng.standard_normal((w * rows_per_rank, T, D)).astype(dtype)) for _ in range(steps)]


@pytest.mark.parametrize("norm_first,causal,bias,dtype", [(False, False, True, np.float64),
                                                          (True, True, False, np.float32)],
                         ids=["post_norm-float64", "pre_norm-causal-float32"])
def test_sharded_transformer_encoder_matches_unsharded(norm_first, causal, bias, dtype):
    """See [Note: key bias under Adam]."""
    mask = nn.Transformer.generate_square_subsequent_mask(T, dtype=dtype) if causal else None

    def loss_fn(m, x, y):
        out = m(hp.tensor(x), mask=mask)  # (B, T, D)
        return ((out - hp.tensor(y)) ** 2).mean()

    model, ref = train_parity(_encoder(norm_first, bias, dtype), _shard, steps=3, lr=1e-2,
                              batches=_batches(3, dtype), loss_fn=loss_fn)
    assert isinstance(model, FSDPModule) and all(isinstance(layer, FSDPModule) for layer in model.layers)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(model.state_dict()) == list(ref.state_dict())
