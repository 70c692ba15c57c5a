"""torch.distributed's collectives of Python objects: all_gather_object, broadcast_object_list, gather_object and
scatter_object_list (distributed_c10d re-exports them). Objects travel as tagged JSON, no pickle (see
[Note: Objects without pickle] in _buffers.py)."""

from __future__ import annotations

from hpcfsdp.distributed._c10d_common import check_root_list
from hpcfsdp.distributed._c10d_groups import global_to_group, resolve_group, to_group_rank

__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"]


def all_gather_object(object_list, obj, group=None):
    """Fill ``object_list[r]`` with rank r's ``obj`` (tagged JSON on the wire, no pickle)."""
    g = resolve_group(group)
    if not isinstance(object_list, list) or len(object_list) != g.size():
        n = len(object_list) if isinstance(object_list, list) else type(object_list).__name__
        raise ValueError(f"all_gather_object: object_list has {n} entries, expected the group size {g.size()}")
    object_list[:] = g.all_gather_object(obj)


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Replace ``object_list``'s items on every rank by those of rank ``src`` (default 0)."""
    g = resolve_group(group)
    if not isinstance(object_list, list):
        raise TypeError(f"broadcast_object_list: object_list must be a list, got {type(object_list).__name__}")
    if src is not None and group_src is not None:
        raise ValueError(f"broadcast_object_list: give only one of src={src!r} and group_src={group_src!r}")
    if group_src is not None:
        gs = g._check_rank(group_src, "broadcast_object_list: group_src")
    else:
        gs = global_to_group(g, 0 if src is None else src, "broadcast_object_list: src")
    got = g.broadcast_object(list(object_list) if g.rank() == gs else None, gs)
    if len(got) != len(object_list):
        raise ValueError(
            f"broadcast_object_list: src sent {len(got)} objects but this rank's list has {len(object_list)}"
        )
    object_list[:] = got


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None) -> None:
    """Fill ``object_gather_list[r]`` on rank ``dst`` (default global rank 0) with group rank r's ``obj``
    (tagged JSON on the wire, no pickle; see [Note: Objects without pickle] in _buffers.py)."""
    g = resolve_group(group)
    gd = to_group_rank(g, dst, group_dst, "gather_object", "dst", default=0)
    root = g.rank() == gd
    check_root_list("gather_object", "object_gather_list", object_gather_list, root, "destination")
    if root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size()):
        n = len(object_gather_list) if isinstance(object_gather_list, (list, tuple)) else \
            type(object_gather_list).__name__
        raise ValueError(f"gather_object: object_gather_list has {n} entries, expected a list of the group size "
                         f"{g.size()}")
    got = g.gather_object(obj, gd)
    if root:
        object_gather_list[:] = got


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None) -> None:
    """Set ``scatter_object_output_list[0]`` on group rank r to ``scatter_object_input_list[r]`` of rank ``src``
    (default global rank 0); tagged JSON on the wire, no pickle."""
    g = resolve_group(group)
    gs = to_group_rank(g, src, group_src, "scatter_object_list", "src", default=0)
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_list: Expected argument scatter_object_output_list to be a list of size at "
                         "least 1.")
    root = g.rank() == gs
    if root and scatter_object_input_list is None:
        raise ValueError("scatter_object_list: source rank must provide non-None scatter_object_input_list")
    objs = list(scatter_object_input_list) if root else None
    if root and len(objs) != g.size():
        raise ValueError(f"scatter_object_list: scatter_object_input_list has {len(objs)} entries, expected the "
                         f"group size {g.size()}")
    scatter_object_output_list[0] = g.scatter_object(objs, gs)
