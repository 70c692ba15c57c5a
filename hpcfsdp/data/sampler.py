"""DistributedSampler: a disjoint, deterministic, resumable share of the samples per data-parallel rank."""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np

__all__ = ["DistributedSampler", "batches"]


def _int(x, what: str, lo: int) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < lo:
        raise ValueError(f"{what} must be an int >= {lo}, got {x!r}")
    return int(x)


class DistributedSampler:
    """PyTorch's DistributedSampler semantics on sample indices, plus exact resumption.

    Epoch e orders the indices 0..N-1 by a permutation drawn from Generator(PCG64(seed + e)) (or keeps them in
    order when shuffle=False). drop_last=True trims the tail so every rank gets the same count (the ranks'
    shares are disjoint); drop_last=False pads by wrapping around to the start (a few samples repeat). Rank r
    takes positions r, r+R, r+2R, ... of that order, so after every rank consumed p samples, exactly the first
    p*R positions of the epoch are used up: the state saved is that global position, and a resumed sampler,
    at the same or another number of replicas, continues with the next unseen samples.

    [Note: Lazy position] Iterating advances the position one sample at a time, as the caller pulls indices,
    so a state_dict() taken between batches resumes at the exact next batch. set_epoch(e) with e equal to the
    current epoch keeps the position (a resumed loop calls set_epoch(epoch) again); another e starts over.
    """

    def __init__(self, num_samples, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = True):
        n = len(num_samples) if hasattr(num_samples, "__len__") else num_samples
        self.num_samples = _int(n, "num_samples", 0)
        self.num_replicas = _int(num_replicas, "num_replicas", 1)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.num_replicas:
            raise ValueError(f"Invalid rank {rank!r}, rank should be in the interval [0, {self.num_replicas - 1}]")
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = _int(seed, "seed", 0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._start = 0  # global position where this segment of the epoch began (after a resume)
        self._taken = 0  # indices this rank yielded since _start

    # ------------------------------------------------------------------ order

    def _order(self) -> np.ndarray:
        if self.shuffle:
            return np.random.Generator(np.random.PCG64(self.seed + self.epoch)).permutation(self.num_samples)
        return np.arange(self.num_samples)

    def _mine(self) -> np.ndarray:
        """This rank's indices for the rest of the epoch from _start."""
        order = self._order()
        rest = order[self._start:]
        R = self.num_replicas
        if self.drop_last:
            rest = rest[: len(rest) // R * R]
        elif len(rest) % R:
            pad = R - len(rest) % R
            rest = np.concatenate([rest, np.resize(order, pad)]) if len(order) else rest
        return rest[self.rank::R]

    def __len__(self) -> int:
        """Samples per rank in a whole epoch."""
        N, R = self.num_samples, self.num_replicas
        return N // R if self.drop_last else -(-N // R)

    def remaining(self) -> int:
        """Samples this rank has left in the current epoch."""
        return len(self._mine()) - self._taken

    def __iter__(self) -> Iterator[int]:
        mine = self._mine()
        while self._taken < len(mine):
            i = int(mine[self._taken])
            self._taken += 1
            yield i

    def set_epoch(self, epoch: int) -> None:
        epoch = _int(epoch, "epoch", 0)
        if epoch != self.epoch:
            self.epoch, self._start, self._taken = epoch, 0, 0

    # ------------------------------------------------------------------ state

    @property
    def position(self) -> int:
        """Samples of this epoch consumed by all ranks together."""
        return self._start + self._taken * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "num_samples": self.num_samples,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        missing = {"epoch", "position", "num_samples", "seed", "shuffle", "drop_last"} - state.keys()
        if missing:
            raise ValueError(f"sampler state lacks {sorted(missing)}")
        for k in ("num_samples", "seed", "shuffle", "drop_last"):
            if state[k] != getattr(self, k):
                raise ValueError(f"sampler state has {k}={state[k]!r} but this sampler has {k}={getattr(self, k)!r}")
        epoch = _int(state["epoch"], "state['epoch']", 0)
        pos = _int(state["position"], "state['position']", 0)
        limit = self.num_samples + self.num_replicas if not self.drop_last else self.num_samples
        if pos > limit:
            raise ValueError(f"state['position'] = {pos} exceeds the epoch ({self.num_samples} samples)")
        self.epoch, self._start, self._taken = epoch, min(pos, self.num_samples), 0


def batches(dataset, sampler: DistributedSampler, batch_size: int, *, drop_last: bool = True,
            loop: bool = False):
    """Yield (x, y), each (B, T) int64, from this rank's share of `dataset`: the rest of the current epoch,
    or (loop=True) forever, moving the sampler to the next epoch at each end. Resumable: restore the sampler
    with load_state_dict and call batches() again. drop_last drops a short final batch of an epoch."""
    batch_size = _int(batch_size, "batch_size", 1)
    if len(dataset) != sampler.num_samples:
        raise ValueError(f"the sampler covers {sampler.num_samples} samples but the dataset has {len(dataset)}")
    while True:
        it = iter(sampler)
        while True:
            idx = list(itertools.islice(it, batch_size))
            if not idx or (drop_last and len(idx) < batch_size):
                break
            yield dataset.get_batch(idx) if hasattr(dataset, "get_batch") else _stack(dataset, idx)
        if not loop:
            return
        sampler.set_epoch(sampler.epoch + 1)


def _stack(dataset, idx):
    xs, ys = zip(*(dataset[i] for i in idx))
    return np.stack(xs).astype(np.int64), np.stack(ys).astype(np.int64)
