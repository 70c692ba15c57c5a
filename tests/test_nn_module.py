"""Tests of nn.Module: registration, iteration, hooks, state_dict, _apply, repr, class swap."""
import copy
from collections import OrderedDict

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(3, 2, bias=False)
        self.register_buffer("running", hp.zeros(2))
        self.register_buffer("scratch", hp.ones(2), persistent=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_registration_and_iteration_order():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight"]
    assert [n for n, _ in net.named_buffers()] == ["running", "scratch"]
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "fc2"]
    assert [n for n, _ in net.named_modules()] == ["", "fc1", "act", "fc2"]
    assert [n for n, _ in net.named_parameters(prefix="m", recurse=False)] == []
    assert [n for n, _ in net.fc1.named_parameters(prefix="m")] == ["m.weight", "m.bias"]
    assert isinstance(net.fc1.weight, nn.Parameter)
    assert net.fc2.bias is None
    assert net.get_submodule("fc1") is net.fc1
    assert net.get_parameter("fc1.bias") is net.fc1.bias
    assert net.get_buffer("running") is net.running
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        net.get_submodule("fc1.nope")
    with pytest.raises(AttributeError, match="'Net' object has no attribute 'missing'"):
        net.missing
    assert "fc1" in dir(net) and "running" in dir(net)


def test_setattr_routing_and_errors():
    m = nn.Module()
    p = nn.Parameter(hp.zeros(3))
    m.w = p
    assert m._parameters["w"] is p and "w" not in m.__dict__
    m.sub = nn.Linear(2, 2)
    assert "sub" in m._modules
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'w'"):
        m.w = hp.zeros(3)
    m.w = None
    assert m._parameters["w"] is None
    assert [id(q) for q in m.parameters()] == [id(q) for q in m.sub.parameters()]
    with pytest.raises(TypeError, match="cannot assign .* as child module 'sub'"):
        m.sub = 3
    m.register_buffer("b", hp.zeros(1))
    with pytest.raises(TypeError, match="as buffer 'b'"):
        m.b = 3
    with pytest.raises(KeyError, match="attribute 'sub' already exists"):
        m.register_buffer("sub", hp.zeros(1))
    with pytest.raises(KeyError, match="parameter name can.*contain"):
        m.register_parameter("a.b", nn.Parameter(hp.zeros(1)))
    with pytest.raises(TypeError, match="to parameter 'q'"):
        m.register_parameter("q", hp.zeros(1))
    with pytest.raises(TypeError, match="is not a Module subclass"):
        m.add_module("x", 3)
    del m.sub
    assert "sub" not in m._modules
    with pytest.raises(AttributeError, match="before Module.__init__"):
        class Bad(nn.Module):
            def __init__(self):
                self.w = nn.Parameter(hp.zeros(1))

        Bad()


def test_shared_parameters_and_modules_are_deduplicated():
    lin = nn.Linear(3, 3)
    seq = nn.Sequential(lin, nn.ReLU(), lin)
    assert [n for n, _ in seq.named_modules()] == ["", "0", "1"]
    assert len(list(seq.named_modules(remove_duplicate=False))) == 4
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]
    assert [n for n, _ in seq.named_parameters(remove_duplicate=False)] == [
        "0.weight", "0.bias", "2.weight", "2.bias"]
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    b.weight = a.weight
    both = nn.ModuleList([a, b])
    assert [n for n, _ in both.named_parameters()] == ["0.weight", "0.bias", "1.bias"]
    # state_dict keeps every name (as PyTorch), both pointing at the same values
    sd = both.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_train_eval_apply_requires_grad_zero_grad():
    net = Net()
    assert net.training and net.fc1.training
    net.eval()
    assert not net.training and not net.fc1.training
    net.train()
    assert net.fc2.training
    with pytest.raises(ValueError, match="boolean"):
        net.train("yes")
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "ReLU", "Linear", "Net"]
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    net.requires_grad_(True)
    out = net(hp.randn(5, 4)).sum()
    out.backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_forward_hooks_order_prepend_kwargs_and_remove():
    log = []

    class Add(nn.Module):
        def forward(self, x, *, scale=1.0):
            log.append(("forward", x, scale))
            return x * scale

    m = Add()
    h1 = m.register_forward_pre_hook(lambda mod, args: log.append("pre1"))
    h2 = m.register_forward_pre_hook(lambda mod, args: log.append("pre0"), prepend=True)

    def pre_kw(mod, args, kwargs):
        log.append("prekw")
        return (args[0] + 1,), {"scale": 10.0}

    h3 = m.register_forward_pre_hook(pre_kw, with_kwargs=True)
    h4 = m.register_forward_hook(lambda mod, args, out: log.append(("post", args[0], out)))

    def post_kw(mod, args, kwargs, out):
        log.append(("postkw", kwargs["scale"]))
        return out + 0.5

    h5 = m.register_forward_hook(post_kw, with_kwargs=True, prepend=True)
    out = m(1.0, scale=2.0)
    assert out == 20.5
    assert log == ["pre0", "pre1", "prekw", ("forward", 2.0, 10.0), ("postkw", 10.0), ("post", 2.0, 20.5)]
    for h in (h1, h2, h3, h4, h5):
        h.remove()
    h1.remove()  # idempotent
    log.clear()
    assert m(1.0) == 1.0 and log == [("forward", 1.0, 1.0)]


def test_forward_pre_hook_non_tuple_result_is_wrapped_and_bad_kwargs_result_raises():
    m = nn.Identity()
    m.register_forward_pre_hook(lambda mod, args: 7)
    assert m(1) == 7
    m2 = nn.Identity()
    m2.register_forward_pre_hook(lambda mod, args, kwargs: 7, with_kwargs=True)
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        m2(1)


def test_forward_hook_always_call_runs_on_error():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    seen = []
    m = Boom()
    m.register_forward_hook(lambda mod, args, out: seen.append(out), always_call=True)
    with pytest.raises(ValueError, match="boom"):
        m(1)
    assert seen == [None]


def test_failing_always_call_hook_keeps_the_forward_error_and_warns():
    # forward raised, then an always_call hook raised too: the user sees forward's exception, and a
    # warning names the hook's error (it must not be replaced by the hook's error or anything else).
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    def bad_hook(mod, args, out):
        raise KeyError("hook broke")

    m = Boom()
    m.register_forward_hook(bad_hook, always_call=True)
    with pytest.warns(UserWarning, match=r"always_call=True raised an exception that was ignored.*KeyError\('hook broke'\)"):
        with pytest.raises(ValueError, match="boom") as info:
            m(1)
    assert type(info.value) is ValueError and info.value.__context__ is None


def test_state_dict_keys_detached_persistent_only():
    net = Net()
    sd = net.state_dict()
    assert isinstance(sd, OrderedDict)
    assert list(sd) == ["running", "fc1.weight", "fc1.bias", "fc2.weight"]
    assert all(not v.requires_grad and not isinstance(v, nn.Parameter) for v in sd.values())
    # detached but sharing storage, as PyTorch
    assert np.shares_memory(sd["fc1.weight"].numpy(), net.fc1.weight.detach().numpy())
    assert sd._metadata[""]["version"] == 1 and "fc1" in sd._metadata
    kv = net.state_dict(keep_vars=True)
    assert kv["fc1.weight"] is net.fc1.weight
    pre = net.state_dict(prefix="model.")
    assert list(pre)[0] == "model.running"


def test_load_state_dict_copies_in_place_and_reports_keys():
    src, dst = Net(), Net()
    w_before = dst.fc1.weight
    res = dst.load_state_dict(src.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert dst.fc1.weight is w_before
    np.testing.assert_array_equal(dst.fc1.weight.detach().numpy(), src.fc1.weight.detach().numpy())
    # loading copies values: later changes to src do not leak into dst
    with hp.no_grad():
        src.fc1.weight.add_(1.0)
    assert not np.allclose(dst.fc1.weight.detach().numpy(), src.fc1.weight.detach().numpy())

    sd = src.state_dict()
    del sd["fc2.weight"]
    sd["extra.weight"] = hp.zeros(1)
    sd["fc1.nope"] = hp.zeros(1)
    with pytest.raises(RuntimeError) as ei:
        dst.load_state_dict(sd)
    msg = str(ei.value)
    assert msg.startswith("Error(s) in loading state_dict for Net:")
    assert 'Missing key(s) in state_dict: "fc2.weight".' in msg
    assert 'Unexpected key(s) in state_dict: "extra.weight", "fc1.nope".' in msg
    res = dst.load_state_dict(sd, strict=False)
    # non-strict: no error, but the keys are still reported (as PyTorch)
    assert res.missing_keys == ["fc2.weight"] and res.unexpected_keys == ["extra.weight", "fc1.nope"]


def test_load_state_dict_size_mismatch_always_raises():
    class M(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.fc = nn.Linear(4, n)

    with pytest.raises(RuntimeError, match=r"size mismatch for fc.weight: copying a param with shape \(3, 4\) "
                                           r"from checkpoint, the shape in current model is \(4, 4\)"):
        M(4).load_state_dict(M(3).state_dict(), strict=False)


def test_load_state_dict_assign_and_hooks():
    src, dst = Net(), Net()
    old = dst.fc1.weight
    dst.load_state_dict(src.state_dict(keep_vars=False), assign=True)
    assert dst.fc1.weight is not old and isinstance(dst.fc1.weight, nn.Parameter)
    assert dst.fc1.weight.requires_grad

    calls = []

    def pre(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        calls.append(("pre", type(module).__name__, prefix))
        if prefix == "fc1.":  # rename a legacy key, as FSDP / checkpoint converters do
            state_dict[prefix + "weight"] = state_dict.pop(prefix + "w_old")

    def post(module, incompatible):
        calls.append(("post", type(module).__name__))

    h = dst.fc1.register_load_state_dict_pre_hook(pre)
    dst.register_load_state_dict_post_hook(post)
    sd = src.state_dict()
    sd["fc1.w_old"] = sd.pop("fc1.weight")
    dst.load_state_dict(sd)
    assert calls == [("pre", "Linear", "fc1."), ("post", "Net")]
    np.testing.assert_array_equal(dst.fc1.weight.detach().numpy(), src.fc1.weight.detach().numpy())
    h.remove()


def test_state_dict_hooks():
    net = Net()
    seen = []
    net.fc1.register_state_dict_pre_hook(lambda m, prefix, keep_vars: seen.append(prefix))

    def rename(module, sd, prefix, local_metadata):
        return OrderedDict((k.replace("fc2", "head"), v) for k, v in sd.items())

    h = net._register_state_dict_hook(rename)

    def add_key(module, sd, prefix, local_metadata):
        sd[prefix + "marker"] = hp.zeros(1)

    net.fc2.register_state_dict_post_hook(add_key)
    sd = net.state_dict()
    assert seen == ["fc1."]
    assert "head.weight" in sd and "head.marker" in sd and "fc2.weight" not in sd
    h.remove()
    assert "fc2.weight" in net.state_dict()

    def bad(module, sd, prefix, local_metadata):
        return sd

    net.register_state_dict_post_hook(bad)
    with pytest.raises(RuntimeError, match="must return None"):
        net.state_dict()


class _Sub(nn.Linear):
    """A dynamically usable subclass, as FSDP swaps __class__ to."""

    def forward(self, x):
        return super().forward(x) * 2


def test_class_swap_keeps_registrations_and_hooks():
    lin = nn.Linear(3, 2)
    x = hp.randn(4, 3)
    ref = lin(x).detach().numpy()
    seen = []
    lin.register_forward_hook(lambda m, a, o: seen.append(type(m).__name__))
    dyn = type("FSDPLinear", (_Sub,), {})
    lin.__class__ = dyn
    out = lin(x).detach().numpy()
    np.testing.assert_allclose(out, 2 * ref, rtol=1e-6)
    assert seen == ["FSDPLinear"]
    assert isinstance(lin, nn.Linear) and [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    assert list(lin.state_dict()) == ["weight", "bias"]


def test_apply_to_float_double_and_to_empty():
    net = Net()
    w = net.fc1.weight
    net.double()
    assert net.fc1.weight is w and w.dtype == hp.float64 and net.running.dtype == hp.float64
    net.to(hp.float32)
    assert w.dtype == hp.float32
    net.to("cpu")
    assert w.device == "cpu"
    with pytest.raises(TypeError, match="floating point"):
        net.to(hp.int64)
    net.to_empty(device="meta")
    assert net.fc1.weight is w and w.device == "meta" and tuple(w.shape) == (3, 4)
    net.to_empty(device="cpu")
    assert w.device == "cpu" and tuple(w.shape) == (3, 4)
    # _apply also converts existing grads; integer buffers keep their dtype under to(dtype)
    m = nn.Linear(2, 2)
    m.register_buffer("count", hp.zeros(1, dtype=hp.int64))
    m(hp.randn(1, 2)).sum().backward()
    m.double()
    assert m.weight.grad.dtype == hp.float64 and m.count.dtype == hp.int64


def test_meta_device_context_builds_meta_modules():
    with hp.device("meta"):
        lin = nn.Linear(1000, 1000)
    assert lin.weight.device == "meta" and lin.bias.device == "meta"
    lin2 = nn.Linear(3, 3, device="meta")
    assert lin2.weight.device == "meta"
    lin2.to_empty(device="cpu")
    lin2.reset_parameters()
    assert np.all(np.isfinite(lin2.weight.detach().numpy()))


def test_to_empty_storage_is_zero_filled_not_garbage():
    # PyTorch leaves it uninitialised; scripts that forget to re-initialise a submodule (pytorch/examples'
    # FSDP2 Transformer.reset_parameters skips its blocks) get whatever the allocator held, NaN included.
    # Zeros are one valid "uninitialised" content and make such a script deterministic and finite.
    junk = [np.full(n, np.nan, dtype=np.float32) for n in (16, 256, 4096)]  # freed below: recycled memory
    del junk
    with hp.device("meta"):
        net = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 64))
    net.to_empty(device="cpu")
    for name, p in net.named_parameters():
        assert np.array_equal(p.detach().numpy(), np.zeros(tuple(p.shape), np.float32)), name


def test_repr_matches_pytorch_layout():
    net = Net()
    assert repr(net) == (
        "Net(\n"
        "  (fc1): Linear(in_features=4, out_features=3, bias=True)\n"
        "  (act): ReLU()\n"
        "  (fc2): Linear(in_features=3, out_features=2, bias=False)\n"
        ")"
    )
    ml = nn.ModuleList([nn.GELU() for _ in range(3)] + [nn.Tanh()])
    assert repr(ml) == "ModuleList(\n  (0-2): 3 x GELU(approximate='none')\n  (3): Tanh()\n)"


def test_deepcopy_gives_independent_equal_module():
    net = Net()
    cp = copy.deepcopy(net)
    assert cp.fc1.weight is not net.fc1.weight
    np.testing.assert_array_equal(cp.fc1.weight.detach().numpy(), net.fc1.weight.detach().numpy())
    with hp.no_grad():
        cp.fc1.weight.add_(1.0)
    assert not np.allclose(cp.fc1.weight.detach().numpy(), net.fc1.weight.detach().numpy())


def test_parameter_repr_sharing_and_subclass_combination():
    t = hp.zeros(2)
    p = nn.Parameter(t)
    assert p.requires_grad and p.is_leaf and type(p) is nn.Parameter
    assert np.shares_memory(p.detach().numpy(), t.numpy())
    assert repr(p).startswith("Parameter containing:\ntensor(")
    assert not nn.Parameter(t, requires_grad=False).requires_grad

    class Sharded(hp.Tensor):
        pass

    s = Sharded._make_subclass(Sharded, hp.ones(3))
    s.spec = "Shard(0)"
    ps = nn.Parameter(s)
    assert isinstance(ps, nn.Parameter) and isinstance(ps, Sharded)
    assert ps.spec == "Shard(0)" and ps.requires_grad
    assert type(nn.Parameter(Sharded._make_subclass(Sharded, hp.ones(1)))) is type(ps)  # class is cached
    m = nn.Module()
    m.w = ps
    assert list(m.parameters())[0] is ps


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear) and isinstance(seq[1:], nn.Sequential)
    x = hp.randn(4, 2)
    ref = seq[2](seq[1](seq[0](x)))
    np.testing.assert_allclose(seq(x).detach().numpy(), ref.detach().numpy())
    named = nn.Sequential(OrderedDict(a=nn.ReLU(), b=nn.Tanh()))
    assert [n for n, _ in named.named_children()] == ["a", "b"]
    ml = nn.ModuleList([nn.ReLU()])
    ml.append(nn.Tanh())
    ml.extend([nn.GELU()])
    ml.insert(0, nn.Identity())
    assert [type(m).__name__ for m in ml] == ["Identity", "ReLU", "Tanh", "GELU"]
    del ml[0]
    assert [n for n, _ in ml.named_children()] == ["0", "1", "2"]
    with pytest.raises(IndexError):
        ml[5]
    md = nn.ModuleDict({"x": nn.ReLU()})
    md["y"] = nn.Tanh()
    assert list(md.keys()) == ["x", "y"] and "y" in md and len(md) == 2
    assert md.pop("x").__class__ is nn.ReLU and list(md) == ["y"]


def test_parameter_deepcopy_keeps_subclass_fields_and_cuda_error():
    class Sharded(hp.Tensor):
        pass

    s = Sharded._make_subclass(Sharded, hp.ones(3))
    s.spec = ["Shard(0)"]
    m = nn.Module()
    m.w = nn.Parameter(s)
    cp = copy.deepcopy(m)
    assert type(cp.w) is type(m.w) and cp.w.spec == ["Shard(0)"] and cp.w.spec is not m.w.spec
    assert not np.shares_memory(cp.w.detach().numpy(), m.w.detach().numpy())
    meta = nn.Parameter(hp.empty(2, 2, device="meta"))
    assert copy.deepcopy(meta).device == "meta"
    if not hp._backend.cupy_available():
        with pytest.raises(RuntimeError, match="needs (CuPy|a CUDA GPU)"):
            nn.Linear(2, 2).cuda()


def test_register_module_and_state_dict_destination():
    m = nn.Module()
    m.register_module("a", nn.Linear(2, 2))
    m.add_module("b", None)
    assert [n for n, _ in m.named_children()] == ["a"] and m.b is None
    dest = OrderedDict()
    out = m.state_dict(destination=dest, prefix="x.")
    assert out is dest and list(dest) == ["x.a.weight", "x.a.bias"]


# -- parameter containers --------------------------------------------------------------------------------
def test_parameter_list():
    pl = nn.ParameterList([nn.Parameter(hp.randn(3, 4)), hp.randn(5)])
    assert len(pl) == 2 and all(isinstance(p, nn.Parameter) for p in pl)  # a plain Tensor becomes a Parameter
    pl.append(hp.zeros(2))
    pl.extend([hp.ones(1)])
    assert [tuple(p.shape) for p in pl.parameters()] == [(3, 4), (5,), (2,), (1,)]
    assert list(pl.state_dict()) == ["0", "1", "2", "3"]
    assert pl[-1].shape == (1,) and len(pl[1:3]) == 2
    pl[0] = hp.ones(7)
    assert pl[0].shape == (7,) and isinstance(pl[0], nn.Parameter)
    assert repr(nn.ParameterList([hp.zeros(3, 4), hp.zeros(5, dtype=hp.float64)])) == (
        "ParameterList(\n    (0): Parameter containing: [hp.float32 of size 3x4]\n"
        "    (1): Parameter containing: [hp.float64 of size 5]\n)")
    # one entry: PyTorch's Module.__repr__ puts a single extra_repr line inline
    assert repr(nn.ParameterList([hp.zeros(3)])) == "ParameterList(  (0): Parameter containing: [hp.float32 of size 3])"
    assert repr(nn.ParameterList()) == "ParameterList()"

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.ParameterList([hp.zeros(2)])

    assert list(dict(M().named_parameters())) == ["p.0"]
    with pytest.raises(IndexError):
        pl[4]
    with pytest.raises(TypeError, match="should be called with an iterable"):
        pl.extend(3)
    with pytest.raises(RuntimeError, match="ParameterList should not be called"):
        pl(1)


def test_parameter_dict():
    pd = nn.ParameterDict({"b": hp.randn(3, 4), "a": nn.Parameter(hp.zeros(5, dtype=hp.float64))})
    assert list(pd.keys()) == ["a", "b"]  # a plain dict is inserted in sorted order, as PyTorch
    assert all(isinstance(v, nn.Parameter) for v in pd.values())
    assert list(pd.state_dict()) == ["a", "b"] and "a" in pd and len(pd) == 2
    pd["c"] = hp.ones(1)
    pd.update([("d", hp.ones(2))])
    assert list(pd) == ["a", "b", "c", "d"]
    assert pd.pop("c").shape == (1,) and "c" not in dict(pd.named_parameters())
    assert pd.popitem()[0] == "d" and pd.get("zz", 3) == 3 and pd.setdefault("e", hp.ones(3)).shape == (3,)
    assert repr(nn.ParameterDict({"a": hp.zeros(5, dtype=hp.float64), "b": hp.zeros(2, 3)})) == (
        "ParameterDict(\n    (a): Parameter containing: [hp.DoubleTensor of size 5]\n"
        "    (b): Parameter containing: [hp.FloatTensor of size 2x3]\n)")
    merged = nn.ParameterDict({"x": hp.ones(1)}) | nn.ParameterDict({"y": hp.ones(2)})
    assert list(merged) == ["x", "y"]
    with pytest.raises(TypeError, match="not a string"):
        pd[1] = hp.ones(1)
    with pytest.raises(RuntimeError, match="ParameterDict should not be called"):
        pd(1)
