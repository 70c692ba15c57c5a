"""ASGD: SGD with a decaying step and a running (Polyak) average of the iterates (torch.optim.ASGD)."""
from hpcfsdp.optim.optimizer import Optimizer, _check_lr, _check_unsupported, _grads_of, _step_tensor, _zeros_state

__all__ = ["ASGD"]


class ASGD(Optimizer):
    """Averaged SGD, PyTorch's single-tensor update rule (state ``step``, ``eta`` = lr, ``mu`` = 1, ``ax`` = 0):

        g = grad (+ weight_decay * p);  p = p * (1 - lambd * eta) - eta * g
        ax = p if mu == 1 else ax + mu * (p - ax)
        eta = lr / (1 + lambd * lr * step)^alpha;  mu = 1 / max(1, step - t0)

    ``eta`` and ``mu`` are float32 cpu scalars, as ``step`` (PyTorch keeps them on the parameter's device).
    """

    def __init__(self, params, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 weight_decay: float = 0, foreach=None, maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False):
        _check_lr(lr)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported("ASGD", capturable, differentiable)
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    _group_defaults = {"foreach": None, "maximize": False, "differentiable": False, "capturable": False}

    def step(self, closure=None):
        """One ASGD update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            lambd, alpha, t0 = group["lambd"], group["alpha"], group["t0"]
            weight_decay = group["weight_decay"]
            for p, param, xp, g in _grads_of(group):
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = _step_tensor(0.0)
                    state["eta"] = _step_tensor(lr)
                    state["mu"] = _step_tensor(1.0)
                    state["ax"] = _zeros_state(p)
                ax = state["ax"]._data
                state["step"]._data += 1
                if weight_decay != 0:
                    g = g + weight_decay * param               # grad.add(param, alpha=weight_decay)
                eta = float(state["eta"].item())
                param *= 1 - lambd * eta                       # param.mul_(1 - lambd * eta)
                param += (-eta) * g                            # param.add_(grad, alpha=-eta)
                if float(state["mu"].item()) != 1:
                    mu = float(state["mu"].item())
                    ax += xp.subtract(param, ax) * mu          # ax.add_(param.sub(ax).mul_(mu))
                else:
                    ax[...] = param                            # ax.copy_(param)
                step = float(state["step"].item())
                state["eta"]._data[...] = lr / ((1 + lambd * lr * step) ** alpha)
                state["mu"]._data[...] = 1 / max(1, step - t0)
        return loss
