"""torch.distributed-style functional collectives on Tensors over MPI process groups (torch.distributed.distributed_c10d).

This module is the public path; the parts, each importing only lower ones (never this module):
_c10d_groups.py (the default group, new_group, ranks, backend names: [Note: Default process group]),
_c10d_common.py (argument checks, completion of a collective into its output tensors), _c10d_collectives.py
(all ranks: all_reduce, all_gather, reduce_scatter, all_to_all, barriers), _c10d_rooted.py (broadcast, reduce,
gather, scatter), _c10d_p2p.py (send, recv, isend, irecv, batch_isend_irecv), _c10d_objects.py (collectives of
Python objects) and _c10d_backends.py (what is available, how this process was launched).

The conventions hold throughout: ranks are global ranks (ranks of the default group) unless named ``group_*``,
tensors are modified in place, and a call returns a Work with ``async_op=True``, else None once done. Bad input
raises before any communication: TypeError for a non-Tensor, ValueError for wrong list lengths, sizes, dtypes or
ranks (PyTorch's backends raise RuntimeError for some of these).
"""

from hpcfsdp.distributed._c10d_backends import (
    get_default_backend_for_device, get_node_local_rank, is_available, is_gloo_available, is_mpi_available,
    is_nccl_available, is_torchelastic_launched,
)
from hpcfsdp.distributed._c10d_collectives import (
    all_gather, all_gather_into_tensor, all_reduce, all_to_all, all_to_all_single, barrier, monitored_barrier,
    reduce_scatter, reduce_scatter_single, reduce_scatter_tensor,
)
from hpcfsdp.distributed._c10d_groups import (
    GroupMember, destroy_process_group, get_backend, get_global_rank, get_group_rank, get_process_group_ranks,
    get_rank, get_world_size, group, init_process_group, is_initialized, new_group,
)
from hpcfsdp.distributed._c10d_objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from hpcfsdp.distributed._c10d_p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from hpcfsdp.distributed._c10d_rooted import broadcast, gather, reduce, scatter

__all__ = [
    # process groups (_c10d_groups.py)
    "init_process_group", "is_initialized", "destroy_process_group", "get_rank", "get_world_size", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "new_group", "group", "GroupMember",
    # collectives over all ranks (_c10d_collectives.py)
    "barrier", "all_reduce", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor", "all_gather",
    "reduce_scatter", "all_to_all", "all_to_all_single", "monitored_barrier",
    # rooted collectives (_c10d_rooted.py)
    "broadcast", "reduce", "gather", "scatter",
    # point-to-point (_c10d_p2p.py)
    "send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv",
    # objects (_c10d_objects.py)
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    # availability and launch (_c10d_backends.py)
    "is_available", "is_mpi_available", "is_nccl_available", "is_gloo_available", "get_default_backend_for_device",
    "is_torchelastic_launched", "get_node_local_rank",
]
