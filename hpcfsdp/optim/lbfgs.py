"""L-BFGS with an optional strong-Wolfe line search, on the flat vector of all parameters (torch.optim.LBFGS)."""
import copy
import math

import numpy as np

from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor
from hpcfsdp.optim.optimizer import Optimizer, _check_lr

__all__ = ["LBFGS"]

# [Note: L-BFGS on sharded parameters]
# L-BFGS works on one flat vector: here the concatenation of the parameters' local arrays, so a rank holds the
# local pieces of sharded parameters (DTensor) and their flat gradient. Every scalar it decides on is global:
# dot products and the sum of |x| are the local partials summed, max |x| the local maxima reduced, over the
# groups of the parameters' Shard dims (the DTensor's __hp_reduce_norm__ hook, See [Note: Norms of sharded
# gradients] in hpcfsdp/nn/utils/clip_grad.py), and the closure's loss is the mean of the ranks' values (the
# loss whose gradient FSDP's averaged gradients are). So every rank takes the same branches and calls the
# closure the same number of times. The parameters must then share one mesh and placements (FSDP's own
# parameters do); plain Tensors need no reduction.


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2) within ``bounds`` (PyTorch's port of
    torch/optim's polyinterp.lua); the bounds' midpoint when the cubic has no real minimiser."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(opt, obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """PyTorch's strong-Wolfe line search (a port of lswolfe.lua): bracket, then zoom by cubic interpolation.
    Returns (loss, flat gradient, step, evaluations)."""
    d_norm = opt._max_abs(d)
    g = g.copy()
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = opt._dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.copy()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.copy()], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new.copy(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = opt._dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                t = max(bracket) - eps if abs(t - max(bracket)) < abs(t - min(bracket)) else min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = opt._dot(g_new, d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new.copy(), gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos] = bracket[low_pos], bracket_f[low_pos]
                bracket_g[high_pos], bracket_gtd[high_pos] = bracket_g[low_pos], bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new.copy(), gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


class LBFGS(Optimizer):
    """L-BFGS, PyTorch's algorithm (minFunc's): up to ``max_iter`` iterations per ``step(closure)`` (at most
    ``max_eval`` closure calls, ``max_iter * 5 // 4`` by default), the two-loop recursion over the last
    ``history_size`` (s, y) pairs, a first step of ``min(1, 1 / |g|_1) * lr`` then ``lr``, or the strong-Wolfe
    line search (``line_search_fn="strong_wolfe"``); it stops when max |g| <= ``tolerance_grad``, or the
    directional derivative, the step or the loss change falls below ``tolerance_change``.

    One parameter group only. All state is global and kept under the first parameter (PyTorch's keys
    ``func_evals``, ``n_iter``, ``d``, ``t``, ``old_dirs``, ``old_stps``, ``ro``, ``H_diag``,
    ``prev_flat_grad``, ``prev_loss``, ``al``); its vectors are flat, its scalars Python floats (PyTorch:
    0-d tensors). Works on sharded parameters: See [Note: L-BFGS on sharded parameters].
    """

    def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval=None, tolerance_grad: float = 1e-7,
                 tolerance_change: float = 1e-9, history_size: int = 100, line_search_fn=None):
        _check_lr(lr)
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                        tolerance_change=tolerance_change, history_size=history_size, line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]
        self._reducer = self._make_reducer()

    def __setstate__(self, state):
        super().__setstate__(state)
        self._params = self.param_groups[0]["params"]
        self._reducer = self._make_reducer()

    # ------------------------------------------------------------------ global reductions
    def _make_reducer(self):
        """(Tensor subclass, its parameters, ranks averaged over) for sharded parameters, or None for plain ones."""
        kinds = {type(p) for p in self._params}
        if kinds == {Tensor} or not any(hasattr(k, "__hp_reduce_norm__") for k in kinds):
            return None
        if len(kinds) != 1:
            raise NotImplementedError(f"LBFGS: parameters of several tensor types {sorted(k.__name__ for k in kinds)} "
                                      "cannot share its global reductions; give it one kind (all sharded or all plain)")
        cls = kinds.pop()
        first = self._params[0]
        layout = (id(first.device_mesh), tuple(first.placements))
        for p in self._params[1:]:
            if (id(p.device_mesh), tuple(p.placements)) != layout:
                raise NotImplementedError(
                    "LBFGS: sharded parameters must share one device mesh and placements (as FSDP's do), got "
                    f"{first.placements} and {p.placements}")
        ranks = 1
        for i, pl in enumerate(first.placements):
            if type(pl).__name__ == "Shard":
                ranks *= first.device_mesh.size(i)
        return cls, list(self._params), ranks

    def _sum(self, value):
        value = float(value)
        if self._reducer is None:
            return value
        cls, params, _ = self._reducer
        return cls.__hp_reduce_norm__(params, value, 1.0)

    def _dot(self, a, b):
        return self._sum(_backend.array_module(a).dot(a, b))

    def _max_abs(self, a):
        local = float(_backend.array_module(a).abs(a).max()) if a.size else 0.0
        if self._reducer is None:
            return local
        cls, params, _ = self._reducer
        return cls.__hp_reduce_norm__(params, local, math.inf)

    def _abs_sum(self, a):
        return self._sum(_backend.array_module(a).abs(a).sum())

    def _loss(self, value):
        value = float(value)
        if self._reducer is None:
            return value
        return self._sum(value / self._reducer[2])

    # ------------------------------------------------------------------ the flat vector
    def _gather_flat_grad(self):
        first = self._params[0]._data
        xp = _backend.array_module(first)
        views = [xp.zeros(p._data.size, dtype=p._data.dtype) if p.grad is None else p.grad._data.reshape(-1)
                 for p in self._params]
        return xp.concatenate(views, 0)

    def _add_grad(self, step_size, update):
        offset = 0
        for p in self._params:
            arr = p._data
            numel = arr.size
            arr += update[offset:offset + numel].reshape(arr.shape) * arr.dtype.type(step_size)
            offset += numel
        assert offset == update.size, (offset, update.size)

    def _clone_param(self):
        return [p._data.copy() for p in self._params]

    def _set_param(self, params_data):
        for p, pdata in zip(self._params, params_data):
            p._data[...] = pdata

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = self._loss(closure())
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    def step(self, closure):
        """Up to ``max_iter`` L-BFGS iterations; ``closure`` re-evaluates the model (zero the gradients, compute
        the loss, backward, return the loss) and is required. Returns its first loss."""
        import hpcfsdp

        def evaluate():
            with hpcfsdp.enable_grad():
                return closure()

        with hpcfsdp.no_grad():
            return self._step(evaluate)

    def _step(self, closure):
        group = self.param_groups[0]
        lr = float(group["lr"])
        max_iter, max_eval = group["max_iter"], group["max_eval"]
        tolerance_grad, tolerance_change = group["tolerance_grad"], group["tolerance_change"]
        line_search_fn, history_size = group["line_search_fn"], group["history_size"]

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = closure()
        loss = self._loss(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        opt_cond = self._max_abs(flat_grad) <= tolerance_grad
        if opt_cond:
            return orig_loss

        d = _array(state.get("d"))
        t = state.get("t")
        old_dirs = [_array(v) for v in state["old_dirs"]] if "old_dirs" in state else None
        old_stps = [_array(v) for v in state["old_stps"]] if "old_stps" in state else None
        ro = state.get("ro")
        h_diag = state.get("H_diag")
        prev_flat_grad = _array(state.get("prev_flat_grad"))
        prev_loss = state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            # the descent direction
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro = [], [], []
                h_diag = 1
            else:
                y = flat_grad - prev_flat_grad
                s = d * d.dtype.type(t)
                ys = self._dot(y, s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:  # shift the history by one (limited memory)
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / self._dot(y, y)  # scale of the initial inverse Hessian
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                q = -flat_grad  # the two-loop recursion on one buffer
                for i in range(num_old - 1, -1, -1):
                    al[i] = self._dot(old_stps[i], q) * ro[i]
                    q -= old_dirs[i] * q.dtype.type(al[i])
                d = r = q * q.dtype.type(h_diag)
                for i in range(num_old):
                    be_i = self._dot(old_dirs[i], r) * ro[i]
                    r += old_stps[i] * r.dtype.type(al[i] - be_i)
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.copy()
            else:
                prev_flat_grad[...] = flat_grad
            prev_loss = loss
            # the step length
            t = min(1.0, 1.0 / self._abs_sum(flat_grad)) * lr if state["n_iter"] == 1 else lr
            gtd = self._dot(flat_grad, d)
            if gtd > -tolerance_change:
                break
            ls_func_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                x_init = self._clone_param()

                def obj_func(x, t, d):
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(self, obj_func, x_init, t, d, loss, flat_grad, gtd,
                                                                  max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = self._max_abs(flat_grad) <= tolerance_grad
            else:
                self._add_grad(t, d)
                if n_iter != max_iter:  # re-evaluated only if not the last iteration
                    loss = self._loss(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = self._max_abs(flat_grad) <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals
            # the stopping conditions
            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if self._max_abs(d) * abs(t) <= tolerance_change:  # lack of progress
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state["d"] = _state(d)
        state["t"] = t
        state["old_dirs"] = [_state(v) for v in old_dirs]
        state["old_stps"] = [_state(v) for v in old_stps]
        state["ro"] = ro
        state["H_diag"] = h_diag
        state["prev_flat_grad"] = _state(prev_flat_grad)
        state["prev_loss"] = prev_loss
        return orig_loss

    def load_state_dict(self, state_dict):
        """As Optimizer's, except that the flat vectors keep their own shape: copied to the first parameter's
        array module, floating ones in its dtype."""
        saved = state_dict.get("state", {}) if isinstance(state_dict, dict) else {}
        super().load_state_dict({**state_dict, "state": {}} if isinstance(state_dict, dict) else state_dict)
        self._params = self.param_groups[0]["params"]
        index = dict(zip(state_dict["param_groups"][0]["params"], self._params))
        for key, value in saved.items():
            param = index.get(key)
            self.state[param if param is not None else key] = _copied(value, self._params[0])


def _array(t):
    return None if t is None else t._data


def _state(arr):
    return Tensor._wrap(arr)


def _copied(value, param):
    if isinstance(value, Tensor):
        target = param._data
        xp = _backend.array_module(target)
        arr = _backend.to_numpy(value._data) if xp is not _backend.array_module(value._data) else value._data
        dtype = target.dtype if _backend.is_floating_dtype(arr.dtype) else arr.dtype
        return Tensor._wrap(xp.array(arr, dtype=dtype, copy=True))
    if isinstance(value, dict):
        return {k: _copied(v, param) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v, param) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return copy.deepcopy(value)
