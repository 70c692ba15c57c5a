"""Adadelta: per-element step sizes from running averages of squared gradients and updates (torch.optim.Adadelta)."""
from hpcfsdp.optim.optimizer import Optimizer, _check_lr, _check_unsupported, _grads_of, _step_tensor, _zeros_state

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """Adadelta, PyTorch's single-tensor update rule (state ``step``, ``square_avg``, ``acc_delta``):

        g = grad (+ weight_decay * p);  v = rho * v + (1 - rho) * g^2
        d = sqrt(u + eps) / sqrt(v + eps) * g;  u = rho * u + (1 - rho) * d^2;  p = p - lr * d
    """

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
                 foreach=None, *, capturable: bool = False, maximize: bool = False, differentiable: bool = False):
        _check_lr(lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported("Adadelta", capturable, differentiable)
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                        capturable=capturable, foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)

    _group_defaults = {"foreach": None, "maximize": False, "differentiable": False, "capturable": False}

    def step(self, closure=None):
        """One Adadelta update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            rho = group["rho"]
            eps = group["eps"]
            weight_decay = group["weight_decay"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["square_avg"] = _zeros_state(p)
                    state["acc_delta"] = _zeros_state(p)
                square_avg = state["square_avg"]._data
                acc_delta = state["acc_delta"]._data
                state["step"]._data += 1
                if weight_decay != 0:
                    g = g + weight_decay * param        # grad.add(param, alpha=weight_decay)
                tmp = xp.multiply(1 - rho, g)          # square_avg.mul_(rho).addcmul_(g, g, value=1 - rho)
                tmp *= g
                square_avg *= rho
                square_avg += tmp
                xp.add(square_avg, eps, out=tmp)       # std = square_avg.add(eps).sqrt_()
                xp.sqrt(tmp, out=tmp)
                delta = xp.add(acc_delta, eps)         # delta = acc_delta.add(eps).sqrt_().div_(std).mul_(g)
                xp.sqrt(delta, out=delta)
                delta /= tmp
                delta *= g
                xp.multiply(1 - rho, delta, out=tmp)   # acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
                tmp *= delta
                acc_delta *= rho
                acc_delta += tmp
                delta *= -lr                           # param.add_(delta, alpha=-lr)
                param += delta
        return loss
