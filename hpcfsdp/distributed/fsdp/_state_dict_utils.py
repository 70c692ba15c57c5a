"""State dicts by FSDP1's StateDictType (SHARDED: DTensors, FULL: gathered, LOCAL: flat pieces) and optimizer state
dicts keyed by parameter name, which survive re-wrapping and a different world size; rank 0's state dicts
broadcast to every rank (see [Note: Agreed errors]). FullyShardedDataParallel's methods and DCP's get/set_state_dict
call these; what they need of fully_shard's internals is in _fully_shard/_fsdp_state_dict.py.
"""

from collections import OrderedDict

import numpy as np

from ... import _backend
from ..._tensor import Tensor
from ..tensor import DTensor
from ._fully_shard._fsdp_state_dict import (clean_fqn, host_copy, load_local_state_dict, local_chunk, local_state_dict,
                                            offloaded, reshard_all)
from .api import FullOptimStateDictConfig, FullStateDictConfig, StateDictType

__all__ = [
    "model_state_dict",
    "load_model_state_dict",
    "optim_state_dict",
    "optim_state_dict_to_load",
    "optim_param_list",
    "rekey",
    "broadcast_outline",
    "broadcast_tensor",
    "broadcast_optim_state_dict",
]


def _world_rank():
    from ..distributed_c10d import get_rank

    return get_rank()


def model_state_dict(root, sd_type: StateDictType, config=None) -> OrderedDict:
    reshard_all(root)
    sd = root.state_dict()
    offload = bool(getattr(config, "offload_to_cpu", False))
    if sd_type == StateDictType.SHARDED_STATE_DICT:
        if offload:
            for k, v in sd.items():
                if isinstance(v, DTensor):
                    sd[k] = DTensor.from_local(host_copy(v.to_local()), v.device_mesh, v.placements, shape=v.shape)
                elif isinstance(v, Tensor):
                    sd[k] = host_copy(v)
        return sd
    if sd_type == StateDictType.FULL_STATE_DICT:
        config = config or FullStateDictConfig()
        keep = not config.rank0_only or _world_rank() == 0
        out = OrderedDict()
        for k, v in sd.items():
            full = v.full_tensor() if isinstance(v, DTensor) else v  # collective: same order on every rank
            if keep:
                out[k] = host_copy(full) if offload and isinstance(full, Tensor) else full
        return out
    if sd_type == StateDictType.LOCAL_STATE_DICT:
        return local_state_dict(root, sd, offload)
    raise TypeError(f"unknown state_dict_type {sd_type!r}")


def load_model_state_dict(root, sd, sd_type: StateDictType, strict: bool = True):
    """Write ``sd`` into the sharded parameters in place (DTensors, full tensors or LOCAL pieces)."""
    reshard_all(root)
    if sd_type == StateDictType.LOCAL_STATE_DICT:
        return load_local_state_dict(root, sd, strict)
    return root.load_state_dict(sd, strict=strict)


# -- optimizer state --------------------------------------------------------------------------------------
def _optim_params(optim):
    out = []
    for g in optim.param_groups:
        out.extend(g["params"])
    return out


def _group_rank(group=None) -> int:
    from ..distributed_c10d import get_rank

    return get_rank(group)


def optim_param_list(model, optim=None, optim_input=None) -> list:
    """The parameters an optimizer state dict's integer keys index, as PyTorch's FSDP1 reads them:
    ``optim_input`` (parameters, or param groups' ``params`` back to back), else ``optim``'s param groups, else
    ``model.parameters()``."""
    if optim_input is not None:
        try:
            items = list(optim_input)
        except TypeError as e:
            raise TypeError(f"Optimizer input should be an iterable of Tensors or dicts, but got {optim_input}") from e
        if not items:
            raise ValueError("Optimizer input should not be empty")
        if all(isinstance(x, Tensor) for x in items):
            return items
        if not all(isinstance(x, dict) for x in items):
            raise TypeError("Optimizer input should be an iterable of Tensors or dicts")
        out = []
        for g in items:
            if "params" not in g:
                raise ValueError('A parameter group should map "params" to a list of the parameters in the group')
            out.extend(g["params"])
        return out
    if optim is not None:
        return _optim_params(optim)
    return list(model.parameters())


_MISSING_STATES = ("FSDP currently requires each rank to have at least the optimizer states needed by rank 0's "
                   "optimizer but some ranks are missing some of those states")


def _agreed_state_names(root, local_names, names_in_order, merge: bool, group) -> list:
    """The parameter names whose optimizer state every rank converts, in one order on every rank (FULL gathers a
    collective per sharded tensor). As PyTorch: with ``merge`` (use_orig_params) the union over the ranks, else
    rank 0's, and a RuntimeError on every rank when some rank lacks one of them. A rank lacking the state of a
    sharded parameter in the union cannot take part in its gather either: the same error (PyTorch would gather
    an empty piece)."""
    from ..distributed_c10d import all_gather_object, get_world_size

    everyone = [None] * get_world_size(group)
    all_gather_object(everyone, sorted(local_names), group=group)
    if merge:
        agreed = set().union(*map(set, everyone))
        required = {n for n in agreed if n in names_in_order and names_in_order[n][1]}  # sharded ones
    else:
        agreed = required = set(everyone[0])
    missing = {r: sorted(required - set(keys)) for r, keys in enumerate(everyone)}
    if any(missing.values()):
        raise RuntimeError(_MISSING_STATES + "".join(
            f"\nRank {r} is missing states for the parameters: {keys}" for r, keys in missing.items() if keys))
    return _in_model_order(agreed, names_in_order)


def _in_model_order(names, names_in_order) -> list:
    end = len(names_in_order)
    return sorted(names, key=lambda n: (names_in_order.get(n, (end,))[0], n))


def optim_state_dict(root, optim, sd_type, osd_config=None, osd=None, *, params=None, group=None,
                     use_orig_params: bool = True, agree: bool = True) -> dict:
    """The optimizer state keyed by parameter name (FULL: gathered tensors; SHARDED: DTensors).

    ``params``: what the state dict's integer keys index (default: ``optim``'s parameters). ``group``: the ranks
    that agree on the parameters to convert (default: all); with a FULL ``rank0_only`` config only its rank 0
    keeps the result. ``use_orig_params``: the state names are the union over the ranks, else rank 0's (see
    _agreed_state_names). ``agree=False`` (SHARDED only): this rank's own names, no communication (the elastic
    memory image, which must not fail halfway through a step that every survivor committed)."""
    if not agree and sd_type == StateDictType.FULL_STATE_DICT:
        raise ValueError("a FULL optimizer state dict gathers every sharded tensor: it cannot skip the agreement")
    reshard_all(root)
    osd = osd if osd is not None else optim.state_dict()
    if not isinstance(osd, dict) or "state" not in osd:
        raise ValueError('`optim_state_dict` must have the keys "state" to be a valid optimizer state dict')
    names = _names_of(root)
    params = params if params is not None else _optim_params(optim)
    full = sd_type == StateDictType.FULL_STATE_DICT
    cfg = osd_config or FullOptimStateDictConfig()
    keep = not (full and getattr(cfg, "rank0_only", False)) or _group_rank(group) == 0
    offload = bool(getattr(cfg, "offload_to_cpu", False))
    index_of = {}
    for i in osd["state"]:
        p = params[i] if isinstance(i, int) and 0 <= i < len(params) else None
        if p is None or id(p) not in names:
            raise ValueError(f"optimizer state key {i!r} is not a parameter of {type(root).__name__} (as indexed by "
                             "the optimizer's param groups)")
        index_of[names[id(p)]] = i
    # in the model's parameter order, not the optimizer's: ranks whose optimizers list the parameters in other
    # orders still gather (FULL: a collective per tensor) in one order
    in_order = {}
    for n, q in root.named_parameters():
        in_order.setdefault(clean_fqn(n), (len(in_order), isinstance(q, DTensor)))
    state = {}
    names_here = (_agreed_state_names(root, list(index_of), in_order, use_orig_params, group) if agree
                  else _in_model_order(index_of, in_order))
    for name in names_here:
        if name not in index_of:  # not sharded and not this rank's (use_orig_params: kept where it is)
            continue
        p = params[index_of[name]]
        entry = {}
        for k, v in osd["state"][index_of[name]].items():
            if isinstance(p, DTensor) and isinstance(v, Tensor) and not isinstance(v, DTensor) and v.ndim > 0 \
                    and tuple(v.shape) == tuple(p._data.shape):
                v = DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape)
            if isinstance(v, DTensor) and full:
                v = v.full_tensor()  # collective: every rank, same order
            if offload and isinstance(v, Tensor):
                v = offloaded(v)
            entry[k] = v
        if keep:
            state[name] = entry
    if not keep:
        return {}
    out = {"state": state}
    if "param_groups" in osd:  # PyTorch: a state dict without param groups comes back without them
        out["param_groups"] = [{**{k: v for k, v in g.items() if k != "params"},
                                "params": [names[id(params[i])] for i in g["params"]]} for g in osd["param_groups"]]
    return out


def _names_of(root) -> dict:
    names = {}
    for n, p in root.named_parameters():
        names.setdefault(id(p), clean_fqn(n))
    return names


def rekey(osd, root, params, to_names: bool) -> dict:
    """An optimizer state dict keyed by index into ``params`` (``optim.state_dict()``'s keys) rekeyed by
    parameter name (``to_names``), or the other way round."""
    if not isinstance(osd, dict) or "state" not in osd:
        raise ValueError("optimizer state dict must be a dict with 'state' (and 'param_groups')")
    names = _names_of(root)
    fqns = [names[id(p)] for p in params]
    pos = {n: i for i, n in enumerate(fqns)}

    def key(k):
        try:
            return fqns[k] if to_names else pos[k]
        except (IndexError, KeyError, TypeError):
            raise KeyError(f"optimizer state key {k!r} is not a parameter {'index' if to_names else 'name'} of "
                           f"{type(root).__name__}") from None

    out = {"state": {key(k): v for k, v in osd["state"].items()}}
    if "param_groups" in osd:  # each group's keys sorted, as PyTorch's rekey_optim_state_dict
        out["param_groups"] = [{**g, "params": sorted(key(k) for k in g["params"])} for g in osd["param_groups"]]
    return out


def _like(local: Tensor, p: DTensor) -> DTensor:
    return DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape)


def optim_state_dict_to_load(root, optim, osd, osd_config=None, *, params=None, group=None,
                             rank0_only=None) -> dict:
    """``optim.load_state_dict`` input from a name-keyed optimizer state dict (FULL: full tensors, cut to this
    rank's pieces; SHARDED: DTensors). Keys are indices into ``params`` (default: ``optim``'s parameters), each
    group's sorted, as PyTorch's; a state dict without param groups gives one without them. ``rank0_only``
    (default: a ``FullOptimStateDictConfig(rank0_only=True)``): only ``group``'s rank 0 reads ``osd``, which it
    broadcasts over ``group`` (collective). The state of a parameter this optimizer does not hold is left out."""
    reshard_all(root)
    if rank0_only is None:
        rank0_only = isinstance(osd_config, FullOptimStateDictConfig) and osd_config.rank0_only
    if rank0_only:
        osd = broadcast_optim_state_dict(root, osd if _group_rank(group) == 0 else None, group=group)
    if not isinstance(osd, dict) or "state" not in osd:
        raise ValueError('`optim_state_dict` must have the keys "state" to be a valid optimizer state dict')
    by_name = {clean_fqn(n): p for n, p in root.named_parameters(remove_duplicate=False)}
    params = params if params is not None else _optim_params(optim)
    index = {}
    for i, p in enumerate(params):
        index.setdefault(id(p), i)
    state = {}
    for name, entry in osd["state"].items():
        if name not in by_name:
            raise KeyError(f"optimizer state for {name!r}, which is not a parameter of {type(root).__name__}")
        p = by_name[name]
        if id(p) not in index:
            continue
        new = {}
        for k, v in entry.items():  # a sharded parameter's state laid out as the parameter (as its optimizer holds it)
            if isinstance(p, DTensor) and isinstance(v, Tensor) and v.ndim > 0:
                if isinstance(v, DTensor):
                    if not (v.placements == p.placements and v.device_mesh is p.device_mesh):
                        v = _like(local_chunk(v.full_tensor(), p), p)
                elif tuple(v.shape) == tuple(p.shape):
                    v = _like(local_chunk(v, p), p)
            new[k] = v
        state[index[id(p)]] = new
    if "param_groups" not in osd:
        return {"state": state}
    mine = None
    if optim is not None:
        if len(osd["param_groups"]) != len(optim.param_groups):
            raise ValueError(f"optimizer state dict has {len(osd['param_groups'])} param groups, the optimizer "
                             f"{len(optim.param_groups)}")
        mine = [{id(p) for p in g["params"]} for g in optim.param_groups]
    groups = []
    for j, g in enumerate(osd["param_groups"]):
        ids = set()
        for n in g["params"]:
            p = by_name.get(n)
            if p is None or id(p) not in index:
                raise KeyError(f"param group {j} of the optimizer state dict holds {n!r}, which is not a parameter "
                               "of this optimizer")
            if mine is not None and id(p) not in mine[j]:  # load_state_dict pairs by position: a silent mix-up
                raise ValueError(f"optimizer state dict's param group {j} holds {n!r}, which this optimizer has in "
                                 "another param group")
            ids.add(index[id(p)])
        # ids in this optimizer's order: load_state_dict pairs them positionally with its params. A parameter the
        # state dict's group lacks is left out (PyTorch's: its entry is the caller's to add)
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": sorted(ids)})
    return {"state": state, "param_groups": groups}


# -- broadcast from rank 0 ----------------------------------------------------------------------------------
# [Note: Agreed errors]
# When only rank 0 holds a state dict, rank 0 first broadcasts its outline (keys, shapes, dtypes and every
# non-tensor value) or the error it hit building it; every rank then validates that same outline against
# the same model, so all ranks raise the same error or all enter the tensor broadcasts, in the same order.
# No rank is left alone in a collective.


def _as_tensor(v, key):
    if isinstance(v, Tensor):
        return v
    if isinstance(v, np.ndarray) or _backend.is_cupy_array(v):
        return Tensor._wrap(v)
    raise TypeError(f"state dict entry {key!r}: expected a Tensor or ndarray, got {type(v).__name__}")


def _outline(sd):
    """Rank 0's description of a flat state dict: {key: ("tensor", shape, dtype name) | ("value", v)}."""
    if not isinstance(sd, dict):
        raise TypeError(f"broadcast_from_rank0: rank 0's state dict must be a dict, got {type(sd).__name__}")
    out = {}
    for k, v in sd.items():
        if isinstance(v, DTensor):  # gathering it here would be a collective on rank 0 alone
            raise TypeError(f"broadcast_from_rank0: entry {k!r} is a DTensor; rank 0 must hold full tensors "
                            "(or load a sharded state dict without broadcast_from_rank0)")
        if isinstance(v, (Tensor, np.ndarray)) or _backend.is_cupy_array(v):
            t = _as_tensor(v, k)
            if np.dtype(t.dtype).name not in _BCAST_DTYPES:
                raise TypeError(f"broadcast_from_rank0: entry {k!r} has dtype {t.dtype}, which cannot be broadcast")
            out[k] = ("tensor", tuple(int(n) for n in t.shape), np.dtype(t.dtype).name)
        elif _plain(v):
            out[k] = ("value", v)
        else:
            raise TypeError(f"broadcast_from_rank0: entry {k!r} is a {type(v).__name__}; a state dict holds "
                            "tensors and plain Python values (None, bool, int, float, str, lists, tuples, dicts)")
    return out


def _plain(v) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, (str, int)) and _plain(x) for k, x in v.items())
    return False


_ERRORS = {"TypeError": TypeError, "ValueError": ValueError, "KeyError": KeyError}


def broadcast_outline(sd, prepare=None, group=None):
    """See [Note: Agreed errors]. Returns (rank 0's outline, rank 0's prepared state dict) on every rank (the
    second is None elsewhere), or raises rank 0's error on every rank. ``group``: its rank 0 sends (default:
    the world's)."""
    from ..distributed_c10d import broadcast_object_list

    msg = [None]
    root = _group_rank(group) == 0
    if root:
        try:
            if prepare is not None:
                sd = prepare(sd)
            msg[0] = (None, _outline(sd))
        except Exception as e:  # sent, not raised: every rank must reach the broadcast
            msg[0] = ((type(e).__name__, f"rank 0: {e}"), None)
    broadcast_object_list(msg, group=group, group_src=0)
    err, outline = msg[0]
    if err is not None:
        raise _ERRORS.get(err[0], RuntimeError)(err[1])
    return outline, (sd if root else None)


_BCAST_DTYPES = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}


def broadcast_tensor(value, shape, dtype_name, group=None) -> Tensor:
    """Broadcast one full tensor from rank 0 (of ``group``, default the world's) on the host."""
    from ..distributed_c10d import broadcast

    dt = _backend.to_dtype(dtype_name)
    if _group_rank(group) == 0:
        arr = np.ascontiguousarray(_backend.to_numpy(_as_tensor(value, "")._data), dtype=dt)
    else:
        arr = np.empty(shape, dtype=dt)
    t = Tensor._wrap(arr)
    if arr.size:
        broadcast(t, group=group, group_src=0)
    return t


def broadcast_optim_state_dict(root, osd, group=None) -> dict:
    """Rank 0's (of ``group``, default the world's) full optimizer state dict on every rank of ``group``, each
    state tensor cut to this rank's piece as soon as it arrives (a DTensor like its parameter). See
    [Note: Agreed errors]."""
    outline, flat_in = broadcast_outline(osd, _flatten_nested, group=group)
    params = dict(root.named_parameters(remove_duplicate=False))
    flat = {}
    for key, info in outline.items():
        if info[0] != "tensor":
            flat[key] = info[1]
            continue
        t = broadcast_tensor(flat_in[key] if flat_in is not None else None, info[1], info[2], group=group)
        path = key.split("\x00")
        p = params.get(path[1]) if len(path) == 3 and path[0] == "state" else None
        if isinstance(p, DTensor) and tuple(t.shape) == tuple(p.shape) and t.ndim > 0:
            t = DTensor.from_local(local_chunk(t, p), p.device_mesh, p.placements, shape=p.shape)
        flat[key] = t
    return _unflatten_nested(flat)


def _flatten_nested(osd):
    if not isinstance(osd, dict) or "state" not in osd:
        raise ValueError("optimizer state dict must be a dict with 'state' (and 'param_groups'), got "
                         f"{type(osd).__name__}")
    out = {}
    for fqn, entry in osd["state"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"optimizer state of {fqn!r} must be a dict, got {type(entry).__name__}")
        for k, v in entry.items():
            out[f"state\x00{fqn}\x00{k}"] = v
    if "param_groups" in osd:
        out["param_groups"] = osd["param_groups"]
    return out


def _unflatten_nested(flat):
    state = {}
    for key, v in flat.items():
        if key == "param_groups":
            continue
        _, fqn, k = key.split("\x00")
        state.setdefault(fqn, {})[k] = v
    return {"state": state, **({"param_groups": flat["param_groups"]} if "param_groups" in flat else {})}
