"""Rprop: per-element step sizes grown or shrunk by the sign agreement of successive gradients (torch.optim.Rprop)."""
from hpcfsdp.optim.optimizer import Optimizer, _check_lr, _check_unsupported, _grads_of, _step_tensor, _wrap_state

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """Rprop, PyTorch's single-tensor update rule (state ``step``, ``prev``, ``step_size`` filled with ``lr``):

        s = sign(g * prev) -> etaplus where > 0, etaminus where < 0, 1 where 0
        step_size = clamp(step_size * s, step_sizes[0], step_sizes[1]);  g = 0 where s == etaminus
        p = p - sign(g) * step_size;  prev = g
    """

    def __init__(self, params, lr: float = 1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable: bool = False, foreach=None, maximize: bool = False, differentiable: bool = False):
        _check_lr(lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        _check_unsupported("Rprop", capturable, differentiable)
        defaults = dict(lr=lr, etas=etas, step_sizes=step_sizes, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    _group_defaults = {"foreach": None, "maximize": False, "differentiable": False, "capturable": False}

    def step(self, closure=None):
        """One Rprop update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            etaminus, etaplus = group["etas"]
            step_size_min, step_size_max = group["step_sizes"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["prev"] = _wrap_state(p, xp.zeros(param.shape, dtype=param.dtype))
                    state["step_size"] = _wrap_state(p, xp.full(g.shape, float(group["lr"]), dtype=g.dtype))
                prev = state["prev"]._data
                step_size = state["step_size"]._data
                state["step"]._data += 1
                sign = xp.sign(g * prev)                       # sign = grad.mul(prev).sign()
                sign[sign > 0] = etaplus
                sign[sign < 0] = etaminus
                sign[sign == 0] = 1
                step_size *= sign                              # step_size.mul_(sign).clamp_(min, max)
                xp.clip(step_size, step_size_min, step_size_max, out=step_size)
                g = g.copy()                                   # grad[sign.eq(etaminus)] = 0
                g[sign == etaminus] = 0
                param -= xp.sign(g) * step_size                # param.addcmul_(grad.sign(), step_size, value=-1)
                prev[...] = g                                  # prev.copy_(grad)
        return loss
