"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_mixed_precision.py (FSDP1 MixedPrecision) on CPU."""
import functools
import warnings

import numpy as np
import pytest

from _common import (
    assert_close,
    copy_model,
    fsdp1_clean,
    fsdp1_cpu,
    fsdp1_train_parity,
    local,
    randn,
    record_collectives,
    to_np,
    world,
)
from _framework import (
    FSDP,
    F,
    MixedPrecision,
    ModuleWrapPolicy,
    ShardingStrategy,
    StateDictType,
    nn,
    size_based_auto_wrap_policy,
    torch,
)

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


# ------------------------------------------------------------------------- the newest revision's other tests
# (ROCm/pytorch's copy of test_fsdp_mixed_precision.py, the newest stored: TestFSDPMixedPrecisionSharded,
# TestFSDPMixedPrecisionIgnoredModules, TestFSDPDifferentSubmodulePrecision, TestFSDPTrainEval)

_BUFFER_ORIG_DTYPE = torch.float64
_MP_CONFIGS = {
    "mp_fp16": dict(param_dtype=torch.float16, buffer_dtype=torch.float16, reduce_dtype=torch.float16),
    "mp_only_reduce": dict(reduce_dtype=torch.float16),
    "mp_only_param_and_buf": dict(param_dtype=torch.float16, buffer_dtype=torch.float16),
    "mp_no_mp": dict(),
    "mp_diff_buffer_reduce": dict(param_dtype=torch.float16, buffer_dtype=torch.bfloat16, reduce_dtype=torch.float32),
}


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "").replace("hpcfsdp.", "")


def _expected_reduce_dtype(mp, full_dtype):
    """reduce_dtype, else param_dtype, else the parameters' own dtype (PyTorch's _reduce_scatter_validate_mp)."""
    return mp.reduce_dtype or mp.param_dtype or full_dtype


class LinearMixedPrecision(nn.Module):
    """A bias-free linear in ``param_dtype`` with a float64 buffer; its forward checks what mixed precision
    promises the module sees: the input and the weight in the compute dtype, the buffer in buffer_dtype."""

    def __init__(self, param_dtype, buffer_name="buffer"):
        super().__init__()
        self.lin = nn.Linear(10, 10, bias=False).to(param_dtype)
        self.buffer_name = buffer_name
        self.register_buffer(buffer_name, randn(1, 2, seed=7).to(_BUFFER_ORIG_DTYPE))
        self.orig_param_dtype = param_dtype
        self.checked = 0

    def forward(self, tup):
        inp, mp = tup
        compute = mp.param_dtype or self.orig_param_dtype
        assert inp.dtype == compute, (inp.dtype, compute)
        assert self.lin.weight.dtype == compute, (self.lin.weight.dtype, compute)
        assert getattr(self, self.buffer_name).dtype == (mp.buffer_dtype or _BUFFER_ORIG_DTYPE)
        self.checked += 1
        return self.lin(inp), mp


def _simple_and_nested(full_dtype, **kw):
    torch.manual_seed(0)
    simple = FSDP(LinearMixedPrecision(full_dtype), device_id=fsdp1_cpu(), **kw)
    inner = FSDP(LinearMixedPrecision(full_dtype, buffer_name="buffer0"), device_id=fsdp1_cpu(), **kw)
    nested = FSDP(nn.Sequential(inner, LinearMixedPrecision(full_dtype, buffer_name="buffer1")),
                  device_id=fsdp1_cpu(), **kw)
    return [simple, nested]


@pytest.mark.parametrize("full_dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("mp_name", list(_MP_CONFIGS))
def test_mixed_precision_e2e(mp_name, full_dtype):
    """TestFSDPMixedPrecisionSharded.test_mixed_precision_e2e_full_shard (FULL_SHARD; SHARD_GRAD_OP: the
    no_reshard_after_forward variant) over the configs and full-precision dtypes: in forward the inputs, weights
    and buffers are in the mixed dtypes, the loss in the compute dtype; the reduce-scatters run in reduce_dtype
    (else param_dtype, else full); after backward parameters and gradients are in full precision and the
    buffers stay cast; summon_full_params shows full-precision parameters and still-cast buffers; the state dict
    holds full-precision parameters and buffers of their original dtype, and the buffers stay cast afterwards.
    Offload and the ShardedGradScaler cases: CUDA / test_fsdp1_checkpoint.py."""
    mp = MixedPrecision(**_MP_CONFIGS[mp_name])
    full = {"fp32": torch.float32, "fp64": torch.float64}[full_dtype]
    buf_dtype = mp.buffer_dtype or _BUFFER_ORIG_DTYPE
    for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP):
        for model in _simple_and_nested(full, mixed_precision=mp, sharding_strategy=strategy):
            optim = torch.optim.Adam(model.parameters())
            for it in range(2):
                inp = randn(3, 10, seed=it).to(full)
                with record_collectives() as log:
                    act, _ = model((inp, mp))
                    assert all(b.dtype == buf_dtype for b in model.buffers())
                    loss = act.sum()
                    assert loss.dtype == (mp.param_dtype or full)
                    loss.backward()
                assert log.num("reduce_scatter") >= 1
                assert log.dtypes("reduce_scatter") == {_dtype_name(_expected_reduce_dtype(mp, full))}, log
                assert all(b.dtype == buf_dtype for b in model.buffers())
                for p in model.parameters():
                    assert p.dtype == full
                    assert p.grad is not None and p.grad.dtype == full
                optim.step()
                optim.zero_grad()
                with FSDP.summon_full_params(model):
                    assert all(p.dtype == full for p in model.parameters())
                    named_buffers = dict(model.named_buffers())
                    assert named_buffers and all(b.dtype == buf_dtype for b in named_buffers.values())
                sd = model.state_dict()
                for name, t in sd.items():
                    clean = fsdp1_clean(name)
                    expected = _BUFFER_ORIG_DTYPE if clean.rsplit(".", 1)[-1].startswith("buffer") else full
                    assert t.dtype == expected, (name, t.dtype)
                assert all(b.dtype == buf_dtype for b in model.buffers())
            checked = [m.checked for m in model.modules() if isinstance(m, LinearMixedPrecision)]
            assert checked and all(c == 2 for c in checked)  # every module's forward checks ran


class Embedded(nn.Module):
    """Token embedding -> Linear -> LayerNorm -> output projection tied to the embedding (the integer-input
    part of common_fsdp.TransformerWithSharedParams), recording its input dtypes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 16, bias=False)
        self.out.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(8))
        self.seen = []

    def forward(self, tokens):
        self.seen.append(tokens.dtype)
        h = self.embed(tokens) * self.scale
        return self.out(self.norm(torch.relu(self.lin(h))))


@pytest.mark.parametrize("mp_name", ["reduce", "only_params_and_bufs", "default", "params_and_reduce_diff"])
def test_mp_embedding(mp_name):
    """test_mp_embedding_reduce / _only_params_and_bufs / _default / _params_and_reduce_diff: a model taking
    integer tokens, wrapped whole with each MixedPrecision, trains six SGD steps: the tokens reach the embedding
    as int64 (never cast), the loss is in param_dtype (float32 without one), the reduce-scatters run in
    reduce_dtype (else param_dtype, else float32), and the loss goes down."""
    mp = MixedPrecision(**{
        "reduce": dict(reduce_dtype=torch.float16),
        "only_params_and_bufs": dict(param_dtype=torch.float16, buffer_dtype=torch.float16),
        "default": dict(param_dtype=torch.float16, buffer_dtype=torch.float16, reduce_dtype=torch.float16),
        "params_and_reduce_diff": dict(param_dtype=torch.float16, reduce_dtype=torch.float32,
                                       buffer_dtype=torch.float16),
    }[mp_name])
    param_dtype = mp.param_dtype or torch.float32
    model = Embedded()
    fsdp = FSDP(model, mixed_precision=mp, device_id=fsdp1_cpu())
    optim = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    tokens = torch.tensor(np.random.default_rng(0).integers(0, 16, (4, 5)).astype(np.int64))
    losses = []
    for _ in range(6):
        with record_collectives() as log:
            loss = fsdp(tokens).pow(2).mean()
            assert loss.dtype == param_dtype
            loss.backward()
        assert log.dtypes("reduce_scatter") == {_dtype_name(mp.reduce_dtype or param_dtype)}, log
        optim.step()
        optim.zero_grad()
        losses.append(float(loss.float().item()))
    assert model.seen == [torch.int64] * 6
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("use_orig_params", [False, True])
def test_grads_reduced_precision(use_orig_params):
    """keep_low_precision_grads=True: after each of six backwards every gradient is float16 (a nested instance
    and the root; offload_params: CUDA)."""

    class TwoLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1 = nn.Linear(10, 10)
            self.lin2 = nn.Linear(10, 10)

        def forward(self, x):
            return self.lin2(self.lin1(x))

    torch.manual_seed(0)
    mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16,
                        keep_low_precision_grads=True)
    kw = dict(mixed_precision=mp, use_orig_params=use_orig_params, device_id=fsdp1_cpu())
    m = TwoLinear()
    m.lin1 = FSDP(m.lin1, **kw)
    m = FSDP(m, **kw)
    for _ in range(6):
        m(torch.ones(1, 10)).sum().backward()
        grads = [p.grad for p in m.parameters() if p.grad is not None]
        assert grads  # (PyTorch's FlatParameters without use_orig_params: one per instance)
        assert all(g.dtype == torch.float16 for g in grads)


@pytest.mark.parametrize("use_orig_params", [False, True])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_input_grads_with_param_mixed_precision(strategy, use_orig_params):
    """An input of float32 that requires grad, cast to the float16 param_dtype on the way in, still gets its
    gradient, in float32 (the cast is differentiable), equal to the float16 model's up to its precision."""
    torch.manual_seed(0)
    model = nn.Linear(64, 64, bias=False)
    ref_weight = to_np(model.weight)
    fsdp = FSDP(model, sharding_strategy=getattr(ShardingStrategy, strategy), use_orig_params=use_orig_params,
                mixed_precision=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float32,
                                               buffer_dtype=torch.float32), device_id=fsdp1_cpu())
    x = randn(8, 64, seed=3).requires_grad_(True)
    fsdp(x).sum().backward()
    assert x.grad is not None
    assert x.grad.dtype == torch.float32
    expected = np.broadcast_to(ref_weight.sum(axis=0), (8, 64))  # d(sum(x W^T)) / dx
    assert_close(x.grad, expected, rtol=2e-2, atol=2e-2)


class NonLearnableConv(nn.Module):
    """A fixed blur kernel held as a buffer (no parameters), depthwise conv2d with stride 2."""

    def __init__(self, kernel, in_channels):
        super().__init__()
        self.padding = (len(kernel) - 1) // 2
        k = torch.tensor(np.asarray(kernel, dtype=np.float32))
        k = k / k.sum()
        k = torch.tensor(np.outer(to_np(k), to_np(k)).astype(np.float32))[None, None]
        self.register_buffer("kernel", k.repeat(in_channels, 1, 1, 1))

    def forward(self, x):
        return F.conv2d(x, self.kernel, groups=self.kernel.shape[0], stride=2, padding=self.padding)


def test_buffer_dtype_no_root_handle():
    """Every Sequential an instance, the root holding no parameters, float16 params and buffers: the blur
    kernels (buffers of parameter-free instances) are cast too, so forward and backward run without a dtype
    error, and the convolutions get gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 8, 3, padding=1)),
        nn.Sequential(NonLearnableConv((1, 2, 2, 1), 8)),
        nn.Sequential(nn.Conv2d(8, 3, 3, padding=1)),
        nn.Sequential(NonLearnableConv((1, 2, 2, 1), 3)),
    )
    dtype = torch.float16
    fsdp = FSDP(model, use_orig_params=True, limit_all_gathers=True, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}),
                mixed_precision=MixedPrecision(param_dtype=dtype, buffer_dtype=dtype, reduce_dtype=dtype),
                device_id=fsdp1_cpu())
    out = fsdp(randn(2, 3, 16, 16, seed=1))
    assert out.dtype == dtype and tuple(out.shape) == (2, 3, 4, 4)
    out.float().mean().backward()
    assert all(b.dtype == dtype for b in fsdp.buffers())
    with FSDP.summon_full_params(fsdp, with_grads=True):  # (a rank may hold no piece of a parameter)
        assert all(p.grad is not None for p in fsdp.parameters())


def test_mixed_precision_with_ignored_module():
    """TestFSDPMixedPrecisionIgnoredModules (one rank upstream; two here): an ignored module keeps its float32
    parameters while the rest computes in float16, so its linear sees a float16 input: RuntimeError "must have
    the same dtype" (nothing casts for it)."""

    class Ignored(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(100, 100)

        def forward(self, x):
            return self.l(x)

    class WithIgnored(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.l1 = nn.Linear(100, 100)
            self.ignored = Ignored()
            self.l2 = nn.Linear(100, 100)

        def forward(self, x):
            return self.l2(self.ignored(self.l1(x)))

    model = WithIgnored()
    fsdp = FSDP(model, ignored_modules=[model.ignored], mixed_precision=MixedPrecision(param_dtype=torch.float16),
                device_id=fsdp1_cpu())
    assert model.ignored.l.weight.dtype == torch.float32
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        fsdp(torch.ones(2, 100)).sum().backward()


class SaveForwardInputsModule(nn.Module):
    """common_distributed.SaveForwardInputsModule: records its input, optionally casts it to its weight dtype."""

    def __init__(self, forward_inputs, cast_forward_inputs):
        super().__init__()
        self.l = nn.Linear(100, 100)
        self.forward_inputs = forward_inputs
        self.cast_forward_inputs = cast_forward_inputs

    def forward(self, x):
        self.forward_inputs[self] = x
        return self.l(x.to(self.l.weight.dtype) if self.cast_forward_inputs else x)


class SaveForwardInputsModel(nn.Module):
    def __init__(self, forward_inputs, cast_forward_inputs):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.c2 = SaveForwardInputsModule(forward_inputs, cast_forward_inputs)
        self.forward_inputs = forward_inputs

    def forward(self, x):
        self.forward_inputs[self] = x
        return self.c2(self.c1(x))


_FP16_CAST = dict(param_dtype=torch.float16, cast_forward_inputs=True)


@pytest.mark.parametrize("case", ["float16_on_one_submodule", "skip_inputs", "different_precisions"])
def test_submodule_precisions(case):
    """TestFSDPDifferentSubmodulePrecision.test_float16_on_one_submodule (c2 float16 with cast_forward_inputs,
    the rest float32), _skip_inputs (c2 float16 without casting, the modules cast for themselves) and
    test_submodules_with_different_precisions (c2 float16, the root float32, both casting): the dtypes each
    module's forward received."""
    inputs = {}
    model = SaveForwardInputsModel(inputs, cast_forward_inputs=case == "skip_inputs")
    c1, c2 = model.c1, model.c2
    c2_mp = MixedPrecision(param_dtype=torch.float16, cast_forward_inputs=case != "skip_inputs")
    model.c2 = FSDP(model.c2, mixed_precision=c2_mp, device_id=fsdp1_cpu())
    root_mp = MixedPrecision(param_dtype=torch.float32, cast_forward_inputs=True) \
        if case == "different_precisions" else None
    fsdp = FSDP(model, mixed_precision=root_mp, device_id=fsdp1_cpu())
    fsdp(torch.zeros(2, 100)).sum().backward()
    assert inputs[model].dtype == torch.float32
    assert inputs[c1].dtype == torch.float32
    assert inputs[c2].dtype == (torch.float32 if case == "skip_inputs" else torch.float16)
    assert all(p.grad is not None for p in fsdp.parameters())


@pytest.mark.parametrize("case", ["skip_inputs_error", "different_precisions_error"])
def test_submodule_precisions_error(case):
    """test_float16_on_one_submodule_skip_inputs_error (c2 float16 without casting, the modules not casting)
    and test_submodules_with_different_precisions_error (c1 float16, the root float32: the root casts its
    input to float32 before c1, which runs first, so c1's float16 weight meets a float32 input): RuntimeError
    "mat1 and mat2 must have the same dtype"."""
    model = SaveForwardInputsModel({}, cast_forward_inputs=False)
    if case == "skip_inputs_error":
        model.c2 = FSDP(model.c2, mixed_precision=MixedPrecision(param_dtype=torch.float16,
                                                                 cast_forward_inputs=False), device_id=fsdp1_cpu())
        fsdp = FSDP(model, device_id=fsdp1_cpu())
    else:
        model.c1 = FSDP(model.c1, mixed_precision=MixedPrecision(**_FP16_CAST), device_id=fsdp1_cpu())
        fsdp = FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.float32, cast_forward_inputs=True),
                    device_id=fsdp1_cpu())
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        fsdp(torch.zeros(2, 100)).sum().backward()
    assert all(p.grad is None for p in fsdp.parameters())  # it failed in forward: nothing was reduced


def test_submodules_with_external_inputs():
    """The root casts its inputs; a nested instance with the default cast_forward_inputs=False leaves an
    input its parent makes itself (y, float32) as it is, while its first input (the float16 output of l1)
    stays float16."""
    seen = {}

    class ToyModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(100, 100)

        def forward(self, x, y):
            seen["l2_input_x"], seen["l2_input_y"] = x, y
            return self.l(x)

    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.l1 = nn.Linear(100, 100)
            self.l2 = ToyModule()

        def forward(self, x):
            seen["model_input_x"] = x
            return self.l2(self.l1(x), torch.ones(2, 100, dtype=torch.float32))

    fp16 = MixedPrecision(param_dtype=torch.float16)
    model = ToyModel()
    model.l2 = FSDP(model.l2, mixed_precision=fp16, device_id=fsdp1_cpu())
    fsdp = FSDP(model, mixed_precision=fp16, device_id=fsdp1_cpu())
    fsdp(torch.zeros(2, 100, dtype=torch.float32)).sum().backward()
    assert seen["model_input_x"].dtype == torch.float16
    assert seen["l2_input_x"].dtype == torch.float16
    assert seen["l2_input_y"].dtype == torch.float32


def test_mp_batchnorm_and_layernorm_ignored():
    """test_mp_batchnorm (newest revision): with _module_classes_to_ignore=[BatchNorm, LayerNorm] and a policy
    that wraps nothing, FSDP warns that those modules become separate instances without mixed precision; they
    compute in float32 while the linears compute in float16, and forward / backward run."""
    from _framework import IS_TORCH

    bn_cls = torch.nn.modules.batchnorm._BatchNorm if IS_TORCH else nn.BatchNorm1d

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = nn.Linear(2, 40, bias=False)
            self.bn = nn.BatchNorm1d(4)
            self.fc2 = nn.Linear(40, 4, bias=False)
            self.ln = nn.LayerNorm(4)
            self.fc3 = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            x = torch.reshape(self.fc1(x), (-1, 4, 10))
            x = torch.reshape(self.bn(x), (-1, 40))
            return F.softmax(self.fc3(self.ln(self.fc2(x))), dim=1)

    net = Net()
    computed = {}
    for name in ("fc1", "bn", "fc2", "ln", "fc3"):
        getattr(net, name).register_forward_pre_hook(
            lambda m, args, name=name: computed.__setitem__(name, m.weight.dtype))
    mp = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16,
                        _module_classes_to_ignore=[bn_cls, nn.LayerNorm])
    with pytest.warns(UserWarning, match="These modules will be wrapped as separate FSDP"):
        model = FSDP(net, mixed_precision=mp, auto_wrap_policy=lambda *args, **kwargs: False,
                     device_id=fsdp1_cpu())
    assert model.mixed_precision == mp
    model(randn(2, 2)).sum().backward()
    assert computed == {"fc1": torch.float16, "bn": torch.float32, "fc2": torch.float16, "ln": torch.float32,
                        "fc3": torch.float16}
    assert all(p.grad is not None for p in model.parameters())


def _small_transformer(seed):
    torch.manual_seed(seed)
    return nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                          dropout=0.0)


class TransformerWithEMA(nn.Module):
    """A transformer trained, and a second one holding its exponential moving average (upstream uses
    torch.optim.swa_utils.AveragedModel, absent from hpcfsdp: the average is written out here); the forward uses
    the trained one in training mode and the average in eval mode."""

    def __init__(self):
        super().__init__()
        self.module = _small_transformer(0)
        self.ema_module = _small_transformer(1)
        self.num_averaged = 0

    def forward(self, src, tgt):
        return self.module(src, tgt) if self.training else self.ema_module(src, tgt)


def _update_ema(ema, src, n, decay=0.9):
    """AveragedModel's EMA update: the first call copies, later ones blend (parameters)."""
    with torch.no_grad():
        for pe, p in zip(ema.parameters(), src.parameters()):
            pe.copy_(p.detach() if n == 0 else pe * decay + p.detach() * (1 - decay))


@pytest.mark.parametrize("strategy", ["SHARD_GRAD_OP", "FULL_SHARD", "NO_SHARD"])
def test_train_ema_eval_flow(strategy):
    """TestFSDPTrainEval.test_train_ema_eval_flow: train (float16 params) -> EMA update inside
    summon_full_params -> eval forward under no_grad, three times: the eval outputs change every iteration (they
    use the updated average; upstream's bug was SHARD_GRAD_OP evaluating stale parameters) and equal the average's
    own output computed unsharded in float16 from its summoned parameters."""
    _, rank = world()
    model = TransformerWithEMA()
    policy = ModuleWrapPolicy({nn.Transformer, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
    fsdp = FSDP(model, auto_wrap_policy=policy, mixed_precision=MixedPrecision(param_dtype=torch.float16),
                sharding_strategy=getattr(ShardingStrategy, strategy), device_id=fsdp1_cpu())
    optim = torch.optim.Adam(fsdp.module.module.parameters(), lr=1e-2)
    eval_src, eval_tgt = randn(8, 1, 16, seed=1 + rank), randn(6, 1, 16, seed=11 + rank)
    sums = []
    for it in range(3):
        fsdp.train()
        out = fsdp(randn(8, 4, 16, seed=20 + 10 * it + rank), randn(6, 4, 16, seed=21 + 10 * it + rank))
        out.float().sum().backward()
        optim.step()
        optim.zero_grad()
        with FSDP.summon_full_params(fsdp):
            _update_ema(fsdp.module.ema_module, fsdp.module.module, model.num_averaged)
            model.num_averaged += 1
            ema_params = [to_np(p) for p in fsdp.module.ema_module.parameters()]
        fsdp.eval()
        with torch.no_grad():
            eval_out = fsdp(eval_src, eval_tgt)
        plain = _small_transformer(1)
        with torch.no_grad():
            for p, v in zip(plain.parameters(), ema_params):
                p.copy_(torch.tensor(v.astype(np.float32)))
        plain = plain.half().eval()
        with torch.no_grad():
            expected = plain(eval_src.half(), eval_tgt.half())
        assert_close(eval_out.float(), expected.float(), rtol=2e-2, atol=2e-2, msg=f"eval at {it}")
        sums.append(float(eval_out.float().sum()))
    assert len(set(sums)) == 3, sums
