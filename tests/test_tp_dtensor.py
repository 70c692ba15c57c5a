"""Tensor parallelism with DTensors as PyTorch's: gradients of TP parameters are DTensors of the parameters'
layouts, TP-only gradient norms are global, DTensor outputs (use_local_output=False), PrepareModuleInput /
PrepareModuleOutput, loss_parallel, and random init of sharded parameters; each against the unsharded model
on a tensor-parallel mesh of every rank (run at 2 and at 4 ranks)."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
import hpcfsdp.distributed as dist
from hpcfsdp import nn
from hpcfsdp.distributed.device_mesh import init_device_mesh
from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from hpcfsdp.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                 RowwiseParallel, SequenceParallel, parallelize_module)

pytestmark = pytest.mark.mpi(min_size=2)
B, T, C, H, V = 2, 8, 8, 16, 12


class Net(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        hp.manual_seed(seed)
        self.tok = nn.Embedding(V, C)
        self.norm = nn.LayerNorm(C)
        self.up = nn.Linear(C, H)
        self.act = nn.GELU()
        self.down = nn.Linear(H, C)
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        with hp.no_grad():  # non-trivial norm parameters, so their gradients mean something
            self.norm.weight.add_(hp.randn(C) * 0.3)
            self.ln_f.bias.add_(hp.randn(C) * 0.3)

    def forward(self, idx):
        x = self.tok(idx)
        x = x + self.down(self.act(self.up(self.norm(x))))
        return self.head(self.ln_f(x))


def _mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))


def _data():
    rng = np.random.default_rng(3)
    idx = rng.integers(0, V, (B, T))
    tgt = rng.integers(0, V, (B, T))
    return idx, tgt


def _ref_loss(ref, idx, tgt):
    logits = ref(hp.tensor(idx))
    return nn.functional.cross_entropy(logits.reshape(-1, V), hp.tensor(tgt).reshape(-1))


PLANS = {
    "tensor": lambda: {"tok": RowwiseParallel(input_layouts=Replicate()), "up": ColwiseParallel(), "down": RowwiseParallel(),
                       "head": ColwiseParallel(output_layouts=Replicate())},
    "sequence": lambda: {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)), "norm": SequenceParallel(),
                         "up": ColwiseParallel(input_layouts=Shard(1)), "down": RowwiseParallel(output_layouts=Shard(1)),
                         "ln_f": SequenceParallel(), "head": ColwiseParallel(input_layouts=Shard(1),
                                                                             output_layouts=Replicate())},
}
PLACEMENTS = {"tok.weight": Shard(0), "up.weight": Shard(0), "up.bias": Shard(0), "down.weight": Shard(1),
              "down.bias": Replicate(), "head.weight": Shard(0)}


def _full(t):
    return t.full_tensor()._data if isinstance(t, DTensor) else t._data


def _slice(full, placement, n, r):
    """Rank r's piece of ``full`` (torch.chunk's split: pieces of ceil(size / n), the last ones short or empty)."""
    if isinstance(placement, Shard):
        size = full.shape[placement.dim]
        c = -(-size // n)
        return np.take(full, range(min(r * c, size), min((r + 1) * c, size)), axis=placement.dim)
    return full


@pytest.mark.timeout(120)
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_tp_gradients_are_dtensors_of_the_parameters_layout(plan):
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = _mesh()
    ref, model = Net(1), Net(1)
    parallelize_module(model, mesh, PLANS[plan]())
    idx, tgt = _data()
    loss = _ref_loss(ref, idx, tgt)
    loss.backward()
    mine = hp.tensor(idx)
    logits = model(mine)
    tl = nn.functional.cross_entropy(logits.reshape(-1, V), hp.tensor(tgt).reshape(-1))
    np.testing.assert_allclose(tl.item(), loss.item(), rtol=1e-5)
    tl.backward()
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g = refp[name].grad._data
        if plan == "tensor" and name.split(".")[0] in ("norm", "ln_f"):  # not parallelized: plain, as PyTorch
            assert not isinstance(p, DTensor) and not isinstance(p.grad, DTensor), name
            np.testing.assert_allclose(p.grad._data, g, rtol=1e-4, atol=1e-5, err_msg=name)
            continue
        assert isinstance(p, DTensor), name
        assert isinstance(p.grad, DTensor), name
        want = PLACEMENTS.get(name, Replicate())
        assert p.placements == (want,) and p.grad.placements == (want,), (name, p.grad.placements)
        assert p.grad.shape == p.shape and p.grad.device_mesh is p.device_mesh
        np.testing.assert_allclose(p.grad._data, _slice(g, want, n, r), rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(p.grad.full_tensor()._data, g, rtol=1e-4, atol=1e-5, err_msg=name)
    # the global norms, as the unsharded model's (not this rank's pieces)
    want = nn.utils.get_total_norm([p.grad for p in ref.parameters()]).item()
    got = nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert isinstance(got, DTensor) and got.placements == (Replicate(),)
    np.testing.assert_allclose(got.full_tensor().item(), want, rtol=1e-5)
    inf = nn.utils.get_total_norm([p.grad for p in model.parameters()], math.inf).full_tensor().item()
    np.testing.assert_allclose(inf, nn.utils.get_total_norm([p.grad for p in ref.parameters()], math.inf).item(),
                               rtol=1e-6)
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    rtotal = nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    np.testing.assert_allclose(total.full_tensor().item(), rtotal.item(), rtol=1e-5)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p.grad), refp[name].grad._data, rtol=1e-4, atol=1e-6,
                                   err_msg=name)


class MLP(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        hp.manual_seed(seed)
        self.up = nn.Linear(C, H)
        self.down = nn.Linear(H, C)

    def forward(self, x):
        return self.down(nn.functional.silu(self.up(x)))


def _grads_match(model, ref):
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p.grad), refp[name].grad._data, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.timeout(120)
def test_dtensor_outputs_flow_between_styles():
    n = dist.get_world_size()
    mesh = _mesh()
    ref, model = MLP(2), MLP(2)
    parallelize_module(model, mesh, {"up": ColwiseParallel(use_local_output=False),
                                     "down": RowwiseParallel(use_local_output=False)})
    rng = np.random.default_rng(5)
    x, g = rng.standard_normal((B, T, C)).astype(np.float32), rng.standard_normal((B, T, C)).astype(np.float32)
    h = model.up(hp.tensor(x))
    assert isinstance(h, DTensor) and h.placements == (Shard(2),) and tuple(h.shape) == (B, T, H)
    assert tuple(h.to_local().shape) == (B, T, H // n)
    xr = hp.tensor(x, requires_grad=True)
    yr = ref(xr)
    (yr * hp.tensor(g)).sum().backward()
    xs = hp.tensor(x, requires_grad=True)
    y = model(xs)
    assert isinstance(y, DTensor) and y.placements == (Replicate(),) and tuple(y.shape) == (B, T, C)
    np.testing.assert_allclose(y.to_local()._data, yr._data, rtol=1e-5, atol=1e-6)
    (y.to_local() * hp.tensor(g)).sum().backward()
    np.testing.assert_allclose(xs.grad._data, xr.grad._data, rtol=1e-4, atol=1e-5)
    _grads_match(model, ref)
    # a DTensor input is redistributed to the style's input layout: a Shard(1) input to ColwiseParallel
    dx = distribute_tensor(hp.tensor(x), mesh, [Shard(1)])
    np.testing.assert_allclose(model(dx).to_local()._data, yr._data, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_rowwise_layouts_and_local_outputs():
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = _mesh()
    ref, model = MLP(3), MLP(3)
    parallelize_module(model, mesh, {"up": ColwiseParallel(),
                                     "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=True)})
    rng = np.random.default_rng(6)
    x, g = rng.standard_normal((B, T, C)).astype(np.float32), rng.standard_normal((B, T, C)).astype(np.float32)
    s = slice(r * T // n, (r + 1) * T // n)
    yr = ref(hp.tensor(x))
    (yr * hp.tensor(g)).sum().backward()
    y = model(hp.tensor(x))
    assert not isinstance(y, DTensor) and tuple(y.shape) == (B, T // n, C)
    np.testing.assert_allclose(y._data, yr._data[:, s], rtol=1e-5, atol=1e-6)
    (y * hp.tensor(np.ascontiguousarray(g[:, s]))).sum().backward()
    _grads_match(model, ref)
    # RowwiseParallel(input_layouts=Replicate()): the whole input, sliced on this rank
    lin, rlin = nn.Linear(H, C), nn.Linear(H, C)
    rlin.load_state_dict(lin.state_dict())
    parallelize_module(lin, mesh, RowwiseParallel(input_layouts=Replicate(), use_local_output=False))
    z = rng.standard_normal((B, H)).astype(np.float32)
    out = lin(hp.tensor(z))
    assert isinstance(out, DTensor) and out.placements == (Replicate(),)
    np.testing.assert_allclose(out.full_tensor()._data, rlin(hp.tensor(z))._data, rtol=1e-5, atol=1e-6)


class _Probe(nn.Module):
    def forward(self, a, b=None):
        self.seen = a
        return a * 2.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("local", [False, True])
def test_prepare_module_input_and_output(local):
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = _mesh()
    rng = np.random.default_rng(8)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    s = slice(r * T // n, (r + 1) * T // n)
    m = _Probe()
    parallelize_module(m, mesh, PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(),
                                                   use_local_output=local))
    xs = hp.tensor(np.ascontiguousarray(x[:, s]), requires_grad=True)
    out = m(xs)
    if local:
        assert not isinstance(m.seen, DTensor) and tuple(m.seen.shape) == (B, T, C)
        full = out
    else:
        assert isinstance(m.seen, DTensor) and m.seen.placements == (Replicate(),)
        full = out.to_local()
    np.testing.assert_allclose(full._data, 2 * x, rtol=1e-6)
    full.sum().backward()
    np.testing.assert_allclose(xs.grad._data, np.full((B, T // n, C), 2.0), rtol=1e-6)
    assert PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1)).use_local_output is False
    # PrepareModuleOutput: Replicate -> Shard(1), local by default (PyTorch's use_local_output=True)
    m2 = _Probe()
    parallelize_module(m2, mesh, PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                     use_local_output=not local))
    xr = hp.tensor(x, requires_grad=True)
    o = m2(xr)
    if local:  # use_local_output=False
        assert isinstance(o, DTensor) and o.placements == (Shard(1),) and tuple(o.shape) == (B, T, C)
        o = o.to_local()
    assert tuple(o.shape) == (B, T // n, C)
    np.testing.assert_allclose(o._data, 2 * x[:, s], rtol=1e-6)
    o.sum().backward()
    # Replicate -> Shard backward: the Shard(1) gradient all-gathered (PyTorch's), the whole of d(sum)/dx
    np.testing.assert_allclose(xr.grad._data, np.full((B, T, C), 2.0), rtol=1e-6)


@pytest.mark.timeout(120)
def test_sequence_parallel_output_is_a_dtensor_by_default():
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = _mesh()
    hp.manual_seed(4)
    norm = nn.LayerNorm(C)
    ref = nn.LayerNorm(C)
    ref.load_state_dict(norm.state_dict())
    parallelize_module(norm, mesh, SequenceParallel())
    rng = np.random.default_rng(9)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    s = slice(r * T // n, (r + 1) * T // n)
    y = norm(hp.tensor(np.ascontiguousarray(x[:, s])))
    assert isinstance(y, DTensor) and y.placements == (Shard(1),) and tuple(y.shape) == (B, T, C)
    np.testing.assert_allclose(y.full_tensor()._data, ref(hp.tensor(x))._data, rtol=1e-5, atol=1e-6)
    # a DTensor input of another layout is redistributed to Shard(sequence_dim)
    y2 = norm(distribute_tensor(hp.tensor(x), mesh, [Replicate()]))
    np.testing.assert_allclose(y2.to_local()._data, y.to_local()._data, rtol=1e-6)
    norm2 = nn.LayerNorm(C)
    parallelize_module(norm2, mesh, SequenceParallel(use_local_output=True))
    assert not isinstance(norm2(hp.tensor(np.ascontiguousarray(x[:, s]))), DTensor)


class Head(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        hp.manual_seed(seed)
        self.proj = nn.Linear(C, C)
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, x):
        return self.head(self.proj(x))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["mean", "sum", "none", "ignore+weight", "3d"])
def test_loss_parallel_matches_cross_entropy(case, monkeypatch):
    from hpcfsdp.distributed.tensor.parallel import loss_parallel
    from hpcfsdp.distributed.tensor.parallel.loss import loss_parallel as same

    assert same is loss_parallel
    mesh = _mesh()
    ref, model = Head(4), Head(4)
    parallelize_module(model, mesh, {"proj": ColwiseParallel(output_layouts=Replicate()),
                                     "head": ColwiseParallel(use_local_output=False)})
    rng = np.random.default_rng(11)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    tgt = rng.integers(0, V, (B, T))
    kw = {"reduction": case if case in ("mean", "sum", "none") else "mean"}
    if case == "ignore+weight":
        tgt[0, :3] = -100
        kw["weight"] = hp.tensor(rng.uniform(0.5, 2.0, V).astype(np.float32))

    def loss_of(logits, t):
        if case == "3d":  # (B, V, T): the class dim 1, sharded
            return nn.functional.cross_entropy(logits.transpose(1, 2), hp.tensor(t), **kw)
        return nn.functional.cross_entropy(logits, hp.tensor(t.reshape(-1)), **kw)

    xr = hp.tensor(x.reshape(-1, C) if case != "3d" else x)
    rl = loss_of(ref(xr), tgt)
    go = rng.standard_normal(tuple(rl.shape)).astype(np.float32)
    (rl * hp.tensor(go)).sum().backward()
    logits = model(hp.tensor(x.reshape(-1, C) if case != "3d" else x))
    assert isinstance(logits, DTensor) and isinstance(logits.placements[0], Shard)
    with loss_parallel(), monkeypatch.context() as mp:
        mp.setattr(DTensor, "full_tensor", lambda *a, **k: pytest.fail("loss_parallel gathered the logits"))
        loss = loss_of(logits, tgt)
        assert isinstance(loss, DTensor) and loss.placements == (Replicate(),) and loss.shape == rl.shape
        np.testing.assert_allclose(loss.to_local()._data, rl._data, rtol=1e-5, atol=1e-6)
        (loss.to_local() * hp.tensor(go)).sum().backward()
    _grads_match(model, ref)


@pytest.mark.timeout(60)
def test_cross_entropy_on_a_dtensor_outside_loss_parallel_gathers():
    mesh = _mesh()
    rng = np.random.default_rng(12)
    z = rng.standard_normal((6, V)).astype(np.float32)
    t = rng.integers(0, V, 6)
    ref = hp.tensor(z, requires_grad=True)
    want = nn.functional.cross_entropy(ref, hp.tensor(t))
    want.backward()
    leaf = distribute_tensor(hp.tensor(z), mesh, [Shard(1)])
    leaf.requires_grad_(True)
    got = nn.functional.cross_entropy(leaf, hp.tensor(t))
    assert isinstance(got, DTensor) and got.placements == (Replicate(),)
    np.testing.assert_allclose(got.to_local().item(), want.item(), rtol=1e-6)
    got.to_local().backward()
    assert isinstance(leaf.grad, DTensor) and leaf.grad.placements == (Shard(1),)
    np.testing.assert_allclose(leaf.grad.full_tensor()._data, ref.grad._data, rtol=1e-5, atol=1e-7)


INITS = {
    "normal_": lambda t: nn.init.normal_(t, 0.5, 2.0),
    "uniform_": lambda t: nn.init.uniform_(t, -1.0, 3.0),
    "trunc_normal_": lambda t: nn.init.trunc_normal_(t, std=0.8, a=-1.0, b=1.0),
    "trunc_normal_tail": lambda t: nn.init.trunc_normal_(t, mean=0.0, std=1.0, a=5.0, b=6.0),
    "kaiming_uniform_": lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)),
    "kaiming_normal_": lambda t: nn.init.kaiming_normal_(t, mode="fan_out"),
    "xavier_uniform_": lambda t: nn.init.xavier_uniform_(t),
    "xavier_normal_": lambda t: nn.init.xavier_normal_(t, gain=2.0),
    "Tensor.normal_": lambda t: t.normal_(1.0, 0.5),
    "Tensor.uniform_": lambda t: t.uniform_(-2.0, 2.0),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("uneven", [False, True])
@pytest.mark.parametrize("mode", ["blocks-of-7", "spans", "a-jump-per-run", "a-jump-per-run-float64"])
@pytest.mark.parametrize("how", sorted(INITS))
def test_random_init_of_a_sharded_tensor_equals_the_unsharded_one(how, mode, uneven, monkeypatch):
    """Uniform and normal fills skip to the shard's runs (in blocks of 7 values here, or 4M; "a-jump-per-run": every
    run its own jump, after an odd number of float32 values so PCG64 holds a half, and normal runs that start or end
    inside a Box-Muller pair). Uneven: 7 x 5, an odd count (the last pair's partner drawn) and short shards."""
    from hpcfsdp import random as hp_random
    from hpcfsdp.distributed.tensor._rules import random as rules

    if mode == "blocks-of-7":
        monkeypatch.setattr(rules, "_BLOCK", 7)
    if mode.startswith("a-jump-per-run"):
        monkeypatch.setattr(hp_random, "_GAP", 1)
    dtype = hp.float64 if mode.endswith("float64") else hp.float32
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = _mesh()
    shape = (7, 5) if uneven else (4 * n, 3 * n)

    def seed():
        hp.manual_seed(123)
        if mode.startswith("a-jump-per-run"):
            hp.rand(3)  # an odd count of float32 values: the generator keeps a 32-bit half

    seed()
    ref = hp.zeros(shape, dtype=dtype)
    with hp.no_grad():
        INITS[how](ref)
    after_ref = hp.rand(5)._data
    for placement in (Shard(0), Shard(1), Replicate()):
        seed()
        dt = distribute_tensor(hp.zeros(shape, dtype=dtype), mesh, [placement])
        with hp.no_grad():
            out = INITS[how](dt)
        assert out is dt and isinstance(dt, DTensor) and dt.placements == (placement,)
        np.testing.assert_array_equal(dt._data, _slice(ref._data, placement, n, r), err_msg=str(placement))
        np.testing.assert_array_equal(hp.rand(5)._data, after_ref)  # the generator ends where the plain fill does


@pytest.mark.timeout(120)
def test_a_random_fill_of_a_shard_draws_only_the_shards_values(monkeypatch):
    """Skip-ahead, not the whole stream: a Shard(0) fill, uniform or normal, hands its sink this rank's values only,
    and a normal fill draws this rank's uniforms only, with at most a partner at each end of its run (See [Note:
    Normal values at fixed positions])."""
    from hpcfsdp import _normal_math
    from hpcfsdp.distributed.tensor._rules import random as rules

    drawn, uniforms = [], []
    put = rules._ShardSink.put_range
    monkeypatch.setattr(rules._ShardSink, "put_range", lambda self, start, v: (drawn.append(v.shape[0]), put(self, start, v)))
    u64 = _normal_math.uniform64
    monkeypatch.setattr(_normal_math, "uniform64", lambda gen, k: (uniforms.append(k), u64(gen, k))[1])
    n = dist.get_world_size()
    dt = distribute_tensor(hp.zeros(256 * n + 3, 65), _mesh(), [Shard(0)])  # 65 columns: runs start mid-pair
    with hp.no_grad():
        nn.init.kaiming_uniform_(dt, a=math.sqrt(5))
        assert sum(drawn) == dt._data.size and dt._data.size < dt.numel()
        drawn.clear()
        dt.uniform_(-1, 1)
        assert sum(drawn) == dt._data.size
        for fill in (lambda: nn.init.normal_(dt), lambda: dt.normal_(1.0, 2.0), lambda: nn.init.kaiming_normal_(dt),
                     lambda: nn.init.xavier_normal_(dt)):
            drawn.clear()
            uniforms.clear()
            fill()
            assert sum(drawn) == dt._data.size
            assert dt._data.size <= sum(uniforms) <= dt._data.size + 2
        drawn.clear()
        nn.init.trunc_normal_(dt, std=0.02)
        assert sum(drawn) == dt._data.size


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["hp.Generator", "numpy-Generator", "numpy-RandomState"])
def test_a_sharded_fill_from_a_generator_argument_equals_the_plain_fill_and_moves_it_alike(kind, monkeypatch):
    """generator= (an hp.Generator, or a NumPy generator as nn.init takes): values and the generator's state after
    as the plain fill's. A RandomState cannot be advanced: its sharded normal fill draws the whole stream."""
    from hpcfsdp import _normal_math

    def make():
        if kind == "hp.Generator":
            return hp.Generator().manual_seed(31)
        return np.random.default_rng(31) if kind == "numpy-Generator" else np.random.RandomState(31)

    def next_draws(g):
        return hp.rand(4, generator=g)._data if kind == "hp.Generator" else \
            (g.random(4) if kind == "numpy-Generator" else g.random_sample(4))

    uniforms = []
    u64 = _normal_math.uniform64
    monkeypatch.setattr(_normal_math, "uniform64", lambda gen, k: (uniforms.append(k), u64(gen, k))[1])
    n, r = dist.get_world_size(), dist.get_rank()
    fills = {"normal_": lambda t, g: nn.init.normal_(t, 0.0, 0.3, generator=g),
             "kaiming_normal_": lambda t, g: nn.init.kaiming_normal_(t, generator=g),
             "xavier_normal_": lambda t, g: nn.init.xavier_normal_(t, generator=g),
             "trunc_normal_": lambda t, g: nn.init.trunc_normal_(t, std=0.5, generator=g)}
    if kind == "hp.Generator":
        fills["Tensor.normal_"] = lambda t, g: t.normal_(2.0, 0.1, generator=g)
    for name, fill in fills.items():
        for placement in (Shard(0), Shard(1)):
            g = make()
            ref = hp.zeros(7, 3 * n + 1)
            with hp.no_grad():
                fill(ref, g)
            after = next_draws(g)
            g = make()
            dt = distribute_tensor(hp.zeros(7, 3 * n + 1), _mesh(), [placement])
            uniforms.clear()
            with hp.no_grad():
                fill(dt, g)
            np.testing.assert_array_equal(dt._data, _slice(ref._data, placement, n, r), err_msg=f"{name} {placement}")
            np.testing.assert_array_equal(next_draws(g), after, err_msg=f"{name} {placement}")
            if kind == "numpy-RandomState" and name != "trunc_normal_":
                assert sum(uniforms) == 7 * (3 * n + 1) + (7 * (3 * n + 1)) % 2  # drawn whole


@pytest.mark.timeout(120)
def test_meta_model_to_empty_then_init_matches_the_unsharded_model():
    n = dist.get_world_size()
    mesh = _mesh()
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}

    def init(m):
        hp.manual_seed(7)
        with hp.no_grad():
            for name, p in m.named_parameters():
                (nn.init.trunc_normal_(p, std=0.02) if p.ndim == 2 else nn.init.normal_(p, std=0.1))

    ref = MLP(0)
    init(ref)
    with hp.device("meta"):
        model = MLP(0)
    parallelize_module(model, mesh, plan)
    model.to_empty(device="cpu")
    init(model)
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert isinstance(p, DTensor) and p._data.size * (n if isinstance(p.placements[0], Shard) else 1) == p.numel()
        np.testing.assert_array_equal(p.full_tensor()._data, refp[name]._data, err_msg=name)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_llama_attention_split_by_heads_matches_the_unsharded_model(sequence_parallel):
    from hpcfsdp.models import Llama, LlamaConfig

    n = dist.get_world_size()
    mesh = _mesh()
    cfg = LlamaConfig(vocab_size=V, block_size=T, n_layer=2, n_head=8, n_kv_head=4, n_embd=32,
                      intermediate_size=48)
    hp.manual_seed(21)
    ref = Llama(cfg)
    model = Llama(cfg)
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, mesh, model.tp_plan(sequence_parallel=sequence_parallel))
    q = model.model.layers[0].self_attn.q_proj.weight
    k = model.model.layers[0].self_attn.k_proj.weight
    assert q.placements == (Shard(0),) and q.to_local().shape[0] == 8 * 4 // n
    assert k.to_local().shape[0] == 4 * 4 // n
    opt = hp.optim.AdamW(model.parameters(), lr=1e-2)
    ropt = hp.optim.AdamW(ref.parameters(), lr=1e-2)
    rng = np.random.default_rng(13)
    for _ in range(3):
        idx = hp.tensor(rng.integers(0, V, (B, T)))
        tgt = hp.tensor(rng.integers(0, V, (B, T)))
        logits, loss = model(idx, tgt)
        rlogits, rloss = ref(idx, tgt)
        np.testing.assert_allclose(loss.item(), rloss.item(), rtol=1e-5)
        np.testing.assert_allclose(logits._data, rlogits._data, rtol=1e-4, atol=1e-5)
        loss.backward()
        rloss.backward()
        _grads_match(model, ref)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
    refp = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(_full(p), refp[name]._data, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtensor_activations", [False, True])
def test_uneven_linear_split_as_torch_chunk(dtensor_activations):
    n = dist.get_world_size()
    mesh = _mesh()
    hidden = 3 * n - 1  # torch.chunk pieces of different sizes (none empty: F.linear of a 0-row weight fails)

    class Uneven(nn.Module):
        def __init__(self):
            super().__init__()
            hp.manual_seed(31)
            self.up = nn.Linear(C, hidden)
            self.down = nn.Linear(hidden, C)
            self.out = nn.Linear(C, hidden)

        def forward(self, x):
            return self.out(self.down(nn.functional.relu(self.up(x))))

    ref, model = Uneven(), Uneven()
    parallelize_module(model, mesh, {"up": ColwiseParallel(use_local_output=not dtensor_activations),
                                     "down": RowwiseParallel(), "out": ColwiseParallel(output_layouts=Replicate())})
    rng = np.random.default_rng(14)
    x = rng.standard_normal((B, C)).astype(np.float32)
    g = rng.standard_normal((B, hidden)).astype(np.float32)
    yr = ref(hp.tensor(x))
    (yr * hp.tensor(g)).sum().backward()
    if dtensor_activations:
        h = model.up(hp.tensor(x))
        assert isinstance(h, DTensor) and tuple(h.shape) == (B, hidden)
    y = model(hp.tensor(x))
    assert not isinstance(y, DTensor) and tuple(y.shape) == (B, hidden)
    np.testing.assert_allclose(y._data, yr._data, rtol=1e-5, atol=1e-6)
    (y * hp.tensor(g)).sum().backward()
    _grads_match(model, ref)
