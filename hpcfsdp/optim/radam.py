"""RAdam: Adam with a rectified (variance-corrected) adaptive step (torch.optim.RAdam)."""
from hpcfsdp.optim.adamax import _check_adam_hparams
from hpcfsdp.optim.optimizer import (
    Optimizer,
    _check_unsupported,
    _grads_of,
    _lerp_,
    _step_tensor,
    _zeros_state,
)

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """RAdam, PyTorch's single-tensor update rule (state ``step``, ``exp_avg``, ``exp_avg_sq``):

        wd: p *= 1 - lr * wd (decoupled_weight_decay)  or  g += wd * p
        m = lerp(m, g, 1 - b1);  v = b2 * v + (1 - b2) * g^2;  m_hat = m / (1 - b1^t)
        rho_inf = 2 / (1 - b2) - 1;  rho_t = rho_inf - 2 t b2^t / (1 - b2^t)
        rho_t > 5: p -= m_hat * lr * sqrt(1 - b2^t) / (sqrt(v) + eps) * rect(rho_t);  else p -= m_hat * lr
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 decoupled_weight_decay: bool = False, *, foreach=None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False):
        _check_adam_hparams(lr, betas, eps, weight_decay)
        _check_unsupported("RAdam", capturable, differentiable)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize, foreach=foreach,
                        capturable=capturable, decoupled_weight_decay=decoupled_weight_decay,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    _group_defaults = {"foreach": None,
                       "maximize": False,
                       "differentiable": False,
                       "decoupled_weight_decay": False,
                       "capturable": False}

    def step(self, closure=None):
        """One RAdam update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            eps = group["eps"]
            weight_decay = group["weight_decay"]
            decoupled = group["decoupled_weight_decay"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["exp_avg"] = _zeros_state(p)
                    state["exp_avg_sq"] = _zeros_state(p)
                exp_avg = state["exp_avg"]._data
                exp_avg_sq = state["exp_avg_sq"]._data
                step_t = state["step"]
                step_t._data += 1
                step = float(step_t._data)
                if weight_decay != 0:
                    if decoupled:
                        param *= 1 - lr * weight_decay    # param.mul_(1 - lr * weight_decay)
                    else:
                        g = g + weight_decay * param      # grad.add(param, alpha=weight_decay)
                _lerp_(xp, exp_avg, g, 1 - beta1)         # exp_avg.lerp_(g, 1 - beta1)
                tmp = xp.multiply(1 - beta2, g)          # exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                tmp *= g
                exp_avg_sq *= beta2
                exp_avg_sq += tmp
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                xp.divide(exp_avg, bias_correction1, out=tmp)  # bias_corrected_exp_avg = exp_avg / bc1
                tmp *= lr                                      # ... * lr
                rho_inf = 2 / (1 - beta2) - 1
                rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
                if rho_t > 5.0:
                    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                    adaptive = xp.sqrt(exp_avg_sq)             # adaptive_lr = sqrt(bc2) / (sqrt(v) + eps)
                    adaptive += eps
                    xp.divide(bias_correction2**0.5, adaptive, out=adaptive)
                    tmp *= adaptive
                    tmp *= rect
                param -= tmp                                   # param.add_(update, alpha=-1.0)
        return loss
