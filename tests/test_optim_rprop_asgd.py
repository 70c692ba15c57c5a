"""Rprop and ASGD against float64 NumPy transcriptions of PyTorch's algorithms; state layout, round trips, errors."""
import inspect

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.optim import ASGD, Rprop

from test_optim_adaptive import _problem, _run


def _params(init, dtype, device="cpu"):
    return [nn.Parameter(hp.tensor(p.astype(dtype), device=device)) for p in init]


def ref_rprop(init, grads, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), maximize=False):
    """Riedmiller and Braun's Rprop as PyTorch's docs: the step grows by etaplus where the gradient kept its sign,
    shrinks by etaminus (and that gradient counts as 0) where it flipped, the move is -sign(g) * step."""
    etaminus, etaplus = etas
    ps = [p.copy() for p in init]
    prev = [np.zeros_like(p) for p in ps]
    size = [np.full_like(p, lr) for p in ps]
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            g = (-g if maximize else g).copy()
            prod = g * prev[i]
            factor = np.where(prod > 0, etaplus, np.where(prod < 0, etaminus, 1.0))
            size[i] = np.clip(size[i] * factor, step_sizes[0], step_sizes[1])
            g[prod < 0] = 0
            ps[i] = ps[i] - np.sign(g) * size[i]
            prev[i] = g
    return ps


def ref_asgd(init, grads, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False):
    """(parameters, averages): x = x (1 - lambd eta) - eta g; ax the running mean of the iterates after step t0
    (ax = x while mu = 1); eta_t = lr / (1 + lambd lr t)^alpha, mu_t = 1 / max(1, t - t0)."""
    ps = [p.copy() for p in init]
    ax = [np.zeros_like(p) for p in ps]
    eta, mu = [float(np.float32(lr))] * len(ps), [1.0] * len(ps)
    for t, step_grads in enumerate(grads, 1):
        for i, g in enumerate(step_grads):
            g = -g if maximize else g
            if weight_decay:
                g = g + weight_decay * ps[i]
            ps[i] = ps[i] * (1 - lambd * eta[i]) - eta[i] * g
            ax[i] = ps[i].copy() if mu[i] == 1 else ax[i] + mu[i] * (ps[i] - ax[i])
            eta[i] = float(np.float32(lr / (1 + lambd * lr * t) ** alpha))  # PyTorch keeps both float32
            mu[i] = float(np.float32(1 / max(1, t - t0)))
    return ps, ax


CASES = [
    (Rprop, {}),
    (Rprop, dict(lr=0.1, etas=(0.3, 1.5), step_sizes=(1e-3, 0.2), maximize=True)),
    (ASGD, {}),
    (ASGD, dict(lr=0.05, lambd=0.01, alpha=0.5, t0=4, weight_decay=0.1)),
    (ASGD, dict(lr=0.05, lambd=0.01, t0=6, maximize=True)),
]
IDS = [f"{c.__name__}{i}" for i, (c, _) in enumerate(CASES)]


@pytest.mark.parametrize("cls,kw", CASES, ids=IDS)
def test_matches_reference(cls, kw):
    init, grads = _problem(3)
    # Rprop's sign rule flips on rounding only where g * prev is within an ulp of 0: not in these draws
    for dtype, rtol, atol in ((np.float64, 1e-10, 1e-12), (np.float32, 2e-6, 2e-7)):
        params = _params(init, dtype)
        opt = cls(params, **kw)
        _run(params, opt, grads, dtype)
        if cls is Rprop:
            want, avg = ref_rprop(init, grads, **kw), None
        else:
            want, avg = ref_asgd(init, grads, **kw)
        for i, (p, r) in enumerate(zip(params, want)):
            np.testing.assert_allclose(p.detach().numpy().astype(np.float64), r, rtol=rtol, atol=atol)
            if avg is not None:
                np.testing.assert_allclose(opt.state[p]["ax"].numpy().astype(np.float64), avg[i], rtol=rtol,
                                           atol=atol)


def test_asgd_average_is_the_mean_of_the_iterates_after_t0():
    """With lambd = 0 and t0 = 3, ax after step T is the mean of the iterates x_5 .. x_T (Polyak averaging: step t
    averages with the mu = 1 / max(1, t - 1 - t0) of the step before, so ax = x_t up to t = t0 + 2)."""
    init, grads = _problem(8, shapes=((3,),), steps=9)
    p = _params(init, np.float64)
    opt = ASGD(p, lr=0.1, lambd=0.0, t0=3)
    xs = []
    for step_grads in grads:
        p[0].grad = hp.tensor(step_grads[0])
        opt.step()
        xs.append(p[0].detach().numpy().copy())
    want = np.mean(xs[4:], axis=0)  # to float32 rounding: mu = 1/3, 1/5, ... is a float32 scalar
    np.testing.assert_allclose(opt.state[p[0]]["ax"].numpy(), want, rtol=1e-7)
    assert opt.state[p[0]]["eta"].item() == pytest.approx(0.1)  # lambd = 0: a constant step


def test_rprop_shrinks_the_step_where_the_gradient_flips():
    p = nn.Parameter(hp.tensor([0.0, 0.0]))
    opt = Rprop([p], lr=0.1)
    for g in ([1.0, 1.0], [1.0, -1.0], [1.0, -1.0]):
        p.grad = hp.tensor(g)
        opt.step()
    # element 0: 0.1, 0.12, 0.144 down; element 1: 0.1 down, flip (step 0.05, no move), then 0.05 up (prev = 0)
    np.testing.assert_allclose(p.detach().numpy(), [-(0.1 + 0.12 + 0.144), -0.1 + 0.05], rtol=1e-6)
    np.testing.assert_allclose(opt.state[p]["step_size"].numpy(), [0.144, 0.05], rtol=1e-6)
    np.testing.assert_array_equal(opt.state[p]["prev"].numpy(), [1.0, -1.0])


@pytest.mark.parametrize("cls,kw,keys,group_keys", [
    (Rprop, {}, ["prev", "step", "step_size"],
     ["capturable", "differentiable", "etas", "foreach", "lr", "maximize", "params", "step_sizes"]),
    (ASGD, dict(t0=2), ["ax", "eta", "mu", "step"],
     ["alpha", "capturable", "differentiable", "foreach", "lambd", "lr", "maximize", "params", "t0",
      "weight_decay"]),
])
def test_state_dict_layout_and_round_trip(cls, kw, keys, group_keys):
    init, grads = _problem(5, steps=10)
    pa = _params(init, np.float32)
    oa = cls(pa, **kw)
    _run(pa, oa, grads[:5], np.float32)
    sd = oa.state_dict()
    assert sorted(sd["state"][0]) == keys and sorted(sd["param_groups"][0]) == group_keys
    for key, value in sd["state"][0].items():
        want = () if key in ("step", "eta", "mu") else (4, 3)
        assert value.shape == want and value.dtype == hp.float32, key
    pb = [nn.Parameter(hp.tensor(p.detach().numpy().copy())) for p in pa]
    ob = cls(pb, lr=123.0)
    ob.load_state_dict(sd)
    assert ob.param_groups[0]["lr"] == oa.param_groups[0]["lr"]
    _run(pa, oa, grads[5:], np.float32)
    _run(pb, ob, grads[5:], np.float32)
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_signatures_and_defaults_are_pytorchs():
    assert str(inspect.signature(Rprop)) == (
        "(params, lr: float = 0.01, etas=(0.5, 1.2), step_sizes=(1e-06, 50), *, capturable: bool = False, "
        "foreach=None, maximize: bool = False, differentiable: bool = False)")
    assert str(inspect.signature(ASGD)) == (
        "(params, lr: float = 0.01, lambd: float = 0.0001, alpha: float = 0.75, t0: float = 1000000.0, "
        "weight_decay: float = 0, foreach=None, maximize: bool = False, differentiable: bool = False, "
        "capturable: bool = False)")


@pytest.mark.parametrize("cls,kw,exc,msg", [
    (Rprop, dict(lr=-1.0), ValueError, "Invalid learning rate: -1.0"),
    (Rprop, dict(etas=(1.0, 1.2)), ValueError, "Invalid eta values: 1.0, 1.2"),
    (Rprop, dict(etas=(0.5, 0.9)), ValueError, "Invalid eta values: 0.5, 0.9"),
    (Rprop, dict(capturable=True), ValueError, "capturable and differentiable are not supported"),
    (ASGD, dict(lr=-0.1), ValueError, "Invalid learning rate: -0.1"),
    (ASGD, dict(weight_decay=-1), ValueError, "Invalid weight_decay value: -1"),
    (ASGD, dict(differentiable=True), ValueError, "capturable and differentiable are not supported"),
])
def test_bad_hyperparameters_raise(cls, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        cls([nn.Parameter(hp.zeros(2))], **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("cls,kw", CASES, ids=IDS)
def test_cuda_steps_match_cpu(cls, kw):
    """The same array code on CuPy arrays (a real GPU, or HPCFSDP_CUDA_SIM=1's simulated device)."""
    init, grads = _problem(6, steps=5)
    out = {}
    for dev in ("cpu", "cuda"):
        params = _params(init, np.float32, dev)
        opt = cls(params, **kw)
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = hp.tensor(g.astype(np.float32), device=dev)
            opt.step()
        out[dev] = [p.detach().cpu().numpy() for p in params]
    for a, b in zip(out["cuda"], out["cpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
