"""Reductions, norms, scans, softmax, sorting, cat/stack and equal/allclose on DTensors give the global values
(PyTorch's DTensor): each result against the same op on the full tensor, its placements as PyTorch's (Partial
for a reduction over a sharded dim, Shard kept otherwise), no data moved for sums and norms until resolved, and
gradients equal to the full tensor's."""
import copy
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.fsdp import fully_shard
from hpcfsdp.distributed.process_group import collective_bytes, collective_counts, reset_collective_counts
from hpcfsdp.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from hpcfsdp.distributed.tensor.placement_types import _NormPartial

pytestmark = pytest.mark.mpi(min_size=2)


def _mesh():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(seed=0, shape=(7, 6)):
    """7 rows: uneven torch.chunk shards at 2 and 4 ranks (4 ranks: 2, 2, 2, 1)."""
    return hp.tensor(np.random.default_rng(seed).standard_normal(shape))


def _assert_like_full(out, ref, placements=None, case=""):
    if isinstance(ref, tuple):
        for o, r in zip(out, ref):
            _assert_like_full(o, r, None, case)
        return
    assert isinstance(out, DTensor), case
    assert tuple(out.shape) == tuple(ref.shape), (case, out.shape, ref.shape)
    assert out.dtype == ref.dtype, (case, out.dtype, ref.dtype)
    np.testing.assert_allclose(out.full_tensor().numpy(), ref.numpy(), rtol=1e-12, atol=1e-12, err_msg=case)
    if placements is not None:
        assert out.placements == (placements,), (case, out.placements)


REDUCTIONS = {  # name: (op, placement over sharded dim 0 when it is reduced)
    "sum": (lambda a: a.sum(), Partial()), "sum0": (lambda a: a.sum(0), Partial()),
    "sum1": (lambda a: a.sum(1), Shard(0)), "sum1k": (lambda a: a.sum(1, keepdim=True), Shard(0)),
    "sum01": (lambda a: a.sum((0, 1)), Partial()), "hp.sum": (lambda a: hp.sum(a, -1), Shard(0)),
    "nansum": (lambda a: a.nansum(0), Partial()), "mean": (lambda a: a.mean(), Partial()),
    "mean0": (lambda a: a.mean(0, keepdim=True), Partial()), "mean1": (lambda a: a.mean(1), Shard(0)),
    "prod": (lambda a: a.prod(0), Partial("product")), "amax": (lambda a: a.amax(0), Partial("max")),
    "amin": (lambda a: a.amin(), Partial("min")), "max": (lambda a: a.max(), Partial("max")),
    "min": (lambda a: a.min(), Partial("min")), "amax1": (lambda a: a.amax(1), Shard(0)),
    "count_nonzero": (lambda a: (a > 0).count_nonzero(0), Partial()),
    "all": (lambda a: (a > -5).all(), Replicate()), "any0": (lambda a: (a > 1).any(0), Replicate()),
    "norm": (lambda a: a.norm(), _NormPartial(2)), "norm1": (lambda a: a.norm(1), _NormPartial(1)),
    "norm_inf": (lambda a: a.norm(math.inf), _NormPartial(math.inf)),
    "norm_-inf": (lambda a: a.norm(-math.inf), _NormPartial(-math.inf)),
    "norm0": (lambda a: a.norm(0), _NormPartial(0)), "norm3_0": (lambda a: a.norm(3, 0), _NormPartial(3)),
    "norm_fro1": (lambda a: a.norm("fro", 1), Shard(0)),
    "vector_norm": (lambda a: hp.linalg.vector_norm(a), _NormPartial(2)),
    "vector_norm0k": (lambda a: hp.linalg.vector_norm(a, 1.5, 0, keepdim=True), _NormPartial(1.5)),
    "max_dim0": (lambda a: a.max(0), None), "min_dim1": (lambda a: a.min(1), None),
    "argmax": (lambda a: a.argmax(), Replicate()), "argmin0": (lambda a: a.argmin(0), Replicate()),
    "argmax1": (lambda a: a.argmax(1), Shard(0)), "var": (lambda a: a.var(), Replicate()),
    "std0": (lambda a: a.std(0, correction=0), Replicate()), "var1": (lambda a: a.var(1), Shard(0)),
    "logsumexp0": (lambda a: a.logsumexp(0), Replicate()), "logsumexp1": (lambda a: a.logsumexp(1), Shard(0)),
    "nanmean0": (lambda a: a.nanmean(0), Replicate()), "median": (lambda a: a.median(), Replicate()),
    "nanmedian": (lambda a: a.nanmedian(), Replicate()),
    "var_mean": (lambda a: hp.var_mean(a, 1), None),
}

SCANS = {  # dim-wise ops: placements kept along an unsharded dim, the dim gathered when sharded
    "cumsum": lambda a, d: a.cumsum(d), "cumprod": lambda a, d: a.cumprod(d), "cummax": lambda a, d: a.cummax(d),
    "cummin": lambda a, d: a.cummin(d), "softmax": lambda a, d: a.softmax(d),
    "log_softmax": lambda a, d: a.log_softmax(d), "F.softmax": lambda a, d: nn.functional.softmax(a, d),
    "sort": lambda a, d: a.sort(d), "argsort": lambda a, d: a.argsort(d, descending=True),
    "topk": lambda a, d: a.topk(2, d), "kthvalue": lambda a, d: a.kthvalue(2, d),
    "median": lambda a, d: a.median(d), "quantile": lambda a, d: a.quantile(0.3, d),
    "nanmedian": lambda a, d: a.nanmedian(d), "mode": lambda a, d: a.mode(d),
    "logcumsumexp": lambda a, d: a.logcumsumexp(d), "nanquantile": lambda a, d: a.nanquantile(0.3, d),
}


@pytest.mark.parametrize("case", sorted(REDUCTIONS))
def test_reductions_match_the_full_tensor(case):
    mesh = _mesh()
    fa = _full()
    fn, want = REDUCTIONS[case]
    ref = fn(fa)
    for pl, expect in ((Shard(0), want), (Replicate(), Replicate())):
        out = fn(distribute_tensor(fa, mesh, [pl]))
        _assert_like_full(out, tuple(ref) if isinstance(ref, tuple) else ref, expect, f"{case} {pl}")
        if isinstance(ref, tuple):  # values and global indices
            assert all(o.placements == (Replicate() if pl == Replicate() or case == "max_dim0" else Shard(0),)
                       for o in out), case


@pytest.mark.parametrize("case", sorted(SCANS))
@pytest.mark.parametrize("dim", [0, 1])
def test_scans_and_dimwise_ops(case, dim):
    mesh = _mesh()
    fa = _full(3)
    ref = SCANS[case](fa, dim)
    out = SCANS[case](distribute_tensor(fa, mesh, [Shard(0)]), dim)
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    removed = case in ("kthvalue", "median") and dim == 1
    for o, r in zip(outs, refs):
        _assert_like_full(o, r, None, case)
        want = Replicate() if dim == 0 else Shard(0)
        assert o.placements == (want,), (case, dim, o.placements, removed)


def test_a_partial_input_stays_partial_only_for_linear_reductions():
    mesh = _mesh()
    n = mesh.size()
    v = _full(4, (3, 4))
    p = DTensor.from_local(v, mesh, [Partial()])  # global n * v
    s = p.sum(0)
    assert s.placements == (Partial(),)
    np.testing.assert_allclose(s.full_tensor().numpy(), n * v.numpy().sum(0), rtol=1e-12)
    assert p.mean().placements == (Partial(),)
    np.testing.assert_allclose(p.mean().full_tensor().numpy(), n * v.numpy().mean(), rtol=1e-12)
    m = p.amax(0)  # not linear: reduced first
    assert m.placements == (Replicate(),)
    np.testing.assert_allclose(m.full_tensor().numpy(), (n * v.numpy()).max(0), rtol=1e-12)
    np.testing.assert_allclose(p.norm().full_tensor().numpy(), n * np.linalg.norm(v.numpy()), rtol=1e-12)


def test_norm_partial_placement_and_pointwise_ops_reduce_it():
    mesh = _mesh()
    fa = _full(5)
    a = distribute_tensor(fa, mesh, [Shard(0)])
    g = a.norm()
    assert g.placements == (_NormPartial(2),) and g.placements != (Partial(),)
    assert _NormPartial(2) != Partial("sum") and Partial("sum") != _NormPartial(2)
    assert "_NormPartial(reduce_op=sum, norm_type=2)" in repr(g)
    ref = float(np.linalg.norm(fa.numpy()))
    # .item() is the local partial value (PyTorch's behaviour)
    local = a.to_local().numpy()
    assert g.item() == pytest.approx(float(np.linalg.norm(local)) if local.size else 0.0, rel=1e-12)
    for f, want in ((lambda x: x + x, 2 * ref), (lambda x: x * 2, 2 * ref), (lambda x: -x, -ref),
                    (lambda x: x ** 2, ref ** 2), (lambda x: x + 1, ref + 1)):
        out = f(g)
        assert out.placements == (Replicate(),), out.placements
        assert out.full_tensor().item() == pytest.approx(want, rel=1e-12)
    assert g.redistribute(mesh, [Replicate()]).to_local().item() == pytest.approx(ref, rel=1e-12)


def test_norm_and_sum_move_a_scalar_only_when_resolved():
    mesh = _mesh()
    fa = hp.tensor(np.random.default_rng(6).standard_normal((64, 32)))
    a = distribute_tensor(fa, mesh, [Shard(0)])
    for f, ref in ((lambda x: x.norm(), np.linalg.norm(fa.numpy())), (lambda x: x.sum(), fa.numpy().sum()),
                   (lambda x: x.amax(), fa.numpy().max())):
        reset_collective_counts()
        out = f(a)
        assert sum(collective_counts().values()) == 0, collective_counts()  # nothing moves
        val = out.full_tensor()
        assert collective_counts() == {"all_reduce": 1}, collective_counts()
        assert collective_bytes() == {"all_reduce": 8}, collective_bytes()  # one float64 scalar, no gather
        assert val.item() == pytest.approx(float(ref), rel=1e-12)


def test_total_norm_of_stacked_norm_partials():
    mesh = _mesh()
    fulls = [_full(10 + i, s) for i, s in enumerate([(7, 3), (5,), (9, 2)])]
    ds = [distribute_tensor(f, mesh, [Shard(0)]) for f in fulls]
    for p in (2.0, 1.0, math.inf):
        st = hp.stack([d.norm(p) for d in ds])
        assert st.placements == (_NormPartial(int(p) if p != math.inf else p),), st.placements
        reset_collective_counts()
        total = hp.linalg.vector_norm(st, p)
        assert sum(collective_counts().values()) == 0
        ref = hp.linalg.vector_norm(hp.stack([f.norm(p) for f in fulls]), p)
        assert total.full_tensor().item() == pytest.approx(ref.item(), rel=1e-12)


def test_cat_and_stack():
    mesh = _mesh()
    fa, fb = _full(20), _full(21)
    a, b = distribute_tensor(fa, mesh, [Shard(0)]), distribute_tensor(fb, mesh, [Shard(0)])
    br = distribute_tensor(fb, mesh, [Replicate()])
    _assert_like_full(hp.cat([a, b], 1), hp.cat([fa, fb], 1), Shard(0), "cat1")
    _assert_like_full(hp.cat([a, br], 1), hp.cat([fa, fb], 1), Shard(0), "cat1 mixed")
    _assert_like_full(hp.cat([a, b], 0), hp.cat([fa, fb], 0), Replicate(), "cat0")
    _assert_like_full(hp.stack([a, b]), hp.stack([fa, fb]), Shard(1), "stack0")
    _assert_like_full(hp.stack([a, b], 1), hp.stack([fa, fb], 1), Shard(0), "stack1")
    _assert_like_full(hp.stack([a, br], 2), hp.stack([fa, fb], 2), Shard(0), "stack2")
    with pytest.raises(RuntimeError, match="mixed"):
        hp.cat([a, fb], 1)


def test_equal_and_allclose_are_global():
    mesh = _mesh()
    fa = _full(30)
    a = distribute_tensor(fa, mesh, [Shard(0)])
    b = distribute_tensor(fa.clone(), mesh, [Replicate()])
    assert hp.equal(a, b) is True and a.allclose(b) is True
    fc = fa.clone()
    fc[6, 5] += 1.0  # on the last non-empty shard only
    c = distribute_tensor(fc, mesh, [Shard(0)])
    assert hp.equal(a, c) is False and hp.allclose(a, c) is False


@pytest.mark.parametrize("case", ["sum", "mean", "norm", "amax", "max_dim", "var", "softmax", "norm_inf"])
def test_gradients_match_the_full_tensor(case):
    mesh = _mesh()
    fns = {"sum": lambda x: (x.sum(0) ** 2).sum(), "mean": lambda x: x.mean() * 3,
           "norm": lambda x: x.norm(), "amax": lambda x: x.amax(), "max_dim": lambda x: x.max(0).values.sum(),
           "var": lambda x: x.var(0).sum(), "softmax": lambda x: (x.softmax(0) * hp.arange(6.0)).sum(),
           "norm_inf": lambda x: x.norm(math.inf) + hp.linalg.vector_norm(x, 3)}
    fa = _full(40)
    ref_x = fa.clone().requires_grad_(True)
    fns[case](ref_x).backward()
    x = distribute_tensor(fa, mesh, [Shard(0)]).requires_grad_(True)
    y = fns[case](x)
    y = y.full_tensor() if isinstance(y, DTensor) else y
    y.backward()
    assert isinstance(x.grad, DTensor) and x.grad.placements == (Shard(0),)
    np.testing.assert_allclose(x.grad.full_tensor().numpy(), ref_x.grad.numpy(), rtol=1e-10, atol=1e-12,
                               err_msg=case)


@pytest.mark.parametrize("p", [2.0, 1.0, math.inf])
def test_fsdp_grad_norms_equal_the_unsharded_models(p):
    hp.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    ref = copy.deepcopy(model)
    fully_shard(model[0])
    fully_shard(model)
    x = hp.tensor(np.random.default_rng(8).standard_normal((4, 5)).astype(np.float32))
    model(x).sum().backward()
    ref(x).sum().backward()
    for (name, q), r in zip(model.named_parameters(), ref.parameters()):
        assert isinstance(q.grad, DTensor) and q.grad.placements == (Shard(0),), name
        gn = q.grad.norm(p)
        assert gn.placements == (_NormPartial(int(p) if p != math.inf else p),)
        assert gn.full_tensor().item() == pytest.approx(r.grad.norm(p).item(), rel=1e-5), name
    total = hp.linalg.vector_norm(hp.stack([q.grad.norm(p) for q in model.parameters()]), p)
    want = hp.linalg.vector_norm(hp.stack([r.grad.norm(p) for r in ref.parameters()]), p)
    assert total.full_tensor().item() == pytest.approx(want.item(), rel=1e-5)
    helper = nn.utils.get_total_norm([q.grad for q in model.parameters()], p)
    assert helper.full_tensor().item() == pytest.approx(want.item(), rel=1e-5)


def test_empty_shards_hold_the_identity():
    """3 rows over 4 ranks: the last holds none (over 2 ranks: 2 and 1)."""
    mesh = _mesh()
    fa = _full(50, (3, 4))
    a = distribute_tensor(fa, mesh, [Shard(0)])
    cases = {"amax": lambda x: x.amax(0), "max": lambda x: x.max(), "min": lambda x: x.min(),
             "mean": lambda x: x.mean(0), "prod": lambda x: x.prod(0), "sum": lambda x: x.sum(),
             "inf": lambda x: x.norm(math.inf, 0), "-inf": lambda x: x.norm(-math.inf), "p-1": lambda x: x.norm(-1),
             "argmax": lambda x: x.argmax(), "max0": lambda x: x.max(0), "var": lambda x: x.var(0),
             "cumsum": lambda x: x.cumsum(0)}
    for case, f in cases.items():
        out, ref = f(a), f(fa)
        _assert_like_full(tuple(out) if isinstance(ref, tuple) else out, tuple(ref) if isinstance(ref, tuple) else ref,
               None, case)


@pytest.mark.mpi(min_size=4)
def test_two_dim_mesh():
    assert dist.get_world_size() % 2 == 0, "a 2 x n mesh: run at an even world size (the suite runs 2 and 4)"
    _mesh()
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2))
    fa = _full(60, (5, 6))
    for pls in ([Shard(0), Shard(1)], [Shard(0), Shard(0)], [Replicate(), Shard(1)], [Shard(1), Replicate()]):
        a = distribute_tensor(fa, mesh, pls)
        for case, f in {"sum": lambda x: x.sum(), "sum0": lambda x: x.sum(0), "mean1": lambda x: x.mean(1),
                        "norm": lambda x: x.norm(), "norm1_0": lambda x: x.norm(1, 0), "amax": lambda x: x.amax(),
                        "max1": lambda x: x.max(1), "softmax0": lambda x: x.softmax(0)}.items():
            out, ref = f(a), f(fa)
            _assert_like_full(tuple(out) if isinstance(ref, tuple) else out, tuple(ref) if isinstance(ref, tuple) else ref,
                   None, f"{case} {pls}")
        x = distribute_tensor(fa, mesh, pls).requires_grad_(True)
        (x.norm() + x.mean(0).sum() + x.amax()).full_tensor().backward()
        rx = fa.clone().requires_grad_(True)
        (rx.norm() + rx.mean(0).sum() + rx.amax()).backward()
        np.testing.assert_allclose(x.grad.full_tensor().numpy(), rx.grad.numpy(), rtol=1e-10, atol=1e-12)
    g = distribute_tensor(fa, mesh, [Shard(0), Shard(1)]).norm()
    assert g.placements == (_NormPartial(2), _NormPartial(2))


def test_distribute_tensor_to_a_norm_partial():
    mesh = _mesh()
    v = hp.tensor(np.array([3.0, 4.0]))
    for p in (2, 1, math.inf, 3):
        d = distribute_tensor(v, mesh, [_NormPartial(p)])
        np.testing.assert_allclose(d.full_tensor().numpy(), v.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="_NormPartial"):
        DTensor.from_local(v, init_device_mesh("cpu", (1, dist.get_world_size())), [Partial(), _NormPartial(2)])


@pytest.mark.mpi(min_size=2)
def test_unique_consecutive_and_histogram_gather_the_tensor():
    mesh = _mesh()
    fa = hp.tensor(np.repeat(np.arange(6.0), 3).reshape(6, 3) % 4)
    d = distribute_tensor(fa, mesh, [Shard(0)])
    vals, counts = d.unique_consecutive(return_counts=True)
    want_vals, want_counts = fa.unique_consecutive(return_counts=True)
    assert vals.placements == (Replicate(),) and vals.full_tensor().tolist() == want_vals.tolist()
    assert counts.full_tensor().tolist() == want_counts.tolist()
    h = hp.histogram(d, bins=4)
    ref = hp.histogram(fa, bins=4)
    assert h.hist.full_tensor().tolist() == ref.hist.tolist() and h.bin_edges.full_tensor().tolist() == ref.bin_edges.tolist()

