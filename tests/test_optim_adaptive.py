"""Adadelta, Adagrad, RMSprop, Adamax, NAdam, RAdam against float64 NumPy transcriptions of PyTorch's documented
algorithms; signatures, state layout, state_dict round trips and PyTorch's errors for bad hyperparameters."""
import inspect

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.optim import Adadelta, Adagrad, Adamax, NAdam, Optimizer, RAdam, RMSprop

STEPS = 20


def _problem(seed, shapes=((4, 3), (5,)), steps=STEPS):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(steps)]
    return init, grads


# ---------------------------------------------------------------------------- references (float64)
# Each is the algorithm box of PyTorch's docs, one parameter at a time; ``maximize`` negates the gradient.
def ref_adadelta(init, grads, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    ps = [p.copy() for p in init]
    v = [np.zeros_like(p) for p in ps]
    u = [np.zeros_like(p) for p in ps]
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            v[i] = v[i] * rho + g * g * (1 - rho)
            dx = np.sqrt(u[i] + eps) / np.sqrt(v[i] + eps) * g
            u[i] = u[i] * rho + dx * dx * (1 - rho)
            ps[i] = ps[i] - lr * dx
    return ps


def ref_adagrad(init, grads, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                maximize=False):
    ps = [p.copy() for p in init]
    s = [np.full_like(p, initial_accumulator_value) for p in ps]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            clr = lr / (1 + (t - 1) * lr_decay)
            if weight_decay:
                g = g + weight_decay * ps[i]
            s[i] = s[i] + g * g
            ps[i] = ps[i] - clr * g / (np.sqrt(s[i]) + eps)
    return ps


def ref_rmsprop(init, grads, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                maximize=False):
    ps = [p.copy() for p in init]
    v = [np.zeros_like(p) for p in ps]
    b = [np.zeros_like(p) for p in ps]
    gave = [np.zeros_like(p) for p in ps]
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            v[i] = alpha * v[i] + (1 - alpha) * g * g
            vt = v[i]
            if centered:
                gave[i] = gave[i] * alpha + (1 - alpha) * g
                vt = vt - gave[i] ** 2
            if momentum > 0:
                b[i] = momentum * b[i] + g / (np.sqrt(vt) + eps)
                ps[i] = ps[i] - lr * b[i]
            else:
                ps[i] = ps[i] - lr * g / (np.sqrt(vt) + eps)
    return ps


def ref_adamax(init, grads, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False):
    b1, b2 = betas
    ps = [p.copy() for p in init]
    m = [np.zeros_like(p) for p in ps]
    u = [np.zeros_like(p) for p in ps]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            u[i] = np.maximum(b2 * u[i], np.abs(g) + eps)
            ps[i] = ps[i] - lr * m[i] / ((1 - b1**t) * u[i])
    return ps


def ref_nadam(init, grads, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
              decoupled_weight_decay=False, maximize=False):
    b1, b2 = betas
    ps = [p.copy() for p in init]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    mu_prod = [1.0] * len(ps)
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            if weight_decay and decoupled_weight_decay:
                ps[i] = ps[i] - lr * weight_decay * ps[i]
            elif weight_decay:
                g = g + weight_decay * ps[i]
            mu = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
            mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
            # PyTorch keeps prod(mu_i) in its float32 ``mu_product`` state scalar
            mu_prod[i] = float(np.float32(mu_prod[i]) * np.float32(mu))
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = mu_next * m[i] / (1 - mu_prod[i] * mu_next) + (1 - mu) * g / (1 - mu_prod[i])
            v_hat = v[i] / (1 - b2**t)
            ps[i] = ps[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return ps


def ref_radam(init, grads, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
              maximize=False):
    b1, b2 = betas
    ps = [p.copy() for p in init]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    rho_inf = 2 / (1 - b2) - 1
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            if weight_decay and decoupled_weight_decay:
                ps[i] = ps[i] - lr * weight_decay * ps[i]
            elif weight_decay:
                g = g + weight_decay * ps[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1**t)
            rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)
            if rho_t > 5:
                l_t = np.sqrt(1 - b2**t) / (np.sqrt(v[i]) + eps)
                r_t = np.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                ps[i] = ps[i] - lr * m_hat * r_t * l_t
            else:
                ps[i] = ps[i] - lr * m_hat
    return ps


REFS = {Adadelta: ref_adadelta, Adagrad: ref_adagrad, RMSprop: ref_rmsprop, Adamax: ref_adamax, NAdam: ref_nadam,
        RAdam: ref_radam}

CASES = [
    (Adadelta, {}),  # PyTorch's defaults (the FSDP MNIST tutorial's optimizer)
    (Adadelta, dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1)),
    (Adadelta, dict(weight_decay=0.05, maximize=True)),
    (Adagrad, {}),
    (Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.5)),
    (Adagrad, dict(lr=0.05, maximize=True, eps=1e-6)),
    (RMSprop, {}),
    (RMSprop, dict(lr=0.01, momentum=0.9)),
    (RMSprop, dict(lr=0.01, centered=True, weight_decay=0.1)),
    (RMSprop, dict(lr=0.01, alpha=0.3, centered=True, momentum=0.5, maximize=True)),  # lerp weight 0.7 >= 0.5
    (Adamax, {}),
    (Adamax, dict(lr=0.01, betas=(0.3, 0.9), eps=1e-6, weight_decay=0.1, maximize=True)),
    (NAdam, {}),
    (NAdam, dict(lr=0.01, weight_decay=0.1, momentum_decay=0.01)),
    (NAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    (RAdam, {}),  # rho_t <= 5 for the first steps, then the rectified step
    (RAdam, dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1)),
    (RAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
]
IDS = [f"{cls.__name__}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for cls, kw in CASES]


def _params(init, dtype):
    return [nn.Parameter(hp.tensor(p.astype(dtype))) for p in init]


def _run(params, opt, grads, dtype):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = hp.tensor(g.astype(dtype))
        opt.step()


@pytest.mark.parametrize("cls,kw", CASES, ids=IDS)
def test_matches_reference(cls, kw):
    init, grads = _problem(3)
    ref = REFS[cls](init, grads, **kw)
    for dtype, rtol, atol in ((np.float64, 1e-10, 1e-12), (np.float32, 2e-6, 2e-7)):
        params = _params(init, dtype)
        _run(params, cls(params, **kw), grads, dtype)
        for p, r in zip(params, ref):
            assert p.dtype == (hp.float64 if dtype is np.float64 else hp.float32)
            np.testing.assert_allclose(p.detach().numpy().astype(np.float64), r, rtol=rtol, atol=atol)


# The layout of PyTorch 2.13's state_dict: per-parameter state keys, param_group keys.
STATE_KEYS = [
    (Adadelta, {}, ["acc_delta", "square_avg", "step"],
     ["capturable", "differentiable", "eps", "foreach", "lr", "maximize", "params", "rho", "weight_decay"]),
    (Adagrad, {}, ["step", "sum"],
     ["differentiable", "eps", "foreach", "fused", "initial_accumulator_value", "lr", "lr_decay", "maximize",
      "params", "weight_decay"]),
    (RMSprop, {}, ["square_avg", "step"],
     ["alpha", "capturable", "centered", "differentiable", "eps", "foreach", "lr", "maximize", "momentum",
      "params", "weight_decay"]),
    (RMSprop, dict(momentum=0.9, centered=True), ["grad_avg", "momentum_buffer", "square_avg", "step"], None),
    (Adamax, {}, ["exp_avg", "exp_inf", "step"],
     ["betas", "capturable", "differentiable", "eps", "foreach", "lr", "maximize", "params", "weight_decay"]),
    (NAdam, {}, ["exp_avg", "exp_avg_sq", "mu_product", "step"],
     ["betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize",
      "momentum_decay", "params", "weight_decay"]),
    (RAdam, {}, ["exp_avg", "exp_avg_sq", "step"],
     ["betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach", "lr", "maximize",
      "params", "weight_decay"]),
]


@pytest.mark.parametrize("cls,kw,state_keys,group_keys", STATE_KEYS)
def test_state_dict_layout_is_pytorchs(cls, kw, state_keys, group_keys):
    init, grads = _problem(4, steps=3)
    params = _params(init, np.float32)
    opt = cls(params, **kw)
    _run(params, opt, grads, np.float32)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1] and sd["param_groups"][0]["params"] == [0, 1]
    st = sd["state"][0]
    assert sorted(st) == state_keys
    if group_keys is not None:
        assert sorted(sd["param_groups"][0]) == group_keys
    for key, value in st.items():
        if key in ("step", "mu_product"):  # float32 cpu scalars, as PyTorch's
            assert type(value) is hp.Tensor and value.shape == () and value.dtype == hp.float32
        else:
            assert value.shape == (4, 3) and value.dtype == hp.float32
    assert st["step"].item() == 3.0


ROUND_TRIP = [
    (Adadelta, dict(weight_decay=0.01)),
    (Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    (RMSprop, dict(momentum=0.9, centered=True)),
    (Adamax, dict(lr=0.01)),
    (NAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    (RAdam, dict(lr=0.01)),
]


@pytest.mark.parametrize("cls,kw", ROUND_TRIP, ids=[c.__name__ for c, _ in ROUND_TRIP])
def test_state_dict_round_trip_continues_identically(cls, kw):
    init, grads = _problem(5, steps=14)
    pa = _params(init, np.float32)
    oa = cls(pa, **kw)
    _run(pa, oa, grads[:7], np.float32)
    sd = oa.state_dict()
    pb = [nn.Parameter(hp.tensor(p.detach().numpy().copy())) for p in pa]
    ob = cls(pb, lr=123.0)  # hyperparameters come from the state dict
    ob.load_state_dict(sd)
    assert ob.param_groups[0]["lr"] == kw["lr"] if "lr" in kw else ob.param_groups[0]["lr"] == oa.defaults["lr"]
    assert ob.param_groups[0]["params"][0] is pb[0]
    for key, value in ob.state[pb[0]].items():  # copies, not aliases, of the saved state
        assert value is not sd["state"][0][key]
        np.testing.assert_array_equal(value.numpy(), sd["state"][0][key].numpy())
        assert value.dtype == sd["state"][0][key].dtype and value.shape == sd["state"][0][key].shape
    _run(pa, oa, grads[7:], np.float32)
    _run(pb, ob, grads[7:], np.float32)
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_signatures_and_defaults_are_pytorchs():
    P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    expected = {
        Adadelta: [("lr", 1.0, P), ("rho", 0.9, P), ("eps", 1e-6, P), ("weight_decay", 0, P), ("foreach", None, P),
                   ("capturable", False, K), ("maximize", False, K), ("differentiable", False, K)],
        Adagrad: [("lr", 1e-2, P), ("lr_decay", 0, P), ("weight_decay", 0, P), ("initial_accumulator_value", 0, P),
                  ("eps", 1e-10, P), ("foreach", None, P), ("maximize", False, K), ("differentiable", False, K),
                  ("fused", None, K)],
        RMSprop: [("lr", 1e-2, P), ("alpha", 0.99, P), ("eps", 1e-8, P), ("weight_decay", 0, P), ("momentum", 0, P),
                  ("centered", False, P), ("capturable", False, P), ("foreach", None, P), ("maximize", False, P),
                  ("differentiable", False, P)],
        Adamax: [("lr", 2e-3, P), ("betas", (0.9, 0.999), P), ("eps", 1e-8, P), ("weight_decay", 0, P),
                 ("foreach", None, P), ("maximize", False, K), ("differentiable", False, K), ("capturable", False, K)],
        NAdam: [("lr", 2e-3, P), ("betas", (0.9, 0.999), P), ("eps", 1e-8, P), ("weight_decay", 0, P),
                ("momentum_decay", 4e-3, P), ("decoupled_weight_decay", False, P), ("foreach", None, K),
                ("maximize", False, K), ("capturable", False, K), ("differentiable", False, K)],
        RAdam: [("lr", 1e-3, P), ("betas", (0.9, 0.999), P), ("eps", 1e-8, P), ("weight_decay", 0, P),
                ("decoupled_weight_decay", False, P), ("foreach", None, K), ("maximize", False, K),
                ("capturable", False, K), ("differentiable", False, K)],
    }
    for cls, params in expected.items():
        got = [(p.name, p.default, p.kind) for p in inspect.signature(cls).parameters.values()]
        assert got[0][0] == "params" and got[1:] == params, cls.__name__
        assert issubclass(cls, Optimizer) and cls.__doc__ and cls.step.__doc__


BAD_ARGS = [
    (Adadelta, dict(lr=-0.1), "Invalid learning rate: -0.1"),
    (Adadelta, dict(rho=1.5), "Invalid rho value: 1.5"),
    (Adadelta, dict(eps=-1.0), "Invalid epsilon value: -1.0"),
    (Adadelta, dict(weight_decay=-1e-3), "Invalid weight_decay value: -0.001"),
    (Adagrad, dict(lr=-1), "Invalid learning rate: -1"),
    (Adagrad, dict(lr_decay=-0.5), "Invalid lr_decay value: -0.5"),
    (Adagrad, dict(weight_decay=-0.5), "Invalid weight_decay value: -0.5"),
    (Adagrad, dict(initial_accumulator_value=-0.5), "Invalid initial_accumulator_value value: -0.5"),
    (Adagrad, dict(eps=-0.5), "Invalid epsilon value: -0.5"),
    (RMSprop, dict(lr=-1e-3), "Invalid learning rate: -0.001"),
    (RMSprop, dict(eps=-1e-8), "Invalid epsilon value: -1e-08"),
    (RMSprop, dict(momentum=-0.9), "Invalid momentum value: -0.9"),
    (RMSprop, dict(weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
    (RMSprop, dict(alpha=-0.99), "Invalid alpha value: -0.99"),
    (Adamax, dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
    (Adamax, dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
    (NAdam, dict(momentum_decay=-1e-3), "Invalid momentum_decay value: -0.001"),
    (NAdam, dict(eps=-1.0), "Invalid epsilon value: -1.0"),
    (RAdam, dict(weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
    (RAdam, dict(lr=hp.tensor([0.1, 0.2])), "Tensor lr must be 1-element"),
]


@pytest.mark.parametrize("cls,kw,msg", BAD_ARGS, ids=[f"{c.__name__}-{m}" for c, _, m in BAD_ARGS])
def test_bad_hyperparameters_raise_pytorchs_value_error(cls, kw, msg):
    p = nn.Parameter(hp.ones(3))
    with pytest.raises(ValueError) as info:
        cls([p], **kw)
    assert str(info.value) == msg


@pytest.mark.parametrize("cls", list(REFS))
def test_implementation_flags(cls):
    p = nn.Parameter(hp.ones(3))
    opt = cls([p], foreach=False)  # foreach/fused choose a kernel in PyTorch; here there is one
    assert opt.defaults["foreach"] is False and opt.param_groups[0]["maximize"] is False
    for flag in ("capturable", "differentiable"):
        if flag in inspect.signature(cls).parameters:
            with pytest.raises(ValueError, match=f"{cls.__name__}: capturable and differentiable are not supported"):
                cls([p], **{flag: True})
    if cls is Adagrad:
        assert Adagrad([p], fused=True).defaults["fused"] is True
        with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together."):
            Adagrad([p], foreach=True, fused=True)


def test_tensor_lr_and_closure():
    p = nn.Parameter(hp.tensor([2.0, -1.5]))
    opt = RMSprop([p], lr=hp.tensor(0.05))

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 6.25
    ref = ref_rmsprop([np.array([2.0, -1.5])], [[np.array([4.0, -3.0])]], lr=0.05)[0]
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-6)


def test_adagrad_state_is_created_eagerly_and_late_groups_use_the_defaults():
    a = nn.Parameter(hp.ones(2))
    b = nn.Parameter(hp.ones(3))
    opt = Adagrad([{"params": [a]}], lr=0.1, initial_accumulator_value=0.25)
    st = opt.state[a]
    assert st["step"].item() == 0.0 and st["step"].dtype == hp.float32
    np.testing.assert_array_equal(st["sum"].numpy(), [0.25, 0.25])
    assert sorted(opt.state_dict()["state"]) == [0]  # in the state dict before any step, as in PyTorch
    opt.add_param_group({"params": [b], "initial_accumulator_value": 7.0})
    assert b not in opt.state
    b.grad = hp.ones(3)
    opt.step()
    # PyTorch's _init_group fills a late parameter's sum from self.defaults, not from its group
    np.testing.assert_allclose(opt.state[b]["sum"].numpy(), [1.25] * 3)
    np.testing.assert_allclose(b.detach().numpy(), 1 - 0.1 / (np.sqrt(1.25) + 1e-10))
    np.testing.assert_array_equal(a.detach().numpy(), [1.0, 1.0])  # no grad: not stepped
    assert opt.state[a]["step"].item() == 0.0


def test_params_without_grad_are_skipped_and_groups_keep_their_hyperparameters():
    a = nn.Parameter(hp.ones(2))
    b = nn.Parameter(hp.ones(2))
    c = nn.Parameter(hp.ones(2))
    opt = Adadelta([{"params": [a]}, {"params": [b], "lr": 0.5}], rho=0.5)
    opt.add_param_group({"params": [c], "weight_decay": 0.1})
    assert [g["lr"] for g in opt.param_groups] == [1.0, 0.5, 1.0]
    assert [g["rho"] for g in opt.param_groups] == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    a.grad = hp.ones(2)
    c.grad = hp.ones(2)
    opt.step()
    assert b not in opt.state and a in opt.state
    np.testing.assert_allclose(a.detach().numpy(), ref_adadelta([np.ones(2)], [[np.ones(2)]], rho=0.5)[0])
    np.testing.assert_allclose(c.detach().numpy(),
                               ref_adadelta([np.ones(2)], [[np.ones(2)]], rho=0.5, weight_decay=0.1)[0])


def test_adadelta_trains_a_model():
    """The FSDP MNIST tutorial's choice: Adadelta(lr=1.0) on a small regression."""
    hp.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3
    model = nn.Linear(3, 1, dtype=hp.float64)
    opt = Adadelta(model.parameters(), lr=1.0)
    first = None
    for _ in range(600):
        opt.zero_grad()
        loss = nn.MSELoss()(model(hp.tensor(x)), hp.tensor(y))
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 1e-3 * first


class _Shard(hp.Tensor):
    """A DTensor stand-in: state tensors are wrapped like the parameter through __hp_wrap_like__."""

    def __hp_wrap_like__(self, array):
        t = _Shard._make_subclass(_Shard, hp.Tensor._wrap(array))
        t.spec = self.spec
        return t


@pytest.mark.parametrize("cls,kw", [(Adadelta, {}), (Adagrad, {}), (RMSprop, dict(momentum=0.9, centered=True)),
                                    (Adamax, {}), (NAdam, {}), (RAdam, {})], ids=lambda v: getattr(v, "__name__", ""))
def test_state_of_subclass_params_is_wrapped_like_the_param(cls, kw):
    s = _Shard._make_subclass(_Shard, hp.ones(4))
    s.spec = "Shard(0)"
    p = nn.Parameter(s)
    opt = cls([p], **kw)
    p.grad = hp.ones(4)
    opt.step()
    for key, value in opt.state[p].items():
        if key in ("step", "mu_product"):
            assert type(value) is hp.Tensor
        else:
            assert isinstance(value, _Shard) and value.spec == "Shard(0)", key
    np.testing.assert_allclose(p.detach().numpy(), REFS[cls]([np.ones(4)], [[np.ones(4)]], **kw)[0], rtol=1e-6)
    sd = opt.state_dict()
    opt2 = cls([p], **kw)
    opt2.load_state_dict(sd)  # scalar state stays a cpu scalar; shaped state is wrapped like the parameter
    for key, value in opt2.state[p].items():
        assert (type(value) is hp.Tensor) if key in ("step", "mu_product") else isinstance(value, _Shard)


@pytest.mark.gpu
@pytest.mark.parametrize("cls,kw", CASES, ids=IDS)
def test_cuda_steps_match_cpu(cls, kw):
    """The same kernels on CuPy arrays (a real GPU, or HPCFSDP_CUDA_SIM=1's simulated device)."""
    init, grads = _problem(6, steps=5)
    out = {}
    for dev in ("cpu", "cuda"):
        params = [nn.Parameter(hp.tensor(p.astype(np.float32), device=dev)) for p in init]
        opt = cls(params, **kw)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = hp.tensor(g.astype(np.float32), device=dev)
            opt.step()
        st = opt.state[params[0]]
        assert st["step"].device.type == "cpu" and st["step"].item() == 5.0
        assert all(v.device.type == dev for k, v in st.items() if k not in ("step", "mu_product"))
        out[dev] = [p.detach().cpu().numpy() for p in params]
    for a, b in zip(out["cuda"], out["cpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
