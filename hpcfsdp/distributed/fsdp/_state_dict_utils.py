"""Model and optimizer state dicts of sharded modules: SHARDED (DTensors), FULL (gathered), LOCAL (flat pieces).

Optimizer state dicts are keyed by parameter name, not position, so they survive re-wrapping and a
different world size.
"""

from collections import OrderedDict

from ... import _backend
from ..._tensor import Tensor
from ..tensor import DTensor
from ..tensor._dtensor import _local_bounds
from ._fully_shard import FSDPModule
from .api import FullOptimStateDictConfig, FullStateDictConfig, StateDictType

__all__ = [
    "model_state_dict",
    "load_model_state_dict",
    "optim_state_dict",
    "optim_state_dict_to_load",
    "local_chunk",
    "fsdp_groups",
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


def _reshard_all(root):
    for g in fsdp_groups(root):
        g.reshard()


def _world_rank():
    from ..distributed_c10d import get_rank

    return get_rank()


def _host(t: Tensor) -> Tensor:
    return Tensor._wrap(_backend.to_numpy(t._data))


def model_state_dict(root, sd_type: StateDictType, config=None) -> OrderedDict:
    _reshard_all(root)
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


def _fqn(name):
    """A parameter's name as state dicts spell it: activation-checkpoint wrappers are transparent, as in PyTorch."""
    return name.replace("_checkpoint_wrapped_module.", "")


def _param_names(root):
    """FSDPParam of every parameter name (tied parameters appear under each name)."""
    by_id = {}
    for g in fsdp_groups(root):
        for fp in g.fsdp_params:
            by_id[id(fp.sharded_param)] = (g, fp)
    return {_fqn(name): by_id[id(p)] for name, p in root.named_parameters(remove_duplicate=False) if id(p) in by_id}


def _local_state_dict(root, sd, offload):
    names = _param_names(root)
    out = OrderedDict()
    layout = {}
    for k, v in sd.items():
        if k in names:
            g, fp = names[k]
            piece = fp.layout.segment(g.flat).reshape(-1)
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
        seg = fp.layout.segment(g.flat).reshape(-1)
        if tuple(v.shape) != tuple(seg.shape):
            raise RuntimeError(f"LOCAL state dict entry {k} has shape {tuple(v.shape)}, this rank's piece is "
                               f"{tuple(seg.shape)}: it was saved with another world size or layout")
        seg[...] = _backend.array_module(seg).asarray(v._data)
    rest = {k: v for k, v in sd.items() if k not in names}
    res = root.load_state_dict(rest, strict=False)
    missing += [k for k in res.missing_keys if k not in names]
    unexpected = list(res.unexpected_keys)
    if strict and (missing or unexpected):
        raise RuntimeError(f"Error(s) in loading LOCAL state_dict: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
    return res._replace(missing_keys=missing, unexpected_keys=unexpected)


def load_model_state_dict(root, sd, sd_type: StateDictType, strict: bool = True):
    """Write ``sd`` into the sharded parameters in place (DTensors, full tensors or LOCAL pieces)."""
    _reshard_all(root)
    if sd_type == StateDictType.LOCAL_STATE_DICT:
        return _load_local(root, sd, strict)
    return root.load_state_dict(sd, strict=strict)


def local_chunk(full: Tensor, like: DTensor) -> Tensor:
    """The piece of the full tensor ``full`` that this rank holds for a DTensor laid out like ``like``."""
    if tuple(full.shape) != tuple(like.shape):
        raise ValueError(f"full tensor of shape {tuple(full.shape)} does not match the sharded tensor's "
                         f"global shape {tuple(like.shape)}")
    mesh = like.device_mesh
    bounds = _local_bounds(like.shape, mesh, like.placements, mesh.get_coordinate())
    idx = tuple(slice(a, b) for a, b in bounds)
    xp = _backend.array_module(like._data)
    return Tensor._wrap(xp.ascontiguousarray(xp.asarray(full._data[idx])))


# -- optimizer state --------------------------------------------------------------------------------------
def _optim_params(optim):
    out = []
    for g in optim.param_groups:
        out.extend(g["params"])
    return out


def optim_state_dict(root, optim, sd_type, osd_config=None, osd=None) -> dict:
    _reshard_all(root)
    osd = osd if osd is not None else optim.state_dict()
    names = {}
    for n, p in root.named_parameters():
        names.setdefault(id(p), _fqn(n))
    params = _optim_params(optim)
    full = sd_type == StateDictType.FULL_STATE_DICT
    cfg = osd_config or FullOptimStateDictConfig()
    keep = not (full and getattr(cfg, "rank0_only", False)) or _world_rank() == 0
    state = {}
    for i in sorted(osd["state"]):
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
            entry[k] = v
        if keep:
            state[names[id(p)]] = entry
    groups = []
    for g in osd["param_groups"]:
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [names[id(params[i])] for i in g["params"]]})
    return {"state": state, "param_groups": groups} if keep else {}


def optim_state_dict_to_load(root, optim, osd) -> dict:
    _reshard_all(root)
    by_name = {_fqn(n): p for n, p in root.named_parameters(remove_duplicate=False)}
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
