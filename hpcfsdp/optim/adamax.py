"""Adamax: Adam with an infinity-norm second moment (torch.optim.Adamax)."""
from hpcfsdp.optim.optimizer import (
    Optimizer,
    _check_lr,
    _check_unsupported,
    _grads_of,
    _lerp_,
    _step_tensor,
    _zeros_state,
)

__all__ = ["Adamax"]


def _check_adam_hparams(lr, betas, eps, weight_decay):
    """PyTorch's checks, in its order, shared by Adamax, NAdam and RAdam."""
    _check_lr(lr)
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class Adamax(Optimizer):
    """Adamax, PyTorch's single-tensor update rule (state ``step``, ``exp_avg``, ``exp_inf``):

        g = grad (+ weight_decay * p);  m = lerp(m, g, 1 - b1);  u = max(b2 * u, |g| + eps)
        p = p - lr / (1 - b1^t) * m / u
    """

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 foreach=None, *, maximize: bool = False, differentiable: bool = False, capturable: bool = False):
        _check_adam_hparams(lr, betas, eps, weight_decay)
        _check_unsupported("Adamax", capturable, differentiable)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    _group_defaults = {"foreach": None, "maximize": False, "differentiable": False, "capturable": False}

    def step(self, closure=None):
        """One Adamax update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            eps = group["eps"]
            weight_decay = group["weight_decay"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["exp_avg"] = _zeros_state(p)
                    state["exp_inf"] = _zeros_state(p)
                exp_avg = state["exp_avg"]._data
                exp_inf = state["exp_inf"]._data
                step_t = state["step"]
                step_t._data += 1
                if weight_decay != 0:
                    g = g + weight_decay * param          # grad.add(param, alpha=weight_decay)
                _lerp_(xp, exp_avg, g, 1 - beta1)         # exp_avg.lerp_(g, 1 - beta1)
                tmp = xp.abs(g)                          # exp_inf = max(exp_inf.mul_(beta2), g.abs().add_(eps))
                tmp += eps
                exp_inf *= beta2
                xp.maximum(exp_inf, tmp, out=exp_inf)
                clr = lr / (1 - beta1 ** float(step_t._data))
                xp.multiply(-clr, exp_avg, out=tmp)       # param.addcdiv_(exp_avg, exp_inf, value=-clr)
                tmp /= exp_inf
                param += tmp
        return loss
