"""Distributed checkpoints: state-dict helpers and sharded save/load that reshard across world sizes.

``save(state_dict, checkpoint_id=DIR)`` writes a nested state dict (model and optimizer state dicts,
step counters, RNG state ...) as a checkpoint directory: every rank writes only its own pieces of
DTensors, replicated tensors are written once, and Python scalars/strings/lists go into
``metadata.json``. ``load(state_dict, checkpoint_id=DIR)`` fills a state dict of the same structure in
place, at any world size and mesh, reading only the bytes each rank needs. No pickle anywhere.
"""

from dataclasses import dataclass

from ... import _backend
from ..._tensor import Tensor
from ..fsdp import _state_dict_utils as sdu
from ..fsdp.api import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from ..tensor import DTensor
from ..tensor._dtensor import _local_bounds
from ._format import (
    IncompleteCheckpointError,
    Piece,
    consolidate,
    load_pieces,
    read_metadata,
    save_pieces,
    verify_checkpoint,
)

__all__ = [
    "save",
    "load",
    "StateDictOptions",
    "get_model_state_dict",
    "set_model_state_dict",
    "get_optimizer_state_dict",
    "set_optimizer_state_dict",
    "get_state_dict",
    "set_state_dict",
    "read_metadata",
    "verify_checkpoint",
    "consolidate",
    "IncompleteCheckpointError",
]

_JSON_LEAVES = (bool, int, float, str, type(None))


@dataclass
class StateDictOptions:
    """How the state-dict helpers work (PyTorch's `torch.distributed.checkpoint.state_dict` options).

    full_state_dict: gather full tensors instead of returning DTensors (collective).
    cpu_offload: move values to host memory; with full_state_dict only rank 0 keeps them.
    strict: loading fails on missing/unexpected keys.
    broadcast_from_rank0: set_* with a full state dict present on rank 0 only.
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    strict: bool = True
    broadcast_from_rank0: bool = False
    ignore_frozen_params: bool = False


def _opts(options):
    if options is None:
        return StateDictOptions()
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"options must be a StateDictOptions, got {type(options).__name__}")
    return options


def _one_optim(optimizers):
    if isinstance(optimizers, (list, tuple)):
        if len(optimizers) != 1:
            raise ValueError(f"expected one optimizer, got {len(optimizers)}")
        return optimizers[0]
    return optimizers


def get_model_state_dict(model, *, submodules=None, options=None):
    """SHARDED (DTensor) model state dict, or FULL with ``full_state_dict=True``."""
    o = _opts(options)
    root = sdu_root(model)
    if o.full_state_dict:
        sd = sdu.model_state_dict(root, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=o.cpu_offload, rank0_only=o.cpu_offload))
    else:
        sd = sdu.model_state_dict(root, StateDictType.SHARDED_STATE_DICT)
    if o.ignore_frozen_params:
        frozen = {n for n, p in root.named_parameters() if not p.requires_grad}
        sd = type(sd)((k, v) for k, v in sd.items() if k not in frozen)
    return sd


def _broadcast_full(root, sd):
    """Rank 0 holds full tensors; give every rank the same (shapes from the model's own entries)."""
    from ..distributed_c10d import broadcast, get_rank

    like = root.state_dict()
    out = {}
    for k, v in like.items():
        if get_rank() == 0:
            if k not in sd:
                raise KeyError(f"broadcast_from_rank0: rank 0's state dict has no entry {k!r}")
            t = sd[k]
        else:
            xp = _backend.array_module(v._data)
            t = Tensor._wrap(xp.empty(tuple(v.shape), dtype=v.dtype))
        t = Tensor._wrap(_backend.array_module(v._data).ascontiguousarray(t._data))
        broadcast(t, src=0)
        out[k] = t
    return out


def set_model_state_dict(model, model_state_dict, *, options=None):
    """Load a SHARDED or FULL model state dict into the sharded model, in place."""
    o = _opts(options)
    root = sdu_root(model)
    if o.broadcast_from_rank0:
        model_state_dict = _broadcast_full(root, model_state_dict)
    return sdu.load_model_state_dict(root, model_state_dict, StateDictType.SHARDED_STATE_DICT, strict=o.strict)


def _init_optim_state(optim):
    """Create the optimizer's state (zero gradients, learning rate 0) so that it can be loaded into."""
    if optim.state:
        return
    saved = []
    for g in optim.param_groups:
        saved.append(g["lr"])
        g["lr"] = 0.0
        for p in g["params"]:
            if p.grad is None and p.requires_grad:
                p.grad = p.detach() * 0 if not isinstance(p, DTensor) else DTensor.from_local(
                    Tensor._wrap(_backend.array_module(p._data).zeros_like(p._data)), p.device_mesh, p.placements,
                    shape=p.shape)
    wd = [g.get("weight_decay") for g in optim.param_groups]
    try:
        optim.step()
    finally:
        for g, lr, w in zip(optim.param_groups, saved, wd):
            g["lr"] = lr
            for p in g["params"]:
                p.grad = None


def get_optimizer_state_dict(model, optimizers, *, options=None):
    """The optimizer state keyed by parameter name: DTensors, or full tensors with ``full_state_dict``."""
    o = _opts(options)
    optim = _one_optim(optimizers)
    _init_optim_state(optim)
    sd_type = StateDictType.FULL_STATE_DICT if o.full_state_dict else StateDictType.SHARDED_STATE_DICT
    return sdu.optim_state_dict(sdu_root(model), optim, sd_type,
                                FullOptimStateDictConfig(offload_to_cpu=o.cpu_offload, rank0_only=o.cpu_offload))


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None) -> None:
    optim = _one_optim(optimizers)
    _init_optim_state(optim)
    optim.load_state_dict(sdu.optim_state_dict_to_load(sdu_root(model), optim, optim_state_dict))


def get_state_dict(model, optimizers, *, submodules=None, options=None):
    return (get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizers, options=options))


def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
    res = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return res


def sdu_root(model):
    from ..fsdp.fully_sharded_data_parallel import FullyShardedDataParallel

    return model.module if isinstance(model, FullyShardedDataParallel) else model


# -- save / load --------------------------------------------------------------------------------------------
def _walk(obj, prefix, tensors, plain):
    """Split a nested state dict into tensor leaves (by dotted path) and a JSON-safe skeleton."""
    if isinstance(obj, Tensor):
        tensors[prefix] = obj
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"state dict key {k!r} at {prefix or '<root>'}: only str and int keys can be saved")
            out[str(k) if isinstance(k, str) else f"__int__{k}"] = _walk(v, f"{prefix}.{k}" if prefix else str(k),
                                                                           tensors, plain)
        return out
    if isinstance(obj, (list, tuple)):
        return [_walk(v, f"{prefix}.{i}", tensors, plain) for i, v in enumerate(obj)]
    if isinstance(obj, _JSON_LEAVES):
        if isinstance(obj, float) and obj != obj:
            return {"__float__": "nan"}
        return obj
    if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:  # numpy scalar
        return obj.item()
    raise TypeError(f"cannot save {type(obj).__name__} at {prefix!r}: checkpoints hold tensors and JSON values")


def _box(t: Tensor):
    """(global shape, offsets, local host array) of a tensor leaf."""
    if isinstance(t, DTensor):
        mesh = t.device_mesh
        bounds = _local_bounds(t.shape, mesh, t.placements, mesh.get_coordinate())
        arr = _backend.to_numpy(t._data)
        return tuple(t.shape), tuple(a for a, _ in bounds), arr
    return tuple(t.shape), (0,) * t.ndim, _backend.to_numpy(t._data)


_comms: dict = {}


def _comm(process_group):
    """A communicator of its own for checkpoint I/O (a Dup of the group's), so that checkpoint collectives
    never interleave with the communication thread's on the same communicator."""
    from ..distributed_c10d import _resolve
    from ..process_group import _call_sync

    pg = _resolve(process_group)
    if id(pg) not in _comms:  # Dup is a collective on pg.comm: run it in the communication thread's order
        _comms[id(pg)] = (pg, _call_sync("Comm.Dup", pg.comm.Dup))
    return _comms[id(pg)][1]


def save(state_dict, *, checkpoint_id, process_group=None, storage_writer=None, planner=None) -> None:
    """Save ``state_dict`` (nested dicts/lists of tensors, DTensors and JSON values) to directory
    ``checkpoint_id``. Collective; atomic: a crash leaves the previous checkpoint there intact."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"save expects a dict state_dict, got {type(state_dict).__name__}")
    tensors: dict = {}
    skeleton = _walk(state_dict, "", tensors, None)
    pieces = {}
    for name, t in tensors.items():
        shape, offsets, arr = _box(t)
        pieces[name] = Piece(shape, arr.dtype, offsets, arr)
    comm = _comm(process_group)
    save_pieces(str(checkpoint_id), pieces, comm=comm, extras={"skeleton": skeleton},
                mesh_info={"world_size": comm.Get_size()})


def _fill(skel, dest, path):
    """Write the saved JSON values of ``skel`` into ``dest`` (same structure) in place."""
    if isinstance(skel, dict) and "__tensor__" in skel:
        return dest
    if isinstance(skel, dict) and "__float__" in skel:
        return float("nan")
    if isinstance(skel, dict):
        if not isinstance(dest, dict):
            raise ValueError(f"checkpoint has a dict at {path or '<root>'}, the state dict a {type(dest).__name__}")
        for k, v in skel.items():
            key = int(k[7:]) if k.startswith("__int__") else k
            if key in dest:
                dest[key] = _fill(v, dest[key], f"{path}.{key}" if path else str(key))
            elif not isinstance(v, dict) or "__tensor__" not in v:
                dest[key] = _restore(v)
        return dest
    if isinstance(skel, list):
        if isinstance(dest, (list, tuple)) and len(dest) == len(skel):
            vals = [_fill(s, d, f"{path}.{i}") for i, (s, d) in enumerate(zip(skel, dest))]
            return type(dest)(vals) if isinstance(dest, tuple) else vals
        return _restore(skel)
    return skel


def _restore(skel):
    if isinstance(skel, dict):
        if "__float__" in skel:
            return float("nan")
        return {(int(k[7:]) if k.startswith("__int__") else k): _restore(v) for k, v in skel.items()}
    if isinstance(skel, list):
        return [_restore(v) for v in skel]
    return skel


def load(state_dict, *, checkpoint_id, process_group=None, storage_reader=None, planner=None, strict: bool = True):
    """Fill ``state_dict`` in place from checkpoint ``checkpoint_id``, saved at any world size. Tensor
    leaves are overwritten in place (each rank reads only its own pieces); JSON values are replaced."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"load expects a dict state_dict, got {type(state_dict).__name__}")
    tensors: dict = {}
    _walk(state_dict, "", tensors, None)
    requests = {}
    for name, t in tensors.items():
        shape, offsets, _ = _box(t)
        requests[name] = (shape, t._data.dtype, offsets, t._data)  # filled in place (NumPy or CuPy)
    res = load_pieces(str(checkpoint_id), requests, comm=_comm(process_group), strict=strict)
    skel = (res.metadata.extras or {}).get("skeleton")
    if skel is not None:
        _fill(skel, state_dict, "")
    return res
