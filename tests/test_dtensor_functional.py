"""nn.functional on DTensors (See [Note: Functional placements]): each result and each gradient against the same
call on the full tensors in float64, the result's placements as PyTorch's where it defines them, and a
primitive that has no rule refused with the op and the placements named (it used to compute on the shard)."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
import hpcfsdp.nn.functional as F
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

pytestmark = pytest.mark.mpi(min_size=2)


def _mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(seed, shape):
    return hp.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


def _check(fn, fulls, placements):
    """fn on DTensors of ``fulls`` laid out as ``placements`` against fn on ``fulls``: values and gradients. Returns
    the DTensor result (its placements are checked by the caller)."""
    mesh = _mesh()
    dts = [distribute_tensor(f.detach(), mesh, [p]).requires_grad_(f.requires_grad) for f, p in zip(fulls, placements)]
    out = fn(*dts)
    ref = fn(*fulls)
    assert isinstance(out, DTensor), type(out)
    np.testing.assert_allclose(out.full_tensor().detach().numpy(), ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    weight = hp.tensor(np.random.default_rng(99).standard_normal(tuple(ref.shape)))
    (ref * weight).sum().backward()
    (out.full_tensor() * weight).sum().backward()
    for f, d in zip(fulls, dts):
        if f.requires_grad:
            assert isinstance(d.grad, DTensor) and d.grad.placements == d.placements
            np.testing.assert_allclose(d.grad.full_tensor().numpy(), f.grad.numpy(), rtol=1e-10, atol=1e-12)
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("px,pw,want", [
    (Replicate(), Shard(0), Shard(1)),  # column-wise: the result sharded on its last dim
    (Shard(1), Shard(1), Partial()),  # row-wise: partial sums
    (Shard(0), Replicate(), Shard(0)),  # data parallel
])
def test_linear(px, pw, want):
    x, w = _full(0, (4, 8)), _full(1, (6, 8))
    assert _check(lambda a, b: F.linear(a, b), [x, w], [px, pw]).placements == (want,)


@pytest.mark.timeout(60)
def test_linear_with_a_replicated_bias_on_a_column_sharded_weight():
    def fulls():
        return [_full(0, (4, 8)), _full(1, (6, 8)), _full(2, (6,))]

    assert _check(F.linear, fulls(), [Replicate(), Shard(0), Replicate()]).placements == (Shard(1),)
    # partial + bias: reduced first
    assert _check(F.linear, fulls(), [Shard(1), Shard(1), Replicate()]).placements == (Replicate(),)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("px,want", [(Shard(0), Shard(0)), (Shard(1), Shard(1)), (Shard(2), Replicate())])
def test_layer_norm_keeps_the_unnormalized_dims_sharded(px, want):
    x, w, b = _full(0, (4, 6, 8)), _full(1, (8,)), _full(2, (8,))
    out = _check(lambda a, g, h: F.layer_norm(a, (8,), g, h), [x, w, b], [px, Replicate(), Replicate()])
    assert out.placements == (want,)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pi,pw,want", [(Shard(0), Replicate(), Shard(0)), (Replicate(), Shard(1), Shard(2)),
                                        (Replicate(), Shard(0), Replicate())])
def test_embedding(pi, pw, want):
    mesh = _mesh()
    idx = hp.tensor(np.random.default_rng(3).integers(0, 10, (4, 5)))
    w = _full(1, (10, 6))
    dw = distribute_tensor(w.detach(), mesh, [pw]).requires_grad_()
    out = F.embedding(distribute_tensor(idx, mesh, [pi]), dw)
    ref = F.embedding(idx, w)
    assert out.placements == (want,)
    np.testing.assert_allclose(out.full_tensor().detach().numpy(), ref.detach().numpy())
    (ref * ref).sum().backward()
    full = out.full_tensor()
    (full * full).sum().backward()
    np.testing.assert_allclose(dw.grad.full_tensor().numpy(), w.grad.numpy(), rtol=1e-12)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("p", [Shard(0), Shard(1), Shard(2)])
def test_scaled_dot_product_attention(p):
    q, k, v = _full(0, (4, 4, 6, 8)), _full(1, (4, 4, 6, 8)), _full(2, (4, 4, 6, 8))
    want = p if p.dim < 2 else Replicate()  # batch and heads stay local; the sequence dim is gathered
    out = _check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), [q, k, v], [p] * 3)
    assert out.placements == (want,)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses(name, reduction):
    x, t = _full(0, (8, 6)), _full(1, (8, 6))
    t.requires_grad_(False)
    fn = getattr(F, name)
    out = _check(lambda a, b: fn(a, b, reduction=reduction), [x, t], [Shard(0), Shard(0)])
    # mse and l1 are composed of DTensor ops (a mean over a Shard(0) loss is Partial); smooth_l1 is gathered
    want = Replicate() if name == "smooth_l1_loss" else Shard(0) if reduction == "none" else Partial()
    assert out.placements == (want,)


@pytest.mark.timeout(60)
def test_nll_loss_and_activations():
    x = _full(0, (8, 5))
    tgt = hp.tensor(np.random.default_rng(1).integers(0, 5, (8,)))
    mesh = _mesh()
    cases = [(lambda a: F.nll_loss(F.log_softmax(a, -1), tgt if not isinstance(a, DTensor) else
                                   distribute_tensor(tgt, mesh, [Replicate()])), Replicate()),  # gathered
             (lambda a: F.relu(a), Shard(0)), (lambda a: F.dropout(a, 0.5, training=False), Shard(0)),
             (lambda a: F.normalize(a, dim=0), Shard(0))]  # the norm over the sharded dim is global
    for fn, want in cases:
        x.grad = None
        assert _check(fn, [x], [Shard(0)]).placements == (want,)


@pytest.mark.timeout(60)
def test_a_primitive_without_a_rule_raises_naming_the_op_and_placements():
    mesh = _mesh()
    x = distribute_tensor(hp.randn(2, 3, 8), mesh, [Shard(2)])
    with pytest.raises(NotImplementedError, match=r"MaxPool.*sharding strategy.*Shard\(dim=2\)"):
        F.max_pool1d(x, 2)
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        hp.randn(2, 3, 8).add(x)  # the plain tensor's method: never computed on the shard (PyTorch's error)
    w = distribute_tensor(hp.randn(4, 8), mesh, [Shard(0)])
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        F.linear(x, hp.randn(4, 8))
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        F.layer_norm(x, (8,), hp.randn(8))
    out = F.linear(x.redistribute(mesh, [Replicate()]), w)  # a replicated input: column-wise
    assert out.placements == (Shard(2),)
