"""Parameters replaced on a module after fully_shard: adopted into their group's flat buffer."""

from .... import _backend
from ...tensor import DTensor

__all__ = ["adopt_assigned_params"]


# [Note: Assigned parameters]
# ``load_state_dict(assign=True)`` replaces module parameters by the given objects, and so does setting a new
# Parameter on a module after fully_shard. FSDP's sharded parameters are views into its group's flat buffer,
# so a replaced one would be left out of every all-gather (a materialised model silently keeps its old
# weights) and a meta-built model would stay meta. A load post-hook on every fully_shard module, and the
# root's lazy init, therefore adopt the replacements (as PyTorch's FSDPParam.reset_sharded_param does): each
# must be a DTensor laid out like the parameter it replaces; its local piece is copied into the flat buffer
# (allocated on first use if the group was built on the meta device) and the new Parameter object, now a
# view of that buffer, becomes the sharded parameter. A group is usable once none of its parameters is meta.


def _materialize_flat(group) -> None:
    xp = _backend.array_module(group._storage_device())
    flat = xp.zeros((group.total,), dtype=group.dtype)
    for fp in group.fsdp_params:
        old = fp.sharded_param._data
        fp.bind_flat(flat)
        if _backend.is_meta_array(old):
            fp.sharded_param._data = old  # stays meta until a value is loaded for it
    group.flat = flat


def _check_assigned(fp, group, new, how: str) -> None:
    name = fp.fqn or fp.name
    if not isinstance(new, DTensor):
        raise RuntimeError(
            f"{how} gave the sharded parameter {name} a {type(new).__name__} of shape "
            f"{tuple(new.shape)}; FSDP needs a DTensor laid out like it (placements {fp.placements}): load a "
            "sharded state dict, use set_model_state_dict(..., StateDictOptions(full_state_dict=True)), or "
            "assign=False")
    if (tuple(new.shape) != tuple(fp.global_shape) or tuple(new.placements) != tuple(fp.placements)
            or new.device_mesh != fp.mesh):
        raise RuntimeError(
            f"{how} gave the sharded parameter {name} a DTensor of shape "
            f"{tuple(new.shape)} with placements {tuple(new.placements)} on {new.device_mesh!r}; expected shape "
            f"{tuple(fp.global_shape)} with placements {fp.placements} on {fp.mesh!r}")
    if tuple(new._data.shape) != tuple(fp._local.shape):
        raise RuntimeError(f"{how}: the local piece of {name} has shape "
                           f"{tuple(new._data.shape)}, this rank holds {tuple(fp._local.shape)}")
    if new.dtype != group.dtype:
        raise TypeError(f"{how} gave the sharded parameter {name} dtype {new.dtype}, its "
                        f"group holds {group.dtype}: convert the state dict first, or load with assign=False")


def adopt_assigned_params(group, how: str = "load_state_dict(assign=True)") -> None:
    """See [Note: Assigned parameters]; ``how`` names the replacement in errors."""
    changed = []
    for fp in group.fsdp_params:
        module, name = fp.module_infos[0]
        new = module._parameters.get(name)
        if new is None or new is fp.sharded_param or new is fp.unsharded_param:
            continue
        _check_assigned(fp, group, new, how)
        changed.append((fp, new))
    if not changed:
        return
    if _backend.is_meta_array(group.flat) and any(not _backend.is_meta_array(n._data) for _, n in changed):
        _materialize_flat(group)
    for fp, new in changed:
        fp.sharded_param = new
        fp.set_on_modules(new)
        if not _backend.is_meta_array(new._data):
            seg = fp.layout.segment(group.flat)[:fp.local_rows()]
            xp = _backend.array_module(seg)
            src = xp.asarray(new._data)
            seg[...] = xp.moveaxis(src, fp.shard_dim, 0) if fp.shard_dim else src
            new._data = fp._local
    group.is_meta = any(_backend.is_meta_array(fp.sharded_param._data) for fp in group.fsdp_params)
