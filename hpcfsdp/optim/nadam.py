"""NAdam: Adam with Nesterov momentum and a momentum-decay schedule (torch.optim.NAdam)."""
from hpcfsdp.optim.adamax import _check_adam_hparams
from hpcfsdp.optim.optimizer import (
    Optimizer,
    _check_unsupported,
    _grads_of,
    _lerp_,
    _step_tensor,
    _zeros_state,
)

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """NAdam, PyTorch's single-tensor update rule (state ``step``, ``mu_product``, ``exp_avg``, ``exp_avg_sq``;
    ``step`` and ``mu_product`` are float32 cpu scalars, as in PyTorch):

        wd: p *= 1 - lr * wd (decoupled_weight_decay)  or  g += wd * p
        mu_t = b1 * (1 - 0.5 * 0.96^(t * momentum_decay));  mu_product *= mu_t
        m = lerp(m, g, 1 - b1);  v = b2 * v + (1 - b2) * g^2;  denom = sqrt(v / (1 - b2^t)) + eps
        p -= lr * (1 - mu_t) / (1 - mu_product) * g / denom + lr * mu_{t+1} / (1 - mu_product * mu_{t+1}) * m / denom
    """

    def __init__(self, params, lr: float = 2e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *, foreach=None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False):
        _check_adam_hparams(lr, betas, eps, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        _check_unsupported("NAdam", capturable, differentiable)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable)
        super().__init__(params, defaults)

    _group_defaults = {"maximize": False,
                       "foreach": None,
                       "capturable": False,
                       "differentiable": False,
                       "decoupled_weight_decay": False}

    def step(self, closure=None):
        """One NAdam update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            eps = group["eps"]
            weight_decay = group["weight_decay"]
            momentum_decay = group["momentum_decay"]
            decoupled = group["decoupled_weight_decay"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["mu_product"] = _step_tensor(1.0)
                    state["exp_avg"] = _zeros_state(p)
                    state["exp_avg_sq"] = _zeros_state(p)
                exp_avg = state["exp_avg"]._data
                exp_avg_sq = state["exp_avg_sq"]._data
                mu_product_t = state["mu_product"]._data
                step_t = state["step"]
                step_t._data += 1
                step = float(step_t._data)
                bias_correction2 = 1 - beta2**step
                if weight_decay != 0:
                    if decoupled:
                        param *= 1 - lr * weight_decay    # param.mul_(1 - lr * weight_decay)
                    else:
                        g = g + weight_decay * param      # grad.add(param, alpha=weight_decay)
                mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
                mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
                mu_product_t *= mu                        # in float32, as PyTorch's cpu scalar tensor
                mu_product = float(mu_product_t)
                _lerp_(xp, exp_avg, g, 1 - beta1)         # exp_avg.lerp_(g, 1 - beta1)
                tmp = xp.multiply(1 - beta2, g)          # exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                tmp *= g
                exp_avg_sq *= beta2
                exp_avg_sq += tmp
                denom = xp.divide(exp_avg_sq, bias_correction2)  # denom = exp_avg_sq.div(bc2).sqrt().add_(eps)
                xp.sqrt(denom, out=denom)
                denom += eps
                mu_product_next = mu_product * mu_next
                xp.multiply(-lr * (1.0 - mu) / (1.0 - mu_product), g, out=tmp)  # param.addcdiv_(g, denom, ...)
                tmp /= denom
                param += tmp
                xp.multiply((-lr * mu_next) / (1.0 - mu_product_next), exp_avg, out=tmp)  # addcdiv_(exp_avg, ...)
                tmp /= denom
                param += tmp
        return loss
