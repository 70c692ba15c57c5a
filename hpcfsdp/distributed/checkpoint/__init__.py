"""Distributed checkpoints: state-dict helpers (``.state_dict``) and sharded save/load that reshard across world sizes.

``save(state_dict, checkpoint_id=DIR)`` writes a nested state dict (model and optimizer state dicts,
step counters, RNG state ...) as a checkpoint directory: every rank writes only its own pieces of
DTensors, replicated tensors are written once, and Python scalars/strings/lists go into
``metadata.json``. ``load(state_dict, checkpoint_id=DIR)`` fills a state dict of the same structure in
place, at any world size and mesh, reading only the bytes each rank needs. No pickle anywhere.
``async_save(state_dict, checkpoint_id=DIR)`` returns a Future once the shards are copied to host memory
and writes them in the background (see [Note: Asynchronous save] in ``_async.py``).
"""

import numpy as np

from ... import _backend
from ..._tensor import Tensor
from ..tensor import DTensor
from ..tensor._dtensor import _local_boxes, _local_ranges
from . import _async
from ._format import (
    IncompleteCheckpointError,
    Piece,
    consolidate,
    load_pieces,
    read_metadata,
    save_pieces,
    verify_checkpoint,
)
from .state_dict import (
    StateDictOptions,
    _init_optim_state,  # noqa: F401  (PyTorch scripts import it from here too)
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from .filesystem import DefaultLoadPlanner, DefaultSavePlanner, FileSystemReader, FileSystemWriter, resolve
from .stateful import Stateful

__all__ = [
    "save",
    "async_save",
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
    "Stateful",
    "FileSystemWriter",
    "FileSystemReader",
    "DefaultSavePlanner",
    "DefaultLoadPlanner",
]

_JSON_LEAVES = (bool, int, float, str, type(None))


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


def _local_views(t: Tensor):
    """[(global offsets, view of the local array)] of a tensor leaf: one box, or several for a DTensor whose
    piece is several ranges of the global tensor (see [Note: Interleaved shard]); the views alias ``t._data``."""
    if isinstance(t, DTensor):
        mesh = t.device_mesh
        boxes = _local_boxes(_local_ranges(t.shape, mesh, t.placements, mesh.get_coordinate()))
        return [(goff, t._data[tuple(slice(o, o + n) for o, n in zip(loff, lens))] if lens else t._data)
                for goff, lens, loff in boxes]
    return [((0,) * t.ndim, t._data)]


def _boxes(t: Tensor, host: bool = True):
    """[(global shape, offsets, local array)] of a tensor leaf, one per box of its piece: host arrays, or
    (host=False) views of the arrays where they live (NumPy or CuPy)."""
    return [(tuple(t.shape), off, _backend.to_numpy(v) if host else v) for off, v in _local_views(t)]


def _stateful_to_state_dict(state_dict):
    """A shallow copy of ``state_dict`` with each top-level Stateful value replaced by its ``state_dict()``."""
    if not isinstance(state_dict, dict):
        return state_dict
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


_comms: dict = {}


def _comm(process_group):
    """A communicator of its own for checkpoint I/O (a Dup of the group's), so that checkpoint collectives
    never interleave with the communication thread's on the same communicator."""
    from .._c10d_groups import resolve_group
    from .._comm_thread import call_sync

    pg = resolve_group(process_group)
    if id(pg) not in _comms:  # Dup is a collective on pg.comm: run it in the communication thread's order
        _comms[id(pg)] = (pg, call_sync("Comm.Dup", pg.comm.Dup))
    return _comms[id(pg)][1]


def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None,
         no_dist: bool = False) -> None:
    """Save ``state_dict`` (nested dicts/lists of tensors, DTensors and JSON values; a top-level Stateful value
    is saved as its ``state_dict()``) to directory ``checkpoint_id`` (or ``storage_writer``'s
    ``FileSystemWriter`` path). Collective; atomic: a crash leaves the previous checkpoint there intact."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"save expects a dict state_dict, got {type(state_dict).__name__}")
    if no_dist:
        raise ValueError("save: no_dist=True is not supported; the commit is collective")
    checkpoint_id, _ = resolve("save", checkpoint_id, storage_writer, planner, FileSystemWriter, DefaultSavePlanner)
    tensors: dict = {}
    skeleton = _walk(_stateful_to_state_dict(state_dict), "", tensors, None)
    pieces = {}
    for name, t in tensors.items():
        pieces[name] = [Piece(shape, arr.dtype, offsets, arr) for shape, offsets, arr in _boxes(t)]
    _async.wait_pending()  # an async save in flight finishes first
    comm = _comm(process_group)
    save_pieces(str(checkpoint_id), pieces, comm=comm, extras={"skeleton": skeleton},
                mesh_info={"world_size": comm.Get_size()})


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None,
               async_checkpointer_type=None, async_stager=None, no_dist: bool = False, use_collectives: bool = True):
    """``save`` in the background: returns a ``concurrent.futures.Future`` once this rank's pieces are copied
    to host memory; ``.result()`` is None once committed, or raises any rank's error. Collective. Stateful
    values are saved as their ``state_dict()``, taken before this returns."""
    checkpoint_id, _ = resolve("async_save", checkpoint_id, storage_writer, planner, FileSystemWriter,
                               DefaultSavePlanner)
    return _async.async_save(_stateful_to_state_dict(state_dict), checkpoint_id=checkpoint_id,
                             process_group=process_group,
                             async_checkpointer_type=async_checkpointer_type, async_stager=async_stager,
                             no_dist=no_dist, use_collectives=use_collectives, _walk=_walk, _boxes=_boxes)


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


def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None, process_group=None,
         no_dist: bool = False, strict: bool = True):
    """Fill ``state_dict`` in place from checkpoint ``checkpoint_id`` (or ``storage_reader``'s
    ``FileSystemReader`` path), saved at any world size. Tensor leaves are overwritten in place (each rank
    reads only its own pieces); JSON values are replaced. A top-level Stateful value is loaded into its
    ``state_dict()``, which then goes to its ``load_state_dict``. ``strict=False`` (or
    ``DefaultLoadPlanner(allow_partial_load=True)``): keys the checkpoint lacks keep their values."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"load expects a dict state_dict, got {type(state_dict).__name__}")
    if no_dist:
        raise ValueError("load: no_dist=True is not supported; hpcfsdp's load is collective")
    checkpoint_id, planner = resolve("load", checkpoint_id, storage_reader, planner, FileSystemReader,
                                     DefaultLoadPlanner)
    if planner is not None and planner.allow_partial_load:
        strict, planner = False, None
    stateful = {k: v for k, v in state_dict.items() if isinstance(v, Stateful)}
    if stateful:  # as PyTorch: load into the objects' state dicts, then hand them back (in key order)
        loaded = _stateful_to_state_dict(state_dict)
        res = load(loaded, checkpoint_id=checkpoint_id, process_group=process_group,
                   storage_reader=storage_reader, planner=planner, strict=strict)
        for k in sorted(loaded, key=str):
            if k in stateful:
                stateful[k].load_state_dict(loaded[k])
            else:
                state_dict[k] = loaded[k]
        return res
    tensors: dict = {}
    _walk(state_dict, "", tensors, None)
    requests, staged = {}, []
    for name, t in tensors.items():  # views of t._data, filled in place (NumPy or CuPy)
        reqs, views = [], _local_views(t)
        if len(views) == 1:
            views = [(views[0][0], t._data)]
        for off, view in views:
            if len(views) > 1 and not isinstance(view, np.ndarray):  # a device view: through host memory
                host = np.empty(view.shape, view.dtype)
                staged.append((view, host))
                view = host
            reqs.append((tuple(t.shape), t._data.dtype, off, view))
        requests[name] = reqs
    _async.wait_pending()
    res = load_pieces(str(checkpoint_id), requests, comm=_comm(process_group), strict=strict)
    for view, host in staged:
        view[...] = _backend.array_module(view).asarray(host)
    skel = (res.metadata.extras or {}).get("skeleton")
    if skel is not None:
        _fill(skel, state_dict, "")
    return res
