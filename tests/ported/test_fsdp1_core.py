"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_core.py (parity with DDP over backward prefetch and
forward prefetch, parameter changes after init, no_grad eval), test_fsdp_multiple_forward.py,
test_fsdp_input.py (input types), test_fsdp_uneven.py, test_fsdp_multiple_wrapping.py and the CPU-meaningful part of
test_fsdp_backward_prefetch.py (training is unchanged by the prefetch mode) on CPU."""
import pytest

from _common import (
    TransformerBlock,
    Transformer,
    allreduce_avg_grads,
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_cpu,
    fsdp1_full_params,
    fsdp1_train_parity,
    fsdp1_units,
    local,
    randint,
    randn,
    to_np,
    world,
)
from _framework import FSDP, BackwardPrefetch, F, ModuleWrapPolicy, dist, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


def _fsdp(module, **kwargs):
    return FSDP(module, device_id=fsdp1_cpu(), **kwargs)


class Nested(nn.Module):
    """common_fsdp.NestedWrappedModule's shape: linear, (wrapped (wrapped linear), linear), wrapped linear,
    linear; ``wrap_everything`` wraps every linear."""

    def __init__(self, wrap_everything=False, **fsdp_kwargs):
        super().__init__()
        torch.manual_seed(0)
        wrap = (lambda m: _fsdp(m, **fsdp_kwargs)) if fsdp_kwargs.pop("_wrap", True) else (lambda m: m)
        every = wrap if wrap_everything else (lambda m: m)
        self.module = nn.Sequential(
            every(nn.Linear(8, 4)),
            wrap(nn.Sequential(wrap(nn.Linear(4, 16)), every(nn.Linear(16, 16)))),
            wrap(nn.Linear(16, 4)),
            every(nn.Linear(4, 8)),
        )

    def forward(self, x):
        return self.module(x)


def _prefetch_kwargs(backward_prefetch, forward_prefetch):
    bp = getattr(BackwardPrefetch, backward_prefetch) if backward_prefetch else None
    return dict(backward_prefetch=bp, forward_prefetch=forward_prefetch)


@pytest.mark.parametrize("wrap_everything", [False, True], ids=["nested", "nested_all_wrapped"])
@pytest.mark.parametrize("backward_prefetch", ["BACKWARD_PRE", "BACKWARD_POST", None])
def test_nested_wrapped_model(wrap_everything, backward_prefetch):
    """TestParityWithDDP.test_nested_wrapped_model / test_nested_all_wrapped_model: hand-nested FSDP
    instances train as the unsharded reference, for every backward prefetch mode (forward prefetch on
    with BACKWARD_POST)."""
    w, _ = world()
    kw = _prefetch_kwargs(backward_prefetch, backward_prefetch == "BACKWARD_POST")
    ref = Nested(_wrap=False)
    model = _fsdp(Nested(wrap_everything=wrap_everything, **kw), **kw)
    assert len(fsdp1_units(model)) == (7 if wrap_everything else 4)
    fsdp1_train_parity(ref, model, lambda it: randn(2 * w, 8, seed=it), iters=3,
                       optim_cls=lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9))


@pytest.mark.parametrize("backward_prefetch", ["BACKWARD_PRE", "BACKWARD_POST", None])
@pytest.mark.parametrize("forward_prefetch", [False, True])
def test_transformer_parameterized(backward_prefetch, forward_prefetch):
    """TestParityWithDDP.test_transformer_parameterized (a transformer with shared embedding/output
    weights, auto-wrapped per block) and test_fsdp_backward_prefetch.py's model under each prefetch mode
    (its assertions on which FlatParamHandle is prefetched are private): training equals the reference."""
    w, _ = world()
    torch.manual_seed(0)
    model = Transformer(weight_tying=True)
    ref = copy_model(model)
    fsdp = _fsdp(model, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), use_orig_params=True,
                 **_prefetch_kwargs(backward_prefetch, forward_prefetch))
    fsdp1_train_parity(ref, fsdp, lambda it: randint(17, 2 * w, 6, seed=it), iters=2)


class MoE(nn.Module):
    """common_fsdp.MixtureOfExperts' point: a shared part sharded over the world and an expert whose
    parameters differ per rank, wrapped by its own FSDP instance over a group of one rank."""

    def __init__(self, expert_group=None):
        super().__init__()
        _, r = world()
        torch.manual_seed(0)
        self.shared_in = nn.Linear(4, 8)
        torch.manual_seed(100 + r)
        expert = nn.Linear(8, 8)
        self.expert = expert if expert_group is None else _fsdp(expert, process_group=expert_group)
        torch.manual_seed(1)
        self.shared_out = nn.Linear(8, 4)

    def forward(self, x):
        return self.shared_out(F.relu(self.expert(F.relu(self.shared_in(x)))))


def test_mixture_of_experts():
    """TestParityWithDDP.test_mixture_of_experts: an expert FSDP instance over a one-rank group inside an
    FSDP root over the world trains as DDP by hand that averages only the shared gradients (DummyDDP)."""
    w, r = world()
    groups = [dist.new_group([i]) for i in range(w)]  # every rank creates every group
    ref = MoE()
    model = _fsdp(MoE(expert_group=groups[r]))
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_optim = torch.optim.SGD(ref.parameters(), lr=0.05)
    for it in range(3):
        x = local(randn(2 * w, 4, seed=it))
        loss = model(x).sum()
        loss.backward()
        ref_loss = ref(x).sum()
        ref_loss.backward()
        assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5, msg=f"loss at iter {it}")
        for name, p in ref.named_parameters():
            if not name.startswith("expert"):
                dist.all_reduce(p.grad)
                p.grad.div_(w)
        optim.step()
        ref_optim.step()
        optim.zero_grad()
        ref_optim.zero_grad()
    with FSDP.summon_full_params(model.expert, writeback=False):
        expert = {n: to_np(p) for n, p in model.expert.named_parameters()}
    for n, p in ref.expert.named_parameters():
        assert_close(expert[n], to_np(p), rtol=1e-4, atol=1e-5, msg=f"expert {n}")
    full = fsdp1_full_params(model)
    for n, p in ref.named_parameters():
        if not n.startswith("expert"):
            assert_close(full[n], to_np(p), rtol=1e-4, atol=1e-5, msg=n)


def test_param_change_after_init():
    """TestParamInit.test_param_change_after_init: changing a (sharded) parameter in place after wrapping
    changes the output."""
    w, _ = world()
    x = randn(2, 8, seed=3)
    ref_out = _fsdp(Nested())(x)
    model = _fsdp(Nested())
    first = next(model.parameters())
    with torch.no_grad():
        first.data.mul_(3.0).add_(1.0)
    new_out = model(x)
    assert (abs(to_np(ref_out) - to_np(new_out)) > 1e-6).any()


def test_transformer_no_grad():
    """TestNoGrad.test_transformer_no_grad: after a training step, eval with and without no_grad agree."""
    w, _ = world()
    torch.manual_seed(0)
    model = _fsdp(Transformer(weight_tying=True), auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    model(local(randint(17, 2 * w, 6, seed=0))).sum().backward()
    optim.step()
    model.eval()
    x = randint(17, 2, 6, seed=1)
    out = model(x)
    with torch.no_grad():
        out_no_grad = model(x)
    assert_close(out_no_grad, out, rtol=1e-6, atol=1e-6)


class TwiceInner(nn.Module):
    """test_fsdp_multiple_forward.Model: the inner (wrapped) linear runs twice per forward."""

    def __init__(self, wrap_fsdp):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Linear(4, 4)
        if wrap_fsdp:
            self.inner = _fsdp(self.inner)
        self.outer = nn.Linear(4, 5)

    def forward(self, x):
        return self.outer(self.inner(x) + self.inner(x))


def test_multi_forward():
    """TestMultiForward.test_multi_forward: a nested instance used twice in one forward trains as DDP."""
    w, _ = world()
    ddp = TwiceInner(wrap_fsdp=False)
    model = _fsdp(TwiceInner(wrap_fsdp=True))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_optim = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for it in range(3):
        x = local(randn(4 * w, 4, seed=it))
        x.requires_grad_(True)
        model(x).sum().backward()
        ddp(x).sum().backward()
        allreduce_avg_grads(ddp)
        for o in (optim, ddp_optim):
            o.step()
            o.zero_grad()
    full = fsdp1_check_params(ddp, model)
    assert len(full) == len(list(ddp.parameters()))  # every parameter, the one used twice included


class ContainerInput(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 4)

    def forward(self, inp):
        if isinstance(inp, list):
            return self.layer(inp[0])
        assert isinstance(inp, dict), type(inp)
        return self.layer(inp["in"])


def _pack(kind, x):
    return [x] if kind == "list" else {"in": x}


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_input_type(kind):
    """TestInput.test_input_type: a list or dict input reaches the module and trains as the reference."""
    w, _ = world()
    model = ContainerInput()
    ref = copy_model(model)
    fsdp = _fsdp(model)
    losses = fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it), iters=3,
                                loss_fn=lambda m, x: m(_pack(kind, x)).sum(),
                                optim_cls=lambda p, lr: torch.optim.SGD(p, lr=0.1))
    assert len(losses) == 3 and len(set(losses)) == 3  # the container input trained the layer


def test_one_iteration_uneven():
    """TestUnevenParamShard.test_one_iteration: a 3x3 weight (9 elements, uneven over the ranks) gives each
    rank's output and, after one SGD step, the weight of the hand-computed global update."""
    w, r = world()
    torch.manual_seed(0)
    lin = nn.Linear(3, 3, bias=False)
    inp = randn(8, 3, seed=5)
    lr = 0.1
    weight = to_np(lin.weight)  # (out, in)
    x = to_np(inp)
    ref_out = x[r] @ weight.T
    grad = x[:w].sum(0)[None, :].repeat(3, 0) / w  # d/dW of sum(W x) averaged over the ranks
    ref_weight = weight - lr * grad
    model = _fsdp(lin)
    optim = torch.optim.SGD(model.parameters(), lr=lr)
    out = model(inp[r])
    out.float().sum().backward()
    optim.step()
    optim.zero_grad()
    assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    full = fsdp1_full_params(model)
    assert_close(full["weight"], ref_weight, rtol=1e-5, atol=1e-6)


class InnerModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(_fsdp(nn.Linear(5, 5)))

    def forward(self, x):
        return self.layers(x)


def test_multiple_wrapping():
    """TestMultipleWrapping.test_multiple_wrapping: after training, wrapping the (already wrapped) inner
    model again for inference gives the same output."""
    inner = InnerModel()
    model = _fsdp(inner)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    for it in range(3):
        x = randn(1, 5, seed=it)
        x.requires_grad_(True)
        model(x).sum().backward()
        optim.step()
        optim.zero_grad()
    x = randn(1, 5, seed=7)
    out = model(x)
    rewrapped = _fsdp(inner)
    assert_close(rewrapped(x), out, rtol=1e-6, atol=1e-6)


class MultiTraversal(nn.Module):
    """test_fsdp_fine_tune's multi-traversal module: ``layer_no_grad`` (frozen) and ``layer_with_grad`` run
    several times per forward, ``layer_with_grad`` once more per round under no_grad (added in place)."""

    def __init__(self, rounds=3):
        super().__init__()
        torch.manual_seed(42)
        self.rounds = rounds
        self.layer_0 = nn.Linear(5, 5)
        self.layer_no_grad = nn.Linear(5, 5)
        self.layer_with_grad = nn.Linear(5, 5)
        self.layer_no_grad.requires_grad_(False)

    def forward(self, x):
        x = self.layer_0(x)
        for _ in range(self.rounds):
            x = self.layer_no_grad(self.layer_with_grad(x))
            with torch.no_grad():
                x += self.layer_with_grad(x)
        return x


@pytest.mark.parametrize("forward_prefetch", [False, True])
@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_hooks_multi_traversal(strategy, use_orig_params, forward_prefetch):
    """TestFSDPFineTune.test_hooks_multi_traversal: with every Linear its own unit, layers used several
    times per forward (with and without grad, one frozen) train as DDP by hand (Adam); the input requires
    grad on every other iteration."""
    from _framework import ShardingStrategy

    w, _ = world()
    ddp = MultiTraversal()
    model = _fsdp(copy_model(ddp), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                  sharding_strategy=getattr(ShardingStrategy, strategy), use_orig_params=use_orig_params,
                  forward_prefetch=forward_prefetch)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ddp_optim = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    for it in range(4):
        x = local(randn(2 * w, 5, seed=it))
        x.requires_grad_(it % 2 == 1)
        loss = model(x).sum()
        loss.backward()
        ddp_loss = ddp(x).sum()
        ddp_loss.backward()
        allreduce_avg_grads(ddp)
        assert_close(loss, ddp_loss, rtol=1e-4, atol=1e-5, msg=f"loss at iter {it}")
        for o in (optim, ddp_optim):
            o.step()
            o.zero_grad()
    fsdp1_check_params(ddp, model)


class FakeLinear(nn.Module):
    """test_fsdp_meta's FakeLinear: a bare (in, out) weight, not an nn.Linear (so not wrapped by the policy)."""

    def __init__(self, in_dim, out_dim, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn((in_dim, out_dim), device=device))

    def forward(self, x):
        return x @ self.weight


class MetaMPModel(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.lin1 = nn.Linear(5, 5, device=device)
        self.lin2 = FakeLinear(5, 5, device=device)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.lin2(self.relu(self.lin1(x)))


def _meta_mp_init(module):
    """Deterministic values (the same on every rank and framework) for the modules of MetaMPModel."""
    with torch.no_grad():
        if isinstance(module, nn.Linear):
            module.weight.copy_(0.1 * randn(5, 5, seed=11))
            module.bias.zero_()
        elif isinstance(module, FakeLinear):
            module.weight.copy_(0.1 * randn(5, 5, seed=12))


def test_meta_device_with_mixed_precision():
    """TestFSDPWithMetaDevice.test_meta_device_with_mixed_precision: a meta model (an nn.Linear unit by
    policy plus a root owning a non-Linear parameter) materialized by param_init_fn under
    MixedPrecision(param_dtype=float32, reduce_dtype=float16) constructs, and (beyond upstream, which only
    constructs) trains as the unsharded reference built with the same init."""
    from _framework import MixedPrecision

    w, _ = world()

    def param_init_fn(module):  # materializes only what is still on meta (called per module or per subtree)
        for m in module.modules():
            if any(p.is_meta for p in m.parameters(recurse=False)):
                m.to_empty(device=fsdp1_cpu(), recurse=False)
                _meta_mp_init(m)

    meta = MetaMPModel(device="meta")
    assert all(p.is_meta for p in meta.parameters())
    model = _fsdp(meta, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), param_init_fn=param_init_fn,
                  mixed_precision=MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float16))
    assert len(fsdp1_units(model)) == 2
    ref = MetaMPModel()
    ref.apply(_meta_mp_init)
    fsdp1_train_parity(ref, model, lambda it: randn(2 * w, 5, seed=it), iters=2, rtol=2e-3, atol=2e-3,
                       optim_cls=lambda p, lr: torch.optim.SGD(p, lr=0.1))
