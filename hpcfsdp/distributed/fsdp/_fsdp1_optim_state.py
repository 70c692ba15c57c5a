"""FullyShardedDataParallel's optimizer-state API (PyTorch's FSDP1 static methods): which parameters a state
dict's integer keys index, which ranks agree and which rank keeps a FULL result, and the deprecated forms
(``full_optim_state_dict``, ``shard_full_optim_state_dict``, ...). The conversions are in _state_dict_utils.py."""

import warnings

from . import _state_dict_utils as sdu
from ._fsdp1_state import fsdp1_instances, fsdp1_root, state_dict_settings
from ._fully_shard._fsdp_state_dict import reshard_all
from .api import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    OptimStateKeyType,
    StateDictSettings,
    StateDictType,
)

__all__ = [
    "optim_state_dict",
    "optim_state_dict_to_load",
    "full_optim_state_dict",
    "sharded_optim_state_dict",
    "load_full_optim_state_dict",
    "flatten_sharded_optim_state_dict",
    "rekey_optim_state_dict",
]


def _settings(model) -> StateDictSettings:
    if fsdp1_instances(model, required=False):
        return state_dict_settings(model)
    return StateDictSettings(StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig())


def _use_orig_params(model) -> bool:
    """The instances' shared ``use_orig_params`` (PyTorch: the state names are the union over the ranks with it,
    rank 0's without); True for a model without FSDP1 instances (fully_shard units hold original parameters)."""
    values = {w.use_orig_params for w in fsdp1_instances(model, required=False)}
    if len(values) > 1:
        raise AssertionError("Not all FSDP modules have the same _use_orig_params value")
    return values.pop() if values else True


def _warn_optim_input(optim_input) -> None:
    if optim_input is not None:
        warnings.warn("The `optim_input` argument is deprecated and will be removed after PyTorch 1.13. You may "
                      "remove it from your code without changing its functionality.", FutureWarning, stacklevel=4)


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(f"FSDP.{name}() is being deprecated and is not recommended; use FSDP.{instead}() instead "
                  f"(hpcfsdp keeps it for scripts written against it).", FutureWarning, stacklevel=4)


def _gathered(model, optim, osd, sd_type, osd_config, params=None, group=None) -> dict:
    return sdu.optim_state_dict(fsdp1_root(model), optim, sd_type, osd_config, osd, params=params, group=group,
                                use_orig_params=_use_orig_params(model))


def optim_state_dict(model, optim, osd=None, group=None) -> dict:
    s = _settings(model)
    return _gathered(model, optim, osd, s.state_dict_type, s.optim_state_dict_config, group=group)


def optim_state_dict_to_load(model, optim, osd, load_directly=False, group=None) -> dict:
    s = _settings(model)
    full = s.state_dict_type == StateDictType.FULL_STATE_DICT
    rank0_only = bool(full and getattr(s.optim_state_dict_config, "rank0_only", False))
    result = sdu.optim_state_dict_to_load(fsdp1_root(model), optim, osd, params=sdu.optim_param_list(model, optim),
                                          group=group, rank0_only=rank0_only)
    if load_directly:
        optim.load_state_dict(result)
    return result


def full_optim_state_dict(model, optim, optim_input=None, rank0_only=True, group=None) -> dict:
    _deprecated("full_optim_state_dict", "optim_state_dict")
    _warn_optim_input(optim_input)
    params = sdu.optim_param_list(model, optim, optim_input)
    return _gathered(model, optim, optim.state_dict(), StateDictType.FULL_STATE_DICT,
                     FullOptimStateDictConfig(rank0_only=rank0_only), params=params, group=group)


def sharded_optim_state_dict(model, optim, group=None) -> dict:
    _deprecated("sharded_optim_state_dict", "optim_state_dict")
    return _gathered(model, optim, optim.state_dict(), StateDictType.SHARDED_STATE_DICT, None, group=group)


def load_full_optim_state_dict(full_osd, model, optim_input=None, optim=None, broadcast=False, group=None) -> dict:
    """shard_full_optim_state_dict / scatter_full_optim_state_dict (``broadcast``: ``group``'s rank 0 holds
    ``full_osd`` and sends it): ``optim.load_state_dict`` input from a full optimizer state dict keyed by name
    (PyTorch's) or by index (``rekey_optim_state_dict(..., PARAM_ID)``). The keys index ``optim_input``, else
    ``optim``'s parameters, else ``model.parameters()``, as PyTorch's."""
    _deprecated("scatter_full_optim_state_dict" if broadcast else "shard_full_optim_state_dict",
                "optim_state_dict_to_load")
    _warn_optim_input(optim_input)
    root = fsdp1_root(model)
    reshard_all(root)  # model.parameters() below: the sharded parameters an optimizer holds
    params = sdu.optim_param_list(model, optim, optim_input)
    named = full_osd
    if not broadcast or sdu._group_rank(group) == 0:
        if not _keyed_by(full_osd, str):
            named = sdu.rekey(full_osd, root, params, to_names=True)
    return sdu.optim_state_dict_to_load(root, optim if optim_input is None else None, named, params=params,
                                        group=group, rank0_only=broadcast)


def flatten_sharded_optim_state_dict(sharded_osd, model, optim) -> dict:
    _deprecated("flatten_sharded_optim_state_dict", "optim_state_dict_to_load")
    return sdu.optim_state_dict_to_load(fsdp1_root(model), optim, sharded_osd, rank0_only=False)


def _keyed_by(osd, kind) -> bool:
    return all(isinstance(k, kind) for k in osd.get("state", {})) and all(
        isinstance(k, kind) for g in osd.get("param_groups", []) for k in g["params"])


def rekey_optim_state_dict(osd, key_type, model, optim_input=None, optim=None) -> dict:
    _warn_optim_input(optim_input)
    if not isinstance(key_type, OptimStateKeyType):
        raise TypeError(f"optim_state_key_type must be an OptimStateKeyType, got {key_type!r}")
    kinds = {type(k) for k in osd["state"]}
    if len(kinds) > 1:  # PyTorch's check: the keys are uniformly names or ids
        raise ValueError(f"Invalid parameter keys: {osd['state'].keys()}")
    params = sdu.optim_param_list(model, optim, optim_input)
    by_name = _keyed_by(osd, str)
    if by_name == (key_type is OptimStateKeyType.PARAM_NAME):
        return osd
    return sdu.rekey(osd, fsdp1_root(model), params, to_names=not by_name)
