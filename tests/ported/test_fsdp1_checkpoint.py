"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_checkpoint.py (activation checkpointing with FSDP1)
and test_fsdp_sharded_grad_scaler.py (ShardedGradScaler) on CPU. PyTorch runs the checkpoint tests on
accelerators only; their point (checkpoint_wrapper outside/inside FSDP, a manual reentrant checkpoint, a
checkpointed submodule) holds on CPU. offload_wrapper / CPUOffload cases are left out (pinned memory)."""
import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_check_params,
    fsdp1_cpu,
    local,
    randn,
    global_sum,
    to_np,
    world,
)
from _framework import (
    FSDP,
    F,
    GradScaler,
    ShardedGradScaler,
    ShardingStrategy,
    checkpoint,
    checkpoint_wrapper,
    dist,
    nn,
    torch,
)

pytestmark = pytest.mark.mpi(min_size=2)


def _fsdp(module, **kwargs):
    return FSDP(module, device_id=fsdp1_cpu(), **kwargs)


class SequentialModule(nn.Module):
    """Three 3x3 linears; each optionally checkpoint-wrapped, then optionally FSDP-wrapped."""

    def __init__(self, checkpoint_layer=False, wrap_fsdp=False, **fsdp_kwargs):
        super().__init__()
        torch.manual_seed(0)
        layers = [nn.Linear(3, 3) for _ in range(3)]
        if checkpoint_layer:
            layers = [checkpoint_wrapper(m) for m in layers]
        if wrap_fsdp:
            layers = [_fsdp(m, **fsdp_kwargs) for m in layers]
        self.ffn = nn.Sequential(*layers)

    def forward(self, x):
        return self.ffn(x)


def _grads(model):
    """Gradients in parameter order (None where this rank holds no piece: PyTorch's use_orig_params)."""
    return [None if p.grad is None else to_np(p.grad) for p in model.parameters()]


def _check_same(outs, losses, models):
    for o, loss in zip(outs[1:], losses[1:]):
        assert_close(o, outs[0], rtol=1e-6, atol=1e-6)
        assert_close(loss, losses[0], rtol=1e-6, atol=1e-6)
    ref = _grads(models[0])
    for m in models[1:]:
        got = _grads(m)
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert (a is None) == (b is None)
            if a is not None:
                assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_checkpoint_fsdp_wrapping(use_orig_params):
    """checkpoint_wrapper(Sequential(FSDP(l1), FSDP(l2), FSDP(l3))) and Sequential(FSDP(checkpoint_wrapper(li)))
    give the outputs, losses and (accumulated) gradients of the un-checkpointed FSDP model."""
    kw = dict(use_orig_params=use_orig_params)
    outer_ckpt = checkpoint_wrapper(SequentialModule(wrap_fsdp=True, **kw))
    inner_ckpt = SequentialModule(checkpoint_layer=True, wrap_fsdp=True, **kw)
    baseline = SequentialModule(wrap_fsdp=True, **kw)
    replica = SequentialModule()
    inp = randn(10, 3, seed=1)
    inp.requires_grad_(True)
    models = [baseline, outer_ckpt, inner_ckpt]
    for _ in range(2):
        outs, losses = [], []
        for m in models:
            out = m(inp)
            loss = out.sum()
            loss.backward()
            outs.append(out)
            losses.append(loss)
        _check_same(outs, losses, models)
        assert_close(outs[0], replica(inp), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_basic_checkpoint_end_to_end(use_orig_params):
    """FSDP(seq), checkpoint_wrapper(FSDP(seq)), FSDP(checkpoint_wrapper(seq)) and checkpoint(FSDP(seq),
    use_reentrant=True) agree in outputs, losses and gradients over several iterations; the FSDP-only
    model equals the unsharded replica in loss."""
    seq = SequentialModule()
    kw = dict(use_orig_params=use_orig_params)
    fsdp_only = _fsdp(copy_model(seq), **kw)
    ckpt_of_fsdp = checkpoint_wrapper(_fsdp(copy_model(seq), **kw))
    fsdp_of_ckpt = _fsdp(checkpoint_wrapper(copy_model(seq)), **kw)
    fsdp_call_ckpt = _fsdp(copy_model(seq), **kw)
    models = [fsdp_only, ckpt_of_fsdp, fsdp_of_ckpt, fsdp_call_ckpt]
    inp = randn(10, 3, seed=2)
    inp.requires_grad_(True)
    for _ in range(3):
        outs, losses = [], []
        for m in models:
            out = checkpoint(m, inp, use_reentrant=True) if m is fsdp_call_ckpt else m(inp)
            loss = out.sum()
            loss.backward()
            outs.append(out)
            losses.append(loss)
        _check_same(outs, losses, models)
        assert_close(losses[0], seq(inp).sum(), rtol=1e-6, atol=1e-6)


class CheckpointModule(nn.Module):
    def __init__(self, use_checkpoint=False):
        super().__init__()
        self.seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(2)])
        self.use_checkpoint = use_checkpoint

    def forward(self, x):
        return checkpoint(self.seq, x, use_reentrant=False) if self.use_checkpoint else self.seq(x)


class WithCheckpointSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.s1 = CheckpointModule()
        self.s2 = CheckpointModule()
        self.l2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.l2(F.relu(self.s2(self.s1(self.l1(x)))))


class CkptTestModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(8, 8)
        self.checkpoint1 = WithCheckpointSubmodule()
        self.checkpoint2 = WithCheckpointSubmodule()
        self.l2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.l2(F.relu(self.checkpoint2(self.checkpoint1(self.l1(x)))))


def test_checkpoint_submodule():
    """TestFSDPCheckpointSubmodule.test_checkpoint_submodule: NO_SHARD instances over submodules that
    checkpoint inner Sequentials (non-reentrant) give the gradients of the same model without checkpointing."""
    model = CkptTestModel()
    model_ac = copy_model(model)
    for m in model_ac.modules():
        if isinstance(m, CheckpointModule):
            m.use_checkpoint = True
    kw = dict(sharding_strategy=ShardingStrategy.NO_SHARD)
    for mm in (model, model_ac):
        mm.checkpoint1 = _fsdp(mm.checkpoint1, **kw)
        mm.checkpoint2 = _fsdp(mm.checkpoint2, **kw)
    x = randn(2, 8, seed=4)
    model(x).sum().backward()
    model_ac(x).sum().backward()
    named, named_ac = list(model.named_parameters()), list(model_ac.named_parameters())
    assert [n for n, _ in named] == [n for n, _ in named_ac]
    for (n, p), (_, q) in zip(named, named_ac):
        assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=n)


# ---------------------------------------------------------------------------------------------- grad scaler


def test_grad_scaling():
    """TestShardGradScaler.test_grad_scaling: scale() multiplies tensors nested in lists and tuples."""
    scaler = ShardedGradScaler(device="cpu", init_scale=2.0, enabled=True)
    t0 = torch.full((1,), 4.0)
    t1 = torch.full((1,), 8.0)
    out = scaler.scale([t1.clone(), (t0.clone(), t1.clone()), [t0.clone(), t1.clone()]])
    assert float(out[0].item()) == 16.0 and float(out[1][0].item()) == 8.0 and float(out[1][1].item()) == 16.0
    assert float(out[2][0].item()) == 8.0 and float(out[2][1].item()) == 16.0


def test_inf_gradients_skip_optim_step():
    """TestShardGradScaler.test_inf_gradients_skip_optim_step: an inf gradient makes step() skip (None)."""
    scaler = ShardedGradScaler(device="cpu", init_scale=2.0, enabled=True)
    t0 = nn.Parameter(torch.tensor([float("inf")]))
    t0.grad = t0.detach().clone()
    opt = torch.optim.SGD([t0], lr=1.0)
    scaler.scale(torch.full((1,), 4.0))
    assert scaler.step(opt) is None


@pytest.mark.parametrize("sharding_strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_fsdp_ddp_parity_with_grad_scaler(sharding_strategy, use_orig_params):
    """TestShardedGradScalerParityWithDDP: FSDP with ShardedGradScaler trains as the unsharded replica with
    GradScaler; an overflow on one rank makes every rank skip the step and back off the scale alike
    (mixed-precision cases left out: float16 numerics of the CPU kernels)."""
    w, r = world()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    ref = copy_model(model)
    fsdp = _fsdp(model, sharding_strategy=getattr(ShardingStrategy, sharding_strategy),
                 use_orig_params=use_orig_params)
    optim = torch.optim.SGD(fsdp.parameters(), lr=0.05)
    ref_optim = torch.optim.SGD(ref.parameters(), lr=0.05)
    scaler = ShardedGradScaler(device="cpu", init_scale=2.0**8)
    ref_scaler = GradScaler("cpu", init_scale=2.0**8)
    for it in range(3):
        gx = randn(2 * w, 4, seed=it)
        loss = fsdp(local(gx)).sum()
        scaler.scale(loss).backward()
        ref_loss = ref(gx).sum()
        ref_scaler.scale(ref_loss / w).backward()
        assert_close(global_sum(loss), float(ref_loss.item()), rtol=1e-5, atol=1e-5)
        scaler.step(optim)
        ref_scaler.step(ref_optim)
        scaler.update()
        ref_scaler.update()
        optim.zero_grad()
        ref_optim.zero_grad()
    assert float(scaler.get_scale()) == float(ref_scaler.get_scale())
    fsdp1_check_params(ref, fsdp)
    # an overflow on rank 0 only: every rank skips and backs off
    gx = randn(2 * w, 4, seed=9)
    x = local(gx).clone()
    if r == 0:
        x[0, 0] = float("inf")
    before = float(scaler.get_scale())
    scaler.scale(fsdp(x).sum()).backward()
    scaler.step(optim)
    scaler.update()
    scales = torch.tensor([float(scaler.get_scale())])
    gathered = [torch.zeros(1) for _ in range(w)]
    dist.all_gather(gathered, scales)
    assert all(float(g.item()) == before / 2 for g in gathered), [float(g.item()) for g in gathered]
    fsdp1_check_params(ref, fsdp)  # the skipped step left the parameters as they were
