"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_state_dict.py on CPU, second part: state dicts of models
with activation-checkpoint wrappers, modules FSDP skips or ignores, shared modules and parameters, ranks holding no
elements, one-rank groups, and the save-on-rank-0 / load-on-rank-0 flow with sync_module_states."""
import numpy as np
import pytest

from _common import assert_close, fsdp1_clean, fsdp1_cpu, fsdp1_full_params, randn, to_np, world
from _framework import (
    FSDP,
    IS_TORCH,
    CheckpointImpl,
    DTensor,
    FullStateDictConfig,
    MixedPrecision,
    ModuleWrapPolicy,
    ShardedStateDictConfig,
    StateDictType,
    apply_activation_checkpointing,
    checkpoint_wrapper,
    dist,
    enable_wrap,
    nn,
    torch,
    wrap,
)

pytestmark = pytest.mark.mpi(min_size=2)

CPU = fsdp1_cpu()


# ---------------------------------------------------------------------------------------------- helpers
def _full_value(v):
    """A state-dict value as a full tensor (collective for DTensor / ShardedTensor)."""
    if isinstance(v, DTensor):
        return v.full_tensor()
    if type(v).__name__ == "ShardedTensor":  # PyTorch's FSDP1 SHARDED_STATE_DICT without a device mesh
        from torch.distributed._state_dict_utils import _gather_state_dict

        return _gather_state_dict({"v": v})["v"]
    return v


def _gathered(sd):
    return {k: _full_value(v) for k, v in sd.items()}


def _from_rank0(obj):
    """Rank 0's object on every rank (in place of torch.save / torch.load)."""
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _zero(model, buffers=False):
    """Every parameter (and buffer) of ``model`` zeroed, through summon_full_params when it holds FSDP."""
    with FSDP.summon_full_params(model, writeback=True):
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
            if buffers:
                for b in model.buffers():
                    b.zero_()
    full = fsdp1_full_params(model)
    assert all(not v.any() for v in full.values()), "the model was not zeroed"
    return full


def _check_same_params(model, other, msg=""):
    a, b = fsdp1_full_params(model), fsdp1_full_params(other)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for name, value in a.items():
        assert_close(b[name], value, msg=f"{msg} {name}")
    return a


def _sd_context(model, sd_type, rank0_only):
    """PyTorch's _get_state_dict_mgr: FULL with rank0_only (offload_to_cpu dropped on CPU: PyTorch frees that
    copy), SHARDED with offload_to_cpu for the same flag."""
    if sd_type == "full":
        return FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=rank0_only))
    return FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT,
                                ShardedStateDictConfig(offload_to_cpu=rank0_only))


# ---------------------------------------------------------------------------------------------- activation checkpointing
def _simple_model(ckpt, seed):
    torch.manual_seed(seed)
    lin = nn.Linear(10, 10, bias=False)
    if ckpt:
        lin = checkpoint_wrapper(lin)
    return FSDP(lin, device_id=CPU)


def _simple_nested_model(ckpt, seed):
    torch.manual_seed(seed)
    lin1, lin2 = nn.Linear(10, 10, bias=False), nn.Linear(10, 10, bias=False)
    if ckpt:
        lin1, lin2 = checkpoint_wrapper(lin1), checkpoint_wrapper(lin2)
    seq = nn.Sequential(FSDP(lin1, device_id=CPU), lin2)
    if ckpt:
        seq = checkpoint_wrapper(seq)
    return FSDP(seq, device_id=CPU)


def _has_ac(model):
    """Whether ``model`` holds a checkpoint wrapper (fully_shard renames the class of the modules it shards)."""
    return any("CheckpointWrapper" in type(m).__name__ for m in model.modules())


def _ac_to_linears(model):
    """apply_activation_checkpointing on every Linear of an already wrapped model."""
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, nn.Linear))


_AC_WRAPS = ["source", "dest", "both", "source_after_wrap", "both_after_wrap"]


@pytest.mark.parametrize(("sd_type", "checkpoint_wrap", "rank0_only"),
                         [("full", w, i % 2 == 0) for i, w in enumerate(_AC_WRAPS)]
                         + [("sharded", w, i % 2 == 1) for i, w in enumerate(_AC_WRAPS)])
def test_fsdp_state_dict_with_activation_checkpoint(sd_type, checkpoint_wrap, rank0_only):
    """A state dict saved from a model with or without checkpoint wrappers (around the linears before FSDP, or
    applied after wrapping) loads strictly into a zeroed model with or without them: the keys are the unwrapped
    model's, and the loaded parameters equal the source's. Every wrapping under both state-dict types, each type
    with and without rank0_only (10 of upstream's 20 combinations)."""
    for make, keys in ((_simple_model, ["weight"]), (_simple_nested_model, ["0.weight", "1.weight"])):
        model = make(checkpoint_wrap in ("source", "both"), seed=0)
        if checkpoint_wrap in ("source_after_wrap", "both_after_wrap"):
            _ac_to_linears(model)
            assert _has_ac(model)
        with _sd_context(model, sd_type, rank0_only):
            sd = _gathered(model.state_dict())
        if not (sd_type == "full" and rank0_only and dist.get_rank() != 0):
            assert sorted(sd) == keys, sorted(sd)
        new = make(checkpoint_wrap in ("dest", "both"), seed=1)
        if checkpoint_wrap == "both_after_wrap":
            _ac_to_linears(new)
        _zero(new)
        if rank0_only:
            sd = _from_rank0(sd)
        new.load_state_dict(sd, strict=True)
        full = _check_same_params(model, new, msg=f"{make.__name__} {checkpoint_wrap}")
        assert all(v.any() for v in full.values())


class _Seq2Seq(nn.Module):
    """An embedding, an nn.Transformer and an output projection (the part of common_fsdp's
    TransformerWithSharedParams these tests need)."""

    def __init__(self, seed=0, tied=False):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_tokens = nn.Embedding(11, 8)
        self.transformer = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=8, dropout=0.0)
        self.output_proj = nn.Linear(8, 11)
        if tied:  # TransformerWithSharedParams: the output projection shares the embedding's weight
            self.output_proj.weight = self.embed_tokens.weight
        self.register_buffer("long_buffer", torch.zeros(11, dtype=torch.int64))

    def forward(self, src, tgt):
        return self.output_proj(self.transformer(self.embed_tokens(src), self.embed_tokens(tgt)))


def _wrap_layers_by_hand(model, ac):
    for layers in (model.transformer.encoder.layers, model.transformer.decoder.layers):
        for i, layer in enumerate(layers):
            layers[i] = FSDP(checkpoint_wrapper(layer) if ac else layer, device_id=CPU)
    model.transformer = FSDP(model.transformer, device_id=CPU)
    return model


@pytest.mark.parametrize(("sd_type", "rank0_only"), [("full", False), ("full", True), ("sharded", False)])
def test_state_dict_with_manual_ac_wrapper(sd_type, rank0_only):
    """FSDP(CheckpointWrapper(layer)) wrapped by hand gives the same state-dict keys as FSDP(layer), and each
    model's state dict loads into the other one (here: into a zeroed copy with the other wrapping). SHARDED with
    offload is not a combination PyTorch's test runs."""
    no_ac = _wrap_layers_by_hand(_Seq2Seq(), ac=False)
    ac = _wrap_layers_by_hand(_Seq2Seq(), ac=True)
    assert _has_ac(ac)
    with _sd_context(no_ac, sd_type, rank0_only):
        sd_no_ac = no_ac.state_dict()
    with _sd_context(ac, sd_type, rank0_only):
        sd_ac = ac.state_dict()
    assert list(sd_ac) == list(sd_no_ac)
    assert all("_checkpoint_wrapped_module" not in k for k in sd_ac), list(sd_ac)
    if rank0_only:
        sd_no_ac, sd_ac = _from_rank0(sd_no_ac), _from_rank0(sd_ac)
    targets = (_wrap_layers_by_hand(_Seq2Seq(seed=1), ac=True), _wrap_layers_by_hand(_Seq2Seq(seed=1), ac=False))
    for target, sd, source in zip(targets, (sd_no_ac, sd_ac), (no_ac, ac)):
        _zero(target)
        with _sd_context(target, sd_type, rank0_only):
            target.load_state_dict(sd)
        _check_same_params(source, target)


@pytest.mark.parametrize("sd_type", ["full", "local", "sharded"])
def test_state_dict_with_shared_parameters(sd_type):
    """A model whose output projection shares the embedding's weight, its transformer layers auto-wrapped: its
    state dict of each type loads into a zeroed copy (buffers zeroed too), which then holds the saved model
    (the shared weight under both names)."""
    kind = {"full": StateDictType.FULL_STATE_DICT, "local": StateDictType.LOCAL_STATE_DICT,
            "sharded": StateDictType.SHARDED_STATE_DICT}[sd_type]
    policy = ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
    model = FSDP(_Seq2Seq(tied=True), auto_wrap_policy=policy, device_id=CPU)
    with FSDP.state_dict_type(model, kind):
        sd = model.state_dict()
    new = FSDP(_Seq2Seq(seed=1, tied=True), auto_wrap_policy=policy, device_id=CPU)
    _zero(new, buffers=True)
    with FSDP.state_dict_type(new, kind):
        new.load_state_dict(sd)
    full = _check_same_params(model, new)
    assert full["embed_tokens.weight"].any() and full["transformer.encoder.layers.0.linear1.weight"].any()
    with FSDP.summon_full_params(new, writeback=False):
        assert new.module.output_proj.weight is new.module.embed_tokens.weight


# ---------------------------------------------------------------------------------------------- rank-0 save / load
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_state_dict_rank0_offload_save_load_flow(use_orig_params):
    """A FULL state dict saved on rank 0 only, loaded on rank 0 only into an unwrapped zeroed model, reaches every
    rank through FSDP(..., sync_module_states=True): all ranks then hold the saved model.

    PyTorch's sync_module_states refuses modules on CPU (its broadcast needs the accelerator): on PyTorch the test
    asserts that refusal; hpcfsdp broadcasts on CPU too (see tests/ported/FSDP1.md)."""
    policy = ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
    model = FSDP(_Seq2Seq(), auto_wrap_policy=policy, use_orig_params=use_orig_params, device_id=CPU)
    with FSDP.summon_full_params(model, writeback=True):
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                if not t.count_nonzero().item():
                    t.add_(torch.ones_like(t))
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        sd = model.state_dict()
    assert (len(sd) > 0) == (dist.get_rank() == 0)
    new = _Seq2Seq(seed=1)
    with torch.no_grad():
        for t in list(new.parameters()) + list(new.buffers()):
            t.zero_()
    if dist.get_rank() == 0:
        new.load_state_dict({fsdp1_clean(k): v.clone() for k, v in sd.items()}, strict=True)
    states = [to_np(t) for t in list(new.parameters()) + list(new.buffers())]
    everyone = [None] * world()[0]
    dist.all_gather_object(everyone, [float(np.abs(s).sum()) for s in states])
    assert all(x > 0 for x in everyone[0]) and all(x == 0 for r in everyone[1:] for x in r), everyone
    if IS_TORCH:
        with pytest.raises(ValueError, match="sync_module_states=True"):
            FSDP(new, auto_wrap_policy=policy, device_id=CPU, sync_module_states=True)
        return
    new_fsdp = FSDP(new, auto_wrap_policy=policy, device_id=CPU, sync_module_states=True)
    # every rank's shards came from rank 0: the gathered parameters equal the saved model's on every rank
    _check_same_params(model, new_fsdp)
    mine = {n: to_np(b) for n, b in new_fsdp.named_buffers()}
    rank0 = _from_rank0(mine)
    for n, v in mine.items():
        assert_close(v, rank0[n], msg=n)
    assert mine["long_buffer"].sum() == 11


# ---------------------------------------------------------------------------------------------- skipped / ignored modules
class _SkipModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(10, 10, bias=False)

    def forward(self, x):
        return self.lin(x)


class _NestedLinear(nn.Module):
    def __init__(self, fsdp_wrap):
        super().__init__()
        lin = nn.Linear(10, 10, bias=False)
        self.nested_linear = wrap(lin) if fsdp_wrap else lin

    def forward(self, x):
        return self.nested_linear(x)


class _SkipModel(nn.Module):
    """common_fsdp's SkipModel: ``linear_skip`` is taken out before wrapping and put back after, so FSDP never
    manages it; ``nested_linear`` is wrapped (twice with ``double_nest``) when built inside enable_wrap."""

    def __init__(self, double_nest):
        super().__init__()
        self.linear = nn.Linear(10, 10, bias=False)
        self.linear_skip = _SkipModule()
        self.nested_linear = wrap(_NestedLinear(fsdp_wrap=double_nest))

    def forward(self, x):
        return self.nested_linear(self.linear_skip(self.linear(x)))


def _skip_model(seed, wrap_fsdp=True):
    torch.manual_seed(seed)
    if not wrap_fsdp:
        return _SkipModel(double_nest=True)
    with enable_wrap(wrapper_cls=FSDP, device_id=CPU):
        module = _SkipModel(double_nest=True)
        skip = module.linear_skip
        del module.linear_skip
        fsdp = wrap(module)
        module.linear_skip = skip
    return fsdp


@pytest.mark.parametrize("sd_type", ["full", "local", "sharded"])
def test_state_dict_skip_module(sd_type):
    """A module taken out of the model before wrapping and put back after: the state dict has the unwrapped
    model's keys (the skipped module's included), loads strictly into a new wrapped model, and (FULL, SHARDED)
    into an unwrapped one."""
    _, r = world()
    kind = {"full": StateDictType.FULL_STATE_DICT, "local": StateDictType.LOCAL_STATE_DICT,
            "sharded": StateDictType.SHARDED_STATE_DICT}[sd_type]
    fsdp = _skip_model(seed=0)
    assert not any(isinstance(p, DTensor) for p in fsdp.module.linear_skip.parameters())
    fsdp(randn(2, 10, seed=r)).sum().backward()
    with FSDP.state_dict_type(fsdp, kind):
        sd = fsdp.state_dict()
    if sd_type != "local":
        assert sorted(sd) == sorted(_SkipModel(double_nest=False).state_dict()), sorted(sd)
    new = _skip_model(seed=1)
    _zero(new)
    with FSDP.state_dict_type(new, kind):
        new.load_state_dict(sd, strict=True)
    full = _check_same_params(fsdp, new)
    assert sorted(full) == ["linear.weight", "linear_skip.lin.weight", "nested_linear.nested_linear.weight"]
    if sd_type == "local":
        return
    local = _skip_model(seed=2, wrap_fsdp=False)
    local.load_state_dict(_gathered(sd), strict=True)
    for n, p in local.named_parameters():
        assert_close(p, full[n], msg=n)


class _IgnoredModel(nn.Module):
    """PyTorch's state-dict Model: ``inner`` an FSDP instance (its module ignored with ``ignore_inner``; fp16
    mixed precision with ``mixed_precision``), ``outer`` a plain linear; both with a persistent and a
    non-persistent buffer."""

    def __init__(self, wrap_fsdp, ignore_inner=False, mixed_precision=False):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Linear(4, 4)
        self.inner.register_buffer("buffer", torch.randn(5, 5))
        self.inner.register_buffer("non_persistent_buffer", torch.randn(5, 5), persistent=False)
        if wrap_fsdp:
            self.inner = FSDP(self.inner, ignored_modules=[self.inner] if ignore_inner else [],
                              mixed_precision=_fp16() if mixed_precision else None, device_id=CPU)
        self.outer = nn.Linear(4, 5)
        self.outer.register_buffer("buffer", torch.randn(5, 5))
        self.outer.register_buffer("non_persistent_buffer", torch.randn(5, 5), persistent=False)

    def forward(self, x):
        return self.outer(self.inner(x) + self.inner(x))


def _fp16():
    return MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16)


@pytest.mark.parametrize("mixed_precision", [False, True])
@pytest.mark.parametrize("ignore_inner", [False, True])
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("sd_type", ["full", "sharded"])
def test_state_dict_with_ignored_modules(sd_type, prefix, ignore_inner, mixed_precision):
    """Ignored parameters and every buffer enter the state dict as the module's own tensors (same data pointer,
    not cloned, again on a second call), buffers in float32 whatever the mixed precision, and the state dict
    loads strictly into an unwrapped model with the FSDP model's parameters."""
    import warnings

    kind = StateDictType.FULL_STATE_DICT if sd_type == "full" else StateDictType.SHARDED_STATE_DICT
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ignoring inner's own module warns (test_fsdp1_checks covers it)
        model = _IgnoredModel(wrap_fsdp=True, ignore_inner=ignore_inner, mixed_precision=mixed_precision)
    inner = model.inner.module
    same_tensor = {"outer.weight": model.outer.weight, "outer.bias": model.outer.bias,
                   "outer.buffer": model.outer.buffer}
    if ignore_inner:
        same_tensor.update({"inner.weight": inner.weight, "inner.bias": inner.bias})
    if ignore_inner or not mixed_precision:  # a cast buffer comes back as an fp32 copy
        same_tensor["inner.buffer"] = inner.buffer
    fsdp = FSDP(model, ignored_modules=[model.outer], mixed_precision=_fp16() if mixed_precision else None,
                device_id=CPU)
    p = "foo." if prefix else ""
    with FSDP.state_dict_type(fsdp, kind):
        raw1 = {fsdp1_clean(k): v for k, v in fsdp.state_dict(prefix=p).items()}
    sd1 = _gathered(raw1)
    for name, tensor in same_tensor.items():
        assert p + name in sd1, (p + name, sorted(sd1))
        assert sd1[p + name].data_ptr() == tensor.data_ptr(), f"{p + name} is a copy"
    for name in ("inner.buffer", "outer.buffer"):
        assert sd1[p + name].dtype == torch.float32, (name, sd1[p + name].dtype)
    assert not any("non_persistent" in k for k in sd1)
    fsdp_params = fsdp1_full_params(fsdp)
    plain = _IgnoredModel(wrap_fsdp=False)
    with torch.no_grad():
        for q in plain.parameters():
            q.zero_()
    plain.load_state_dict({k[len(p):]: v for k, v in sd1.items()}, strict=True)
    for n, q in plain.named_parameters():
        assert_close(q, fsdp_params[n], msg=n)
    with FSDP.state_dict_type(fsdp, kind):
        raw2 = {fsdp1_clean(k): v for k, v in fsdp.state_dict(prefix=p).items()}
    for name, tensor in same_tensor.items():
        assert raw2[p + name].data_ptr() == tensor.data_ptr() == raw1[p + name].data_ptr(), name


# ---------------------------------------------------------------------------------------------- shared / empty / one rank
class _DummyShared(nn.Module):
    """test_fsdp_state_dict.py's TestDummyModel: ``net3`` is ``net2``, ``shared_parameter`` is
    ``random_parameter``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.net2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.net3 = self.net2
        self.random_parameter = nn.Parameter(torch.randn(10))
        self.shared_parameter = self.random_parameter

    def forward(self, x):
        return self.net3(self.net2(self.net1(x)))


def test_shared_module_and_shared_parameter():
    """A FULL state dict holds a shared module's and a shared parameter's entries under every name, equal."""
    ref = _DummyShared()
    model = FSDP(_DummyShared(), device_id=CPU)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        sd = {fsdp1_clean(k): v for k, v in model.state_dict().items()}
    for a, b in (("random_parameter", "shared_parameter"), ("net2.0.bias", "net3.0.bias"),
                 ("net2.0.weight", "net3.0.weight")):
        assert_close(sd[a], sd[b], msg=a)
        assert_close(sd[a], dict(ref.state_dict())[a], msg=a)
    assert sorted(sd) == sorted(ref.state_dict())


def test_local_state_dict_with_empty_ranks():
    """A one-element parameter leaves every rank but one without elements: a LOCAL state dict still round-trips
    (the value written inside summon_full_params is undone by loading it)."""

    class OneElement(nn.Module):
        def __init__(self):
            super().__init__()
            self.my_parameter = nn.Parameter(torch.full((1,), 3.1415926))

        def forward(self, x):
            return self.my_parameter

    import copy

    model = FSDP(OneElement(), device_id=CPU)
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        model(None).backward()
        sd = copy.deepcopy(model.state_dict())
        with torch.no_grad():
            with FSDP.summon_full_params(model):
                assert abs(model.my_parameter.item() - 3.1415926) < 1e-6
                model.my_parameter.copy_(torch.full((1,), 1.75))
        assert abs(fsdp1_full_params(model)["my_parameter"][0] - 1.75) < 1e-6
        model.load_state_dict(sd)
        with FSDP.summon_full_params(model):
            assert abs(model.my_parameter.item() - 3.1415926) < 1e-6


def test_world_size_one():
    """Every rank wraps its own model over a one-rank group: a SHARDED state dict saves and loads (into a
    differently initialised model over the same group, which then holds the saved values)."""
    w, r = world()
    mine = None
    for i in range(w):
        g = dist.new_group(ranks=[i])
        if i == r:
            mine = g
    policy = ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})
    model = FSDP(_Seq2Seq(seed=r), process_group=mine, auto_wrap_policy=policy, device_id=CPU)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
        model.load_state_dict(sd)
    other = FSDP(_Seq2Seq(seed=r + 100), process_group=mine, auto_wrap_policy=policy, device_id=CPU)
    with FSDP.state_dict_type(other, StateDictType.SHARDED_STATE_DICT):
        other.load_state_dict(sd)
    ref = _Seq2Seq(seed=r)
    full = fsdp1_full_params(other)
    for n, p in ref.named_parameters():
        assert_close(full[n], p, msg=n)
    dist.barrier()
