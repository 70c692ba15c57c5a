"""Adam (L2 weight decay folded into the gradient) and its shared update kernel (torch.optim.Adam)."""
import math

from hpcfsdp.optim.optimizer import (Optimizer, _check_fused_flags, _fused_split, _grads_of, _step_tensor,
                                     _table_cache, _zeros_state)

__all__ = ["Adam"]


def _check_hparams(lr, betas, eps, weight_decay):
    for name, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number, got {v!r}")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _init_state(opt, p, amsgrad):
    state = opt.state[p]
    if len(state) == 0:
        state["step"] = _step_tensor(0.0)
        state["exp_avg"] = _zeros_state(p)
        state["exp_avg_sq"] = _zeros_state(p)
        if amsgrad:
            state["max_exp_avg_sq"] = _zeros_state(p)
    return state


def _adam_fused(opt, gi, group, decoupled, by_dtype):
    """The fused steps (See [Note: Fused optimizer steps]): one launch per (dtype, step count) of the group, its
    scalars computed on the host exactly as _adam_update computes them."""
    from hpcfsdp._kernels.optim import adam_step

    lr = float(group["lr"])
    beta1, beta2 = group["betas"]
    wd = group["weight_decay"]
    mode = 0 if wd == 0 else 2 if decoupled else 1
    cache = _table_cache(opt)
    for dt, items in by_dtype.items():
        buckets: dict = {}
        for p, param, _, g in items:
            state = _init_state(opt, p, False)
            step_t = state["step"]
            step_t._data += 1
            if param.size:
                cols = buckets.setdefault(float(step_t._data), ([], [], [], []))
                for col, a in zip(cols, (param, g, state["exp_avg"]._data, state["exp_avg_sq"]._data)):
                    col.append(a)
        for b, (step, cols) in enumerate(sorted(buckets.items())):
            adam_step(cache, ("adam", gi, dt.str, b), *cols, decay=1 - lr * wd, wd=wd, c1=1 - beta1, beta2=beta2,
                      c2=1 - beta2, bc2_sqrt=math.sqrt(1 - beta2**step), eps=group["eps"],
                      neg_step=-(lr / (1 - beta1**step)), mode=mode, maximize=group["maximize"])


def _adam_update(opt, group, decoupled, items=None):
    """PyTorch's single-tensor Adam/AdamW kernel, on local arrays in the parameter's dtype:

        t += 1;  p *= 1 - lr * wd (decoupled)  or  g += wd * p (L2)
        m = lerp(m, g, 1 - b1);  v = b2 * v + (1 - b2) * g * g;  (amsgrad: vmax = max(vmax, v), use vmax)
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    ``items``: the (p, param, xp, g) to update (default every parameter with a gradient; g already negated).
    """
    lr = float(group["lr"])
    beta1, beta2 = group["betas"]
    eps = group["eps"]
    weight_decay = group["weight_decay"]
    amsgrad = group["amsgrad"]
    for p, param, xp, g in (_grads_of(group) if items is None else items):
        state = _init_state(opt, p, amsgrad)
        exp_avg = state["exp_avg"]._data
        exp_avg_sq = state["exp_avg_sq"]._data
        step_t = state["step"]
        step_t._data += 1
        step = float(step_t._data)
        if weight_decay != 0:
            if decoupled:
                param *= 1 - lr * weight_decay
            else:
                g = g + weight_decay * param
        # One scratch array per parameter; each line names the PyTorch op it transcribes.
        tmp = xp.subtract(g, exp_avg)          # exp_avg.lerp_(g, 1 - beta1) = exp_avg + (1 - beta1) * (g - exp_avg)
        tmp *= 1 - beta1
        exp_avg += tmp
        xp.multiply(g, g, out=tmp)             # exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        tmp *= 1 - beta2
        exp_avg_sq *= beta2
        exp_avg_sq += tmp
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = math.sqrt(bias_correction2)
        if amsgrad:
            max_sq = state["max_exp_avg_sq"]._data
            xp.maximum(max_sq, exp_avg_sq, out=max_sq)
            xp.sqrt(max_sq, out=tmp)           # denom = sqrt(max_exp_avg_sq) / sqrt(bc2) + eps
        else:
            xp.sqrt(exp_avg_sq, out=tmp)       # denom = sqrt(exp_avg_sq) / sqrt(bc2) + eps
        tmp /= bias_correction2_sqrt
        tmp += eps
        xp.divide(exp_avg, tmp, out=tmp)       # param.addcdiv_(exp_avg, denom, value=-step_size)
        tmp *= -step_size
        param += tmp


class Adam(Optimizer):
    """Adam; ``weight_decay`` adds ``wd * p`` to the gradient (L2), as torch.optim.Adam."""

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 amsgrad: bool = False, *, foreach=None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused=None, decoupled_weight_decay: bool = False):
        _check_hparams(lr, betas, eps, weight_decay)
        if capturable or differentiable:
            raise ValueError(f"{type(self).__name__}: capturable and differentiable are not supported by hpcfsdp; "
                             f"got capturable={capturable}, differentiable={differentiable}")
        _check_fused_flags(fused, foreach)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable, differentiable=differentiable,
                        fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("decoupled_weight_decay", self._decoupled)

    def step(self, closure=None):
        """One Adam update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for gi, group in enumerate(self.param_groups):
            decoupled = group.get("decoupled_weight_decay", self._decoupled)
            if group["amsgrad"]:  # not fused
                _adam_update(self, group, decoupled)
                continue
            by_dtype, rest = _fused_split(group, _grads_of(group, negate=False))
            if by_dtype:
                _adam_fused(self, gi, group, decoupled, by_dtype)
            if rest:
                neg = group["maximize"]
                _adam_update(self, group, decoupled, [(p, a, xp, -g if neg else g) for p, a, xp, g in rest])
        return loss
