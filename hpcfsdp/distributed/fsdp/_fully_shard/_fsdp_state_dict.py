"""The state dicts of fully_shard modules (FSDP2): every parameter group of a model, resharding before a state dict is
read or loaded, a parameter's name as state dicts spell it, this rank's piece of a full tensor, and LOCAL state
dicts (this rank's flat pieces). The load hooks fully_shard registers are FSDPState.register_state_dict_hooks
(see [Note: Assigned parameters]). FSDP1's state-dict types and the optimizer state dicts build on these in
fsdp/_state_dict_utils.py."""

from collections import OrderedDict

from .... import _backend
from ...._tensor import Tensor
from ...tensor import DTensor
from ...tensor._dtensor import _local_ranges, _take
from ._fully_shard import FSDPModule

__all__ = ["fsdp_groups", "reshard_all", "clean_fqn", "param_names", "host_copy", "offloaded", "local_state_dict",
           "load_local_state_dict", "local_chunk"]


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


def clean_fqn(name):
    """A parameter's name as state dicts spell it: activation-checkpoint and FSDP1 wrappers are transparent,
    as in PyTorch."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")


def param_names(root):
    """FSDPParam of every parameter name (tied parameters appear under each name)."""
    by_id = {}
    for g in fsdp_groups(root):
        for fp in g.fsdp_params:
            by_id[id(fp.sharded_param)] = (g, fp)
    return {clean_fqn(name): by_id[id(p)] for name, p in root.named_parameters(remove_duplicate=False) if id(p) in by_id}


def host_copy(t: Tensor) -> Tensor:
    return Tensor._wrap(_backend.to_numpy(t._data))


def offloaded(v: Tensor) -> Tensor:
    """``v`` in host memory (a DTensor keeps its layout; its local piece moves)."""
    if isinstance(v, DTensor):
        return DTensor.from_local(host_copy(v.to_local()), v.device_mesh, v.placements, shape=v.shape)
    return host_copy(v)


def local_state_dict(root, sd, offload):
    names = param_names(root)
    out = OrderedDict()
    layout = {}
    for k, v in sd.items():
        if k in names:
            g, fp = names[k]
            piece = fp.layout.raw(g.flat)
            t = Tensor._wrap(piece.copy())
            out[k] = host_copy(t) if offload else t
            layout[k] = {"global_shape": list(fp.global_shape), "shard_dim": fp.shard_dim,
                         "start": fp.layout.start, "stop": fp.layout.stop, "padded_rows": fp.layout.padded,
                         "world": fp.layout.world}
        else:
            out[k] = v
    out._local_layout = layout
    return out


def load_local_state_dict(root, sd, strict):
    names = param_names(root)
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


def local_chunk(full: Tensor, like: DTensor) -> Tensor:
    """The piece of the full tensor ``full`` that this rank holds for a DTensor laid out like ``like``."""
    if tuple(full.shape) != tuple(like.shape):
        raise ValueError(f"full tensor of shape {tuple(full.shape)} does not match the sharded tensor's "
                         f"global shape {tuple(like.shape)}")
    mesh = like.device_mesh
    piece = _take(full._data, _local_ranges(like.shape, mesh, like.placements, mesh.get_coordinate()))
    xp = _backend.array_module(like._data)
    return Tensor._wrap(xp.ascontiguousarray(xp.asarray(piece)))
