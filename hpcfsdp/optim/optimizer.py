"""Optimizer base class: parameter groups, per-parameter state, state_dict in PyTorch's format."""
import copy
import warnings
from collections import defaultdict
from itertools import chain
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    """Marker for a hyperparameter with no default (``SGD(lr=required)`` in old PyTorch)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _typename(obj):
    return type(obj).__name__


# [Note: Optimizer math on local arrays]
# Optimizers update ``p._data`` in place from ``p.grad._data`` with array-module operations (NumPy on
# cpu, CuPy on cuda), outside autograd. A sharded parameter (DTensor) keeps its local piece in
# ``_data``, so the same code steps a shard: state is allocated like the local array and the update
# is element-wise. State tensors are built from local arrays through ``_wrap_state``: a Tensor
# subclass may provide ``__hp_wrap_like__(self, array)`` to wrap state like the parameter (a DTensor
# with the parameter's spec); otherwise the state is a plain Tensor. Math runs in the parameter's
# dtype, so float32 parameters update in float32 as PyTorch's CPU kernels do.


def _grads_of(group, negate=True):
    """(parameter, its local array, array module, gradient array) for every parameter of ``group`` that has a
    gradient; the gradient is negated when the group maximizes (and ``negate``)."""
    for p in group["params"]:
        if p.grad is None:
            continue
        g = p.grad._data
        yield p, p._data, _backend.array_module(p._data), (-g if negate and group["maximize"] else g)


# [Note: Fused optimizer steps]
# On CUDA arrays Adam, AdamW and SGD step a parameter group in one launch per dtype (hpcfsdp/_kernels/optim.py:
# multi-tensor kernels over cached device pointer tables, See [Note: Multi-tensor pointer tables]), as PyTorch's
# ``fused=True``; ``fused=None`` with ``foreach`` not True picks it on CUDA too. The per-step hyperparameters
# (lr, the bias corrections of the host-side ``step``) are kernel scalars computed from Python floats: no host
# sync. A parameter the kernel does not take (on the CPU, not C-contiguous, a gradient of another dtype or shape,
# a dtype without a kernel) and the options it does not fuse (amsgrad) take the per-parameter path, whose math
# the kernels repeat operation by operation. ``fused=True`` is accepted on the CPU, as in PyTorch 2.4+, and runs
# the per-parameter path there.
_FUSED_DEVICES = ["cuda", "cpu"]


def _check_fused_flags(fused, foreach, differentiable=False):
    """PyTorch's constructor checks of ``fused=True``."""
    if fused:
        if differentiable:
            raise RuntimeError("`fused` does not support `differentiable`")
        if foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def _fused_split(group, items):
    """Split ``items`` ((p, param, xp, g) of _grads_of, the gradient not yet negated for maximize) into
    ({dtype: [items]} for the fused kernels, [items] for the per-parameter path) (See [Note: Fused optimizer
    steps]). ``fused=True`` refuses a non-floating parameter with PyTorch's RuntimeError."""
    from hpcfsdp._kernels._registry import CTYPES, use_fused

    fused, foreach = group.get("fused"), group.get("foreach")
    use = fused is True or (fused is None and not foreach)
    by_dtype, rest = {}, []
    for it in items:
        p, param, _, g = it
        if fused and not _backend.is_floating_dtype(param.dtype):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               f"devices: {_FUSED_DEVICES} but {param.dtype} and {p.device.type}")
        ok = (use and use_fused(param) and use_fused(g) and param.dtype in CTYPES
              and g.dtype == param.dtype and g.shape == param.shape and param.flags.c_contiguous
              and g.flags.c_contiguous)
        if ok:
            by_dtype.setdefault(param.dtype, []).append(it)
        else:
            rest.append(it)
    return by_dtype, rest


def _table_cache(opt):
    """The optimizer's device pointer tables (never pickled or saved: __getstate__ leaves them out)."""
    cache = opt.__dict__.get("_hp_tables")
    if cache is None:
        from hpcfsdp._kernels.tables import TableCache

        cache = opt.__dict__["_hp_tables"] = TableCache()
    return cache


def _wrap_state(param, array):
    wrap_like = getattr(type(param), "__hp_wrap_like__", None)
    if wrap_like is not None:
        return wrap_like(param, array)
    return Tensor._wrap(array)


def _zeros_state(param):
    arr = param._data
    xp = _backend.array_module(arr)
    return _wrap_state(param, xp.zeros(arr.shape, dtype=arr.dtype))


def _step_tensor(value=0.0):
    """PyTorch keeps ``step`` (and NAdam's ``mu_product``) as a float32 0-d tensor on cpu."""
    return Tensor._wrap(np.array(value, dtype=np.float32))


# State keys kept as float32 cpu scalars (not shaped, typed or placed like the parameter): PyTorch's ``step``;
# NAdam's ``mu_product`` and ASGD's ``eta`` and ``mu``, which PyTorch casts to the parameter's dtype on loading.
_SCALAR_STATE_KEYS = ("step", "mu_product", "eta", "mu")


def _check_lr(lr):
    """PyTorch's check of ``lr``: a non-negative number, or a 1-element Tensor."""
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        value = float(lr.item())
    else:
        value = lr
    if not 0.0 <= value:
        raise ValueError(f"Invalid learning rate: {lr}")


def _check_unsupported(name, capturable=False, differentiable=False):
    """hpcfsdp steps outside autograd and without CUDA graphs: both flags are accepted only when False."""
    if capturable or differentiable:
        raise ValueError(f"{name}: capturable and differentiable are not supported by hpcfsdp; "
                         f"got capturable={capturable}, differentiable={differentiable}")


def _lerp_(xp, start, end, weight):
    """``start.lerp_(end, weight)`` with PyTorch's two formulas (the one that is exact at its end of [0, 1])."""
    diff = xp.subtract(end, start)
    if abs(weight) < 0.5:
        diff *= weight
        start += diff
    else:
        diff *= 1 - weight
        xp.subtract(end, diff, out=start)


def _check_not_replaced(optimizer) -> None:
    """Refuse to step parameters that fully_shard / FullyShardedDataParallel replaced by sharded ones: an optimizer
    built before sharding would update objects no module uses any more and train nothing, silently."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if "_hp_fsdp_orig_uid" in p.__dict__:
                raise RuntimeError(
                    f"{type(optimizer).__name__}.step(): a parameter of shape {tuple(p.shape)} was replaced by its "
                    "sharded DTensor when the model was sharded (fully_shard / FullyShardedDataParallel), so this "
                    "optimizer would train nothing; build the optimizer after sharding, from model.parameters() "
                    "(hpcfsdp keeps no original parameter objects, also with use_orig_params=True)")


class Optimizer:
    """Base class: ``Optimizer(params, defaults)``; subclasses implement ``step``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "_hp_checks_params", False):
            def checked_step(self, *args, **kw):
                _check_not_replaced(self)
                return step(self, *args, **kw)

            checked_step.__name__, checked_step.__doc__ = step.__name__, step.__doc__
            checked_step.__qualname__ = step.__qualname__
            checked_step._hp_checks_params = True
            cls.step = checked_step

    def __init__(self, params, defaults: Dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: Dict[Tensor, Dict[str, Any]] = defaultdict(dict)
        self.param_groups: List[Dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {_typename(params)}")
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for param_group in param_groups:
            self.add_param_group(param_group)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    # Keys a pickled older param group may lack, with PyTorch's defaults (filled in by __setstate__).
    _group_defaults: dict = {}

    def __setstate__(self, state):
        self.__dict__.update(state)
        for group in self.param_groups:
            for key, value in self._group_defaults.items():
                group.setdefault(key, value)

    def __repr__(self) -> str:
        format_string = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            format_string += "\n"
            format_string += f"Parameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    format_string += f"    {key}: {group[key]}\n"
        format_string += ")"
        return format_string

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group of parameters with its own hyperparameters (missing ones from ``defaults``)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {_typename(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs. Please use a list instead.")
        else:
            param_group["params"] = list(params)
        for param in param_group["params"]:
            if not isinstance(param, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is " + _typename(param))
            if not param.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)
        ids = [id(p) for p in param_group["params"]]
        if len(ids) != len(set(ids)):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                          "cause an error (as in PyTorch)", stacklevel=3)
        existing = {id(p) for group in self.param_groups for p in group["params"]}
        if not existing.isdisjoint(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all optimized parameters (to None by default)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad._data[...] = 0

    def step(self, closure: Optional[Callable[[], float]] = None):
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    @staticmethod
    def _run_closure(closure):
        if closure is None:
            return None
        import hpcfsdp

        with hpcfsdp.enable_grad():
            return closure()

    # ------------------------------------------------------------------ state dict
    def state_dict(self) -> Dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}`` (PyTorch's format).

        Parameters are numbered in group order; state tensors are returned by reference, as PyTorch does.
        """
        param_mappings: Dict[int, int] = {}
        start_index = 0

        def pack_group(group):
            nonlocal start_index
            packed = {k: v for k, v in group.items() if k != "params"}
            param_mappings.update(
                {id(p): i for i, p in enumerate(group["params"], start_index) if id(p) not in param_mappings}
            )
            packed["params"] = [param_mappings[id(p)] for p in group["params"]]
            start_index += len(packed["params"])
            return packed

        param_groups = [pack_group(g) for g in self.param_groups]
        packed_state = {
            (param_mappings[id(k)] if isinstance(k, Tensor) else k): v for k, v in self.state.items()
        }
        return {"state": packed_state, "param_groups": param_groups}

    @staticmethod
    def _process_value_according_to_param_policy(param, value, key):
        """Copy a loaded state value for ``param``: floating state takes the parameter's dtype and device;
        ``step`` and ``mu_product`` stay float32 cpu scalars. Values are always copied (never aliased with the
        input)."""
        if not isinstance(value, Tensor):
            return copy.deepcopy(value)
        if key in _SCALAR_STATE_KEYS:
            return _step_tensor(float(value.item()))
        arr = value._data
        target = param._data
        xp = _backend.array_module(target)
        if _backend.is_floating_dtype(target.dtype) and _backend.is_floating_dtype(arr.dtype):
            dtype = target.dtype
        else:
            dtype = arr.dtype
        new = xp.array(_backend.to_numpy(arr) if xp is not _backend.array_module(arr) else arr, dtype=dtype,
                       copy=True)
        if new.shape != target.shape:
            raise ValueError(f"loaded optimizer state '{key}' has shape {tuple(new.shape)}, but the parameter's "
                             f"local shape is {tuple(target.shape)}")
        return _wrap_state(param, new)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load state produced by ``state_dict()`` (matching parameters by position in the groups)."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("optimizer state_dict must be a dict with keys 'state' and 'param_groups', got "
                             + (str(sorted(state_dict)) if isinstance(state_dict, dict) else _typename(state_dict)))
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        param_lens = (len(g["params"]) for g in groups)
        saved_lens = (len(g["params"]) for g in saved_groups)
        if any(p_len != s_len for p_len, s_len in zip(param_lens, saved_lens)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))

        def _cast(param, value, key=None):
            if isinstance(value, Tensor):
                return Optimizer._process_value_according_to_param_policy(param, value, key)
            if isinstance(value, dict):
                return {k: _cast(param, v, key=k) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(_cast(param, v, key=key) for v in value)
            return copy.deepcopy(value)

        state: Dict[Any, Dict[str, Any]] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = _cast(param, v)
            else:
                state[k] = v

        def update_group(group, new_group):
            new_group["params"] = group["params"]
            return new_group

        param_groups = [update_group(g, ng) for g, ng in zip(groups, saved_groups)]
        self.__setstate__({"state": state, "param_groups": param_groups})
