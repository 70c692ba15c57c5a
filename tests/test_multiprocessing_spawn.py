"""hpcfsdp.multiprocessing.spawn: under an MPI launcher, fn(mpi_rank, *args) runs once per rank, in place.

See [Note: spawn under MPI] in hpcfsdp/multiprocessing/spawn.py.
"""
import os

import pytest

import hpcfsdp as hp
import hpcfsdp.multiprocessing as mp
from hpcfsdp.distributed._mpi import get_mpi


def _world():
    comm = get_mpi().COMM_WORLD
    return comm.Get_rank(), comm.Get_size()


def _fresh_default_group():
    import hpcfsdp.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return dist


def test_reachable_after_import_hpcfsdp():
    assert hp.multiprocessing is mp and mp.spawn.__module__ == "hpcfsdp.multiprocessing.spawn"


def _tutorial_main(rank, world_size, seen, tag):
    """What PyTorch's FSDP tutorial's fsdp_main does first: init the group with the spawn index as rank."""
    dist = _fresh_default_group()
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    t = hp.tensor([float(rank)])
    dist.all_reduce(t)
    seen.append((rank, world_size, tag, t.item()))
    dist.destroy_process_group()


@pytest.mark.mpi(min_size=2)
def test_spawn_calls_fn_with_the_mpi_rank():
    rank, size = _world()
    seen = []
    assert mp.spawn(_tutorial_main, args=(size, seen, "x"), nprocs=size, join=True) is None
    assert seen == [(rank, size, "x", float(sum(range(size))))]


@pytest.mark.mpi(min_size=2)
def test_nprocs_must_match_the_mpi_world():
    _, size = _world()
    with pytest.raises(RuntimeError, match=rf"hpcfsdp launch -n {size + 1}"):
        mp.spawn(_tutorial_main, args=(size + 1, [], "x"), nprocs=size + 1)


@pytest.mark.mpi(min_size=2)
def test_init_process_group_checks_rank_and_world_size():
    rank, size = _world()
    dist = _fresh_default_group()
    with pytest.raises(ValueError, match=rf"world_size={size + 1} but the MPI communicator has {size} ranks"):
        dist.init_process_group("gloo", rank=rank, world_size=size + 1)
    with pytest.raises(ValueError, match=rf"rank={(rank + 1) % size} but this process is rank {rank}"):
        dist.init_process_group("gloo", rank=(rank + 1) % size, world_size=size)
    assert not dist.is_initialized()


def _raises(rank, kind):
    raise kind(f"boom on {rank}")


def test_errors_propagate_wrapped():
    rank, size = _world()
    with pytest.raises(mp.ProcessRaisedException, match=f"Process {rank} terminated") as info:
        mp.spawn(_raises, args=(KeyError,), nprocs=size)
    assert isinstance(info.value.__cause__, KeyError) and info.value.error_index == rank
    assert info.value.pid == os.getpid()
    ctx = mp.spawn(_raises, args=(ValueError,), nprocs=size, join=False)  # the error waits for join()
    assert isinstance(ctx, mp.ProcessContext) and ctx.pids() == [os.getpid()]
    with pytest.raises(mp.ProcessRaisedException, match="boom"):
        ctx.join()
    assert ctx.join() is True


def test_serial_nprocs_1_calls_fn_with_0():
    rank, size = _world()
    if size != 1:
        pytest.skip("the serial case: a job of one rank")
    seen = []
    assert mp.spawn(lambda r, a, b: seen.append((r, a, b)), args=(1, "two"), nprocs=1) is None
    assert seen == [(0, 1, "two")]
    ctx = mp.spawn(lambda r: seen.append(r), nprocs=1, join=False)
    assert ctx.join() is True and seen[-1] == 0
    with pytest.raises(RuntimeError, match="hpcfsdp launch -n 2"):
        mp.spawn(lambda r: None, nprocs=2)
    with pytest.raises(ValueError, match="nprocs=0"):
        mp.spawn(lambda r: None, nprocs=0)
    with pytest.raises(ValueError, match="start_method='thread'"):
        mp.spawn(lambda r: None, start_method="thread")
