"""Adagrad: step sizes shrinking with the accumulated squared gradients (torch.optim.Adagrad)."""
from hpcfsdp import _backend
from hpcfsdp.optim.optimizer import Optimizer, _check_lr, _check_unsupported, _grads_of, _step_tensor, _wrap_state

__all__ = ["Adagrad"]


def _full_state(param, value):
    arr = param._data
    xp = _backend.array_module(arr)
    return _wrap_state(param, xp.full(arr.shape, value, dtype=arr.dtype))


class Adagrad(Optimizer):
    """Adagrad, PyTorch's single-tensor update rule (state ``step``, ``sum``):

        clr = lr / (1 + (t - 1) * lr_decay);  g = grad (+ weight_decay * p)
        sum = sum + g^2;  p = p - clr * g / (sqrt(sum) + eps)

    As in PyTorch, the state of every parameter given to the constructor is created at once, ``sum`` filled
    with ``initial_accumulator_value``; parameters added later get theirs at their first step.
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, fused=None):
        _check_lr(lr)
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(f"Invalid initial_accumulator_value value: {initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        _check_unsupported("Adagrad", differentiable=differentiable)
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["step"] = _step_tensor(0.0)
                state["sum"] = _full_state(p, initial_accumulator_value)

    _group_defaults = {"foreach": None, "maximize": False, "differentiable": False, "fused": None}

    def step(self, closure=None):
        """One Adagrad update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            lr_decay = group["lr_decay"]
            eps = group["eps"]
            weight_decay = group["weight_decay"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:  # PyTorch fills a late parameter's sum from the constructor's defaults
                    state["step"] = _step_tensor(0.0)
                    state["sum"] = _full_state(p, self.defaults["initial_accumulator_value"])
                state_sum = state["sum"]._data
                step_t = state["step"]
                step_t._data += 1
                step = float(step_t._data)
                if weight_decay != 0:
                    g = g + weight_decay * param      # grad.add(param, alpha=weight_decay)
                clr = lr / (1 + (step - 1) * lr_decay)
                tmp = xp.multiply(g, g)              # state_sum.addcmul_(g, g, value=1)
                state_sum += tmp
                xp.sqrt(state_sum, out=tmp)          # std = state_sum.sqrt().add_(eps)
                tmp += eps
                upd = xp.multiply(-clr, g)           # param.addcdiv_(g, std, value=-clr)
                upd /= tmp
                param += upd
        return loss
