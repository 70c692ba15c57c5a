"""FSDP2 controls behave as their PyTorch namesakes: checked against an unsharded reference or PyTorch's formulas."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.fsdp import (
    CPUOffloadPolicy,
    DataParallelMeshDims,
    MixedPrecisionPolicy,
    fully_shard,
)
from hpcfsdp.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultReduceScatter,
    PremulSum,
    get_gradient_divide_factors,
)
from hpcfsdp.distributed.process_group import ReduceOp, collective_counts, reset_collective_counts
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard

from _fsdp_util import full, global_mean, local, train_parity, world

pytestmark = pytest.mark.mpi(min_size=2)


class MLP(nn.Module):
    """Uneven row counts (5, 3): nested and flattened chunkings of them differ over a 2 x 2 mesh."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh()).pow(2).mean()


def _mlp():
    hp.manual_seed(11)
    return MLP()


def _mlp_batches(steps, rows_per_rank=3, seed=4):
    w, _ = world()
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((w * rows_per_rank, 6)).astype(np.float32), None) for _ in range(steps)]


def _mlp_loss(m, x, y):
    return m(hp.tensor(x))


# -- several flattened shard dims --------------------------------------------------------------------------

def _two_dim_mesh():
    w, _ = world()
    return dist.init_device_mesh("cpu", (w // 2, 2), mesh_dim_names=("a", "b"))


def test_several_shard_dims_placements_full_tensor_and_norm():
    mesh = _two_dim_mesh()
    ref, model = _mlp(), _mlp()
    fully_shard(model.fc1, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard=("a", "b")))
    fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard=("a", "b")))
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.placements == (Shard(0), Shard(0)), (name, p.placements)
        np.testing.assert_array_equal(full(p), refp[name].detach().numpy(), err_msg=name)
    sd = model.state_dict()
    assert all(v.placements == (Shard(0), Shard(0)) for v in sd.values())
    x = _mlp_batches(1)[0][0]
    model(hp.tensor(local(x))).backward()
    ref(hp.tensor(x)).backward()
    for name, p in model.named_parameters():
        assert p.grad.placements == (Shard(0), Shard(0))
        np.testing.assert_allclose(full(p.grad), refp[name].grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    grads = np.concatenate([p.grad.numpy().ravel() for p in ref.parameters()]).astype(np.float64)
    total = nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    np.testing.assert_allclose(total.item(), np.sqrt((grads ** 2).sum()), rtol=1e-5)


def test_several_shard_dims_train_like_the_reference():
    mesh = _two_dim_mesh()
    dims = DataParallelMeshDims(shard=("a", "b"))

    def shard(m):
        fully_shard(m.fc1, mesh=mesh, dp_mesh_dims=dims)
        fully_shard(m, mesh=mesh, dp_mesh_dims=dims)

    model, _ = train_parity(_mlp, shard, steps=6, batches=_mlp_batches(6), loss_fn=_mlp_loss)
    w = model.fc1.weight
    assert w.placements == (Shard(0), Shard(0)) and w.device_mesh is mesh


# -- gradient divide factors -------------------------------------------------------------------------------

def _pytorch_factors(n):
    """PyTorch FSDP2's fp16 pre-divide factor: the largest power of two p dividing n with p * p < n... (as
    its loop: double p while n % p == 0 and n / p > p), and the post-divide factor n / p."""
    p = 1
    while n % p == 0 and n / p > p:
        p *= 2
    return float(p), n / p


def test_gradient_divide_factors_follow_pytorch():
    f16, f32, bf16 = hp.float16, hp.float32, hp.bfloat16
    for n in (1, 2, 3, 4, 6, 8, 16, 24, 1000):
        assert get_gradient_divide_factors(n, None, f16) == (*_pytorch_factors(n), ReduceOp.SUM, ReduceOp.SUM)
        assert get_gradient_divide_factors(n, None, f16, force_sum_reduction_for_comms=True)[:2] == \
            _pytorch_factors(n)
    assert get_gradient_divide_factors(2, 2, f16) == (2.0, 2.0, ReduceOp.SUM, ReduceOp.SUM)
    assert get_gradient_divide_factors(4, None, f32) == (None, None, ReduceOp.AVG, ReduceOp.AVG)
    assert get_gradient_divide_factors(2, 2, bf16) == (None, None, ReduceOp.AVG, ReduceOp.AVG)
    assert get_gradient_divide_factors(1, None, f32) == (None, None, ReduceOp.SUM, ReduceOp.SUM)
    assert get_gradient_divide_factors(4, None, f32, force_sum_reduction_for_comms=True) == \
        (None, 4.0, ReduceOp.SUM, ReduceOp.SUM)
    assert get_gradient_divide_factors(4, None, f32, factor=2.0) == (None, None, PremulSum(0.5), ReduceOp.SUM)


class Scaled(nn.Module):
    """loss = sum(w * c): every rank's gradient of w is c."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(hp.ones(8))

    def forward(self, c):
        return (self.w * c).sum()


class SpyReduceScatter(DefaultReduceScatter):
    def __init__(self):
        self.calls = []

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self.calls.append((op, input_tensor._data.dtype, np.array(input_tensor._data, dtype=np.float64)))
        return super().__call__(output_tensor, input_tensor, group, op, async_op=async_op)


def _scaled_step(value, mp=None, force_sum=False, factor=None):
    model = Scaled()
    fully_shard(model, mp_policy=mp)
    spy = SpyReduceScatter()
    model.set_custom_reduce_scatter(spy)
    if force_sum:
        model.set_force_sum_reduction_for_comms(True)
    if factor is not None:
        model.set_gradient_divide_factor(factor)
    model(hp.tensor(np.float32(value))).backward()
    return full(model.w.grad), spy.calls


def test_float16_reduction_divides_before_and_after_the_sum():
    w, _ = world()
    value = 40000.0 if w == 2 else 30000.0  # the fp16 sum of the per-rank values overflows (max 65504)
    assert value * w > 65504
    pre, post = _pytorch_factors(w)
    grad, calls = _scaled_step(value, MixedPrecisionPolicy(reduce_dtype=hp.float16))
    np.testing.assert_array_equal(grad, np.full(8, value, np.float32))  # the mean of equal gradients
    (op, dtype, sent), = calls
    assert op == ReduceOp.SUM and dtype == np.float16
    np.testing.assert_array_equal(sent, value / pre)  # what is communicated: pre-divided
    # force-sum: same factors (fp16 always sums)
    grad, calls = _scaled_step(value, MixedPrecisionPolicy(reduce_dtype=hp.float16), force_sum=True)
    np.testing.assert_array_equal(grad, np.full(8, value, np.float32))
    assert calls[0][0] == ReduceOp.SUM and post == w / pre


def test_force_sum_reduction_changes_the_op_and_divides_locally():
    w, _ = world()
    grad, calls = _scaled_step(3.0)
    np.testing.assert_allclose(grad, 3.0)
    (op, dtype, sent), = calls
    assert op == ReduceOp.AVG and dtype == np.float32  # float32: the collective averages
    np.testing.assert_array_equal(sent[:8], 3.0)
    grad, calls = _scaled_step(3.0, force_sum=True)
    np.testing.assert_allclose(grad, 3.0)
    assert calls[0][0] == ReduceOp.SUM  # a plain sum; the division by the world size is local
    grad, calls = _scaled_step(3.0, factor=1.0)
    np.testing.assert_allclose(grad, 3.0 * w)
    assert calls[0][0] == PremulSum(1.0)
    grad, calls = _scaled_step(3.0, factor=2.0 * w, force_sum=True)
    np.testing.assert_allclose(grad, 1.5)
    assert calls[0][0] == ReduceOp.SUM


# -- set_unshard_in_backward(False) -------------------------------------------------------------------------

def test_unshard_in_backward_false_fails_clearly_when_backward_needs_the_weights():
    x = _mlp_batches(1)[0][0]
    model = _mlp()
    fully_shard(model.fc2)
    fully_shard(model)
    model.fc2.set_unshard_in_backward(False)
    loss = model(hp.tensor(local(x)))
    with pytest.raises(RuntimeError, match=r"fc2.*set_unshard_in_backward\(False\)"):
        loss.backward()


def test_unshard_in_backward_false_is_fine_when_backward_does_not_need_the_weights():
    """An embedding's backward needs only the indices: PyTorch's use case for the setting."""
    w, _ = world()

    class Emb(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(4 * w + 1, 6)
            self.head = nn.Linear(6, 2)

        def forward(self, idx):
            return self.head(self.emb(idx)).pow(2).mean()

    def make():
        hp.manual_seed(6)
        return Emb()

    def sharder(unshard_in_backward):
        def shard(m):
            fully_shard(m.emb)
            fully_shard(m)
            m.emb.set_unshard_in_backward(unshard_in_backward)
        return shard

    rng = np.random.default_rng(3)
    batches = [(rng.integers(0, 4 * w + 1, (w * 2, 5)), None) for _ in range(4)]
    gathers = {}
    for setting in (True, False):
        reset_collective_counts()
        train_parity(make, sharder(setting), steps=4, batches=batches, loss_fn=_mlp_loss)
        gathers[setting] = collective_counts().get("all_gather", 0)
    assert gathers[True] - gathers[False] == len(batches)  # the embedding is not gathered again in backward


# -- set_is_last_backward before the first forward ----------------------------------------------------------

def test_set_is_last_backward_on_a_child_before_the_first_forward():
    def shard(m):
        fully_shard(m.fc1)
        fully_shard(m)
        m.fc1.set_is_last_backward(True)  # before lazy init: the root's context replaces the child's

    model, _ = train_parity(_mlp, shard, steps=3, batches=_mlp_batches(3), loss_fn=_mlp_loss)
    assert all(p.grad is None for p in model.parameters())  # each step ended: gradients reduced and zeroed


# -- containers ----------------------------------------------------------------------------------------------

def test_containers_without_forward_are_refused():
    for container in (nn.ModuleList([nn.Linear(2, 2)]), nn.ModuleDict({"a": nn.Linear(2, 2)})):
        with pytest.raises(ValueError, match="fully_shard does not support containers that do not implement "
                                             "forward"):
            fully_shard(container)
    fully_shard(nn.Sequential(nn.Linear(2, 2)))  # a container with a forward is fine


def test_a_list_of_modules_is_one_unit():
    def shard(m):
        out = fully_shard([m.fc1, m.fc2])
        assert out == [m.fc1, m.fc2]
        assert m.fc1._get_fsdp_state() is m.fc2._get_fsdp_state()
        fully_shard(m)

    model, _ = train_parity(_mlp, shard, steps=3, batches=_mlp_batches(3), loss_fn=_mlp_loss)
    x = _mlp_batches(1)[0][0]
    reset_collective_counts()
    model(hp.tensor(local(x)))
    assert collective_counts().get("all_gather", 0) == 1  # fc1 and fc2 gathered together; the root has none


# -- offload policy subclasses --------------------------------------------------------------------------------

def test_cpu_offload_policy_subclass_offloads():
    class MyOffload(CPUOffloadPolicy):
        pass

    model = _mlp()
    fully_shard(model, offload_policy=MyOffload(pin_memory=False))
    assert model._get_fsdp_state()._param_group.offload


# -- clip_grad_norm_ on DTensor gradients ----------------------------------------------------------------------

def test_clip_grad_norm_returns_a_replicated_dtensor():
    w, _ = world()
    x = _mlp_batches(1)[0][0]
    ref, model = _mlp(), _mlp()
    fully_shard(model.fc1)
    fully_shard(model)
    model(hp.tensor(local(x))).backward()
    ref(hp.tensor(x)).backward()
    want = math.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in ref.parameters()))
    total = nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    assert isinstance(total, DTensor) and total.placements == (Replicate(),) and total.shape == ()
    np.testing.assert_allclose(total.full_tensor().item(), want, rtol=1e-5)
    np.testing.assert_allclose(total.item(), want, rtol=1e-5)
    np.testing.assert_allclose(float(total), want, rtol=1e-5)
    np.testing.assert_allclose(global_mean(total.item()), want, rtol=1e-5)  # the same on every rank
    plain = nn.utils.clip_grad_norm_(ref.parameters(), 1e9)
    assert not isinstance(plain, DTensor)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("reduce_dtype", ["float32", "float16"])
def test_hsdp_divide_factors_with_and_without_all_reduce(reduce_dtype):
    """2 replicas x 2 shards: every rank's gradient c reduces to c (the mean) in float16 too, and a
    micro-batch without the all-reduce (set_requires_all_reduce(False)) accumulates correctly."""
    mesh = dist.init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    dt = getattr(hp, reduce_dtype)
    model = Scaled()
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(reduce_dtype=dt))
    value = 30000.0  # 4 x 30000 overflows float16; pre-divided by 2, the sums stay below 65504
    model(hp.tensor(np.float32(value))).backward()
    np.testing.assert_array_equal(full(model.w.grad), np.full(8, value, np.float32))
    model.w.grad = None
    model.set_requires_all_reduce(False)
    model(hp.tensor(np.float32(value / 2))).backward()
    assert model.w.grad is None  # nothing written until the all-reduce
    model.set_requires_all_reduce(True)
    model(hp.tensor(np.float32(value / 2))).backward()
    np.testing.assert_array_equal(full(model.w.grad), np.full(8, value, np.float32))


# -- autocast around a sharded model ---------------------------------------------------------------------------

def test_autocast_region_around_fully_shard_trains_like_the_unsharded_model():
    """torch.autocast("cpu") around an FSDP2 model: the gathered float32 parameters are cast per op, the
    float32 gradients reach the shards; losses and parameters follow the unsharded model under the same region
    (to bfloat16's rounding: one rank's rows are rounded apart from the others')."""
    batches = _mlp_batches(4)
    ref, model = _mlp(), _mlp()
    fully_shard(model.fc1)
    fully_shard(model)
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)

    def loss_of(m, x):
        with hp.autocast("cpu", dtype=hp.bfloat16):
            out = m(hp.tensor(x))  # fc2(tanh(fc1(x))) in bfloat16, then pow(2).mean() in bfloat16
        assert out.dtype == hp.bfloat16
        return out.float()

    for x, _ in batches:
        loss = loss_of(model, local(x))
        loss.backward()
        opt.step()
        opt.zero_grad()
        rl = loss_of(ref, x)
        rl.backward()
        ropt.step()
        ropt.zero_grad()
        np.testing.assert_allclose(global_mean(loss.item()), rl.item(), rtol=2e-2)
    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert p.dtype == hp.float32 and p.grad is None
        np.testing.assert_allclose(full(p), ref_params[name].detach().numpy(), atol=2e-3, err_msg=name)
    assert not hp.is_autocast_enabled("cpu")


def test_a_sharded_parameter_beside_a_plain_tensor_is_refused_not_computed_on_the_shard():
    """Outside its FSDP forward a parameter holds only this rank's rows: as PyTorch (mixed Tensor and DTensor),
    an op mixing it with a plain tensor raises instead of computing on the shard; so do its views."""
    model = _mlp()
    fully_shard(model.fc1)
    fully_shard(model)
    x = hp.ones(3, 5)
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        model.fc2(x)  # a submodule of the root, called outside the root's forward
    for held in (model.fc2.weight, model.fc2.weight.data, model.fc2.weight.detach(), model.state_dict()["fc2.weight"]):
        assert isinstance(held, DTensor)  # .data of a DTensor is a DTensor, as PyTorch's
        with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
            x @ held.t()  # a view of the shard
    doubled = model.fc2.weight * 2  # an op on the DTensor alone: a DTensor of its layout (PyTorch's dispatch)
    assert isinstance(doubled, DTensor) and doubled.shape == model.fc2.weight.shape
    assert doubled.placements == model.fc2.weight.placements
    out = model(hp.ones(4, 6))  # through the root: gathered, no error
    assert out.shape == () and np.isfinite(out.item())
    model.unshard()  # gathered by hand: the whole weight, usable with plain tensors until reshard()
    full_w = full(model.fc2.weight) if isinstance(model.fc2.weight, DTensor) else model.fc2.weight.detach().numpy()
    y = model.fc2(x)
    model.reshard()
    assert y.shape == (3, 3)
    np.testing.assert_allclose(y.detach().numpy(), np.ones((3, 5)) @ full_w.T + full(model.fc2.bias), rtol=1e-5)
