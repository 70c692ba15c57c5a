"""Views, reshapes, indexing and the matmul family on DTensors (PyTorch's sharding propagation): each result
against the same op on the full tensor, placements as PyTorch's where it defines them, gradients through views
and slices of a sharded tensor as the full tensor's, and state dicts of DTensors copied and loaded back."""
import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

pytestmark = pytest.mark.mpi(min_size=2)


_MESH = []


def _mesh():
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    if not _MESH:
        _MESH.append(init_device_mesh("cpu", (dist.get_world_size(),)))
    return _MESH[0]


def _full(seed=0, shape=(8, 6)):
    return hp.tensor(np.random.default_rng(seed).standard_normal(shape))


def _assert_like_full(out, ref, case, placements=None):
    assert isinstance(out, DTensor), case
    assert tuple(out.shape) == tuple(ref.shape), (case, tuple(out.shape), tuple(ref.shape))
    np.testing.assert_allclose(out.full_tensor().numpy(), ref.numpy(), rtol=1e-12, atol=1e-12, err_msg=case)
    if placements is not None:
        assert out.placements == tuple(placements), (case, out.placements)


def _assert_grads_like_full(fn, full, placements, case):
    """The gradient of sum(fn(x) * weights) w.r.t. a DTensor x equals the full tensor's."""
    mesh = _mesh()
    x = distribute_tensor(full, mesh, placements).detach().requires_grad_(True)
    ref_x = full.detach().clone().requires_grad_(True)
    y, ref_y = fn(x), fn(ref_x)
    wt = _full(7, tuple(ref_y.shape))
    (y.full_tensor() * wt).sum().backward()  # (reductions of DTensors are another rule family's)
    (ref_y * wt).sum().backward()
    assert isinstance(x.grad, DTensor) and x.grad.placements == x.placements, case
    np.testing.assert_allclose(x.grad.full_tensor().numpy(), ref_x.grad.numpy(), rtol=1e-12, err_msg=case)


def _like(a, shape):
    """A tensor of ``shape`` beside ``a``: a Replicate DTensor beside a DTensor (only its shape is used)."""
    z = hp.zeros(*shape)
    return distribute_tensor(z, a.device_mesh, [Replicate()]) if isinstance(a, DTensor) else z


# -- views and reshapes -----------------------------------------------------------------------------------
VIEWS = {  # case: (fn, placements of the result for a Shard(0) input, for Shard(1); None: not checked)
    "view(48)": (lambda a: a.view(48), Shard(0), Replicate()),
    "view(8,3,2)": (lambda a: a.view(8, 3, 2), Shard(0), Replicate()),
    "view(4,2,6)": (lambda a: a.view(4, 2, 6), None, Shard(2)),
    "view(-1,3)": (lambda a: a.view(-1, 3), Shard(0), Replicate()),
    "reshape(2,4,6)": (lambda a: a.reshape(2, 4, 6), None, Shard(2)),
    "reshape(6,8)": (lambda a: a.reshape(6, 8), None, Replicate()),
    "flatten": (lambda a: a.flatten(), Shard(0), Replicate()),
    "unflatten": (lambda a: a.unflatten(1, (2, 3)), Shard(0), "unflatten"),  # Shard(1) where 6 and 2 split evenly
    "unsqueeze(0)": (lambda a: a.unsqueeze(0), Shard(1), Shard(2)),
    "unsqueeze(-1)": (lambda a: a.unsqueeze(-1), Shard(0), Shard(1)),
    "unsqueeze.squeeze": (lambda a: a.unsqueeze(1).squeeze(1), Shard(0), Shard(1)),
    "view_as": (lambda a: a.view_as(_like(a, (6, 8))), None, None),
    "reshape_as": (lambda a: a.reshape_as(_like(a, (48,))), Shard(0), Replicate()),
    "expand": (lambda a: a.unsqueeze(0).expand(3, 8, 6), Shard(1), Shard(2)),
    "broadcast_to": (lambda a: hp.broadcast_to(a, (2, 8, 6)), Shard(1), Shard(2)),
    "expand_as": (lambda a: a.expand_as(_like(a, (2, 8, 6))), Shard(1), Shard(2)),
    "contiguous": (lambda a: a.t().contiguous(), Shard(1), Shard(0)),
    "movedim": (lambda a: a.unsqueeze(0).movedim(0, 2), Shard(0), Shard(1)),
    "narrow(1)": (lambda a: a.narrow(1, 1, 3), Shard(0), Replicate()),
    "narrow(0)": (lambda a: a.narrow(0, 2, 4), Replicate(), Shard(1)),
    "tril": (lambda a: hp.tril(a), Replicate(), Replicate()),
    "triu(1)": (lambda a: hp.triu(a, 1), Replicate(), Replicate()),
    "diagonal": (lambda a: a.diagonal(), Replicate(), Replicate()),
    "diag": (lambda a: a.diag(), None, None),
}


@pytest.mark.parametrize("case", sorted(VIEWS))
@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()], ids=str)
def test_views_match_the_full_tensor(case, pl):
    mesh = _mesh()
    fn, p0, p1 = VIEWS[case]
    fa = _full(0)
    out = fn(distribute_tensor(fa, mesh, [pl]))
    if p1 == "unflatten":
        p1 = Shard(1) if 2 % mesh.size() == 0 and 6 % mesh.size() == 0 else Replicate()
    want = {Shard(0): p0, Shard(1): p1, Replicate(): Replicate()}[pl]
    _assert_like_full(out, fn(fa), case, None if want is None else [want])


@pytest.mark.parametrize("n", [5, 7])
def test_uneven_shards_reshape_right(n):
    """torch.chunk pieces (ceil(n/w) rows, then the rest, maybe none) through reshapes that do and do not line up."""
    mesh = _mesh()
    fa = _full(3, (n, 4))
    a = distribute_tensor(fa, mesh, [Shard(0)])
    for fn in (lambda t: t.view(-1), lambda t: t.view(n, 2, 2), lambda t: t.reshape(2 * n, 2), lambda t: t.flatten(),
               lambda t: t.unsqueeze(0), lambda t: t[1:], lambda t: t[:, 1:3], lambda t: t.t().reshape(4 * n)):
        _assert_like_full(fn(a), fn(fa), "uneven")
    one = distribute_tensor(_full(4, (1, 6)), mesh, [Shard(0)])  # rank 0 holds the row, the others none
    _assert_like_full(one.squeeze(0), _full(4, (1, 6)).squeeze(0), "squeeze a sharded size-1 dim")
    _assert_like_full(one.squeeze(), _full(4, (1, 6)).squeeze(), "squeeze()")


@pytest.mark.parametrize("pl", [Shard(0), Shard(1)], ids=str)
def test_splits_match_the_full_tensor(pl):
    mesh = _mesh()
    fa = _full(0)
    a = distribute_tensor(fa, mesh, [pl])
    for case, fn in {"split(3)": lambda t: t.split(3), "split(2,1)": lambda t: t.split(2, dim=1),
                     "chunk(3,1)": lambda t: t.chunk(3, 1), "chunk(2)": lambda t: t.chunk(2),
                     "unbind(0)": lambda t: t.unbind(0), "unbind(1)": lambda t: t.unbind(1),
                     "tensor_split": lambda t: t.tensor_split([1, 4], dim=1),
                     "hp.split": lambda t: hp.split(t, [5, 3])}.items():
        outs, refs = fn(a), fn(fa)
        assert len(outs) == len(refs), case
        for o, r in zip(outs, refs):
            _assert_like_full(o, r, case)
    a0, a1 = a.split(4, dim=1 - pl.dim)  # along the unsharded dim: local, the shard kept
    assert a0.placements == (pl,) and a1.placements == (pl,)
    u = a.unbind(1 - pl.dim)
    assert u[0].placements == (Shard(0),)


# -- indexing ---------------------------------------------------------------------------------------------
INDEX = {
    "a[2:6]": lambda a: a[2:6], "a[:, 1:3]": lambda a: a[:, 1:3], "a[::2]": lambda a: a[::2],
    "a[1::3, ::2]": lambda a: a[1::3, ::2], "a[3]": lambda a: a[3], "a[:, 2]": lambda a: a[:, 2],
    "a[-1, -2]": lambda a: a[-1, -2], "a[None]": lambda a: a[None], "a[..., None]": lambda a: a[..., None],
    "a[..., 1]": lambda a: a[..., 1], "a[:]": lambda a: a[:], "a[0:8]": lambda a: a[0:8],
    "a[-3:]": lambda a: a[-3:], "a[5:2]": lambda a: a[5:2], "a[1:2, None, ...]": lambda a: a[1:2, None, ...],
}


@pytest.mark.parametrize("case", sorted(INDEX))
@pytest.mark.parametrize("pl", [Shard(0), Shard(1)], ids=str)
def test_getitem_matches_the_full_tensor(case, pl):
    mesh = _mesh()
    fa = _full(0)
    out = INDEX[case](distribute_tensor(fa, mesh, [pl]))
    _assert_like_full(out, INDEX[case](fa), case)


def test_getitem_placements():
    mesh = _mesh()
    a = distribute_tensor(_full(0), mesh, [Shard(0)])
    assert a[:, 1:3].placements == (Shard(0),)  # a slice of an unsharded dim is local
    assert a[:, 2].placements == (Shard(0),)
    assert a[None].placements == (Shard(1),)
    assert a[2:6].placements == (Replicate(),) and tuple(a[2:6].shape) == (4, 6)
    p = DTensor.from_local(_full(1, (4, 3)), mesh, [Partial()])
    assert p[1:3].placements == (Partial(),)
    np.testing.assert_allclose(p[1:3].full_tensor().numpy(), mesh.size() * _full(1, (4, 3)).numpy()[1:3])


def test_advanced_indexing_and_selection():
    mesh = _mesh()
    fa = _full(0)
    a = distribute_tensor(fa, mesh, [Shard(0)])
    idx = hp.tensor([5, 0, 3, 2])
    di = distribute_tensor(idx, mesh, [Replicate()])
    _assert_like_full(a[di], fa[idx], "a[idx]")
    _assert_like_full(a.index_select(1, di), fa.index_select(1, idx), "index_select(1)")
    assert a.index_select(1, di).placements == (Shard(0),)
    _assert_like_full(a.index_select(0, di), fa.index_select(0, idx), "index_select(0)")
    gi = hp.tensor(np.random.default_rng(2).integers(0, 6, (8, 6)))
    g = a.gather(1, distribute_tensor(gi, mesh, [Shard(0)]))
    _assert_like_full(g, fa.gather(1, gi), "gather(1)", [Shard(0)])
    _assert_like_full(a.gather(0, distribute_tensor(gi, mesh, [Replicate()])), fa.gather(0, gi), "gather(0)")
    _assert_like_full(a.take(di), fa.take(idx), "take")
    mask = fa > 0
    _assert_like_full(a.masked_select(distribute_tensor(mask, mesh, [Shard(0)])), fa.masked_select(mask), "masked_select")
    _assert_like_full(a.gt(0).nonzero(), fa.gt(0).nonzero(), "nonzero")
    r = distribute_tensor(hp.tensor([3, 1, 3, 2, 1, 0, 0, 3]), mesh, [Shard(0)])
    _assert_like_full(r.unique(), hp.tensor([3, 1, 3, 2, 1, 0, 0, 3]).unique(), "unique")
    _assert_like_full(a[distribute_tensor(mask, mesh, [Shard(0)])], fa[mask], "a[mask]")
    _assert_like_full(a[[1, 6]], fa[[1, 6]], "a[list]")
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        a[idx]  # a plain index tensor beside a sharded DTensor, as PyTorch


@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()], ids=str)
def test_setitem_matches_the_full_tensor(pl):
    mesh = _mesh()
    for case, idx, value in [("a[2:6]=v", (slice(2, 6),), "d"), ("a[:,1]=2", (slice(None), 1), 2.0),
                             ("a[1]=-1", 1, -1.0), ("a[:, 1:3]=v", (slice(None), slice(1, 3)), "d"),
                             ("a[:]=0.5", slice(None), 0.5), ("a[..., ::2]=v", (Ellipsis, slice(None, None, 2)), "d")]:
        fa = _full(0)
        a = distribute_tensor(fa, mesh, [pl])
        ref = fa.clone()
        if value == "d":
            fv = _full(5, tuple(ref[idx].shape))
            value, ref_value = distribute_tensor(fv, mesh, [Shard(0)]), fv
        else:
            ref_value = value
        a[idx] = value
        ref[idx] = ref_value
        _assert_like_full(a, ref, case, [pl])
    r = distribute_tensor(_full(0), mesh, [Replicate()])
    r[0] = hp.ones(6)  # a plain value where the target is Replicate
    assert np.all(r.full_tensor().numpy()[0] == 1)
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        distribute_tensor(_full(0), mesh, [Shard(0)])[0] = hp.ones(6)
    leaf = distribute_tensor(_full(0), mesh, [Shard(0)]).requires_grad_(True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf[2:6] = 0.0


GRADS = {"a[2:6]": lambda t: t[2:6], "a[:, 1:3]": lambda t: t[:, 1:3], "a[3]": lambda t: t[3],
         "a[::3]": lambda t: t[::3], "view(8,3,2)": lambda t: t.view(8, 3, 2), "flatten": lambda t: t.flatten(),
         "reshape(6,8)": lambda t: t.reshape(6, 8), "unsqueeze.expand": lambda t: t.unsqueeze(0).expand(2, 8, 6),
         "split": lambda t: t.split(5)[1], "unbind": lambda t: t.unbind(1)[2], "narrow": lambda t: t.narrow(0, 1, 5),
         "tril": lambda t: hp.tril(t), "a@b": lambda t: t @ _full(8, (6, 4)).detach(),
         "index_select": lambda t: t.index_select(1, hp.tensor([0, 3, 3]))}


@pytest.mark.parametrize("case", sorted(GRADS))
@pytest.mark.parametrize("pl", [Shard(0), Shard(1)], ids=str)
def test_gradients_through_views_and_slices(case, pl):
    mesh = _mesh()
    fn = GRADS[case]
    if case in ("a@b", "index_select"):  # plain operands become replicated DTensors
        const = {"a@b": _full(8, (6, 4)), "index_select": hp.tensor([0, 3, 3])}[case]
        dconst = distribute_tensor(const, mesh, [Replicate()])
        fn = ((lambda t: t @ (dconst if isinstance(t, DTensor) else const)) if case == "a@b" else
              (lambda t: t.index_select(1, dconst if isinstance(t, DTensor) else const)))
    _assert_grads_like_full(fn, _full(0), [pl], case)


# -- matmul family ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("pa,pb,want", [
    (Shard(0), Replicate(), Shard(0)), (Replicate(), Shard(1), Shard(1)), (Shard(1), Shard(0), Partial()),
    (Replicate(), Replicate(), Replicate()), (Shard(0), Shard(0), Shard(0)), (Shard(1), Replicate(), Partial()),
    (Replicate(), Shard(0), Partial()), (Shard(1), Shard(1), Partial()), (Shard(0), Shard(1), Shard(0))], ids=str)
def test_mm_placements_and_values(pa, pb, want):
    mesh = _mesh()
    fa, fb = _full(0, (8, 6)), _full(1, (6, 4))
    a, b = distribute_tensor(fa, mesh, [pa]), distribute_tensor(fb, mesh, [pb])
    for case, fn in {"@": lambda x, y: x @ y, "mm": lambda x, y: x.mm(y), "matmul": hp.matmul,
                     "einsum": lambda x, y: hp.einsum("ik,kj->ij", x, y)}.items():
        _assert_like_full(fn(a, b), fn(fa, fb), case, [want])


def test_matmul_family_matches_the_full_tensor():
    mesh = _mesh()
    S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()
    x3, w, v6, v4 = _full(0, (4, 8, 6)), _full(1, (6, 5)), _full(2, (6,)), _full(3, (4,))
    y3, bias, m = _full(4, (4, 6, 5)), _full(5, (5,)), _full(6, (8, 6))

    def d(t, p):
        return distribute_tensor(t, mesh, [p])
    cases = [
        ("batched@ S0", lambda f: f(x3, S0) @ f(w, R), x3 @ w, S0),
        ("batched@ S1", lambda f: f(x3, S1) @ f(w, R), x3 @ w, S1),
        ("batched@ S2", lambda f: f(x3, S2) @ f(w, S0), x3 @ w, Partial()),
        ("bmm alike", lambda f: f(x3, S0).bmm(f(y3, S0)), x3.bmm(y3), S0),
        ("bmm mixed", lambda f: f(x3, S0).bmm(f(y3, S2)), x3.bmm(y3), S0),
        ("matmul broadcast", lambda f: hp.matmul(f(x3, S0), f(y3[:1], R)), hp.matmul(x3, y3[:1]), S0),
        ("matmul broadcast sharded", lambda f: hp.matmul(f(x3[:1], S1), f(y3, S0)), hp.matmul(x3[:1], y3), None),
        ("matmul broadcast dim sharded", lambda f: hp.matmul(f(x3[:1], S0), f(y3, S0)), hp.matmul(x3[:1], y3), S0),
        ("mat@vec", lambda f: f(m, S0) @ f(v6, R), m @ v6, S0),
        ("mat@vec contracted", lambda f: f(m, S1) @ f(v6, S0), m @ v6, Partial()),
        ("vec@mat", lambda f: f(v6, S0) @ f(w, S0), v6 @ w, Partial()),
        ("dot", lambda f: f(v6, S0).dot(f(v6, S0)), v6.dot(v6), Partial()),
        ("dot mixed", lambda f: hp.dot(f(v6, S0), f(v6, R)), v6.dot(v6), Partial()),
        ("outer", lambda f: hp.outer(f(v6, S0), f(v4, R)), hp.outer(v6, v4), S0),
        ("outer 1", lambda f: f(v6, R).outer(f(v4, S0)), hp.outer(v6, v4), S1),
        ("addmm", lambda f: hp.addmm(f(bias, R), f(m, S0), f(w, R)), hp.addmm(bias, m, w), S0),
        ("addmm contracted", lambda f: hp.addmm(f(bias, S0), f(m, S1), f(w, S0), beta=0.5, alpha=2.0),
         hp.addmm(bias, m, w, beta=0.5, alpha=2.0), None),
        ("baddbmm", lambda f: hp.baddbmm(f(_full(7, (4, 8, 5)), S0), f(x3, S0), f(y3, S0)),
         hp.baddbmm(_full(7, (4, 8, 5)), x3, y3), S0),
        ("einsum bij,bjk", lambda f: hp.einsum("bij,bjk->bik", f(x3, S1), f(y3, R)), hp.einsum("bij,bjk->bik", x3, y3),
         S1),
        ("einsum implicit", lambda f: hp.einsum("ij,jk", f(m, S1), f(w, S0)), hp.einsum("ij,jk", m, w), Partial()),
        ("einsum ...", lambda f: hp.einsum("...ij,jk->...ik", f(x3, S0), f(w, R)), hp.einsum("...ij,jk->...ik", x3, w),
         S0),
        ("einsum ... contracted", lambda f: hp.einsum("...j,jk", f(x3, S2), f(w, S0)), hp.einsum("...j,jk", x3, w),
         Partial()),
        ("einsum trace", lambda f: hp.einsum("ii->i", f(m[:6], S0)), hp.einsum("ii->i", m[:6]), None),
    ]
    for case, fn, ref, want in cases:
        _assert_like_full(fn(d), ref, case, None if want is None else [want])
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        m @ d(w, S0)
    with pytest.raises(RuntimeError, match="got mixed torch.Tensor and DTensor"):
        d(m, S0) @ w


def test_a_partial_operand_stays_partial():
    mesh = _mesh()
    n = mesh.size()
    v, fb = _full(1, (4, 6)), _full(2, (6, 3))
    p = DTensor.from_local(v, mesh, [Partial()])  # the global value is n * v
    out = p @ distribute_tensor(fb, mesh, [Replicate()])
    assert out.placements == (Partial(),)
    np.testing.assert_allclose(out.full_tensor().numpy(), n * v.numpy() @ fb.numpy(), rtol=1e-12)
    add = hp.addmm(distribute_tensor(_full(3, (3,)), mesh, [Replicate()]), p, distribute_tensor(fb, mesh, [Replicate()]))
    assert add.placements == (Replicate(),)  # the input is added once
    np.testing.assert_allclose(add.full_tensor().numpy(), _full(3, (3,)).numpy() + n * v.numpy() @ fb.numpy(),
                               rtol=1e-12)
    b = distribute_tensor(fb, mesh, [Replicate()]).detach().requires_grad_(True)
    (p @ b).full_tensor().sum().backward()
    np.testing.assert_allclose(b.grad.full_tensor().numpy(), np.repeat((n * v.numpy()).sum(0)[:, None], 3, 1),
                               rtol=1e-12)


def test_gradients_through_matmul():
    mesh = _mesh()
    for pa, pb in [(Shard(0), Replicate()), (Replicate(), Shard(1)), (Shard(1), Shard(0)), (Shard(0), Shard(1))]:
        fa, fb = _full(0, (8, 6)), _full(1, (6, 4))
        a = distribute_tensor(fa, mesh, [pa]).detach().requires_grad_(True)
        b = distribute_tensor(fb, mesh, [pb]).detach().requires_grad_(True)
        ra, rb = fa.detach().clone().requires_grad_(True), fb.detach().clone().requires_grad_(True)
        wt = _full(2, (8, 4))
        ((a @ b).full_tensor() * wt).sum().backward()
        ((ra @ rb) * wt).sum().backward()
        np.testing.assert_allclose(a.grad.full_tensor().numpy(), ra.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(b.grad.full_tensor().numpy(), rb.grad.numpy(), rtol=1e-12)
        assert a.grad.placements == (pa,) and b.grad.placements == (pb,)


# -- state dicts ------------------------------------------------------------------------------------------
def test_a_copied_state_dict_of_a_fully_shard_model_loads_back():
    from hpcfsdp.distributed.fsdp import fully_shard

    _mesh()
    hp.manual_seed(0)
    model = hp.nn.Sequential(hp.nn.Linear(5, 7), hp.nn.ReLU(), hp.nn.Linear(7, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    x = hp.ones(4, 5)
    model(x).sum().backward()
    copy = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for k, v in copy.items():
        assert isinstance(v, DTensor) and v.placements == model.state_dict()[k].placements, k
    want = {k: v.full_tensor().numpy().copy() for k, v in copy.items()}
    for p in model.parameters():
        g = hp.zeros_like(p) + p.grad  # a DTensor of the parameter's layout
        assert isinstance(g, DTensor) and g.placements == p.placements
        np.testing.assert_array_equal(g.full_tensor().numpy(), p.grad.full_tensor().numpy())
        with hp.no_grad():
            p.mul_(0.0)
    model.load_state_dict(copy)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.full_tensor().numpy(), want[k], err_msg=k)
    out = model(x)
    assert np.isfinite(out.detach().numpy()).all()
