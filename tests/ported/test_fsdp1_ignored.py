"""Re-expresses PyTorch's test/distributed/fsdp/test_fsdp_ignored_modules.py cases not covered elsewhere: ignored
modules that differ across ranks, ignored modules outside the instance given them, and the argument checks. The
ignored parameters train locally (their gradients are not reduced), so the reference is DDP by hand over the
FSDP-managed parameters only."""
import pytest

from _common import assert_close, copy_model, fsdp1_clean, fsdp1_cpu, local, randn, to_np, world
from _framework import FSDP, dist, nn, torch

pytestmark = pytest.mark.mpi(min_size=2)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer0 = nn.Linear(3, 5)
        self.layer1 = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 4), nn.Linear(4, 4))
        self.layer2 = nn.Linear(4, 2)
        self.layer3 = nn.Linear(2, 2)
        self.relu = nn.ReLU()
        with torch.no_grad():  # NumPy values, the same in both frameworks, none of the ReLUs dead
            for i, p in enumerate(self.parameters()):
                p.copy_(randn(*p.shape, seed=63 + i) * 0.7 + (0.5 if p.ndim == 1 else 0.0))

    def forward(self, x):
        z = self.relu(self.layer0(x))
        z = self.relu(self.layer1(z))
        z = self.relu(self.layer2(z))
        return self.relu(self.layer3(z))


class IgnoredModule(nn.Module):
    def __init__(self, dim, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.weight = nn.Parameter(torch.randn((dim, dim)) * 0.5)

    def forward(self, x):
        return x @ self.weight


def _with_ignored(num_ignored):
    """Model with ``num_ignored`` IgnoredModules inside layer1 before its last linear (the other layers equal on
    every rank)."""
    model = Model()
    l1 = model.layer1
    model.layer1 = nn.Sequential(l1[0], l1[1], *[IgnoredModule(4, 100 + i) for i in range(num_ignored)], l1[2])
    return model


def _train_against_ddp(model, ref, managed, iters=3):
    """Adam on each rank's slice; the reference averages the gradients of the parameters FSDP manages (names in
    ``managed``) and keeps the others local, as FSDP does. Returns the reference's parameters by name."""
    w, _ = world()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(iters):
        x = local(randn(2 * w, 3, seed=it))
        model(x).sum().backward()
        ref(x).sum().backward()
        for name, p in ref.named_parameters():
            if name in managed:
                dist.all_reduce(p.grad)
                p.grad.div_(w)
        optim.step()
        ref_optim.step()
        optim.zero_grad()
        ref_optim.zero_grad()
    return dict(ref.named_parameters())


def _check_full(fsdp_modules, model, ref_params):
    """Every parameter of ``model`` (the FSDP instances' full ones summoned) equals the reference's."""
    import contextlib

    with contextlib.ExitStack() as stack:
        for m in fsdp_modules:
            stack.enter_context(FSDP.summon_full_params(m, writeback=False))
        got = {fsdp1_clean(n): to_np(p) for n, p in model.named_parameters()}
    assert sorted(got) == sorted(ref_params)
    for name, value in got.items():
        assert_close(value, ref_params[name], rtol=1e-5, atol=1e-6, msg=name)
    return got


@pytest.mark.parametrize("ignore_modules", [True, False])
@pytest.mark.parametrize("pass_ignored_modules_to_root", [False, True])
def test_diff_ignored_modules_across_ranks(pass_ignored_modules_to_root, ignore_modules):
    """Rank r ignores r + 1 IgnoredModules inside layer1 (an instance of its own; layer3 another, the model the
    root), as ignored_modules or as ignored_states (a generator, as upstream), given to the root too or not: the
    ranks shard the same parameters, three Adam steps train the managed parameters as DDP does and the ignored
    ones locally."""
    _, rank = world()
    model = _with_ignored(rank + 1)
    ref = copy_model(model)
    ignored = [m for m in model.layer1.modules() if isinstance(m, IgnoredModule)]
    kw = ({"ignored_modules": ignored} if ignore_modules
          else {"ignored_states": (p for m in ignored for p in m.parameters())})
    model.layer1 = FSDP(model.layer1, device_id=fsdp1_cpu(), **kw)
    model.layer3 = FSDP(model.layer3, device_id=fsdp1_cpu())
    top = ignored if pass_ignored_modules_to_root else []
    top_kw = ({"ignored_modules": top} if ignore_modules
              else {"ignored_states": {p for m in top for p in m.parameters()}})
    fsdp = FSDP(model, device_id=fsdp1_cpu(), **top_kw)
    ignored_names = {n for n, _ in ref.named_parameters() if n.endswith(".weight") and "layer1" in n
                     and isinstance(ref.get_submodule(n.rsplit(".", 1)[0]), IgnoredModule)}
    assert len(ignored_names) == rank + 1
    managed = {n for n, _ in ref.named_parameters()} - ignored_names
    initial = {n: to_np(p) for n, p in ref.named_parameters()}
    ref_params = _train_against_ddp(fsdp, ref, managed)
    got = _check_full([fsdp], fsdp, ref_params)
    assert all(not (got[n] == initial[n]).all() for n in managed), "a managed parameter did not train"
    for name in ignored_names:  # the ignored weights moved, each rank on its own data
        assert tuple(got[name].shape) == (4, 4)


@pytest.mark.parametrize("ignore_modules", [True, False])
def test_ignored_modules_not_under_wrapped_root(ignore_modules):
    """layer1 and layer3 are FSDP instances of a plain model, both given layer1's last two linears to ignore
    (outside layer3's tree): it trains, the managed parameters as DDP does, the ignored and plain ones locally."""
    model = Model()
    ref = copy_model(model)
    ignored = list(model.layer1.children())[1:]
    kw = ({"ignored_modules": ignored} if ignore_modules
          else {"ignored_states": {p for m in ignored for p in m.parameters()}})
    model.layer1 = FSDP(model.layer1, device_id=fsdp1_cpu(), **kw)
    model.layer3 = FSDP(model.layer3, device_id=fsdp1_cpu(), **kw)
    managed = {"layer1.0.weight", "layer1.0.bias", "layer3.weight", "layer3.bias"}
    initial = {n: to_np(p) for n, p in ref.named_parameters()}
    ref_params = _train_against_ddp(model, ref, managed)
    got = _check_full([model.layer1, model.layer3], model, ref_params)
    for name in got:  # every parameter (managed, ignored, plain) trained: the comparison is not vacuous
        assert not (got[name] == initial[name]).all(), name


def test_ignored_states_check():
    """Parameters given as ignored_modules, both arguments given, and ignored_states mixing modules and
    parameters: ValueError in PyTorch's words (the class paths are the framework's)."""
    model = Model()
    ignored_modules = list(model.layer1.children())[1:]
    ignored_params = {p for m in ignored_modules for p in m.parameters()}
    with pytest.raises(ValueError, match=r"ignored_modules expects nn.Module list elements but got types "
                                         r"\[<class '[\w.]+\.Parameter'>\]"):
        FSDP(model, ignored_modules=ignored_params, device_id=fsdp1_cpu())
    with pytest.raises(ValueError, match="Cannot pass both ignored_modules and ignored_states at the same time"):
        FSDP(model, ignored_modules=ignored_modules, ignored_states=ignored_params, device_id=fsdp1_cpu())
    with pytest.raises(ValueError, match=r"ignored_states expects all nn.Parameter or all nn.Module list elements "
                                         r"but got types \[<class '[\w.]+\.Linear'>, <class '[\w.]+\.Parameter'>\]"):
        FSDP(model, ignored_states=ignored_params.union(set(ignored_modules)), device_id=fsdp1_cpu())
    assert not any(isinstance(m, FSDP) for m in model.modules())  # nothing was wrapped by the failed calls


@pytest.mark.parametrize("ignore_modules", [True, False])
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_ignored_modules_nested(use_orig_params, ignore_modules):
    """layer1[1] is an FSDP instance inside layer1, which the root ignores (as a module, or as layer1's
    parameters through ignored_states): the nested instance still shards and averages its parameters, layer1's
    other parameters train locally, the rest with the root; three Adam steps as DDP over the managed ones.
    (Upstream's FlatParameter numel check: flat.)"""
    model = Model()
    ref = copy_model(model)
    model.layer1[1] = FSDP(model.layer1[1], use_orig_params=use_orig_params, device_id=fsdp1_cpu())
    kw = ({"ignored_modules": [model.layer1]} if ignore_modules
          else {"ignored_states": list(model.layer1.parameters())})
    fsdp = FSDP(model, use_orig_params=use_orig_params, device_id=fsdp1_cpu(), **kw)
    managed = {n for n, _ in ref.named_parameters() if not n.startswith("layer1.") or n.startswith("layer1.1.")}
    assert len(managed) == 8
    initial = {n: to_np(p) for n, p in ref.named_parameters()}
    ref_params = _train_against_ddp(fsdp, ref, managed)
    got = _check_full([fsdp], fsdp, ref_params)
    assert all(not (got[n] == initial[n]).all() for n in got), "a parameter did not train"


@pytest.mark.parametrize("ignore_bias", [True, False])
@pytest.mark.parametrize("policy", ["transformer_policy", "module_policy"])
def test_ignored_states_auto_wrap(policy, ignore_bias):
    """ignored_states naming layer1[1]'s weight (and bias) with a policy making layer1 (the only Sequential) a
    unit: those stay local and train on each rank's data, the rest trains as DDP. (Upstream's sharded-numel
    bounds: flat.)"""
    import functools

    from _framework import ModuleWrapPolicy, transformer_auto_wrap_policy

    model = Model()
    ref = copy_model(model)
    ignored = [model.layer1[1].weight] + ([model.layer1[1].bias] if ignore_bias else [])
    pol = (functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Sequential})
           if policy == "transformer_policy" else ModuleWrapPolicy((nn.Sequential,)))
    fsdp = FSDP(model, use_orig_params=False, auto_wrap_policy=pol, ignored_states=ignored, device_id=fsdp1_cpu())
    ignored_names = {"layer1.1.weight"} | ({"layer1.1.bias"} if ignore_bias else set())
    managed = {n for n, _ in ref.named_parameters()} - ignored_names
    initial = {n: to_np(p) for n, p in ref.named_parameters()}
    ref_params = _train_against_ddp(fsdp, ref, managed)
    got = _check_full([fsdp], fsdp, ref_params)
    assert all(not (got[n] == initial[n]).all() for n in got), "a parameter did not train"


@pytest.mark.parametrize("use_auto_wrap", [False, True])
@pytest.mark.parametrize("ignore_modules", [True, False])
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_ignored_modules_transformer(use_orig_params, ignore_modules, use_auto_wrap):
    """A small transformer whose blocks (the role of nn.Transformer in TransformerWithSharedParams) are ignored,
    as a module or as their parameters, with and without every Linear auto-wrapped (the output projection then
    untied from the embedding, as upstream): the blocks train locally, the rest as DDP, three Adam steps."""
    from _common import Transformer, randint
    from _framework import ModuleWrapPolicy

    w, _ = world()

    def build():
        torch.manual_seed(0)
        m = Transformer(n_layers=2, weight_tying=True)
        if use_auto_wrap:
            m.output.weight = nn.Parameter(m.output.weight.detach().clone())
        return m

    model, ref = build(), build()
    kw = {"ignored_modules": [model.layers]} if ignore_modules else {"ignored_states": list(model.layers.parameters())}
    if use_auto_wrap:
        kw["auto_wrap_policy"] = ModuleWrapPolicy({nn.Linear})
    fsdp = FSDP(model, use_orig_params=use_orig_params, device_id=fsdp1_cpu(), **kw)
    managed = {n for n, _ in ref.named_parameters() if not n.startswith("layers.")}
    optim = torch.optim.Adam(fsdp.parameters(), lr=1e-2)
    ref_optim = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for it in range(3):
        tokens = local(randint(17, 2 * w, 6, seed=it))
        fsdp(tokens).sum().backward()
        ref(tokens).sum().backward()
        for name, p in ref.named_parameters():
            if name in managed:
                dist.all_reduce(p.grad)
                p.grad.div_(w)
        optim.step()
        ref_optim.step()
        optim.zero_grad()
        ref_optim.zero_grad()
    got = _check_full([fsdp], fsdp, dict(ref.named_parameters()))
    assert any(n.startswith("layers.") for n in got) and managed <= set(got)
