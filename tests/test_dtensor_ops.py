"""Ops on DTensors propagate placements (PyTorch's DTensor dispatch): each result against the same op on the full
tensor, its placements as PyTorch's, autograd through the layout changes, and ops without a rule refused."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor


def _mesh():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(seed=0, shape=(8, 6)):
    return hp.tensor(np.random.default_rng(seed).standard_normal(shape))


ELEMENTWISE = {
    "a*2": lambda a, b: a * 2, "a+1": lambda a, b: a + 1, "a/4": lambda a, b: a / 4, "-a": lambda a, b: -a,
    "2*a": lambda a, b: 2 * a, "relu": lambda a, b: a.relu(), "exp": lambda a, b: a.exp(), "abs": lambda a, b: a.abs(),
    "a**2": lambda a, b: a ** 2, "a+b": lambda a, b: a + b, "a*b": lambda a, b: a * b, "a-b": lambda a, b: a - b,
    "a>b": lambda a, b: a > b, "double": lambda a, b: a.double(), "to": lambda a, b: a.to(hp.float32),
    "clone": lambda a, b: a.clone(), "detach.clone": lambda a, b: a.detach().clone(),
    "zeros_like+": lambda a, b: hp.zeros_like(a) + a, "ones_like": lambda a, b: hp.ones_like(a),
    "where": lambda a, b: hp.where(a > 0, a, b), "Tensor.where": lambda a, b: a.where(a > 0, b),
    "pow(2, a)": lambda a, b: hp.pow(2, a), "t": lambda a, b: a.t(), "clamp": lambda a, b: a.clamp(-0.5, 0.5),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(ELEMENTWISE))
@pytest.mark.parametrize("pa,pb", [(Shard(0), Shard(0)), (Shard(0), Replicate()), (Shard(1), Replicate()),
                                   (Replicate(), Shard(1))])
def test_elementwise_matches_the_full_tensor(case, pa, pb):
    mesh = _mesh()
    fa, fb = _full(0), _full(1)
    a, b = distribute_tensor(fa, mesh, [pa]), distribute_tensor(fb, mesh, [pb])
    out = ELEMENTWISE[case](a, b)
    ref = ELEMENTWISE[case](fa, fb)
    assert isinstance(out, DTensor) and tuple(out.shape) == tuple(ref.shape), case
    assert out.dtype == ref.dtype
    np.testing.assert_allclose(out.full_tensor().numpy(), ref.numpy(), rtol=1e-12, err_msg=case)
    if pa == pb or isinstance(pb, Replicate):
        want = pa if case != "t" or not isinstance(pa, Shard) else Shard(1 - pa.dim)
        assert out.placements == (want,), (case, out.placements)


@pytest.mark.mpi(min_size=2)
def test_partial_stays_partial_only_where_the_op_is_linear():
    mesh = _mesh()
    n = mesh.size()
    v = _full(2, (4,))
    p = DTensor.from_local(v, mesh, [Partial()])  # the global value is n * v
    assert (p * 3).placements == (Partial(),) and (-p).placements == (Partial(),)
    np.testing.assert_allclose((p * 3).full_tensor().numpy(), 3 * n * v.numpy())
    np.testing.assert_allclose((p + p).full_tensor().numpy(), 2 * n * v.numpy())
    plus1 = p + 1  # not linear: reduced first, then 1 added once
    assert plus1.placements == (Replicate(),)
    np.testing.assert_allclose(plus1.full_tensor().numpy(), n * v.numpy() + 1)
    sq = p * p
    np.testing.assert_allclose(sq.full_tensor().numpy(), (n * v.numpy()) ** 2)


@pytest.mark.mpi(min_size=2)
def test_in_place_ops_keep_the_layout():
    mesh = _mesh()
    fa, fb = _full(0), _full(1)
    a = distribute_tensor(fa, mesh, [Shard(0)])
    with hp.no_grad():
        assert a.mul_(2) is a and a.add_(distribute_tensor(fb, mesh, [Replicate()])) is a
        a.zero_().add_(1.5)
    assert a.placements == (Shard(0),)
    np.testing.assert_allclose(a.full_tensor().numpy(), np.full((8, 6), 1.5))
    r = distribute_tensor(fa, mesh, [Replicate()])
    with hp.no_grad():
        r.add_(distribute_tensor(fb, mesh, [Shard(0)]))  # the sharded operand is gathered
    np.testing.assert_allclose(r.full_tensor().numpy(), fa.numpy() + fb.numpy())


@pytest.mark.mpi(min_size=2)
def test_plain_tensor_beside_a_sharded_dtensor_is_refused():
    mesh = _mesh()
    a = distribute_tensor(_full(0), mesh, [Shard(0)])
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        a + _full(1)
    assert isinstance(a + hp.tensor(2.0), DTensor)  # a one-element tensor is a replicated scalar
    r = distribute_tensor(_full(0), mesh, [Replicate()])
    np.testing.assert_allclose((r + _full(1)).full_tensor().numpy(), _full(0).numpy() + _full(1).numpy())


@pytest.mark.mpi(min_size=2)
def test_an_op_without_a_rule_raises_naming_it():
    mesh = _mesh()
    a = distribute_tensor(_full(0), mesh, [Shard(0)])
    with pytest.raises(NotImplementedError, match=r"Operator cdist does not have a sharding strategy.*Shard"):
        hp.cdist(a, a)
    r = distribute_tensor(_full(0), mesh, [Replicate()])  # replicated operands: computed, still a DTensor
    out = hp.cdist(r, r)
    assert isinstance(out, DTensor) and out.placements == (Replicate(),)
    np.testing.assert_allclose(out.to_local().numpy(), hp.cdist(_full(0), _full(0)).numpy())


@pytest.mark.mpi(min_size=2)
def test_autograd_through_ops_and_layout_changes():
    mesh = _mesh()
    full = _full(0)
    w = distribute_tensor(full, mesh, [Shard(0)])
    w.requires_grad_(True)
    ((w * w).full_tensor().sum() * 0.5).backward()
    assert isinstance(w.grad, DTensor) and w.grad.placements == (Shard(0),)
    np.testing.assert_allclose(w.grad.full_tensor().numpy(), full.numpy())
    x = hp.tensor(np.ones((2, 3)), requires_grad=True)
    d = DTensor.from_local(x, mesh, [Shard(0)])
    (d.redistribute(mesh, [Replicate()]).to_local() * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 * np.ones((2, 3)))  # the gathered copy's gradient, sliced back
    y = hp.tensor(np.ones((2, 3)), requires_grad=True)
    r = DTensor.from_local(y, mesh, [Replicate()])
    r.to_local(grad_placements=[Partial()]).sum().backward()  # each rank's gradient is a partial sum
    np.testing.assert_allclose(y.grad.numpy(), mesh.size() * np.ones((2, 3)))


@pytest.mark.mpi(min_size=2)
def test_a_function_with_a_plain_first_operand_and_a_sharded_one_is_refused():
    mesh = _mesh()
    a = distribute_tensor(_full(0), mesh, [Shard(0)])
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        hp.add(_full(1), a)  # hp.add(plain, dtensor): the plain tensor's method would compute on the shard
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        _full(1) * a  # the operator: Python asks the DTensor's reflected method first
    out = hp.mul(hp.tensor(2.0), a)  # a one-element plain tensor is a replicated scalar
    assert isinstance(out, DTensor)
    np.testing.assert_allclose(out.full_tensor().numpy(), 2 * _full(0).numpy())


@pytest.mark.mpi(min_size=2)
def test_a_plain_scalar_tensors_method_with_a_sharded_operand_computes_as_pytorch():
    mesh = _mesh()
    full = _full(0)
    a = distribute_tensor(full, mesh, [Shard(0)])
    two, f = hp.tensor(2.0), full.numpy()
    cases = {"add": (two.add(a), 2 + f), "add alpha": (two.add(a, alpha=3), 2 + 3 * f), "sub": (two.sub(a), 2 - f),
             "mul": (two.mul(a), 2 * f), "div": (two.div(a), 2 / f), "pow": (two.pow(a), 2.0 ** f),
             "maximum": (two.maximum(a), np.maximum(2, f)), "minimum": (two.minimum(a), np.minimum(2, f))}
    for name, (out, want) in cases.items():
        assert isinstance(out, DTensor) and out.placements == (Shard(0),), name
        np.testing.assert_allclose(out.full_tensor().numpy(), want, rtol=1e-12, err_msg=name)
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        _full(1).add(a)  # a whole plain tensor beside a shard: PyTorch's error, never the shard's sum


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("pa", [Shard(0), Shard(1)])
def test_a_replicated_operand_broadcast_against_a_sharded_one_gets_the_whole_gradient(pa):
    """b (Replicate, (6,)) meets only this rank's rows of a (Shard(0)): its local gradient is a partial sum, which
    the backward all-reduces, so b.grad equals the full computation's."""
    mesh = _mesh()
    fa, fb = _full(0), _full(1, (6,))
    a = distribute_tensor(fa, mesh, [pa])
    b = distribute_tensor(fb, mesh, [Replicate()])
    b.requires_grad_(True)
    a.requires_grad_(True)
    (a * b + b).full_tensor().sum().backward()
    assert isinstance(b.grad, DTensor) and b.grad.placements == (Replicate(),)
    np.testing.assert_allclose(b.grad.to_local().numpy(), fa.numpy().sum(0) + 8, rtol=1e-12)
    np.testing.assert_allclose(a.grad.full_tensor().numpy(), np.broadcast_to(fb.numpy(), (8, 6)), rtol=1e-12)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["gelu", "leaky_relu", "elu", "softplus", "mish", "hardtanh", "silu", "logsigmoid"])
def test_functional_activations_on_a_dtensor_keep_its_layout(name):
    import hpcfsdp.nn.functional as F

    mesh = _mesh()
    full = _full(0)
    a = distribute_tensor(full, mesh, [Shard(1)])
    a.requires_grad_(True)
    out = getattr(F, name)(a)
    assert isinstance(out, DTensor) and out.placements == (Shard(1),) and out.shape == a.shape, name
    ref = getattr(F, name)(full.clone().requires_grad_(True))
    np.testing.assert_allclose(out.full_tensor().detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    out.full_tensor().sum().backward()
    x = full.clone().requires_grad_(True)
    getattr(F, name)(x).sum().backward()
    np.testing.assert_allclose(a.grad.full_tensor().numpy(), x.grad.numpy(), rtol=1e-12)


@pytest.mark.mpi(min_size=2)
def test_ops_that_read_only_the_others_shape_and_the_new_factories():
    """view_as / reshape_as / expand_as / type_as take a plain ``other`` (only its shape or dtype is read);
    new_zeros / new_ones / new_empty / new_full give Replicate DTensors of the size asked, new_tensor a plain
    tensor: PyTorch 2.13's results on gloo, checked side by side."""
    mesh = _mesh()
    full = _full(0, (8, 6))  # 2 rows a rank at 4 ranks: (4, 12) keeps whole rows on each rank
    d = distribute_tensor(full, mesh, [Shard(0)])
    v = d.view_as(hp.zeros(48))
    assert v.placements == (Shard(0),) and tuple(v.shape) == (48,)
    np.testing.assert_array_equal(v.full_tensor().numpy(), full.numpy().reshape(48))
    r = d.reshape_as(hp.zeros(4, 12))
    assert r.placements == (Shard(0),)
    np.testing.assert_array_equal(r.full_tensor().numpy(), full.numpy().reshape(4, 12))
    e = d[:1].expand_as(hp.zeros(8, 6))
    np.testing.assert_array_equal(e.full_tensor().numpy(), np.broadcast_to(full.numpy()[:1], (8, 6)))
    t = d.type_as(hp.zeros(2, dtype=hp.float32))
    assert t.dtype == hp.float32 and t.placements == (Shard(0),)
    for name, args, value in (("new_zeros", (3,), 0.0), ("new_ones", ((2, 2),), 1.0), ("new_full", ((2,), 3.0), 3.0)):
        out = getattr(d, name)(*args)
        assert isinstance(out, DTensor) and out.placements == (Replicate(),), name
        np.testing.assert_array_equal(out.full_tensor().numpy(), np.full(tuple(out.shape), value))
    assert d.new_empty(3).placements == (Replicate(),) and tuple(d.new_empty(3).shape) == (3,)
    nt = d.new_tensor([1.0, 2.0])
    assert type(nt) is hp.Tensor and nt.dtype == d.dtype
