"""RMSprop, plain or centered, with optional momentum (torch.optim.RMSprop)."""
from hpcfsdp.optim.optimizer import (
    Optimizer,
    _check_lr,
    _check_unsupported,
    _grads_of,
    _lerp_,
    _step_tensor,
    _zeros_state,
)

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop, PyTorch's single-tensor update rule (state ``step``, ``square_avg``, and ``momentum_buffer``
    when ``momentum > 0``, ``grad_avg`` when ``centered``):

        g = grad (+ weight_decay * p);  v = alpha * v + (1 - alpha) * g^2
        centered: ga = lerp(ga, g, 1 - alpha), avg = sqrt(v - ga^2) + eps;  else avg = sqrt(v) + eps
        momentum > 0: b = momentum * b + g / avg, p = p - lr * b;  else p = p - lr * g / avg
    """

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0,
                 momentum: float = 0, centered: bool = False, capturable: bool = False, foreach=None,
                 maximize: bool = False, differentiable: bool = False):
        _check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        _check_unsupported("RMSprop", capturable, differentiable)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach, maximize=maximize,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    _group_defaults = {"momentum": 0,
                       "centered": False,
                       "foreach": None,
                       "maximize": False,
                       "differentiable": False,
                       "capturable": False}

    def step(self, closure=None):
        """One RMSprop update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            alpha = group["alpha"]
            eps = group["eps"]
            weight_decay = group["weight_decay"]
            momentum = group["momentum"]
            centered = group["centered"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["square_avg"] = _zeros_state(p)
                    if momentum > 0:
                        state["momentum_buffer"] = _zeros_state(p)
                    if centered:
                        state["grad_avg"] = _zeros_state(p)
                square_avg = state["square_avg"]._data
                state["step"]._data += 1
                if weight_decay != 0:
                    g = g + weight_decay * param            # grad.add(param, alpha=weight_decay)
                avg = xp.multiply(1 - alpha, g)            # square_avg.mul_(alpha).addcmul_(g, g, value=1 - alpha)
                avg *= g
                square_avg *= alpha
                square_avg += avg
                if centered:
                    grad_avg = state["grad_avg"]._data
                    _lerp_(xp, grad_avg, g, 1 - alpha)     # grad_avg.lerp_(g, 1 - alpha)
                    xp.multiply(-1, grad_avg, out=avg)     # avg = square_avg.addcmul(ga, ga, value=-1).sqrt_()
                    avg *= grad_avg
                    avg += square_avg
                    xp.sqrt(avg, out=avg)
                else:
                    xp.sqrt(square_avg, out=avg)           # avg = square_avg.sqrt()
                avg += eps                                 # avg.add_(eps)
                if momentum > 0:
                    buf = state["momentum_buffer"]._data   # buf.mul_(momentum).addcdiv_(g, avg)
                    xp.divide(g, avg, out=avg)
                    buf *= momentum
                    buf += avg
                    xp.multiply(-lr, buf, out=avg)         # param.add_(buf, alpha=-lr)
                else:
                    upd = xp.multiply(-lr, g)              # param.addcdiv_(g, avg, value=-lr)
                    xp.divide(upd, avg, out=avg)
                param += avg
        return loss
