"""DTensor Partial placements (from_local, full_tensor, redistribute, distribute_tensor) and distribute_module,
against NumPy references at 2 and 4 ranks."""
import pickle
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.distributed.tensor import (DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor,
                                        init_device_mesh)

OPS = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min, "product": np.prod}


def test_partial_placement_value_semantics():
    p = Partial()
    assert p.reduce_op == "sum" and p == Partial("sum") == Partial(reduce_op="sum")
    assert p != Partial("avg") and p != Replicate() and Replicate() != p and p != Shard(0)
    assert hash(p) == hash(Partial("sum")) == 1 + hash("sum") and len({p, Partial(), Partial("max")}) == 2
    assert repr(p) == "Partial(sum)" and str(Partial("max")) == "P(max)"  # PyTorch 2.13's repr and str
    assert p.is_partial() and p.is_partial("sum") and not p.is_partial("avg")
    assert not p.is_replicate() and not p.is_shard() and not Replicate().is_partial() and not Shard(0).is_partial()
    assert pickle.loads(pickle.dumps(Partial("min"))) == Partial("min")
    with pytest.raises(AttributeError, match="immutable"):
        p.reduce_op = "max"
    with pytest.raises(ValueError, match="reduce_op='mean'"):
        Partial("mean")


def _mesh(shape=None):
    import hpcfsdp.distributed as dist

    w = dist.get_world_size()
    return init_device_mesh("cpu", shape or (w,)), w, dist.get_rank()


def _local_value(rank, shape=(5, 3), seed=0):
    """Rank ``rank``'s partial value: positive (so product and min/max are well defined) and rank-dependent."""
    return np.random.default_rng(seed + rank).uniform(0.5, 1.5, shape)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", sorted(OPS))
def test_from_local_partial_full_tensor_and_redistribute_reduce(op):
    mesh, w, r = _mesh()
    local = _local_value(r)
    want = OPS[op](np.stack([_local_value(k) for k in range(w)]), axis=0)
    d = DTensor.from_local(hp.tensor(local.copy()), mesh, [Partial(op)])
    assert d.placements == (Partial(op),) and tuple(d.shape) == (5, 3)  # Partial does not scale the shape
    np.testing.assert_allclose(d.full_tensor().numpy(), want, rtol=1e-13)
    rep = d.redistribute(mesh, [Replicate()])
    assert rep.placements == (Replicate(),)
    np.testing.assert_allclose(rep.to_local().numpy(), want, rtol=1e-13)
    shard = d.redistribute(mesh, [Shard(0)])
    c = -(-5 // w)
    np.testing.assert_allclose(shard.to_local().numpy(), want[min(r * c, 5):min((r + 1) * c, 5)], rtol=1e-13)
    np.testing.assert_array_equal(d.to_local().numpy(), local)  # the partial values stay
    assert d.redistribute(mesh, [Partial(op)]) is d


@pytest.mark.mpi(min_size=2)
def test_redistributing_to_partial_is_refused_as_pytorch_does():
    mesh, _, r = _mesh()
    rep = DTensor.from_local(hp.ones(4), mesh, [Replicate()])
    with pytest.raises(RuntimeError, match=r"Can not redistribute from R to P\(sum\)"):
        rep.redistribute(mesh, [Partial()])
    with pytest.raises(RuntimeError, match=r"from P\(sum\) to P\(max\)"):
        DTensor.from_local(hp.ones(4), mesh, [Partial()]).redistribute(mesh, [Partial("max")])


@pytest.mark.mpi(min_size=4)
def test_partial_on_one_dim_of_a_2d_mesh():
    mesh, w, r = _mesh((2, 2))
    i, j = mesh.get_coordinate()
    # [Shard(0), Partial("sum")]: dp row i holds rows i of the global (4, 3); the tp ranks hold partial sums
    parts = {(a, b): _local_value(2 * a + b, (2, 3)) for a in range(2) for b in range(2)}
    want = np.concatenate([parts[(a, 0)] + parts[(a, 1)] for a in range(2)])
    d = DTensor.from_local(hp.tensor(parts[(i, j)].copy()), mesh, [Shard(0), Partial()])
    assert tuple(d.shape) == (4, 3)
    np.testing.assert_allclose(d.full_tensor().numpy(), want, rtol=1e-13)
    s = d.redistribute(mesh, [Shard(0), Replicate()])
    np.testing.assert_allclose(s.to_local().numpy(), want[2 * i:2 * i + 2], rtol=1e-13)
    # keep the Partial dim, gather the Shard one: every rank holds its tp partial of the whole tensor
    kept = d.redistribute(mesh, [Replicate(), Partial()])
    assert kept.placements == (Replicate(), Partial())
    np.testing.assert_allclose(kept.to_local().numpy(), np.concatenate([parts[(a, j)] for a in range(2)]),
                               rtol=1e-13)
    np.testing.assert_allclose(kept.full_tensor().numpy(), want, rtol=1e-13)
    # Partial over both mesh dims: the reduction of all four ranks
    both = DTensor.from_local(hp.tensor(parts[(i, j)].copy()), mesh, [Partial("max"), Partial("max")])
    np.testing.assert_array_equal(both.full_tensor().numpy(), np.max(np.stack(list(parts.values())), axis=0))
    mixed = DTensor.from_local(hp.tensor(parts[(i, j)].copy()), mesh, [Partial("sum"), Partial("avg")])
    np.testing.assert_allclose(mixed.full_tensor().numpy(), (parts[(0, 0)] + parts[(0, 1)] + parts[(1, 0)]
                                                            + parts[(1, 1)]) / 2, rtol=1e-13)
    with pytest.raises(ValueError, match="mixed Partial reduce ops"):
        DTensor.from_local(hp.ones(2), mesh, [Partial("sum"), Partial("max")])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_distribute_tensor_with_partial_splits_the_value(op):
    mesh, w, r = _mesh()
    full = np.random.default_rng(3).standard_normal((4, 6))
    mine = full if r == 0 else full * 0 + r  # src_data_rank=0: rank 0's value is the one distributed
    d = distribute_tensor(hp.tensor(mine), mesh, [Partial(op)])
    assert d.placements == (Partial(op),)
    np.testing.assert_array_equal(d.to_local().numpy(), full / w if op == "sum" else full)
    np.testing.assert_allclose(d.full_tensor().numpy(), full, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(d.redistribute(mesh, [Shard(1)]).full_tensor().numpy(), full, rtol=1e-13,
                               atol=1e-15)


@pytest.mark.mpi(min_size=2)
def test_distribute_tensor_refuses_what_cannot_be_split():
    mesh, _, _ = _mesh()
    with pytest.raises(ValueError, match=r"Replicate to Partial\(product\) conversion is not supported"):
        distribute_tensor(hp.ones(3), mesh, [Partial("product")])
    with pytest.raises(ValueError, match="int64"):
        distribute_tensor(hp.arange(4), mesh, [Partial("sum")])
    assert distribute_tensor(hp.arange(4), mesh, [Partial("max")]).to_local().numpy().tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="Partial"):
        distribute_tensor(hp.ones(3), mesh, ["sum"])


# -- distribute_module ------------------------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.norm = nn.BatchNorm1d(6)
        self.fc2 = nn.Linear(6, 2, bias=False)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)).relu())


def _net(seed):
    hp.manual_seed(seed)
    return Net()


@pytest.mark.mpi(min_size=2)
def test_distribute_module_replicates_every_parameter_and_buffer_from_rank_0():
    mesh, w, r = _mesh()
    ref = _net(0)
    net = _net(r)  # different values on each rank: rank 0's are broadcast
    net.fc2.weight.requires_grad_(False)
    assert distribute_module(net, mesh) is net
    for (name, p), (_, q) in zip(net.named_parameters(), ref.named_parameters()):
        assert isinstance(p, nn.Parameter) and isinstance(p, DTensor), name
        assert p.placements == (Replicate(),) and p.requires_grad == (name != "fc2.weight"), name
        np.testing.assert_array_equal(p.to_local().detach().numpy(), q.detach().numpy(), err_msg=name)
    for name, b in net.named_buffers():
        assert isinstance(b, DTensor) and b.placements == (Replicate(),), name
    x = np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)
    ref.fc2.weight.requires_grad_(False)
    np.testing.assert_allclose(net(hp.tensor(x)).detach().numpy(), ref(hp.tensor(x)).detach().numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="only be called once"):
        distribute_module(net, mesh)
    with pytest.raises(ValueError, match="device_mesh is required"):
        distribute_module(_net(0))


@pytest.mark.mpi(min_size=2)
def test_distribute_module_partition_fn_and_io_hooks():
    mesh, w, r = _mesh()
    ref, net = _net(0), _net(0)
    seen = []

    def partition_fn(name, module, device_mesh):
        seen.append(name)
        assert device_mesh is mesh
        if isinstance(module, nn.Linear):
            module.register_parameter("weight", nn.Parameter(distribute_tensor(module.weight.detach(), device_mesh,
                                                                               [Shard(0)])))

    def input_fn(module, inputs, device_mesh):
        assert module is net and device_mesh is mesh
        return (inputs[0] * 2,)

    def output_fn(module, outputs, device_mesh):
        return outputs + 1

    distribute_module(net, mesh, partition_fn, input_fn, output_fn)
    assert seen == [n for n, _ in ref.named_modules()]
    assert net.fc1.weight.placements == (Shard(0),) and net.fc2.weight.placements == (Shard(0),)
    assert net.fc1.bias.placements == (Replicate(),) and net.norm.weight.placements == (Replicate(),)
    for name, p in net.named_parameters():
        np.testing.assert_array_equal(p.full_tensor().detach().numpy(), ref.get_parameter(name).detach().numpy())
    c = -(-6 // w)
    np.testing.assert_array_equal(net.fc1.weight.to_local().detach().numpy(),
                                  ref.fc1.weight.detach().numpy()[min(r * c, 6):min((r + 1) * c, 6)])
    # the hooks run around forward (a module whose parameters are all Replicate computes the full result)
    small = nn.Linear(3, 2)
    hp.manual_seed(1)
    small_ref = nn.Linear(3, 2)
    with hp.no_grad():
        small.weight.copy_(small_ref.weight)
        small.bias.copy_(small_ref.bias)
    distribute_module(small, mesh, input_fn=lambda m, inp, dm: (inp[0] * 2,),
                      output_fn=lambda m, out, dm: out + 1)
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(small(hp.tensor(x)).detach().numpy(),
                               small_ref(hp.tensor(x * 2)).detach().numpy() + 1, rtol=1e-6)


@pytest.mark.mpi(min_size=2)
def test_distribute_module_hook_arity():
    mesh, _, _ = _mesh()
    with pytest.warns(FutureWarning, match="Deprecating input_fn that takes two arguments"):
        m = distribute_module(nn.Linear(2, 2), mesh, input_fn=lambda inputs, dm: (inputs[0] + 1,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        m2 = distribute_module(nn.Linear(2, 2), mesh, output_fn=lambda out, dm: out * 0)
    assert m(hp.ones(1, 2)).shape == (1, 2) and m2(hp.ones(1, 2)).detach().numpy().tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="input_fn should take in 3 arguments, but got 1"):
        distribute_module(nn.Linear(2, 2), mesh, input_fn=lambda inputs: inputs)
    with pytest.raises(ValueError, match="output_fn should take in 3 arguments, but got 4"):
        distribute_module(nn.Linear(2, 2), mesh, output_fn=lambda a, b, c, d: a)


@pytest.mark.mpi(min_size=2)
def test_an_integral_cast_of_a_partial_reduces_it_first_a_floating_one_keeps_it():
    mesh, n, _ = _mesh()
    v = hp.tensor(np.full((4, 3), 0.75))  # each rank's part: the sum is 0.75 n, truncated per part it would be 0
    p = DTensor.from_local(v, mesh, [Partial()])
    total = 0.75 * n
    for name, cast in [("long", lambda t: t.long()), ("int", lambda t: t.int()), ("short", lambda t: t.short()),
                       ("bool", lambda t: (t - 0.75 * n / 2).bool()), ("to(int64)", lambda t: t.to(hp.int64)),
                       ("to(dtype=int32)", lambda t: t.to(dtype=hp.int32)),
                       ("type_as", lambda t: t.type_as(hp.tensor([1])))]:
        out = cast(p)
        want = cast(hp.tensor(np.full((4, 3), total)))
        assert out.placements == (Replicate(),), name
        np.testing.assert_array_equal(out.full_tensor().numpy(), want.numpy(), err_msg=name)
    for cast in (lambda t: t.double(), lambda t: t.to(hp.float32), lambda t: t.float()):
        out = cast(p)
        assert out.placements == (Partial(),)
        np.testing.assert_allclose(out.full_tensor().numpy(), np.full((4, 3), total), rtol=1e-6)


@pytest.mark.mpi(min_size=2)
def test_to_and_type_as_take_only_the_dtype_of_a_dtensor_argument():
    mesh, n, _ = _mesh()
    full = hp.tensor(np.arange(12.0).reshape(4, 3))
    donor = DTensor.from_local(hp.ones(4, 3, dtype=hp.float32), mesh, [Partial()])
    for pl in (Replicate(), Shard(0)):
        d = distribute_tensor(full, mesh, [pl])
        for out in (d.to(donor), d.type_as(donor)):
            assert out.placements == (pl,) and out.dtype == hp.float32  # not the donor's Partial
            np.testing.assert_array_equal(out.full_tensor().numpy(), full.numpy().astype(np.float32))
    with pytest.raises(NotImplementedError, match="new_tensor: the data is a DTensor"):
        distribute_tensor(full, mesh, [Replicate()]).new_tensor(donor)


@pytest.mark.mpi(min_size=2)
def test_negating_a_max_or_min_partial_reduces_it_first():
    mesh, n, rank = _mesh()
    full = hp.tensor(np.arange(12.0).reshape(4, 3))
    for op, shift in (("max", -1.0), ("min", 1.0)):
        p = DTensor.from_local(full + (0.0 if rank == 0 else shift), mesh, [Partial(op)])  # global: full
        for neg in (lambda t: -t, lambda t: t.neg(), lambda t: t.negative()):
            out = neg(p)
            assert out.placements == (Replicate(),), op
            np.testing.assert_array_equal(out.full_tensor().numpy(), -full.numpy())
        with pytest.raises(RuntimeError, match="in-place op on a Partial"):
            with hp.no_grad():
                DTensor.from_local(full.clone(), mesh, [Partial(op)]).neg_()
    s = DTensor.from_local(full / n, mesh, [Partial()])
    assert (-s).placements == (Partial(),)  # a sum stays a sum
    np.testing.assert_allclose((-s).full_tensor().numpy(), -full.numpy())
