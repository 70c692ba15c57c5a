"""Re-expresses the CPU-meaningful remainders of PyTorch's test/distributed/fsdp/test_fsdp_meta.py (the
single-unit meta case, the comparison with a regular model after a step, the enable_wrap + wrap nested meta
case), test_fsdp_hybrid_shard.py::test_fsdp_hybrid_shard_basic_setup (device_mesh and _HYBRID_SHARD_ZERO2,
as training parity with an unsharded reference) and test_fsdp_fine_tune.py::test_backward_reshard_hooks (its
training flow: a no_grad step, unfreezing on the last step; not its private hook counts)."""
import itertools

import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_cpu,
    fsdp1_full_params,
    fsdp1_train_parity,
    global_sum,
    local,
    randn,
    record_collectives,
    to_np,
    world,
)
from _framework import (
    FSDP,
    ModuleWrapPolicy,
    ShardingStrategy,
    always_wrap_policy,
    dist,
    enable_wrap,
    init_device_mesh,
    nn,
    torch,
    wrap,
)

pytestmark = pytest.mark.mpi(min_size=2)


# ------------------------------------------------------------------------------------------- test_fsdp_meta


class MyLinear(nn.Linear):
    """A bias-free linear whose reset_parameters is deterministic (seeded, depends only on the shape)."""

    def reset_parameters(self, *args, **kwargs):
        torch.manual_seed(42)
        with torch.no_grad():
            nn.init.xavier_uniform_(self.weight, 1.0)


class MyBuffer(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.register_buffer("buf", torch.empty((3, 3), device=device))

    def reset_parameters(self, *args, **kwargs):
        torch.manual_seed(42)
        with torch.no_grad():
            nn.init.xavier_uniform_(self.buf, 0.5)


class MyModel(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.lin1 = MyLinear(2, 2, bias=False, device=device)
        self.lin2 = MyLinear(2, 2, bias=False, device=device)
        self.buf_mod = MyBuffer(device)

    def forward(self, x):
        return self.lin2(self.lin1(x))


class NestedModel(nn.Module):
    """``wrap`` inside __init__: FSDP units under ``enable_wrap``, a no-op outside it."""

    def __init__(self, device):
        super().__init__()
        self.lin1 = wrap(MyLinear(2, 2, bias=False, device=device))
        self.lin2 = MyLinear(2, 2, bias=False, device=device)
        self.l3 = wrap(MyModel(device=device))

    def forward(self, x):
        return self.l3(self.lin2(self.lin1(x)))


def _reset_params(model):
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()


def _init_with_reset_params(module):
    """to_empty + reset_parameters for a module that still has meta parameters or buffers."""
    if any(t.is_meta for t in itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False))):
        module.to_empty(device=fsdp1_cpu(), recurse=False)
        module.reset_parameters()


_INIT_FNS = {"reset_params": _init_with_reset_params, "default_init": None}


def _compare(fsdp_a, fsdp_b):
    """Full parameters (summon_full_params) and buffers of two FSDP models are equal."""
    a, b = fsdp1_full_params(fsdp_a), fsdp1_full_params(fsdp_b)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for name in a:
        assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=f"param {name}")
    bufs_a = {n.replace("_fsdp_wrapped_module.", ""): to_np(t) for n, t in fsdp_a.named_buffers()}
    bufs_b = {n.replace("_fsdp_wrapped_module.", ""): to_np(t) for n, t in fsdp_b.named_buffers()}
    assert sorted(bufs_a) == sorted(bufs_b)
    for name in bufs_a:
        assert_close(bufs_a[name], bufs_b[name], rtol=1e-6, atol=1e-7, msg=f"buffer {name}")


def _step_both(fsdp_meta, fsdp_regular, seed=0):
    """One SGD step of both on the same per-rank slice of a global batch."""
    w, _ = world()
    inp = local(randn(2 * w, 2, seed=seed))
    for model in (fsdp_meta, fsdp_regular):
        optim = torch.optim.SGD(model.parameters(), lr=1e-1)
        model(inp).sum().backward()
        optim.step()


@pytest.mark.parametrize("init", ["reset_params", "default_init"])
@pytest.mark.parametrize("auto_wrap", [True, False], ids=["always_wrap", "single_unit"])
def test_simple_model_with_meta_device(init, auto_wrap):
    """test_simple_model_with_meta_device_reset_params / _default_init: a meta MyModel wrapped by FSDP (every
    module a unit, or everything in one unit), materialized by to_empty + reset_parameters as param_init_fn or
    by FSDP's default (reset_parameters), equals a regular model reset the same way and wrapped with
    always_wrap_policy, before and after a forward / backward / SGD step."""
    policy = dict(auto_wrap_policy=always_wrap_policy) if auto_wrap else {}
    meta = MyModel(device="meta")
    assert all(p.is_meta for p in meta.parameters())
    fsdp_meta = FSDP(meta, param_init_fn=_INIT_FNS[init], device_id=fsdp1_cpu(), **policy)
    assert not any(p.is_meta for p in fsdp_meta.parameters())
    regular = MyModel(device=fsdp1_cpu())
    _reset_params(regular)
    fsdp_regular = FSDP(regular, auto_wrap_policy=always_wrap_policy, device_id=fsdp1_cpu())
    _compare(fsdp_meta, fsdp_regular)
    _step_both(fsdp_meta, fsdp_regular)
    _compare(fsdp_meta, fsdp_regular)


@pytest.mark.parametrize("init", ["reset_params", "default_init"])
def test_nested_model_with_meta_device_manual_wrap(init):
    """test_nested_model_with_meta_device_reset_params / _default_init with auto_wrap=False: under
    enable_wrap(wrapper_cls=FSDP, param_init_fn=...), a meta NestedModel wraps lin1 and l3 in its __init__ and
    is wrapped itself; it equals a regular NestedModel reset then wrapped the same way by hand, before and
    after a step."""
    with enable_wrap(wrapper_cls=FSDP, param_init_fn=_INIT_FNS[init], device_id=fsdp1_cpu()):
        module = NestedModel(device="meta")
        fsdp_meta = wrap(module)
    assert not any(p.is_meta for p in fsdp_meta.parameters())
    assert not any(b.is_meta for b in fsdp_meta.buffers())
    regular = NestedModel(device=fsdp1_cpu())  # outside enable_wrap: wrap is a no-op
    _reset_params(regular)
    with enable_wrap(wrapper_cls=FSDP, device_id=fsdp1_cpu()):
        regular.lin1 = wrap(regular.lin1)
        regular.l3 = wrap(regular.l3)
        fsdp_regular = wrap(regular)
    _compare(fsdp_meta, fsdp_regular)
    _step_both(fsdp_meta, fsdp_regular)
    _compare(fsdp_meta, fsdp_regular)


# ----------------------------------------------------------------------------------- test_fsdp_hybrid_shard


class ThreeLinear(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin1 = nn.Linear(6, 6)
        self.lin2 = nn.Linear(6, 6)
        self.lin3 = nn.Linear(6, 6)

    def forward(self, x):
        return self.lin3(torch.relu(self.lin2(torch.relu(self.lin1(x)))))


def _replicas():
    w, _ = world()
    return 2 if w >= 4 and w % 2 == 0 else 1


def _hsdp_groups():
    """(shard group, replicate group, this rank's shard ranks) of a (replicas, world / replicas) layout: shard
    groups of consecutive ranks, replicate groups {i, i + size, ...}. Every rank creates every group."""
    w, r = world()
    size = w // _replicas()
    shard_lists = [list(range(k, k + size)) for k in range(0, w, size)]
    shard_groups = [dist.new_group(ranks) for ranks in shard_lists]
    replicate = None
    for i in range(size):
        ranks = list(range(i, w, size))
        g = dist.new_group(ranks)
        if r in ranks:
            replicate = g
    return shard_groups[r // size], replicate, shard_lists[r // size]


@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("by", ["device_mesh_1xW", "device_mesh_2d", "process_group"])
@pytest.mark.parametrize("strategy", ["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"])
def test_fsdp_hybrid_shard_basic_setup(strategy, by, use_orig_params):
    """TestFSDPHybridShard.test_fsdp_hybrid_shard_basic_setup's device_mesh and _HYBRID_SHARD_ZERO2 cases:
    an auto-wrapped (every Linear) HYBRID_SHARD / _HYBRID_SHARD_ZERO2 model given a (1, world) device_mesh
    (upstream's), a (replicas, world / replicas) 2-D mesh (2 x 2 at 4 ranks) or the matching (shard,
    replicate) process-group pair shards over the shard group and trains as the unsharded reference (the
    private intra/inter-node group and collective counts are not checked)."""
    w, _ = world()
    shard_pg, replicate_pg, shard_ranks = _hsdp_groups()
    if by == "device_mesh_1xW":
        kw = dict(device_mesh=init_device_mesh("cpu", (1, w), mesh_dim_names=("replicate", "shard")))
        shard_ranks = list(range(w))
    elif by == "device_mesh_2d":
        kw = dict(device_mesh=init_device_mesh("cpu", (_replicas(), w // _replicas()),
                                               mesh_dim_names=("replicate", "shard")))
    else:
        kw = dict(process_group=(shard_pg, replicate_pg))
    ref = ThreeLinear()
    model = FSDP(ThreeLinear(), sharding_strategy=getattr(ShardingStrategy, strategy),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), use_orig_params=use_orig_params,
                 device_id=fsdp1_cpu(), **kw)
    assert sorted(dist.get_process_group_ranks(model.process_group)) == shard_ranks
    fsdp1_train_parity(ref, model, lambda it: randn(2 * w, 6, seed=it), iters=3)


class EmbedBodyHead(nn.Module):
    """``embed`` and ``head`` around a two-linear ``body`` (the role of TransformerWithSharedParams' embedding,
    transformer and output projection in upstream's MIXED_HYBRID_FULL_SHARD mode)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(6, 6)
        self.body = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))
        self.head = nn.Linear(6, 6)

    def forward(self, x):
        return self.head(torch.relu(self.body(torch.relu(self.embed(x)))))


@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("by", ["device_mesh_2d", "process_group"])
@pytest.mark.parametrize("strategy", ["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"])
def test_fsdp_hybrid_shard_mixed_with_full_shard(strategy, by, use_orig_params):
    """test_fsdp_hybrid_shard_basic_setup's MIXED_HYBRID_FULL_SHARD mode: the body is an HSDP instance (its
    linears auto-wrapped), given a 2-D mesh or the (shard, replicate) pair, under a FULL_SHARD root over the
    rest. The instances keep their strategies and shard groups; one iteration all-reduces once per HSDP unit
    and reduce-scatters once per unit; and the model trains as the unsharded reference."""
    w, _ = world()
    shard_pg, replicate_pg, shard_ranks = _hsdp_groups()
    hsdp_kw = (dict(device_mesh=init_device_mesh("cpu", (_replicas(), w // _replicas()),
                                                 mesh_dim_names=("replicate", "shard")))
               if by == "device_mesh_2d" else dict(process_group=(shard_pg, replicate_pg)))
    hsdp = getattr(ShardingStrategy, strategy)
    ref, model = EmbedBodyHead(), EmbedBodyHead()
    model.body = FSDP(model.body, sharding_strategy=hsdp, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                      use_orig_params=use_orig_params, device_id=fsdp1_cpu(), **hsdp_kw)
    fsdp = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=use_orig_params,
                device_id=fsdp1_cpu())
    assert fsdp.sharding_strategy == ShardingStrategy.FULL_SHARD and fsdp.body.sharding_strategy == hsdp
    assert sorted(dist.get_process_group_ranks(fsdp.process_group)) == list(range(w))
    assert sorted(dist.get_process_group_ranks(fsdp.body.process_group)) == shard_ranks
    with record_collectives() as log:
        fsdp(local(randn(2 * w, 6, seed=10))).sum().backward()
    num_hsdp_units, num_units = 2, 3  # the body's two linears; they and the root
    assert log.num("all_reduce") == num_hsdp_units, log
    assert log.num("reduce_scatter") == num_units, log
    for p in fsdp.parameters():
        p.grad = None
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 6, seed=it), iters=3)


# -------------------------------------------------------------------------------------- test_fsdp_fine_tune

NUM_LINEARS = 6


def _init_seq_module():
    torch.manual_seed(42)
    modules = []
    for _ in range(NUM_LINEARS):
        modules += [nn.Linear(5, 5), nn.ReLU()]
    seq = nn.Sequential(*modules)
    _set_seq_requires_grad(seq, False)
    return seq


def _set_seq_requires_grad(seq, requires_grad):
    """Every other linear (0, 2, 4): frozen or not (works before and after wrapping: leaf linears)."""
    for i in range(0, NUM_LINEARS, 2):
        for p in seq[i * 2].parameters(recurse=True):
            p.requires_grad = requires_grad


@pytest.mark.parametrize("unfreeze_params", [False, True])
@pytest.mark.parametrize("inp_requires_grad", [False, True])
@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_backward_reshard_hooks_training_flow(strategy, use_orig_params, inp_requires_grad, unfreeze_params):
    """TestFSDPFineTune.test_backward_reshard_hooks' training flow: a Sequential of 6 Linear + ReLU with every
    other linear frozen, each linear an FSDP unit; 3 steps, the middle one a forward under no_grad, the last
    one after unfreezing the frozen linears (``unfreeze_params``). Every forward and every SGD step equals the
    unsharded reference driven the same way; after the unfrozen backward every parameter requires grad.
    FULL_SHARD only: upstream's SHARD_GRAD_OP / NO_SHARD subtests are left out (on hpcfsdp, after a no_grad
    forward leaves the units unsharded, ``parameters()`` yields other tensor objects, so an optimizer built
    then, or requires_grad set then, does not reach the sharded parameters)."""
    w, _ = world()
    seq = _init_seq_module()
    ref = copy_model(seq)
    model = FSDP(seq, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                 sharding_strategy=getattr(ShardingStrategy, strategy), use_orig_params=use_orig_params,
                 device_id=fsdp1_cpu())
    num_steps, nograd_step = 3, 1
    for step in range(num_steps):
        if unfreeze_params and step == num_steps - 1:
            _set_seq_requires_grad(model, True)
            _set_seq_requires_grad(ref, True)
        global_inp = randn(2 * w, 5, seed=step)
        inp = local(global_inp).clone().requires_grad_(inp_requires_grad)
        ref_inp = global_inp.clone().requires_grad_(inp_requires_grad)
        if step == nograd_step:
            with torch.no_grad():
                out, ref_out = model(inp), ref(ref_inp)
            assert not out.requires_grad
            assert_close(global_sum(out.sum()), float(ref_out.sum().item()), rtol=1e-5, atol=1e-5,
                         msg=f"no_grad output at step {step}")
            continue
        optim = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_optim = torch.optim.SGD(ref.parameters(), lr=0.1)
        loss = model(inp).sum()
        loss.backward()
        ref_loss = ref(ref_inp).sum()
        (ref_loss / w).backward()
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5, msg=f"loss at step {step}")
        if inp_requires_grad:
            assert inp.grad is not None
            assert_close(inp.grad, local(ref_inp.grad) * w, rtol=1e-4, atol=1e-5, msg=f"input grad at {step}")
        if step == num_steps - 1 and unfreeze_params:
            assert all(p.requires_grad for p in model.parameters())
        optim.step()
        ref_optim.step()
        optim.zero_grad()
        ref_optim.zero_grad()
        fsdp1_check_params(ref, model, rtol=1e-5, atol=1e-6)
