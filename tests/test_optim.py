"""Optimizers against a float64 NumPy transcription of PyTorch's update rules; state_dict round trip."""
import math

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.optim import SGD, Adam, AdamW, Optimizer

STEPS = 20


def _problem(seed, shapes=((4, 3), (5,)), steps=STEPS):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(steps)]
    return init, grads


# ---------------------------------------------------------------------------- references (float64)
def ref_sgd(init, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False):
    ps = [p.copy() for p in init]
    bufs = [None] * len(ps)
    for step_grads in grads:
        for i, (p, g) in enumerate(zip(ps, step_grads)):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * p
            if momentum:
                bufs[i] = g.copy() if bufs[i] is None else momentum * bufs[i] + (1 - dampening) * g
                g = g + momentum * bufs[i] if nesterov else bufs[i]
            ps[i] = p - lr * g
    return ps


def ref_adam(init, grads, lr, betas, eps, weight_decay, decoupled, amsgrad=False):
    b1, b2 = betas
    ps = [p.copy() for p in init]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    vmax = [np.zeros_like(p) for p in ps]
    for t, step_grads in enumerate(grads, start=1):
        for i, g in enumerate(step_grads):
            p = ps[i]
            if weight_decay and decoupled:
                p = p * (1 - lr * weight_decay)
            elif weight_decay:
                g = g + weight_decay * p
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            vmax[i] = np.maximum(vmax[i], v[i])
            vv = vmax[i] if amsgrad else v[i]
            m_hat = m[i] / (1 - b1**t)
            ps[i] = p - lr * m_hat / (np.sqrt(vv) / math.sqrt(1 - b2**t) + eps)
    return ps


# ---------------------------------------------------------------------------- runs
def _run(opt_cls, init, grads, dtype, **kw):
    params = [nn.Parameter(hp.tensor(p.astype(dtype))) for p in init]
    opt = opt_cls(params, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = hp.tensor(g.astype(dtype))
        opt.step()
    return [p.detach().numpy().astype(np.float64) for p in params], opt, params


SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1),
    dict(lr=0.05, momentum=0.9, maximize=True, weight_decay=0.01),
]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_matches_reference(kw):
    init, grads = _problem(0)
    ref = ref_sgd(init, grads, **kw)
    out64, _, _ = _run(SGD, init, grads, np.float64, **kw)
    for a, b in zip(out64, ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    out32, opt, params = _run(SGD, init, grads, np.float32, **kw)
    for a, b in zip(out32, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert params[0].dtype == hp.float32
    if kw.get("momentum"):
        assert opt.state[params[0]]["momentum_buffer"].dtype == hp.float32


ADAM_CASES = [
    (Adam, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0), False),
    (Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), False),
    (Adam, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05, amsgrad=True), False),
    (AdamW, dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1), True),
    (AdamW, dict(lr=0.02, betas=(0.9, 0.999), eps=1e-8), True),  # default weight_decay=1e-2
]


@pytest.mark.parametrize("cls,kw,decoupled", ADAM_CASES)
def test_adam_family_matches_reference(cls, kw, decoupled):
    init, grads = _problem(1)
    ref_kw = dict(kw)
    ref_kw.setdefault("weight_decay", 1e-2)
    ref = ref_adam(init, grads, decoupled=decoupled, **ref_kw)
    out64, _, _ = _run(cls, init, grads, np.float64, **kw)
    for a, b in zip(out64, ref):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)
    out32, opt, params = _run(cls, init, grads, np.float32, **kw)
    for a, b in zip(out32, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)
    st = opt.state[params[0]]
    assert st["step"].item() == STEPS and st["exp_avg"].dtype == hp.float32
    assert ("max_exp_avg_sq" in st) == kw.get("amsgrad", False)


def test_param_groups_defaults_and_skipped_params():
    a = nn.Parameter(hp.ones(2))
    b = nn.Parameter(hp.ones(2))
    c = nn.Parameter(hp.ones(2))
    opt = SGD([{"params": [a]}, {"params": b, "lr": 0.5}], lr=0.1, momentum=0.9)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[1]["lr"] == 0.5
    assert opt.param_groups[1]["momentum"] == 0.9 and opt.defaults["lr"] == 0.1
    opt.add_param_group({"params": [c], "lr": 1.0})
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    a.grad = hp.ones(2)
    c.grad = hp.ones(2)
    opt.step()
    np.testing.assert_allclose(a.detach().numpy(), [0.9, 0.9])
    np.testing.assert_allclose(b.detach().numpy(), [1.0, 1.0])  # no grad: untouched, no state
    np.testing.assert_allclose(c.detach().numpy(), [0.0, 0.0])
    assert b not in opt.state and a in opt.state
    opt.zero_grad(set_to_none=False)
    assert np.all(a.grad.numpy() == 0)
    opt.zero_grad()
    assert a.grad is None and c.grad is None
    assert repr(opt).startswith("SGD (\nParameter Group 0\n    dampening: 0\n")


def test_step_closure_and_validation_messages():
    p = nn.Parameter(hp.tensor([2.0]))
    opt = SGD([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 4.0 and p.item() == pytest.approx(2.0 - 0.1 * 4.0)
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        SGD([p], lr=-1)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid momentum value: -0.5"):
        SGD([p], lr=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        Adam([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid epsilon value: -1e-08"):
        AdamW([p], eps=-1e-8)
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        Adam([p], weight_decay=-0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([])
    with pytest.raises(TypeError, match="iterable of Tensors or dicts"):
        Adam(p)
    with pytest.raises(TypeError, match="ordered collections"):
        Adam([{"params": {p}}])


@pytest.mark.parametrize("cls,kw", [(AdamW, dict(lr=0.01, weight_decay=0.1)),
                                    (SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
                                    (Adam, dict(lr=0.01, amsgrad=True))])
def test_state_dict_round_trip_continues_identically(cls, kw):
    init, grads = _problem(2, steps=2 * 10)
    pa = [nn.Parameter(hp.tensor(p.astype(np.float32))) for p in init]
    oa = cls(pa, **kw)

    def run(params, opt, gs):
        for step_grads in gs:
            for p, g in zip(params, step_grads):
                p.grad = hp.tensor(g.astype(np.float32))
            opt.step()

    run(pa, oa, grads[:10])
    sd = oa.state_dict()
    assert sorted(sd) == ["param_groups", "state"]
    assert sd["param_groups"][0]["params"] == [0, 1] and sorted(sd["state"]) == [0, 1]
    if cls is SGD:
        assert sorted(sd["state"][0]) == ["momentum_buffer"]
    else:
        assert {"step", "exp_avg", "exp_avg_sq"} <= set(sd["state"][0])
        assert sd["state"][0]["step"].item() == 10.0 and sd["state"][0]["step"].dtype == hp.float32
    pb = [nn.Parameter(hp.tensor(p.detach().numpy().copy())) for p in pa]
    ob = cls(pb, lr=123.0)  # hyperparameters come from the state dict
    ob.load_state_dict(sd)
    assert ob.param_groups[0]["lr"] == kw["lr"] and ob.param_groups[0]["params"][0] is pb[0]
    run(pa, oa, grads[10:])
    run(pb, ob, grads[10:])
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    with pytest.raises(ValueError, match="different number of parameter groups"):
        cls([{"params": [pb[0]]}, {"params": [pb[1]]}], lr=0.1).load_state_dict(sd)


def test_optimizer_trains_a_model():
    hp.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3
    model = nn.Linear(3, 1, dtype=hp.float64)
    opt = Adam(model.parameters(), lr=0.05)
    for _ in range(300):
        opt.zero_grad()
        loss = nn.MSELoss()(model(hp.tensor(x)), hp.tensor(y))
        loss.backward()
        opt.step()
    assert loss.item() < 1e-4
    assert isinstance(opt, Optimizer)


class _Shard(hp.Tensor):
    """A DTensor stand-in: state tensors are wrapped like the parameter through __hp_wrap_like__."""

    def __hp_wrap_like__(self, array):
        t = _Shard._make_subclass(_Shard, hp.Tensor._wrap(array))
        t.spec = self.spec
        return t


def test_state_of_subclass_params_is_wrapped_like_the_param():
    s = _Shard._make_subclass(_Shard, hp.ones(4))
    s.spec = "Shard(0)"
    p = nn.Parameter(s)
    opt = AdamW([p], lr=0.1)
    p.grad = hp.ones(4)
    opt.step()
    st = opt.state[p]
    assert isinstance(st["exp_avg"], _Shard) and st["exp_avg"].spec == "Shard(0)"
    assert type(st["step"]) is hp.Tensor
    ref = ref_adam([np.ones(4)], [[np.ones(4)]], 0.1, (0.9, 0.999), 1e-8, 1e-2, decoupled=True)[0]
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-6)
    sgd = SGD([p], lr=0.1, momentum=0.9)
    sgd.step()
    assert isinstance(sgd.state[p]["momentum_buffer"], _Shard)
