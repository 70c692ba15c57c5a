"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_mixed_precision.py (FSDP1 MixedPrecision) on CPU."""
import functools
import warnings

import pytest

from _common import (
    copy_model,
    fsdp1_cpu,
    fsdp1_train_parity,
    local,
    randn,
    world,
)
from _framework import FSDP, MixedPrecision, ModuleWrapPolicy, StateDictType, nn, size_based_auto_wrap_policy, torch

pytestmark = pytest.mark.mpi(min_size=2)


class Recorder(nn.Module):
    """Records the dtype its input arrives in, then computes in its weight's dtype."""

    def __init__(self, dim=4):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.seen = []

    def forward(self, x):
        self.seen.append(x.dtype)
        return self.lin(x.to(self.lin.weight.dtype))


class TwoStage(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.first = nn.Linear(dim, dim)
        self.second = Recorder(dim)

    def forward(self, x):
        h = self.first(x).float()  # (B, dim): float32 again before the inner instance
        return self.second(h)


def _mp(**kw):
    return MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16, **kw)


def test_root_casts_inputs_nested_instance_does_not():
    """cast_root_forward_inputs (default True) casts the root's inputs; cast_forward_inputs (default False)
    leaves a hand-wrapped non-root instance's inputs as they come (test_mp_cast_forward_inputs)."""
    torch.manual_seed(0)
    model = TwoStage()
    model.second = FSDP(model.second, mixed_precision=_mp(), device_id=fsdp1_cpu())
    fsdp = FSDP(model, mixed_precision=_mp(), device_id=fsdp1_cpu())
    root_seen = []
    fsdp.module.first.register_forward_pre_hook(lambda m, args: root_seen.append(args[0].dtype))
    out = fsdp(randn(2, 4))
    assert root_seen == [torch.float16]
    assert fsdp.module.second.module.seen == [torch.float32]
    out.sum().backward()


def test_nested_cast_forward_inputs():
    """cast_forward_inputs=True on the inner instance casts its inputs to its param dtype."""
    torch.manual_seed(0)
    model = TwoStage()
    model.second = FSDP(model.second, mixed_precision=_mp(cast_forward_inputs=True), device_id=fsdp1_cpu())
    fsdp = FSDP(model, mixed_precision=_mp(), device_id=fsdp1_cpu())
    fsdp(randn(2, 4)).sum().backward()
    assert fsdp.module.second.module.seen == [torch.float16]


class WithBuffer(nn.Module):
    def __init__(self, dim=4, dtype=torch.float64):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.register_buffer("buf", torch.ones(dim, dtype=dtype))

    def forward(self, x):
        return self.lin(x.to(self.lin.weight.dtype)) + self.buf.to(self.lin.weight.dtype)


def test_buffer_dtype_restored_in_full_state_dict():
    """Buffers cast to buffer_dtype come back from a FULL state dict in their original dtype, also those of a
    nested instance (float64 here) (test_mixed_precision_e2e_full_shard's state-dict check)."""
    torch.manual_seed(0)
    model = nn.Sequential(WithBuffer(dtype=torch.float32), WithBuffer(dtype=torch.float64))
    model[1] = FSDP(model[1], mixed_precision=_mp(), device_id=fsdp1_cpu())
    fsdp = FSDP(model, mixed_precision=_mp(), device_id=fsdp1_cpu())
    fsdp(randn(2, 4)).sum().backward()
    assert fsdp.module[0].buf.dtype == torch.float16  # cast for compute (PyTorch: at the first forward)
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        sd = fsdp.state_dict()
    bufs = {k.replace("_fsdp_wrapped_module.", ""): v for k, v in sd.items() if k.endswith("buf")}
    assert sorted(bufs) == ["0.buf", "1.buf"]
    assert bufs["0.buf"].dtype == torch.float32
    assert bufs["1.buf"].dtype == torch.float64


def test_ignored_module_buffer_not_cast():
    """An ignored module's buffers keep their dtype under buffer_dtype (ignored_modules are left alone)."""
    torch.manual_seed(0)
    model = nn.Sequential(WithBuffer(dtype=torch.float32), WithBuffer(dtype=torch.float32))
    fsdp = FSDP(model, mixed_precision=_mp(), ignored_modules=[model[1]], device_id=fsdp1_cpu())
    fsdp(randn(2, 4))  # PyTorch casts the buffers at the first forward
    assert fsdp.module[0].buf.dtype == torch.float16
    assert fsdp.module[1].buf.dtype == torch.float32


def _nested_fp16_model(**fsdp_kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 4))
    ref = copy_model(model)
    model[2] = FSDP(model[2], device_id=fsdp1_cpu(), **fsdp_kwargs)
    return model, ref


@pytest.mark.parametrize("mp", ["none", "fp16", "fp32"])
@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("to_half_before_fsdp_init", [False, True])
def test_fp16_dtypes(to_half_before_fsdp_init, use_orig_params, mp):
    """test_fsdp_pure_fp16.py::test_fp16_dtypes: a nested model made float16 before or after wrapping has
    float16 parameters and gradients; it computes in float16 unless MixedPrecision's param_dtype says
    otherwise (the explicit setting wins over the model's dtype)."""
    mixed = {"none": MixedPrecision(), "fp16": MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32),
             "fp32": MixedPrecision(param_dtype=torch.float32)}[mp]
    kw = dict(use_orig_params=use_orig_params, mixed_precision=mixed)
    model, _ = _nested_fp16_model(**kw)
    if to_half_before_fsdp_init:
        model = model.half()
    seen = []
    for m in (model[0], model[2].module[0], model[3]):  # the root's and the nested instance's layers
        m.register_forward_pre_hook(lambda m, args: seen.append((m.weight.dtype, args[0].dtype)))
    fsdp = FSDP(model, device_id=fsdp1_cpu(), **kw)
    if not to_half_before_fsdp_init:
        fsdp = fsdp.half()
    assert all(p.dtype == torch.float16 for p in fsdp.parameters())
    fsdp(randn(2, 4).half()).sum().backward()
    compute = torch.float32 if mp == "fp32" else torch.float16
    assert seen == [(compute, compute)] * 3
    for p in fsdp.parameters():
        assert p.dtype == torch.float16
        assert p.grad is None or p.grad.dtype == torch.float16


def test_pure_fp16_training():
    """test_fsdp_pure_fp16.py::test_pure_fp16_training: a float16 nested model trains one step as the float16
    unsharded reference (loss and full parameters)."""
    w, _ = world()
    model, ref = _nested_fp16_model()
    fsdp = FSDP(model, device_id=fsdp1_cpu()).half()
    ref = ref.half()
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it).half(), iters=1, rtol=2e-2, atol=2e-2,
                       optim_cls=torch.optim.SGD)
    assert all(p.dtype == torch.float16 for p in fsdp.parameters())  # it trained in float16


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.lin(x))


def test_batchnorm_wrapped_separately_warns():
    """Mixed precision with an auto_wrap_policy and BatchNorm submodules: PyTorch warns that the norms are
    wrapped as separate FSDP instances with mixed precision disabled (test_mp_batchnorm)."""
    model = ConvBN()
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=10**6)
    with pytest.warns(UserWarning, match="wrapped as separate FSDP") as rec:
        FSDP(model, auto_wrap_policy=policy, mixed_precision=_mp(), device_id=fsdp1_cpu())
    assert any("BatchNorm1d" in str(r.message) for r in rec)  # the warning names the class


def test_batchnorm_root_with_mixed_precision():
    """FSDP(BatchNorm1d, mixed_precision=...) wraps (the norm class is ignored by MixedPrecision) and runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bn = FSDP(nn.BatchNorm1d(4), mixed_precision=_mp(), device_id=fsdp1_cpu())
    out = bn(randn(4, 4))
    assert tuple(out.shape) == (4, 4)


def test_mixed_precision_train_parity():
    """Training with float16 params/reduce and a Linear auto-wrap stays near the float32 reference."""
    w, _ = world()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    ref = copy_model(model)
    fsdp = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=fsdp1_cpu(),
                mixed_precision=MixedPrecision(param_dtype=torch.float16))
    fsdp1_train_parity(ref, fsdp, lambda it: randn(2 * w, 4, seed=it), iters=2, rtol=2e-2, atol=2e-2,
                       loss_fn=lambda m, x: m(x).float().sum())
    x = randn(2 * w, 4)
    assert fsdp(local(x)).dtype == torch.float16
