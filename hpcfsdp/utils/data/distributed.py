"""DistributedSampler (PyTorch's torch.utils.data.distributed): each rank's share of a dataset's indices."""
import math
from typing import Iterator, TypeVar

from hpcfsdp.utils.data.sampler import Sampler

__all__ = ["DistributedSampler"]

_T_co = TypeVar("_T_co", covariant=True)

# [Note: DistributedSampler shares]
# PyTorch's algorithm: order 0..N-1 by a permutation seeded with seed + epoch only (or keep the order when
# shuffle=False); drop_last=False pads the order to total_size = ceil(N / R) * R by repeating it from its
# start (several times when R > N); drop_last=True cuts it to floor(N / R) * R; rank r takes positions
# r, r + R, r + 2R, ... hpcfsdp.data.DistributedSampler (the CLI trainer's) computes exactly these shares
# from a PCG64 permutation seeded with seed + epoch (the one hp.randperm(N, generator=g) draws for
# g = hp.Generator().manual_seed(seed + epoch), as PyTorch's code draws it), so __iter__ asks it for the
# indices (seed + epoch folded into its seed, wrapped modulo 2**64 as manual_seed wraps negative seeds). The
# permutation depends on seed and epoch alone, never on hpcfsdp's global generator, so every rank draws
# the same one.


def _distributed():
    """hpcfsdp.distributed, imported on use (it loads mpi4py); PyTorch's error when it is unusable."""
    try:
        import hpcfsdp.distributed as dist
    except ImportError as e:
        raise RuntimeError("Requires distributed package to be available") from e
    if not dist.is_available():
        raise RuntimeError("Requires distributed package to be available")
    return dist


class DistributedSampler(Sampler[_T_co]):
    """This rank's share of ``dataset``'s indices, as PyTorch's DistributedSampler.

    ``num_replicas`` and ``rank`` default to the default process group's size and rank (hpcfsdp.distributed
    creates that group on first use when init_process_group was not called; PyTorch raises). ``shuffle``
    orders the indices by a permutation of ``seed + epoch``, identical on every rank (call ``set_epoch`` at
    each epoch). ``drop_last=False`` pads with repeated indices so every rank gets ``ceil(N / num_replicas)``;
    ``drop_last=True`` drops the tail so every rank gets ``floor(N / num_replicas)``. See
    [Note: DistributedSampler shares].
    """

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = _distributed().get_world_size()
        if rank is None:
            rank = _distributed().get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:
            self.num_samples = math.ceil((len(self.dataset) - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[_T_co]:
        from hpcfsdp.data.sampler import DistributedSampler as _Shares  # on use: hpcfsdp.data loads its tokenizers

        shares = _Shares(len(self.dataset), self.num_replicas, self.rank, shuffle=bool(self.shuffle),
                         seed=(int(self.seed) + int(self.epoch)) % 2**64, drop_last=bool(self.drop_last))
        indices = [int(i) for i in shares]
        if len(indices) != self.num_samples:
            raise AssertionError(f"Number of subsampled indices ({len(indices)}) does not match num_samples "
                                 f"({self.num_samples})")
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: with ``shuffle``, the next iteration uses the permutation of ``seed + epoch``."""
        self.epoch = epoch
