"""LBFGS: exact minimum of a quadratic, Rosenbrock convergence, the two-loop recursion against NumPy, the
stopping rules, state_dict round trip and PyTorch's errors."""
import inspect

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp import nn
from hpcfsdp.optim import LBFGS


def _quadratic(n=5, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    a = m @ m.T + n * np.eye(n)  # symmetric positive definite
    b = rng.standard_normal(n)
    return a, b


def _closure(opt, x, a, b, calls=None):
    at, bt = hp.tensor(a), hp.tensor(b)

    def closure():
        if calls is not None:
            calls.append(1)
        opt.zero_grad()
        loss = 0.5 * (x @ (at @ x)) - bt @ x
        loss.backward()
        return loss
    return closure


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_quadratic_reaches_the_solution_of_a_x_equals_b(line_search_fn):
    a, b = _quadratic()
    x = nn.Parameter(hp.zeros(5, dtype=hp.float64))
    opt = LBFGS([x], lr=1 if line_search_fn else 0.5, max_iter=100, line_search_fn=line_search_fn,
                tolerance_grad=1e-12, tolerance_change=1e-15)
    opt.step(_closure(opt, x, a, b))
    np.testing.assert_allclose(x.detach().numpy(), np.linalg.solve(a, b), rtol=0, atol=1e-7)  # where torch stops


def test_rosenbrock_converges_to_one():
    x = nn.Parameter(hp.tensor([-1.2, 1.0, -0.5, 0.8], dtype=hp.float64))
    opt = LBFGS([x], line_search_fn="strong_wolfe", max_iter=200, max_eval=400, tolerance_grad=1e-10)

    def closure():
        opt.zero_grad()
        loss = (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()
        loss.backward()
        return loss
    for _ in range(3):
        opt.step(closure)
    np.testing.assert_allclose(x.detach().numpy(), np.ones(4), atol=1e-6)


def _ref_lbfgs(a, b, lr, iters, history_size):
    """PyTorch's fixed-step L-BFGS (no line search) on 0.5 x'Ax - b'x, written out in NumPy float64: first step
    min(1, 1/|g|_1) lr along -g, then the two-loop recursion over the last history_size (s, y) pairs with
    H0 = s'y / y'y, step lr."""
    x = np.zeros(len(b))
    g = a @ x - b
    dirs, stps, ro, h_diag, d, t, prev_g = [], [], [], 1.0, None, None, None
    for k in range(iters):
        if k == 0:
            d = -g
        else:
            y, s = g - prev_g, d * t
            ys = y @ s
            if ys > 1e-10:
                if len(dirs) == history_size:
                    dirs.pop(0), stps.pop(0), ro.pop(0)
                dirs.append(y), stps.append(s), ro.append(1 / ys)
                h_diag = ys / (y @ y)
            q, al = -g, [0.0] * len(dirs)
            for i in reversed(range(len(dirs))):
                al[i] = stps[i] @ q * ro[i]
                q = q - al[i] * dirs[i]
            r = q * h_diag
            for i in range(len(dirs)):
                r = r + stps[i] * (al[i] - dirs[i] @ r * ro[i])
            d = r
        prev_g = g.copy()
        t = min(1.0, 1.0 / np.abs(g).sum()) * lr if k == 0 else lr
        x = x + t * d
        g = a @ x - b
    return x


def test_fixed_step_iterates_match_the_two_loop_recursion():
    a, b = _quadratic(6, seed=2)
    x = nn.Parameter(hp.zeros(6, dtype=hp.float64))
    opt = LBFGS([x], lr=0.3, max_iter=7, history_size=3, tolerance_change=0.0, tolerance_grad=0.0)
    calls = []
    opt.step(_closure(opt, x, a, b, calls))
    np.testing.assert_allclose(x.detach().numpy(), _ref_lbfgs(a, b, 0.3, 7, 3), rtol=1e-12, atol=1e-14)
    assert len(calls) == 7  # the first evaluation and one after each step but the last
    st = opt.state[x]
    assert st["n_iter"] == 7 and st["func_evals"] == 7 and len(st["old_dirs"]) == 3


def test_stops_at_max_eval_and_at_a_zero_gradient():
    a, b = _quadratic()
    x = nn.Parameter(hp.zeros(5, dtype=hp.float64))
    opt = LBFGS([x], max_iter=50, max_eval=4)
    calls = []
    opt.step(_closure(opt, x, a, b, calls))
    assert len(calls) == 4 and opt.state[x]["func_evals"] == 4
    x2 = nn.Parameter(hp.tensor(np.linalg.solve(a, b)))
    opt2 = LBFGS([x2], tolerance_grad=1e-6)
    calls = []
    opt2.step(_closure(opt2, x2, a, b, calls))
    assert len(calls) == 1 and opt2.state[x2]["n_iter"] == 0  # optimal at once: no iteration


def test_several_parameters_and_state_dict_round_trip():
    a, b = _quadratic(5, seed=3)
    at, bt = hp.tensor(a), hp.tensor(b)

    def make():
        p1 = nn.Parameter(hp.zeros(2, dtype=hp.float64))
        p2 = nn.Parameter(hp.zeros(3, dtype=hp.float64))
        return [p1, p2]

    def closure_for(opt, ps):
        def closure():
            opt.zero_grad()
            x = hp.cat(ps)
            loss = 0.5 * (x @ (at @ x)) - bt @ x
            loss.backward()
            return loss
        return closure

    pa = make()
    oa = LBFGS(pa, max_iter=3, history_size=4)
    oa.step(closure_for(oa, pa))
    sd = oa.state_dict()
    assert sorted(sd["state"]) == [0]
    assert sorted(sd["state"][0]) == ["H_diag", "al", "d", "func_evals", "n_iter", "old_dirs", "old_stps",
                                      "prev_flat_grad", "prev_loss", "ro", "t"]
    assert sd["state"][0]["d"].shape == (5,)
    assert sorted(sd["param_groups"][0]) == ["history_size", "line_search_fn", "lr", "max_eval", "max_iter",
                                             "params", "tolerance_change", "tolerance_grad"]
    assert sd["param_groups"][0]["max_eval"] == 3 * 5 // 4
    pb = [nn.Parameter(hp.tensor(p.detach().numpy().copy())) for p in pa]
    ob = LBFGS(pb)
    ob.load_state_dict(sd)
    assert ob.state[pb[0]]["d"] is not sd["state"][0]["d"]
    oa.step(closure_for(oa, pa))
    ob.step(closure_for(ob, pb))
    for p, q in zip(pa, pb):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    err = np.abs(hp.cat(pa).detach().numpy() - np.linalg.solve(a, b)).max()
    assert err < 0.1 * np.abs(np.linalg.solve(a, b)).max()  # six fixed steps from 0 get within a tenth


def test_signature_and_errors_are_pytorchs():
    assert str(inspect.signature(LBFGS)) == (
        "(params, lr: float = 1, max_iter: int = 20, max_eval=None, tolerance_grad: float = 1e-07, "
        "tolerance_change: float = 1e-09, history_size: int = 100, line_search_fn=None)")
    p = nn.Parameter(hp.zeros(2))
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        LBFGS([p], lr=-1)
    with pytest.raises(ValueError, match="LBFGS doesn't support per-parameter options"):
        LBFGS([{"params": [p]}, {"params": [nn.Parameter(hp.zeros(1))]}])
    opt = LBFGS([p], line_search_fn="backtracking")

    def closure():
        opt.zero_grad()
        loss = ((p - 1) ** 2).sum()
        loss.backward()
        return loss
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        opt.step(closure)
    with pytest.raises(TypeError):
        opt.step()  # the closure is required


@pytest.mark.gpu
def test_cuda_matches_cpu():
    a, b = _quadratic()
    out = {}
    for dev in ("cpu", "cuda"):
        x = nn.Parameter(hp.zeros(5, dtype=hp.float64, device=dev))
        opt = LBFGS([x], line_search_fn="strong_wolfe", max_iter=30)
        at, bt = hp.tensor(a, device=dev), hp.tensor(b, device=dev)

        def closure():
            opt.zero_grad()
            loss = 0.5 * (x @ (at @ x)) - bt @ x
            loss.backward()
            return loss
        opt.step(closure)
        out[dev] = x.detach().cpu().numpy()
    np.testing.assert_allclose(out["cuda"], out["cpu"], rtol=1e-10)
