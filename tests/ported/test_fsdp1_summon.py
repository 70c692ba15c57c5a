"""Re-expresses the CPU-meaningful remainders of PyTorch's test/distributed/fsdp/test_fsdp_unshard_params.py and
test_fsdp_summon_full_params.py (its older name): summon_full_params refused inside forward / backward, the names
of named_parameters / named_buffers inside it, a non-root unit summoned alone, a plain container of FSDP
instances, gradients written back with ``with_grads``."""
import pytest

from _common import assert_close, copy_model, fsdp1_clean, fsdp1_cpu, local, randn, to_np, world
from _framework import FSDP, ModuleWrapPolicy, ShardingStrategy, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)

_IN_PASS = "Cannot manually unshard parameters during forward/backward"


def test_unshard_params_from_forward_raises():
    """test_unshard_params_from_forward_raises / test_cannot_summon_full_params_from_forward: summoning inside
    the wrapped module's forward raises AssertionError."""

    class SummonsInForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.zeros(5))

        def forward(self, fsdp_module):
            with FSDP.summon_full_params(fsdp_module):
                pass

    model = FSDP(SummonsInForward(), device_id=fsdp1_cpu())
    with pytest.raises(AssertionError, match=_IN_PASS) as info:
        model(model)
    assert info.type is AssertionError  # not a subclass standing in for it


def test_unshard_params_from_backward_raises():
    """test_unshard_params_from_backward_raises / test_cannot_summon_full_params_from_backward: summoning in a
    gradient hook during backward raises AssertionError."""
    torch.manual_seed(0)
    model = FSDP(nn.Linear(2, 1), device_id=fsdp1_cpu())
    out = model(torch.ones(2))
    assert out.requires_grad

    def summons_in_backward(grad):
        with FSDP.summon_full_params(model):
            pass

    out.register_hook(summons_in_backward)
    with pytest.raises(AssertionError, match=_IN_PASS):
        out.backward()


class Nested(nn.Module):
    """The shape of common_fsdp.NestedWrappedModule (NO_FSDP): a Sequential under ``module``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.module = nn.Sequential(nn.Linear(8, 4), nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 16)),
                                    nn.Linear(16, 4), nn.Linear(4, 8))

    def forward(self, x):
        return self.module(x)


@pytest.mark.parametrize("recurse", [False, True])
@pytest.mark.parametrize("prefix", ["", "test_prefix"])
def test_named_parameters_and_buffers(prefix, recurse):
    """Inside summon_full_params a top-level FSDP model's named_parameters / named_buffers (with ``prefix`` and
    ``recurse``) list what the unwrapped model's list, names and values, including a buffer registered on the
    FSDP instance itself."""
    model = Nested()
    model.register_buffer("buffer", torch.ones(1))
    fsdp = FSDP(Nested(), device_id=fsdp1_cpu())
    fsdp.register_buffer("buffer", torch.ones(1))
    with FSDP.summon_full_params(fsdp):
        for call in ("named_parameters", "named_buffers"):
            got = [(n, to_np(t)) for n, t in getattr(fsdp, call)(prefix=prefix, recurse=recurse)]
            want = [(n, to_np(t)) for n, t in getattr(model, call)(prefix=prefix, recurse=recurse)]
            assert [n for n, _ in got] == [n for n, _ in want], call
            for (n, a), (_, b) in zip(got, want):
                assert_close(a, b, msg=f"{call} {n}")
    assert any(True for _ in fsdp.named_buffers(recurse=True))  # the buffers are listed outside too


def test_unshard_submodule():
    """summon_full_params on one auto-wrapped unit (model[0]) shows that unit's own parameters, unflattened and
    full, equal to the unwrapped model's, while another unit stays sharded."""
    model = nn.Sequential(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)),
                          nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)))
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy((nn.Sequential,)), device_id=fsdp1_cpu())
    with FSDP.summon_full_params(fsdp[0]):
        params = list(fsdp[0].named_parameters())
        assert len(params) == 4
        for (name, p), (ref_name, rp) in zip(params, ref[0].named_parameters()):
            assert "flat_param" not in name
            assert fsdp1_clean(name) == ref_name
            assert tuple(p.shape) == tuple(rp.shape)
            assert_close(p.detach(), rp.detach(), msg=name)


def test_summon_from_non_fsdp():
    """test_summon_from_non_fsdp (test_fsdp_summon_full_params.py): summon_full_params on a plain module holding
    FSDP instances and a plain child shows every full parameter, equal to the unwrapped model's."""

    class Container(nn.Module):
        def __init__(self, a, b, c):
            super().__init__()
            self.fsdp_1, self.fsdp_2, self.fsdp_3 = a, b, c

    def block(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))

    model = Container(FSDP(block(0), device_id=fsdp1_cpu()), FSDP(block(1), device_id=fsdp1_cpu()), block(2))
    ref = Container(block(0), block(1), block(2))
    with FSDP.summon_full_params(model):
        got = [to_np(p) for p in model.parameters()]
    want = [to_np(p) for p in ref.parameters()]
    assert len(got) == len(want) == 12
    for a, b in zip(got, want):
        assert_close(a, b)


class TiedModel(nn.Module):
    """An embedding, a transformer-ish block and an output projection tied to the embedding (the role of
    common_fsdp.TransformerWithSharedParams)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(12, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.out = nn.Linear(8, 12, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens):
        return self.out(self.block(self.embed(tokens)))


def _tokens(seed):
    w, _ = world()
    return torch.tensor((randn(2 * w, 3, seed=seed) * 100).detach().cpu().numpy().astype("int64") % 12)


@pytest.mark.parametrize("writeback", [False, True])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_with_grads_core(strategy, writeback):
    """summon_full_params(with_grads=True) after a backward and between a forward and its backward: the full
    gradients equal DDP's (the reference on the global batch), and scaling them inside the context persists when
    ``writeback`` (and, for NO_SHARD, whatever ``writeback``: it exposes the gradient the unit holds) and is
    dropped otherwise; the reference is scaled alike so the second check stays comparable."""
    w, _ = world()
    factor = 2.0
    ref = TiedModel()
    fsdp = FSDP(TiedModel(), auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}), use_orig_params=True,
                sharding_strategy=getattr(ShardingStrategy, strategy), device_id=fsdp1_cpu())
    persists = writeback or strategy == "NO_SHARD"

    def full_grads():
        with FSDP.summon_full_params(fsdp, writeback=False, with_grads=True):
            return [to_np(p.grad) for p in fsdp.parameters()]

    def check(phase):
        old = full_grads()
        with FSDP.summon_full_params(fsdp, writeback=writeback, with_grads=True):
            pairs = list(zip(ref.named_parameters(), fsdp.named_parameters()))
            assert len(pairs) == len(list(ref.parameters()))
            for (n1, p1), (n2, p2) in pairs:
                assert n1 == fsdp1_clean(n2)
                assert p1.grad is not None and p2.grad is not None, (phase, n1)
                assert_close(p2.grad, p1.grad, rtol=1e-5, atol=1e-6, msg=f"{phase} {n1}")
                assert bool((p2.grad != 0).any())
                with torch.no_grad():
                    p2.grad.mul_(factor)
        new = full_grads()  # (PyTorch's SHARD_GRAD_OP shows no .grad on the sharded views after the context)
        assert len(new) == len(old) == len(pairs)
        for a, b in zip(old, new):
            assert_close(b, a * factor if persists else a, rtol=1e-6, atol=1e-7, msg=phase)
        if persists:
            for p in ref.parameters():
                p.grad.mul_(factor)

    x = _tokens(0)
    fsdp(local(x)).sum().backward()
    (ref(x).sum() / w).backward()
    check("after backward")
    x = _tokens(1)
    fsdp(local(x))  # between forward and backward
    ref(x)
    check("between forward and backward")
