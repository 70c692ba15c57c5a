"""Collectives built of MPI collectives: node-aware (two-stage) all-gather and reduce-scatter over a group's local
and cross communicators, and the all-reduce of groups whose size is not a power of two."""

from __future__ import annotations

import numpy as np

from hpcfsdp.distributed import _buffers as B
from hpcfsdp.distributed._mpi import get_mpi

__all__: list[str] = []  # internal: used by process_group.ProcessGroup


# [Note: Node-aware collectives]
# A group spanning H nodes with L of its ranks on each (L > 1; HPCFSDP_COMM_HIERARCHY=auto) runs
# all-gather and reduce-scatter in two stages over sub-communicators made once at construction
# (_mpi.node_split_info): "cross" joins the ranks with the same local index on every node, "local"
# the ranks of one node. All-gather: cross all-gather of the k-element inputs (H*k, by node),
# local all-gather of those (L*H*k, by local index, then node), then one permuting copy into the
# rank-major output: block (j, h) is group rank perm[j*H + h] (when the group's ranks are node-major
# the local all-gather receives straight into place through a strided datatype). Reduce-scatter is the mirror:
# permute the input into (local index, node) order, reduce-scatter locally (H*k per rank) and
# then across nodes (k per rank). Each node's link carries (H-1)/H of the buffer once, where a
# flat ring over node-major ranks crosses it with (n-1)/n (3/4 at 2x2 against 1/2). The layout
# equals the flat collective's; a reduction's summation order differs (two stages), so float
# results agree to rounding, and exactly where the sums are exact. The whole collective is one
# Work on the communication thread, so ordering, debug checks and the watchdog are unchanged.


def _hier_all_gather(hier, src, dst, k: int, mode: str) -> None:
    local, cross, perm, node_major = hier
    hosts, per = cross.Get_size(), local.Get_size()
    mid = np.empty(hosts * k, dst.dtype)
    B.call_mpi(mode, cross.Allgather, cross.Iallgather, B.byte_spec(src), B.byte_spec(mid))
    if node_major:
        # node-major ranks: local index j's H blocks land k*itemsize apart from j-1's, every per*k
        # elements: a strided receive type puts them in place (no full-size scratch, no copy)
        MPI = get_mpi()
        blk = k * dst.dtype.itemsize
        vec = MPI.BYTE.Create_vector(hosts, blk, per * blk)
        rtype = vec.Create_resized(0, blk)
        rtype.Commit()
        try:
            B.call_mpi(mode, local.Allgather, local.Iallgather, B.byte_spec(mid),
                       [dst.reshape(-1).view(np.uint8), 1, rtype])
        finally:
            rtype.Free()
            vec.Free()
        return
    tmp = np.empty(per * hosts * k, dst.dtype)
    B.call_mpi(mode, local.Allgather, local.Iallgather, B.byte_spec(mid), B.byte_spec(tmp))
    dst.reshape(-1, k)[perm] = tmp.reshape(-1, k)


def _node_major(perm, hosts: int, per: int) -> bool:
    """Whether group rank h*per + j is local index j of node h (``perm[j*hosts + h]``)."""
    j, h = np.divmod(np.arange(perm.size), hosts)
    return bool(np.array_equal(perm, h * per + j))


def _hier_reduce_scatter(hier, src, dst, k: int, mpi_type, mpi_op, mode: str) -> None:
    local, cross, perm, _ = hier
    hosts = cross.Get_size()
    tmp = src.reshape(-1, k)[perm].reshape(-1)  # (local index, node) order
    mid = np.empty(hosts * k, src.dtype)
    B.call_mpi(mode, local.Reduce_scatter_block, local.Ireduce_scatter_block, [tmp, mpi_type], [mid, mpi_type],
               mpi_op)
    B.call_mpi(mode, cross.Reduce_scatter_block, cross.Ireduce_scatter_block, [mid, mpi_type], [dst, mpi_type],
               mpi_op)


def _hier_all_gather_staged(hier, src, dst, k: int):
    """``_hier_all_gather`` as the generator of a staged collective: across nodes ("inter"), then inside the
    node ("intra"). See [Note: Collectives left in flight] in _comm_thread.py."""
    local, cross, perm, node_major = hier
    hosts, per = cross.Get_size(), local.Get_size()
    mid = np.empty(hosts * k, dst.dtype)
    yield cross.Iallgather(B.byte_spec(src), B.byte_spec(mid))
    if node_major:  # see _hier_all_gather
        MPI = get_mpi()
        blk = k * dst.dtype.itemsize
        vec = MPI.BYTE.Create_vector(hosts, blk, per * blk)
        rtype = vec.Create_resized(0, blk)
        rtype.Commit()
        try:
            yield local.Iallgather(B.byte_spec(mid), [dst.reshape(-1).view(np.uint8), 1, rtype])
        finally:
            rtype.Free()
            vec.Free()
        return
    tmp = np.empty(per * hosts * k, dst.dtype)
    yield local.Iallgather(B.byte_spec(mid), B.byte_spec(tmp))
    dst.reshape(-1, k)[perm] = tmp.reshape(-1, k)


def _hier_reduce_scatter_staged(hier, src, dst, k: int, mpi_type, mpi_op):
    """``_hier_reduce_scatter`` as the generator of a staged collective: inside the node ("intra"), then
    across nodes ("inter")."""
    local, cross, perm, _ = hier
    hosts = cross.Get_size()
    tmp = src.reshape(-1, k)[perm].reshape(-1)  # (local index, node) order
    mid = np.empty(hosts * k, src.dtype)
    yield local.Ireduce_scatter_block([tmp, mpi_type], [mid, mpi_type], mpi_op)
    yield cross.Ireduce_scatter_block([mid, mpi_type], [dst, mpi_type], mpi_op)


# [Note: All-reduce of a group whose size is not a power of two]
# MPICH's all-reduce of a large buffer over p ranks, p not a power of two, first folds the extra ranks
# into a power of two (each sends its whole buffer to a partner and gets the whole result back), so a
# rank moves 2x the buffer where 2(p-1)/p suffices: HSDP's replicate all-reduce over 3 hosts sent 1.50x
# the minimum per host and the step ran 2.5x its wire bound (BENCHMARKS.md). For such groups, at
# RSAG_MIN_BYTES and above (HPCFSDP_COMM_ALLREDUCE=auto), the all-reduce is a reduce-scatter of equal
# blocks (the buffer padded to a multiple of p) and an all-gather of the reduced blocks, each of which
# MPI libraries run at (p-1)/p of the buffer per rank for large messages (pairwise exchange, ring). Every
# element is reduced once, by one rank, and broadcast: all ranks hold the same bits, as replicas must.
RSAG_MIN_BYTES = 64 * 1024


def use_rsag_allreduce(size: int, nbytes: int, setting: str) -> bool:
    """Whether an all-reduce of ``nbytes`` over ``size`` ranks runs as reduce-scatter + all-gather."""
    return setting == "auto" and size > 2 and size & (size - 1) != 0 and nbytes >= RSAG_MIN_BYTES


def _rsag_buffers(w, p: int):
    """(padded buffer holding ``w``'s elements, this rank's block); the padded one is ``w`` when p divides it."""
    n = w.size
    k = -(-n // p)
    if k * p == n:
        return w, np.empty(k, w.dtype)
    full = np.zeros(k * p, w.dtype)
    full[:n] = w
    return full, np.empty(k, w.dtype)


def rsag_allreduce(comm, w, mpi_type, mpi_op, mode: str) -> None:
    """In-place all-reduce of the 1-D host array ``w`` as reduce-scatter + all-gather (see the Note above)."""
    full, part = _rsag_buffers(w, comm.Get_size())
    B.call_mpi(mode, comm.Reduce_scatter_block, comm.Ireduce_scatter_block, [full, mpi_type], [part, mpi_type],
               mpi_op)
    B.call_mpi(mode, comm.Allgather, comm.Iallgather, [part, mpi_type], [full, mpi_type])
    if full is not w:
        w[...] = full[:w.size]


def rsag_allreduce_staged(comm, w, mpi_type, mpi_op):
    """`rsag_allreduce` as stages for the communication thread: yields each nonblocking request."""
    full, part = _rsag_buffers(w, comm.Get_size())
    yield comm.Ireduce_scatter_block([full, mpi_type], [part, mpi_type], mpi_op)
    yield comm.Iallgather([part, mpi_type], [full, mpi_type])
    if full is not w:
        w[...] = full[:w.size]
