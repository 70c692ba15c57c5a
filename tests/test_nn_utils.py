"""nn.utils: clip_grad_norm_ / clip_grad_value_ against NumPy, the sharded-norm hook, vector conversion."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.nn.utils import (
    clip_grad_norm_, clip_grad_value_, get_total_norm, parameters_to_vector, vector_to_parameters,
)

RNG = np.random.default_rng(5)


def _params_with_grads(shapes, scale=1.0, dtype=np.float32):
    ps, gs = [], []
    for s in shapes:
        p = nn.Parameter(hp.tensor(RNG.standard_normal(s).astype(dtype)))
        g = (RNG.standard_normal(s) * scale).astype(dtype)
        p.grad = hp.tensor(g)
        ps.append(p)
        gs.append(g.astype(np.float64))
    return ps, gs


@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf, 3.0])
def test_clip_grad_norm_matches_numpy(norm_type):
    ps, gs = _params_with_grads([(3, 4), (5,), (2, 2, 2)])
    flat = np.concatenate([g.ravel() for g in gs])
    ref = np.abs(flat).max() if norm_type == math.inf else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)
    max_norm = ref / 3
    total = clip_grad_norm_(ps, max_norm, norm_type=norm_type)
    assert total.dtype == hp.float32 and total.ndim == 0
    np.testing.assert_allclose(total.item(), ref, rtol=1e-6)
    coef = max_norm / (ref + 1e-6)
    for p, g in zip(ps, gs):
        np.testing.assert_allclose(p.grad.numpy(), g * coef, rtol=1e-5)


def test_clip_grad_norm_does_not_scale_up_and_skips_missing_grads():
    ps, gs = _params_with_grads([(4,), (3,)], scale=1e-3)
    extra = nn.Parameter(hp.zeros(2))  # no grad
    total = clip_grad_norm_(ps + [extra], max_norm=10.0)
    np.testing.assert_allclose(total.item(), np.sqrt(sum((g**2).sum() for g in gs)), rtol=1e-6)
    for p, g in zip(ps, gs):
        np.testing.assert_array_equal(p.grad.numpy(), g.astype(np.float32))
    assert clip_grad_norm_([extra], 1.0).item() == 0.0
    single, g1 = _params_with_grads([(6,)])
    np.testing.assert_allclose(clip_grad_norm_(single[0], 1e9).item(), np.linalg.norm(g1[0]), rtol=1e-6)


def test_clip_grad_norm_nonfinite():
    ps, _ = _params_with_grads([(3,)])
    ps[0].grad._data[1] = np.inf
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
    assert math.isinf(clip_grad_norm_(ps, 1.0).item())


class _FakeShard(hp.Tensor):
    """Stands in for DTensor: the local array is one of two shards; the hook adds the other's partial."""

    other_partials = {}
    calls = []

    @classmethod
    def __hp_reduce_norm__(cls, grads, local_value, norm_type):
        cls.calls.append((len(grads), norm_type))
        other = cls.other_partials[norm_type]
        return max(local_value, other) if norm_type == math.inf else local_value + other


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_sharded_grads_use_the_reduce_hook_once(norm_type):
    full = [RNG.standard_normal(6).astype(np.float32), RNG.standard_normal(4).astype(np.float32)]
    plain = RNG.standard_normal(3).astype(np.float32)
    mine = [f[: len(f) // 2] for f in full]
    theirs = [f[len(f) // 2:] for f in full]
    if norm_type == math.inf:
        _FakeShard.other_partials = {norm_type: float(max(np.abs(t).max() for t in theirs))}
    else:
        _FakeShard.other_partials = {norm_type: float(sum((t.astype(np.float64) ** 2).sum() for t in theirs))}
    _FakeShard.calls = []
    params = []
    for m in mine:
        p = nn.Parameter(hp.zeros(len(m)))
        p.grad = _FakeShard._make_subclass(_FakeShard, hp.tensor(m))
        params.append(p)
    q = nn.Parameter(hp.zeros(3))
    q.grad = hp.tensor(plain)
    allv = np.concatenate(full + [plain]).astype(np.float64)
    ref = np.abs(allv).max() if norm_type == math.inf else np.linalg.norm(allv)
    total = clip_grad_norm_(params + [q], max_norm=ref / 2, norm_type=norm_type)
    np.testing.assert_allclose(total.item(), ref, rtol=1e-6)
    assert _FakeShard.calls == [(2, norm_type)]
    np.testing.assert_allclose(q.grad.numpy(), plain * (ref / 2) / (ref + 1e-6), rtol=1e-5)


def test_get_total_norm_and_clip_grad_value():
    ps, gs = _params_with_grads([(10,), (2, 3)])
    np.testing.assert_allclose(get_total_norm([p.grad for p in ps]).item(),
                               np.sqrt(sum((g**2).sum() for g in gs)), rtol=1e-6)
    clip_grad_value_(ps, 0.5)
    for p, g in zip(ps, gs):
        np.testing.assert_allclose(p.grad.numpy(), np.clip(g, -0.5, 0.5).astype(np.float32))


def test_parameters_vector_round_trip():
    lin = nn.Linear(3, 2)
    vec = parameters_to_vector(lin.parameters())
    ref = np.concatenate([lin.weight.detach().numpy().ravel(), lin.bias.detach().numpy()])
    np.testing.assert_array_equal(vec.detach().numpy(), ref)
    new = hp.tensor(np.arange(8, dtype=np.float32))
    vector_to_parameters(new, lin.parameters())
    np.testing.assert_array_equal(lin.weight.detach().numpy(), np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(lin.bias.detach().numpy(), [6, 7])
