"""Model and optimizer state dicts of sharded modules: SHARDED (DTensors), FULL (gathered), LOCAL (flat pieces).

Optimizer state dicts are keyed by parameter name, not position, so they survive re-wrapping and a
different world size.
"""

from collections import OrderedDict

import numpy as np

from ... import _backend
from ..._tensor import Tensor
from ..tensor import DTensor
from ..tensor._dtensor import _local_ranges, _take
from ._fully_shard import FSDPModule
from ._fully_shard._fsdp_assigned import adopt_assigned_params
from ._fully_shard._fsdp_common import TrainingState
from .api import FullOptimStateDictConfig, FullStateDictConfig, StateDictType

__all__ = [
    "model_state_dict",
    "load_model_state_dict",
    "optim_state_dict",
    "optim_state_dict_to_load",
    "local_chunk",
    "fsdp_groups",
    "reshard_all",
    "adopt_assigned_params",
    "register_state_dict_hooks",
    "broadcast_outline",
    "broadcast_tensor",
    "broadcast_optim_state_dict",
]


def fsdp_groups(root):
    seen, out = set(), []
    for m in root.modules():
        if isinstance(m, FSDPModule):
            for g in m._get_fsdp_state()._all_param_groups():
                if id(g) not in seen:
                    seen.add(id(g))
                    out.append(g)
    return out


def reshard_all(root):
    for g in fsdp_groups(root):
        g.reshard()


def register_state_dict_hooks(state) -> None:
    """Load hooks of a fully_shard state's modules: loading writes into the sharded parameters, and what
    assign=True puts on the modules is adopted (see [Note: Assigned parameters])."""
    def to_sharded(*args, **kwargs):
        for group in state._all_param_groups():
            group.reshard()

    def adopt(module, incompatible_keys):
        for group in state._all_param_groups():
            adopt_assigned_params(group)

    def to_sharded_when_idle(*args, **kwargs):  # state_dict() between passes gives the sharded DTensors
        for group in state._all_param_groups():
            if group.training_state == TrainingState.IDLE:
                group.reshard()

    for m in state._modules:
        m.register_state_dict_pre_hook(to_sharded_when_idle)
        m._register_load_state_dict_pre_hook(to_sharded)
        m.register_load_state_dict_post_hook(adopt)


def _world_rank():
    from ..distributed_c10d import get_rank

    return get_rank()


def _host(t: Tensor) -> Tensor:
    return Tensor._wrap(_backend.to_numpy(t._data))


def _offloaded(v: Tensor) -> Tensor:
    """``v`` in host memory (a DTensor keeps its layout; its local piece moves)."""
    if isinstance(v, DTensor):
        return DTensor.from_local(_host(v.to_local()), v.device_mesh, v.placements, shape=v.shape)
    return _host(v)


def model_state_dict(root, sd_type: StateDictType, config=None) -> OrderedDict:
    reshard_all(root)
    sd = root.state_dict()
    offload = bool(getattr(config, "offload_to_cpu", False))
    if sd_type == StateDictType.SHARDED_STATE_DICT:
        if offload:
            for k, v in sd.items():
                if isinstance(v, DTensor):
                    sd[k] = DTensor.from_local(_host(v.to_local()), v.device_mesh, v.placements, shape=v.shape)
                elif isinstance(v, Tensor):
                    sd[k] = _host(v)
        return sd
    if sd_type == StateDictType.FULL_STATE_DICT:
        config = config or FullStateDictConfig()
        keep = not config.rank0_only or _world_rank() == 0
        out = OrderedDict()
        for k, v in sd.items():
            full = v.full_tensor() if isinstance(v, DTensor) else v  # collective: same order on every rank
            if keep:
                out[k] = _host(full) if offload and isinstance(full, Tensor) else full
        return out
    if sd_type == StateDictType.LOCAL_STATE_DICT:
        return _local_state_dict(root, sd, offload)
    raise TypeError(f"unknown state_dict_type {sd_type!r}")


def clean_fqn(name):
    """A parameter's name as state dicts spell it: activation-checkpoint and FSDP1 wrappers are transparent,
    as in PyTorch."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")


def _param_names(root):
    """FSDPParam of every parameter name (tied parameters appear under each name)."""
    by_id = {}
    for g in fsdp_groups(root):
        for fp in g.fsdp_params:
            by_id[id(fp.sharded_param)] = (g, fp)
    return {clean_fqn(name): by_id[id(p)] for name, p in root.named_parameters(remove_duplicate=False) if id(p) in by_id}


def _local_state_dict(root, sd, offload):
    names = _param_names(root)
    out = OrderedDict()
    layout = {}
    for k, v in sd.items():
        if k in names:
            g, fp = names[k]
            piece = fp.layout.raw(g.flat)
            t = Tensor._wrap(piece.copy())
            out[k] = _host(t) if offload else t
            layout[k] = {"global_shape": list(fp.global_shape), "shard_dim": fp.shard_dim,
                         "start": fp.layout.start, "stop": fp.layout.stop, "padded_rows": fp.layout.padded,
                         "world": fp.layout.world}
        else:
            out[k] = v
    out._local_layout = layout
    return out


def _load_local(root, sd, strict):
    names = _param_names(root)
    missing = [k for k in names if k not in sd]
    for k, (g, fp) in names.items():
        if k not in sd:
            continue
        v = sd[k]
        seg = fp.layout.raw(g.flat)
        if tuple(v.shape) != tuple(seg.shape):
            raise RuntimeError(f"LOCAL state dict entry {k} has shape {tuple(v.shape)}, this rank's piece is "
                               f"{tuple(seg.shape)}: it was saved with another world size or layout")
        seg[...] = _backend.array_module(seg).asarray(v._data)
    rest = {k: v for k, v in sd.items() if k not in names}
    res = root.load_state_dict(rest, strict=False)
    missing += [k for k in res.missing_keys if clean_fqn(k) not in names]  # nested wrappers' raw names too
    unexpected = list(res.unexpected_keys)
    if strict and (missing or unexpected):
        raise RuntimeError(f"Error(s) in loading LOCAL state_dict: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
    return res._replace(missing_keys=missing, unexpected_keys=unexpected)


def load_model_state_dict(root, sd, sd_type: StateDictType, strict: bool = True):
    """Write ``sd`` into the sharded parameters in place (DTensors, full tensors or LOCAL pieces)."""
    reshard_all(root)
    if sd_type == StateDictType.LOCAL_STATE_DICT:
        return _load_local(root, sd, strict)
    return root.load_state_dict(sd, strict=strict)


def local_chunk(full: Tensor, like: DTensor) -> Tensor:
    """The piece of the full tensor ``full`` that this rank holds for a DTensor laid out like ``like``."""
    if tuple(full.shape) != tuple(like.shape):
        raise ValueError(f"full tensor of shape {tuple(full.shape)} does not match the sharded tensor's "
                         f"global shape {tuple(like.shape)}")
    mesh = like.device_mesh
    piece = _take(full._data, _local_ranges(like.shape, mesh, like.placements, mesh.get_coordinate()))
    xp = _backend.array_module(like._data)
    return Tensor._wrap(xp.ascontiguousarray(xp.asarray(piece)))


# -- optimizer state --------------------------------------------------------------------------------------
def _optim_params(optim):
    out = []
    for g in optim.param_groups:
        out.extend(g["params"])
    return out


def optim_state_dict(root, optim, sd_type, osd_config=None, osd=None) -> dict:
    reshard_all(root)
    osd = osd if osd is not None else optim.state_dict()
    names = _names_of(root)
    params = _optim_params(optim)
    full = sd_type == StateDictType.FULL_STATE_DICT
    cfg = osd_config or FullOptimStateDictConfig()
    keep = not (full and getattr(cfg, "rank0_only", False)) or _world_rank() == 0
    offload = bool(getattr(cfg, "offload_to_cpu", False))
    state = {}
    # in the model's parameter order, not the optimizer's: ranks whose optimizers list the parameters in other
    # orders still gather (FULL: a collective per tensor) in one order
    order = {id(q): j for j, q in enumerate(root.parameters())}
    for i in sorted(osd["state"], key=lambda i: (order.get(id(params[i]), len(order)), i)):
        p = params[i]
        if id(p) not in names:
            raise ValueError(f"optimizer parameter {i} is not a parameter of {type(root).__name__}")
        entry = {}
        for k, v in osd["state"][i].items():
            if isinstance(p, DTensor) and isinstance(v, Tensor) and not isinstance(v, DTensor) and v.ndim > 0 \
                    and tuple(v.shape) == tuple(p._data.shape):
                v = DTensor.from_local(v, p.device_mesh, p.placements, shape=p.shape)
            if isinstance(v, DTensor) and full:
                v = v.full_tensor()  # collective: every rank, same order
            if offload and isinstance(v, Tensor):
                v = _offloaded(v)
            entry[k] = v
        if keep:
            state[names[id(p)]] = entry
    groups = []
    for g in osd["param_groups"]:
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [names[id(params[i])] for i in g["params"]]})
    return {"state": state, "param_groups": groups} if keep else {}


def _names_of(root) -> dict:
    names = {}
    for n, p in root.named_parameters():
        names.setdefault(id(p), clean_fqn(n))
    return names


def rekey(osd, root, params, to_names: bool) -> dict:
    """An optimizer state dict keyed by index into ``params`` (``optim.state_dict()``'s keys) rekeyed by
    parameter name (``to_names``), or the other way round."""
    if not isinstance(osd, dict) or "state" not in osd or "param_groups" not in osd:
        raise ValueError("optimizer state dict must be a dict with 'state' and 'param_groups'")
    names = _names_of(root)
    fqns = [names[id(p)] for p in params]
    pos = {n: i for i, n in enumerate(fqns)}

    def key(k):
        try:
            return fqns[k] if to_names else pos[k]
        except (IndexError, KeyError, TypeError):
            raise KeyError(f"optimizer state key {k!r} is not a parameter {'index' if to_names else 'name'} of "
                           f"{type(root).__name__}") from None

    return {"state": {key(k): v for k, v in osd["state"].items()},
            "param_groups": [{**g, "params": [key(k) for k in g["params"]]} for g in osd["param_groups"]]}


def optim_state_dict_to_load(root, optim, osd, osd_config=None) -> dict:
    """``optim.load_state_dict`` input from a name-keyed optimizer state dict. With a
    ``FullOptimStateDictConfig(rank0_only=True)`` only rank 0's ``osd`` is read; it is broadcast (collective)."""
    reshard_all(root)
    if isinstance(osd_config, FullOptimStateDictConfig) and osd_config.rank0_only:
        osd = broadcast_optim_state_dict(root, osd)
    by_name = {clean_fqn(n): p for n, p in root.named_parameters(remove_duplicate=False)}
    index = {id(p): i for i, p in enumerate(_optim_params(optim))}
    if "state" not in osd or "param_groups" not in osd:
        raise ValueError("optimizer state dict must have 'state' and 'param_groups'")
    state = {}
    for name, entry in osd["state"].items():
        if name not in by_name:
            raise KeyError(f"optimizer state for {name!r}, which is not a parameter of {type(root).__name__}")
        p = by_name[name]
        new = {}
        for k, v in entry.items():
            if isinstance(p, DTensor) and isinstance(v, Tensor) and v.ndim > 0:
                if isinstance(v, DTensor):
                    same = v.placements == p.placements and v.device_mesh is p.device_mesh
                    v = v.to_local() if same else local_chunk(v.full_tensor(), p)
                elif tuple(v.shape) == tuple(p.shape):
                    v = local_chunk(v, p)
            new[k] = v
        state[index[id(p)]] = new
    if len(osd["param_groups"]) != len(optim.param_groups):
        raise ValueError(f"optimizer state dict has {len(osd['param_groups'])} param groups, the optimizer "
                         f"{len(optim.param_groups)}")
    groups = []
    for g, mine in zip(osd["param_groups"], optim.param_groups):
        names = {id(by_name[n]) for n in g["params"] if n in by_name}
        if names != {id(p) for p in mine["params"]}:
            raise ValueError("optimizer state dict's param groups hold other parameters than the optimizer's")
        # ids in this optimizer's own order: load_state_dict pairs them positionally
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [index[id(p)] for p in mine["params"]]})
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


def broadcast_outline(sd, prepare=None):
    """See [Note: Agreed errors]. Returns (rank 0's outline, rank 0's prepared state dict) on every rank (the
    second is None elsewhere), or raises rank 0's error on every rank."""
    from ..distributed_c10d import broadcast_object_list

    msg = [None]
    if _world_rank() == 0:
        try:
            if prepare is not None:
                sd = prepare(sd)
            msg[0] = (None, _outline(sd))
        except Exception as e:  # sent, not raised: every rank must reach the broadcast
            msg[0] = ((type(e).__name__, f"rank 0: {e}"), None)
    broadcast_object_list(msg, src=0)
    err, outline = msg[0]
    if err is not None:
        raise _ERRORS.get(err[0], RuntimeError)(err[1])
    return outline, (sd if _world_rank() == 0 else None)


_BCAST_DTYPES = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}


def broadcast_tensor(value, shape, dtype_name) -> Tensor:
    """Broadcast one full tensor from rank 0 on the host."""
    from ..distributed_c10d import broadcast

    dt = _backend.to_dtype(dtype_name)
    if _world_rank() == 0:
        arr = np.ascontiguousarray(_backend.to_numpy(_as_tensor(value, "")._data), dtype=dt)
    else:
        arr = np.empty(shape, dtype=dt)
    t = Tensor._wrap(arr)
    if arr.size:
        broadcast(t, src=0)
    return t


def broadcast_optim_state_dict(root, osd) -> dict:
    """Rank 0's full optimizer state dict on every rank, each state tensor cut to this rank's piece as soon
    as it arrives (a DTensor like its parameter). See [Note: Agreed errors]."""
    outline, flat_in = broadcast_outline(osd, _flatten_nested)
    params = dict(root.named_parameters(remove_duplicate=False))
    flat = {}
    for key, info in outline.items():
        if info[0] != "tensor":
            flat[key] = info[1]
            continue
        t = broadcast_tensor(flat_in[key] if flat_in is not None else None, info[1], info[2])
        path = key.split("\x00")
        p = params.get(path[1]) if len(path) == 3 and path[0] == "state" else None
        if isinstance(p, DTensor) and tuple(t.shape) == tuple(p.shape) and t.ndim > 0:
            t = DTensor.from_local(local_chunk(t, p), p.device_mesh, p.placements, shape=p.shape)
        flat[key] = t
    return _unflatten_nested(flat)


# The optimizer state dict is flattened for broadcast with "\x00" joined paths: parameter names contain dots.
def _flatten_nested(osd):
    if not isinstance(osd, dict) or "state" not in osd or "param_groups" not in osd:
        raise ValueError("optimizer state dict must be a dict with 'state' and 'param_groups', got "
                         f"{type(osd).__name__}")
    out = {}
    for fqn, entry in osd["state"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"optimizer state of {fqn!r} must be a dict, got {type(entry).__name__}")
        for k, v in entry.items():
            out[f"state\x00{fqn}\x00{k}"] = v
    out["param_groups"] = osd["param_groups"]
    return out


def _unflatten_nested(flat):
    state = {}
    for key, v in flat.items():
        if key == "param_groups":
            continue
        _, fqn, k = key.split("\x00")
        state.setdefault(fqn, {})[k] = v
    return {"state": state, "param_groups": flat["param_groups"]}
