"""Model and optimizer state dicts of (sharded) models by parameter name: PyTorch's ``checkpoint.state_dict``.

``get_*`` return SHARDED (DTensor) or, with ``full_state_dict``, FULL state dicts; ``set_*`` load either
form, and with ``broadcast_from_rank0`` a full state dict that only rank 0 holds (the others pass ``{}``).

[Note: Loading into a meta-device model]
A model built on the meta device and sharded has parameters without storage, so copying into them
does nothing (PyTorch warns). For FULL (and rank-0 broadcast) loads, ``set_model_state_dict`` builds for
every meta entry a new tensor of the model's layout (this rank's piece of a DTensor, cast to the
model's dtype) and, if any entry of the model is meta, loads with ``assign=True`` (PyTorch's rule);
FSDP then adopts the assigned parameters into its sharded storage
(``adopt_assigned_params`` in ``fsdp/_fully_shard/_fsdp_assigned.py``, called by the load hooks of
FSDPState.register_state_dict_hooks), materialising it. A model without meta entries is filled
in place, so its parameter objects (and an optimizer's references to them) survive.

Errors on rank 0's input are raised on every rank: see [Note: Agreed errors] in
``fsdp/_state_dict_utils.py``.
"""

import warnings
from dataclasses import dataclass

import numpy as np

from ... import _backend
from ..._tensor import Tensor
from ...nn.modules._state_dict import _IncompatibleKeys
from ..fsdp import _state_dict_utils as sdu
from ..fsdp._fully_shard._fsdp_state_dict import clean_fqn, local_chunk, reshard_all
from ..fsdp.api import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
)
from ..tensor import DTensor

__all__ = [
    "StateDictOptions",
    "get_model_state_dict",
    "set_model_state_dict",
    "get_optimizer_state_dict",
    "set_optimizer_state_dict",
    "get_state_dict",
    "set_state_dict",
]

_STATE, _PG, _PARAMS = "state", "param_groups", "params"


@dataclass
class StateDictOptions:
    """How the state-dict helpers work (PyTorch's fields and defaults).

    full_state_dict: gather full tensors instead of returning DTensors (collective).
    cpu_offload: move values to host memory; with full_state_dict only rank 0 keeps them (others get {}).
    ignore_frozen_params: leave out parameters with requires_grad=False.
    keep_submodule_prefixes: with ``submodules``, keep their prefixes in the keys.
    strict: loading fails on missing/unexpected keys.
    broadcast_from_rank0: set_* with a full state dict present on rank 0 only (needs full_state_dict).
    flatten_optimizer_state_dict: optimizer state as one flat dict ("state.<fqn>.<key>", "param_groups.<fqn>.<key>").
    dsd_fqn_modifiers: name of a module method mapping hidden submodule names (accepted; no module here has one).
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


def _verify_options(options) -> StateDictOptions:
    if options is None:
        return StateDictOptions()
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"options must be a StateDictOptions, got {type(options).__name__}")
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError("full_state_dict must be True when broadcast_from_rank0 is True.")
    return options


def _optim_tuple(optimizers) -> tuple:
    from ...optim import Optimizer

    if isinstance(optimizers, Optimizer):
        return (optimizers,)
    optims = tuple(optimizers)
    for o in optims:
        if not isinstance(o, Optimizer):
            raise TypeError(f"optimizers must be Optimizers, got {type(o).__name__}")
    return optims


def _root(model):
    from ..fsdp.fully_sharded_data_parallel import FullyShardedDataParallel

    return model.module if isinstance(model, FullyShardedDataParallel) else model


def _rank() -> int:
    from ..distributed_c10d import get_rank, is_initialized

    return get_rank() if is_initialized() else 0


# -- model --------------------------------------------------------------------------------------------------
def _submodule_prefixes(root, submodules):
    wanted = {id(m) for m in submodules}
    return [f"{n}." for n, m in root.named_modules() if id(m) in wanted]


def get_model_state_dict(model, *, submodules=None, options=None) -> dict:
    """SHARDED (DTensor) model state dict, or FULL with ``full_state_dict=True`` (collective)."""
    o = _verify_options(options)
    root = _root(model)
    if o.full_state_dict:
        cfg = FullStateDictConfig(offload_to_cpu=o.cpu_offload, rank0_only=o.cpu_offload)
        sd = sdu.model_state_dict(root, StateDictType.FULL_STATE_DICT, cfg)
    else:
        sd = sdu.model_state_dict(root, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(o.cpu_offload))
    if submodules:
        warnings.warn("Getting submodules only model/optim state_dict is deprecated (as in PyTorch); filter the "
                      "state_dict returned by get_state_dict instead.", FutureWarning, stacklevel=2)
        prefixes = _submodule_prefixes(root, submodules)
        out = type(sd)()
        for k, v in sd.items():
            for p in prefixes:
                if k.startswith(p):
                    out[k if o.keep_submodule_prefixes else k[len(p):]] = v
        sd = out
    if o.ignore_frozen_params:
        for n, p in root.named_parameters():
            if not p.requires_grad:
                sd.pop(clean_fqn(n), None)
    return sd


def _is_meta(t) -> bool:
    return isinstance(t, Tensor) and _backend.is_meta_array(t._data)


_as_tensor = sdu._as_tensor


def _like_local(full: Tensor, like: Tensor, key: str) -> Tensor:
    """``full`` (a full tensor) in the layout and dtype of the model's entry ``like``: this rank's piece of a
    DTensor, or a whole tensor; on ``like``'s array module unless ``like`` is meta (then on the host)."""
    if tuple(full.shape) != tuple(like.shape):
        raise RuntimeError(f"size mismatch for {key}: copying a param with shape {tuple(full.shape)} from "
                           f"checkpoint, the shape in current model is {tuple(like.shape)}.")
    dt = like.dtype
    xp = np if _is_meta(like) else _backend.array_module(like._data)
    if isinstance(like, DTensor):
        piece = local_chunk(full, like)._data
        return DTensor.from_local(Tensor._wrap(xp.asarray(piece).astype(dt, copy=False)), like.device_mesh,
                                  like.placements, shape=like.shape)
    return Tensor._wrap(xp.asarray(full._data).astype(dt, copy=False))


def _check_keys(keys, local, strict, what):
    if not strict:
        return
    missing = [k for k in local if k not in keys]
    unexpected = [k for k in keys if k not in local]
    if missing or unexpected:
        raise RuntimeError(f"Error(s) in loading {what}: missing keys {missing}, unexpected keys {unexpected}")


def _load_full(root, sd, o):
    """FULL load (every rank holds ``sd``, or rank 0 alone with broadcast). See [Note: Loading into a
    meta-device model] and [Note: Agreed errors]."""
    local = root.state_dict()
    if o.broadcast_from_rank0:
        outline, _ = sdu.broadcast_outline(sd)
    else:
        outline = {k: None for k in sd}
    _check_keys(outline, local, o.strict, "state_dict (full_state_dict)")
    for k, like in local.items():  # shape errors are found before any data moves, the same on every rank
        info = outline.get(k)
        if info is not None and info[0] == "tensor" and isinstance(like, Tensor) \
                and tuple(info[1]) != tuple(like.shape):
            raise RuntimeError(f"size mismatch for {k}: copying a param with shape {tuple(info[1])} from "
                               f"checkpoint, the shape in current model is {tuple(like.shape)}.")
    out = {}
    for k, like in local.items():  # the model's order: the same on every rank
        if k not in outline:
            continue
        if o.broadcast_from_rank0:
            info = outline[k]
            if info[0] != "tensor":
                out[k] = info[1]  # extra state (or a wrong value, which load_state_dict reports on every rank)
                continue
            full = sdu.broadcast_tensor(sd.get(k) if _rank() == 0 else None, info[1], info[2])
            if not isinstance(like, Tensor):
                out[k] = full
                continue
        elif not isinstance(like, Tensor):
            out[k] = sd[k]  # a module's extra state
            continue
        else:
            v = sd[k]
            full = v.full_tensor() if isinstance(v, DTensor) else _as_tensor(v, k)
        out[k] = _like_local(full, like, k)
    assign = any(_is_meta(v) for v in local.values())
    return root.load_state_dict(out, strict=o.strict, assign=assign)


def set_model_state_dict(model, model_state_dict, *, options=None) -> _IncompatibleKeys:
    """Load a SHARDED or FULL model state dict into the (sharded) model; returns (missing_keys, unexpected_keys)."""
    o = _verify_options(options)
    root = _root(model)
    if not model_state_dict and not o.broadcast_from_rank0:
        if o.strict:
            raise RuntimeError("The option indicates that model state_dict is required to save or load, but "
                               f"model state_dict is empty. rank = {_rank()}.")
        return _IncompatibleKeys([], [])
    reshard_all(root)
    if o.full_state_dict:
        return _load_full(root, model_state_dict, o)
    sd = {k: (_as_tensor(v, k) if isinstance(v, np.ndarray) else v) for k, v in model_state_dict.items()}
    return root.load_state_dict(sd, strict=o.strict)


# -- optimizer ----------------------------------------------------------------------------------------------
def _init_optim_state(optim) -> None:
    """Create the optimizer's state by one step with zero gradients and learning rate 0 (PyTorch's rule:
    nothing happens if the state exists or any parameter already has a gradient)."""
    if optim.state:
        return
    for g in optim.param_groups:
        for p in g[_PARAMS]:
            if p.grad is not None:
                return
    for g in optim.param_groups:
        for p in g[_PARAMS]:
            if p.requires_grad:
                zeros = Tensor._wrap(_backend.array_module(p._data).zeros_like(p._data))
                p.grad = DTensor.from_local(zeros, p.device_mesh, p.placements, shape=p.shape) \
                    if isinstance(p, DTensor) else zeros
    lrs = []
    for g in optim.param_groups:
        if "lr" in g:
            lrs.append(g["lr"])
            g["lr"] = 0.0
    try:
        with np.errstate(invalid="ignore", over="ignore"):  # parameters may still hold to_empty's garbage
            optim.step()
    finally:
        for g in optim.param_groups:
            if "lr" in g:
                g["lr"] = lrs.pop(0)
        optim.zero_grad(set_to_none=True)


def _flatten_osd(osd) -> dict:
    out = {}
    for fqn, entry in osd[_STATE].items():
        for k, v in entry.items():
            out[f"{_STATE}.{fqn}.{k}"] = v
    for g in osd[_PG]:
        for fqn in g[_PARAMS]:
            for k, v in g.items():
                if k != _PARAMS:
                    out[f"{_PG}.{fqn}.{k}"] = v
    return out


def _unflatten_osd(root, optim, flat) -> dict:
    names = _param_names(root)
    state, groups = {}, []
    for g in optim.param_groups:
        fqns = [names[id(p)] for p in g[_PARAMS]]
        group = {_PARAMS: fqns}
        for k in g:
            if k == _PARAMS:
                continue
            key = f"{_PG}.{fqns[0]}.{k}" if fqns else None
            if key is None or key not in flat:
                raise KeyError(f"flattened optimizer state dict has no {key or 'param group value ' + k!r}")
            group[k] = flat[key]
        groups.append(group)
        for fqn in fqns:
            prefix = f"{_STATE}.{fqn}."
            entry = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
            if entry:
                state[fqn] = entry
    return {_STATE: state, _PG: groups}


def _param_names(root):
    names = {}
    for n, p in root.named_parameters():
        names.setdefault(id(p), clean_fqn(n))
    return names


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None) -> dict:
    """The optimizers' state keyed by parameter name: DTensors, or full tensors with ``full_state_dict``."""
    o = _verify_options(options)
    optims = _optim_tuple(optimizers)
    root = _root(model)
    full = o.full_state_dict
    sd_type = StateDictType.FULL_STATE_DICT if full else StateDictType.SHARDED_STATE_DICT
    cfg = FullOptimStateDictConfig(offload_to_cpu=o.cpu_offload, rank0_only=o.cpu_offload) if full \
        else ShardedOptimStateDictConfig(offload_to_cpu=o.cpu_offload)
    merged = {_STATE: {}, _PG: []}
    for optim in optims:
        _init_optim_state(optim)
        osd = sdu.optim_state_dict(root, optim, sd_type, cfg)
        if not osd:
            continue
        merged[_STATE].update(osd[_STATE])
        merged[_PG].extend(osd[_PG])
    if full and o.cpu_offload and _rank() != 0:
        return {}
    return _flatten_osd(merged) if o.flatten_optimizer_state_dict else merged


def local_optimizer_state_dict(model, optim) -> dict:
    """``get_optimizer_state_dict(model, optim)`` (SHARDED) from this rank's state alone: no rank agrees with
    another on the state's names, so it never communicates. For a state every rank holds the same names of
    (the optimizer has stepped): the elastic memory image (hpcfsdp.distributed.elastic)."""
    return sdu.optim_state_dict(_root(model), optim, StateDictType.SHARDED_STATE_DICT,
                                ShardedOptimStateDictConfig(), agree=False)


def _split_osd(root, optim, osd, strict) -> dict:
    """The part of a (merged) name-keyed optimizer state dict that belongs to ``optim``."""
    if not isinstance(osd, dict) or _STATE not in osd or _PG not in osd:
        raise ValueError("optimizer state dict must be a dict with 'state' and 'param_groups', got "
                         f"{type(osd).__name__} with keys {sorted(osd) if isinstance(osd, dict) else None}")
    names = _param_names(root)
    mine = [names.get(id(p)) for g in optim.param_groups for p in g[_PARAMS]]
    if None in mine:
        raise ValueError(f"the optimizer holds a parameter that is not a parameter of {type(root).__name__}")
    mine_set = set(mine)
    groups = [g for g in osd[_PG] if mine_set & set(g[_PARAMS])]
    if (len(groups) < len(optim.param_groups) == len(osd[_PG])
            and all(set(g[_PARAMS]) <= mine_set for g in osd[_PG])):
        groups = list(osd[_PG])  # this optimizer's, with its empty param groups (matched by position)
    state = {}
    for g in optim.param_groups:
        for p in g[_PARAMS]:
            fqn = names[id(p)]
            if fqn in osd[_STATE]:
                state[fqn] = osd[_STATE][fqn]
            elif strict and p.requires_grad:
                raise RuntimeError(f"Missing optimizer state for parameter '{fqn}' in checkpoint. The parameter "
                                   "requires gradients but has no saved optimizer state. To load anyway, use "
                                   "StateDictOptions(strict=False).")
    return {_STATE: state, _PG: groups}


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None) -> None:
    """Load a name-keyed optimizer state dict (SHARDED, FULL, or FULL on rank 0 with broadcast_from_rank0)."""
    o = _verify_options(options)
    optims = _optim_tuple(optimizers)
    root = _root(model)
    if not optim_state_dict and not o.broadcast_from_rank0 and not (o.cpu_offload and o.full_state_dict):
        raise RuntimeError("The option indicates that model state_dict is required to save, or load but optim "
                           f"state_dict is empty. {optim_state_dict}")
    reshard_all(root)
    for optim in optims:
        _init_optim_state(optim)
    osd = optim_state_dict
    if o.broadcast_from_rank0:
        osd = sdu.broadcast_optim_state_dict(root, osd)
    if isinstance(osd, dict) and osd and _STATE not in osd:
        osd = None if len(optims) != 1 else _unflatten_osd(root, optims[0], osd)
        if osd is None:
            raise ValueError("a flattened optimizer state dict can be loaded into one optimizer only")
    for optim in optims:
        part = _split_osd(root, optim, osd, o.strict)
        optim.load_state_dict(sdu.optim_state_dict_to_load(root, optim, part))


# -- both ---------------------------------------------------------------------------------------------------
def get_state_dict(model, optimizers, *, submodules=None, options=None):
    """(model state dict, optimizer state dict); see get_model_state_dict and get_optimizer_state_dict."""
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, options=options))


def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None) -> _IncompatibleKeys:
    """Load the optimizers' state, then the model's (PyTorch's order); returns the model's incompatible keys."""
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return set_model_state_dict(model, model_state_dict, options=options)
