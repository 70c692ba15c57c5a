"""SGD with momentum, dampening, Nesterov momentum, weight decay and maximize (torch.optim.SGD)."""
from hpcfsdp.optim.optimizer import Optimizer, _check_fused_flags, _fused_split, _grads_of, _table_cache, _wrap_state

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent, PyTorch's update rule:

        g = grad (+ weight_decay * p);  b = momentum * b + (1 - dampening) * g  (b = g at the first step)
        g = g + momentum * b if nesterov else b;  p = p - lr * g
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False, foreach=None,
                 differentiable: bool = False, fused=None):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if differentiable:
            raise ValueError("SGD(differentiable=True) is not supported by hpcfsdp")
        _check_fused_flags(fused, foreach)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach, differentiable=differentiable,
                        fused=fused)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()``'s loss if given."""
        loss = self._run_closure(closure)
        for gi, group in enumerate(self.param_groups):
            lr = float(group["lr"])
            momentum = group["momentum"]
            dampening = group["dampening"]
            weight_decay = group["weight_decay"]
            nesterov = group["nesterov"]
            by_dtype, rest = _fused_split(group, _grads_of(group, negate=False))
            if by_dtype:
                self._fused(gi, group, lr, by_dtype)
            for p, param, xp, g in rest:
                if group["maximize"]:
                    g = -g
                if weight_decay != 0:
                    g = g + weight_decay * param
                if momentum != 0:
                    state = self.state[p]
                    buf_t = state.get("momentum_buffer")
                    if buf_t is None:
                        buf = xp.array(g, dtype=param.dtype, copy=True)
                        state["momentum_buffer"] = _wrap_state(p, buf)
                    else:
                        buf = buf_t._data
                        buf *= momentum
                        buf += (1 - dampening) * g
                    g = g + momentum * buf if nesterov else buf
                param -= lr * g
        return loss

    def _fused(self, gi, group, lr, by_dtype):
        """One launch per (dtype, whether the momentum buffers exist yet) of the group (See [Note: Fused optimizer
        steps]); the first step's buffers are allocated uninitialised and written by the kernel."""
        from hpcfsdp._kernels.optim import sgd_step

        momentum = group["momentum"]
        cache = _table_cache(self)
        for dt, items in by_dtype.items():
            buckets: dict = {}
            for p, param, xp, g in items:
                buf = None
                if momentum != 0:
                    state = self.state[p]
                    first = state.get("momentum_buffer") is None
                    if first:
                        state["momentum_buffer"] = _wrap_state(p, xp.empty(param.shape, dtype=param.dtype))
                    buf = state["momentum_buffer"]._data
                else:
                    first = False
                if param.size:
                    cols = buckets.setdefault(first, ([], [], []))
                    for col, a in zip(cols, (param, g, buf)):
                        col.append(a)
            for first, (ps, gs, bs) in sorted(buckets.items()):
                sgd_step(cache, ("sgd", gi, dt.str, first), ps, gs, bs if momentum != 0 else None, lr=lr,
                         wd=group["weight_decay"], momentum=momentum, dampening=group["dampening"], first=first,
                         nesterov=group["nesterov"], maximize=group["maximize"])
