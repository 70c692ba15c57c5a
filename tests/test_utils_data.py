"""hpcfsdp.utils.data: PyTorch's torch.utils.data datasets, samplers, DistributedSampler, collation, DataLoader.

Expected values are written by hand from PyTorch's documented algorithms (and were checked against
PyTorch 2.13 while writing them); permutations themselves differ from PyTorch's (another bit generator),
so shuffled results are checked for their structure.
"""
import collections
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import hpcfsdp as hp
from hpcfsdp.utils.data import (BatchSampler, ChainDataset, ConcatDataset, DataLoader, Dataset,
                                DistributedSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler,
                                StackDataset, Subset, SubsetRandomSampler, TensorDataset, WeightedRandomSampler,
                                default_collate, default_convert, get_worker_info, random_split)
from hpcfsdp.utils.data import dataloader as dataloader_module
from hpcfsdp.utils.data._utils import collate as _collate


def _vals(t):
    return t.tolist()


class Stream(IterableDataset):
    def __init__(self, n, reported=None):
        self.n, self.reported = n, reported

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n if self.reported is None else self.reported


def _pairs(n=10):
    return TensorDataset(hp.arange(n), hp.arange(n) * 2)


# ------------------------------------------------------------------------------------------------ reachability


def test_reachable_as_torch_utils_data_without_loading_mpi():
    code = ("import sys, hpcfsdp as torch\n"
            "assert 'mpi4py' not in sys.modules and 'hpcfsdp.data' not in sys.modules\n"
            "assert 'hpcfsdp.utils.data.dataloader' not in sys.modules\n"  # loaded on first use
            "from hpcfsdp.utils.data import DataLoader\n"
            "from hpcfsdp.utils.data.distributed import DistributedSampler\n"
            "assert torch.utils.data.DataLoader is DataLoader and torch.utils.data.DistributedSampler is DistributedSampler\n"
            "assert torch.utils.data.distributed.DistributedSampler is DistributedSampler\n"
            "assert 'mpi4py' not in sys.modules\n"
            "print(sorted(n for n in torch.utils.data.__all__ if not hasattr(torch.utils.data, n)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]"]


def test_public_names_and_generic_subscripts():
    import hpcfsdp.utils.data as data

    assert set(data.__all__) >= {"Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "Subset",
                                 "random_split", "Sampler", "SequentialSampler", "RandomSampler",
                                 "SubsetRandomSampler", "BatchSampler", "DistributedSampler", "DataLoader",
                                 "default_collate", "default_convert", "get_worker_info"}
    assert all(getattr(data, n) is not None for n in data.__all__) and "DataLoader" in dir(data)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        data.Nope  # noqa: B018

    class Squares(Dataset[int]):  # subscripted base classes, as typed PyTorch code writes them
        def __getitem__(self, i):
            return i * i

        def __len__(self):
            return 4

    assert [Squares()[i] for i in range(4)] == [0, 1, 4, 9]
    assert Sampler[int] is not None and DataLoader[int] is not None and IterableDataset[int] is not None
    assert get_worker_info() is None


# ------------------------------------------------------------------------------------------------ datasets


def test_tensor_dataset():
    ds = _pairs(5)
    assert len(ds) == 5 and [_vals(t) for t in ds[3]] == [3, 6]
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        TensorDataset(hp.zeros(3), hp.zeros(4))


def test_base_dataset_and_addition():
    with pytest.raises(NotImplementedError, match="should implement __getitem__"):
        Dataset()[0]
    assert not hasattr(Dataset(), "__len__")
    both = _pairs(2) + _pairs(3)
    assert isinstance(both, ConcatDataset) and len(both) == 5 and _vals(both[4][0]) == 2
    chained = Stream(2) + Stream(3)
    assert isinstance(chained, ChainDataset) and list(chained) == [0, 1, 0, 1, 2] and len(chained) == 5


def test_concat_dataset():
    c = ConcatDataset([range(3), range(10, 14)])
    assert len(c) == 7 and c.cumulative_sizes == [3, 7]
    assert [c[i] for i in range(7)] == [0, 1, 2, 10, 11, 12, 13] and c[-1] == 13 and c[-7] == 0
    with pytest.raises(ValueError, match="absolute value of index should not exceed dataset length"):
        c[-8]
    with pytest.raises(IndexError):
        c[7]
    with pytest.raises(AssertionError, match="datasets should not be an empty iterable"):
        ConcatDataset([])
    with pytest.raises(AssertionError, match="ConcatDataset does not support IterableDataset"):
        ConcatDataset([range(2), Stream(2)])
    with pytest.raises(AssertionError, match="ChainDataset only supports IterableDataset"):
        list(ChainDataset([Stream(1), range(2)]))


def test_stack_dataset():
    t = StackDataset(range(3), range(10, 13))
    assert len(t) == 3 and t[1] == (1, 11) and t.__getitems__([2, 0]) == [(2, 12), (0, 10)]
    d = StackDataset(a=range(3), b=Subset(range(10, 20), [5, 6, 7]))
    assert d[2] == {"a": 2, "b": 17} and d.__getitems__([0, 1]) == [{"a": 0, "b": 15}, {"a": 1, "b": 16}]
    with pytest.raises(ValueError, match="Size mismatch between datasets"):
        StackDataset(range(3), range(4))
    with pytest.raises(ValueError, match="At least one dataset should be passed"):
        StackDataset()
    with pytest.raises(ValueError, match="but both types are given"):
        StackDataset(range(2), b=range(2))


def test_subset():
    s = Subset(range(10, 20), [5, 0, 7])
    assert len(s) == 3 and [s[i] for i in range(3)] == [15, 10, 17] and s.__getitems__([2, 0]) == [17, 15]

    class Bad(Subset):
        def __getitem__(self, idx):
            return 0

    with pytest.raises(NotImplementedError, match="Bad overrides __getitem__ but not __getitems__"):
        Bad(range(3), [0])


@pytest.mark.parametrize("lengths,n,expected", [
    ([3, 7], 10, [3, 7]),
    ([0.3, 0.3, 0.4], 10, [3, 3, 4]),
    ([0.3, 0.3, 0.4], 11, [4, 3, 4]),  # floors 3, 3, 4; the remainder 1 goes to the first split
    ([1 / 3, 1 / 3, 1 / 3], 10, [4, 3, 3]),
    ([0.1, 0.9], 20, [2, 18]),
])
def test_random_split_lengths_and_disjointness(lengths, n, expected):
    parts = random_split(range(100, 100 + n), lengths, generator=np.random.default_rng(0))
    assert [len(p) for p in parts] == expected and all(isinstance(p, Subset) for p in parts)
    values = [v for p in parts for v in (p[i] for i in range(len(p)))]
    assert sorted(values) == list(range(100, 100 + n))


def test_random_split_warnings_errors_and_reproducibility():
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0. This might result in an empty dataset."):
        parts = random_split(range(1), [0.5, 0.5])
    assert [len(p) for p in parts] == [1, 0]
    with pytest.raises(ValueError, match="Sum of input lengths does not equal the length of the input dataset!"):
        random_split(range(10), [3, 3])
    with pytest.raises(ValueError, match="Fraction at index 0 is not between 0 and 1"):
        random_split(range(10), [1.2, -0.2])
    a = random_split(range(50), [20, 30], generator=np.random.default_rng(7))
    b = random_split(range(50), [20, 30], generator=np.random.default_rng(7))
    assert a[0].indices == b[0].indices and a[1].indices == b[1].indices
    hp.manual_seed(3)
    c = random_split(range(50), [20, 30])
    hp.manual_seed(3)
    d = random_split(range(50), [20, 30])
    assert c[0].indices == d[0].indices and sorted(c[0].indices + c[1].indices) == list(range(50))


# ------------------------------------------------------------------------------------------------ samplers


def test_sequential_and_batch_sampler():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3] and len(SequentialSampler(range(4))) == 4
    # PyTorch's docstring examples
    assert list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)) == [
        [0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True)) == [
        [0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert len(BatchSampler(range(10), 3, False)) == 4 and len(BatchSampler(range(10), 3, True)) == 3
    assert list(BatchSampler(iter([5, 6, 7]), 2, False)) == [[5, 6], [7]]  # any iterable
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=f"batch_size should be a positive integer value, but got batch_size={bad}"):
            BatchSampler(range(5), bad, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean value, but got drop_last=1"):
        BatchSampler(range(5), 2, 1)


def test_random_sampler_without_replacement():
    for _ in range(3):
        assert sorted(RandomSampler(range(7))) == list(range(7))
    s = RandomSampler(range(5), num_samples=12)
    out = list(s)
    assert len(s) == 12 and len(out) == 12
    # two whole permutations, then 2 distinct indices of a third
    assert sorted(out[:5]) == sorted(out[5:10]) == list(range(5)) and len(set(out[10:])) == 2


def test_random_sampler_with_replacement_and_errors():
    s = RandomSampler(range(3), replacement=True, num_samples=100, generator=np.random.default_rng(1))
    out = list(s)
    assert len(out) == 100 and set(out) == {0, 1, 2}
    assert len(list(RandomSampler(range(3), replacement=True))) == 3
    with pytest.raises(TypeError, match="replacement should be a boolean value, but got replacement=1"):
        RandomSampler(range(5), replacement=1)
    for bad in (0, 2.0, -3):
        with pytest.raises(ValueError, match=f"num_samples should be a positive integer value, but got num_samples={bad}"):
            RandomSampler(range(5), num_samples=bad)
    with pytest.raises(ValueError, match="but got num_samples=0"):
        RandomSampler([])


def test_generators_drive_the_orders():
    # a NumPy Generator is stateful, as a torch.Generator: equal seeds give equal streams, and each
    # iteration draws the next permutation
    a, b = RandomSampler(range(30), generator=np.random.default_rng(5)), RandomSampler(range(30), generator=np.random.default_rng(5))
    first_a, first_b, second_a = list(a), list(b), list(a)
    assert first_a == first_b and first_a != second_a and sorted(second_a) == list(range(30))
    # without a generator, a stream is seeded from hpcfsdp's global generator at each iteration
    hp.manual_seed(11)
    x = [list(RandomSampler(range(30))) for _ in range(2)]
    hp.manual_seed(11)
    y = [list(RandomSampler(range(30))) for _ in range(2)]
    assert x == y and x[0] != x[1]

    # an hp.Generator: the sampler draws what hp.randperm draws from it, and the stream advances
    g = hp.Generator().manual_seed(4)
    assert list(RandomSampler(range(30), generator=g)) == hp.randperm(30, generator=hp.Generator().manual_seed(4)).tolist()
    s = SubsetRandomSampler(list(range(100, 130)), generator=g.manual_seed(9))
    p1, p2 = list(s), list(s)
    assert sorted(p1) == list(range(100, 130)) and p1 != p2
    g.manual_seed(9)
    assert list(s) == p1
    with pytest.raises(TypeError, match="generator must be None, an hp.Generator or a numpy.random.Generator, got int"):
        list(RandomSampler(range(3), generator=42))


def test_subset_random_sampler():
    idx = [9, 3, 5, 1]
    s = SubsetRandomSampler(idx)
    assert len(s) == 4 and sorted(s) == [1, 3, 5, 9]


def test_weighted_random_sampler():
    s = WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 200, generator=np.random.default_rng(0))
    out = list(s)
    assert len(s) == 200 and set(out) == {1, 3} and out.count(3) > out.count(1)
    no_rep = list(WeightedRandomSampler([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 6, replacement=False))
    assert sorted(no_rep) == list(range(6))
    # zero weights are drawn only after every positive one (PyTorch: [1, 0, 0], 2 -> [0, 1])
    z = list(WeightedRandomSampler([1, 0, 0], 2, replacement=False))
    assert z[0] == 0 and z[1] in (1, 2)
    assert _vals(WeightedRandomSampler([1, 2], 1).weights) == [1.0, 2.0]
    assert WeightedRandomSampler([1, 2], 1).weights.dtype == hp.float64
    with pytest.raises(ValueError, match="weights should be a 1d sequence but given weights have shape \\(1, 2\\)"):
        WeightedRandomSampler([[1, 2]], 1)
    with pytest.raises(ValueError, match="num_samples should be a positive integer value, but got num_samples=True"):
        WeightedRandomSampler([1, 2], True)
    with pytest.raises(ValueError, match="replacement should be a boolean value, but got replacement=0"):
        WeightedRandomSampler([1, 2], 1, replacement=0)
    for weights, n, rep, msg in [([1, -1], 2, True, "encountering probability entry < 0"),
                                 ([0, 0], 2, True, "sum of probabilities <= 0"),
                                 ([1, 1], 3, False, "cannot sample n_sample > prob_dist.size"),
                                 ([float("nan"), 1], 1, True, "contains either `inf`, `nan` or element < 0")]:
        with pytest.raises(RuntimeError, match=msg):
            list(WeightedRandomSampler(weights, n, replacement=rep))


# ------------------------------------------------------------------------------------------------ DistributedSampler


# PyTorch's shares of range(N) at R replicas without shuffling: rank r takes positions r, r+R, ... of the
# order padded by repeating its start (drop_last=False) or cut to floor(N/R)*R (drop_last=True).
UNSHUFFLED = [
    (10, 4, False, [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]),
    (10, 4, True, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (3, 4, False, [[0], [1], [2], [0]]),
    (2, 5, False, [[0], [1], [0], [1], [0]]),  # padding longer than the data: the order repeats
    (8, 4, True, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (0, 3, False, [[], [], []]),
    (1, 4, True, [[], [], [], []]),
    (7, 1, False, [[0, 1, 2, 3, 4, 5, 6]]),
]


@pytest.mark.parametrize("n,replicas,drop_last,expected", UNSHUFFLED)
def test_distributed_sampler_unshuffled_shares(n, replicas, drop_last, expected):
    shares = [DistributedSampler(range(n), replicas, r, shuffle=False, drop_last=drop_last) for r in range(replicas)]
    assert [list(s) for s in shares] == expected
    assert all(len(s) == s.num_samples == len(expected[0]) for s in shares)
    assert shares[0].total_size == replicas * len(expected[0])


def _global_order(n, replicas, **kw):
    """The padded (or cut) epoch order, rebuilt by interleaving every rank's share."""
    shares = [list(DistributedSampler(range(n), replicas, r, **kw)) for r in range(replicas)]
    return [shares[r][k] for k in range(len(shares[0])) for r in range(replicas)]


@pytest.mark.parametrize("n,replicas", [(10, 4), (13, 3), (2, 5), (12, 4), (1, 1)])
def test_distributed_sampler_shuffled_structure(n, replicas):
    order = _global_order(n, replicas, seed=3)
    total = -(-n // replicas) * replicas
    assert len(order) == total and sorted(order[:n]) == list(range(n))
    assert order[n:] == (order[:n] * total)[: total - n]  # padding repeats the permutation's start
    cut = _global_order(n, replicas, seed=3, drop_last=True)
    assert cut == order[: n // replicas * replicas]  # drop_last cuts the same permutation


def _pytorch_shares(n, replicas, rank, seed, epoch, drop_last):
    """PyTorch's DistributedSampler.__iter__, line for line, on hpcfsdp's Generator and randperm."""
    g = hp.Generator()
    g.manual_seed(seed + epoch)
    indices = hp.randperm(n, generator=g).tolist()
    if drop_last and n % replicas != 0:
        num_samples = math.ceil((n - replicas) / replicas)
    else:
        num_samples = math.ceil(n / replicas)
    total_size = num_samples * replicas
    if not drop_last:
        padding_size = total_size - len(indices)
        if padding_size <= len(indices):
            indices += indices[:padding_size]
        else:
            indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
    else:
        indices = indices[:total_size]
    return indices[rank:total_size:replicas]


@pytest.mark.parametrize("n,replicas", [(10, 4), (13, 3), (2, 5), (12, 4), (0, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_is_pytorchs_algorithm_on_hpcfsdps_generator(n, replicas, drop_last):
    for epoch in (0, 2):
        for rank in range(replicas):
            s = DistributedSampler(range(n), replicas, rank, seed=17, drop_last=drop_last)
            s.set_epoch(epoch)
            assert list(s) == _pytorch_shares(n, replicas, rank, 17, epoch, drop_last)


def test_distributed_sampler_epochs_seeds_and_global_rng():
    s = DistributedSampler(range(40), 4, 2, seed=5)
    e0 = list(s)
    hp.manual_seed(123)  # the global generator plays no part
    np.random.seed(0)
    assert list(s) == e0 and list(DistributedSampler(range(40), 4, 2, seed=5)) == e0  # the same on every iteration
    s.set_epoch(1)
    assert s.epoch == 1 and list(s) != e0
    other = DistributedSampler(range(40), 4, 2, seed=4)
    other.set_epoch(2)
    assert list(other) == list(s)  # the permutation depends on seed + epoch only
    assert list(DistributedSampler(range(40), 4, 2, seed=-1)) != e0  # negative seeds are valid, as in PyTorch


def test_distributed_sampler_matches_the_trainers_sampler():
    """The CLI trainer's hpcfsdp.data.DistributedSampler gives the same shares for the same seed and epoch."""
    from hpcfsdp.data import DistributedSampler as TrainerSampler

    for drop_last in (False, True):
        for epoch in (0, 3):
            mine = DistributedSampler(range(23), 4, 1, seed=2, drop_last=drop_last)
            mine.set_epoch(epoch)
            theirs = TrainerSampler(23, 4, 1, seed=2, drop_last=drop_last)
            theirs.set_epoch(epoch)
            assert list(mine) == list(theirs)


def test_distributed_sampler_errors():
    for rank in (2, -1):
        with pytest.raises(ValueError, match=f"Invalid rank {rank}, rank should be in the interval \\[0, 1\\]"):
            DistributedSampler(range(3), 2, rank)
    # num_replicas/rank default to the default process group's: hpcfsdp.distributed creates it on first use
    # (See [Note: Default process group]), where PyTorch raises until init_process_group is called
    code = ("import sys, hpcfsdp.distributed as dist\n"
            "from hpcfsdp.utils.data import DistributedSampler\n"
            "assert not dist.is_initialized()\n"
            "s = DistributedSampler(range(5), shuffle=False)\n"
            "print(s.num_replicas, s.rank, list(s), dist.is_initialized())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1 0 [0, 1, 2, 3, 4] True"]


# ------------------------------------------------------------------------------------------------ collation


def test_default_collate_python_and_numpy_types():
    assert default_collate([1, 2]).dtype == hp.int64 and _vals(default_collate([1, 2])) == [1, 2]
    assert default_collate([1.5, 2.0]).dtype == hp.float64  # Python floats -> float64, as PyTorch
    assert default_collate([True, False]).dtype == hp.bool
    assert default_collate([np.float32(1), np.float32(2)]).dtype == hp.float32
    assert default_collate([np.int32(1), np.int32(2)]).dtype == hp.int32
    assert default_collate([np.float64(1)]).dtype == hp.float64 and default_collate([np.bool_(True)]).dtype == hp.bool
    arr = default_collate([np.array([1, 2], dtype=np.int16), np.array([3, 4], dtype=np.int16)])
    assert arr.dtype == hp.int16 and arr.shape == (2, 2) and _vals(arr) == [[1, 2], [3, 4]]
    assert default_collate(["a", "b"]) == ["a", "b"] and default_collate([b"x"]) == [b"x"]


def test_default_collate_tensors_and_containers():
    t = default_collate([hp.ones(2, 3), hp.zeros(2, 3)])
    assert t.shape == (2, 2, 3) and t.dtype == hp.float32 and _vals(t[1]) == [[0.0] * 3] * 2
    # a tuple sample gives a list; strings inside stay the tuple zip made, as PyTorch
    out = default_collate([(1, "a"), (2, "b")])
    assert isinstance(out, list) and _vals(out[0]) == [1, 2] and out[1] == ("a", "b")
    assert [_vals(x) for x in default_collate([[1, 2], [3, 4]])] == [[1, 3], [2, 4]]
    P = collections.namedtuple("P", "x y")
    p = default_collate([P(1, 2.0), P(3, 4.0)])
    assert type(p) is P and _vals(p.x) == [1, 3] and p.y.dtype == hp.float64
    d = default_collate([{"a": 1, "b": np.zeros(2)}, {"a": 2, "b": np.ones(2)}])
    assert list(d) == ["a", "b"] and _vals(d["a"]) == [1, 2] and d["b"].dtype == hp.float64 and d["b"].shape == (2, 2)
    nested = default_collate([{"x": (hp.tensor([1]), 0)}, {"x": (hp.tensor([2]), 1)}])
    assert _vals(nested["x"][0]) == [[1], [2]] and _vals(nested["x"][1]) == [0, 1]


def test_default_collate_errors():
    with pytest.raises(TypeError, match="default_collate: batch must contain tensors, numpy arrays, numbers, "
                                        "dicts or lists; found <class 'object'>"):
        default_collate([object()])
    with pytest.raises(TypeError, match="found <U1"):
        default_collate([np.array(["a"])])
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [3]])


def test_default_convert():
    out = default_convert((np.zeros(2), 1, "a"))
    assert isinstance(out, list) and out[0].dtype == hp.float64 and out[1:] == [1, "a"]
    strings = np.array(["a"])
    assert default_convert(strings) is strings
    scalar = default_convert(np.int32(3))
    assert scalar.shape == () and scalar.dtype == hp.int32 and scalar.item() == 3
    P = collections.namedtuple("P", "x y")
    p = default_convert(P(np.ones(1), "s"))
    assert type(p) is P and _vals(p.x) == [1.0] and p.y == "s"
    t = hp.ones(2)
    assert default_convert(t) is t and default_convert({"k": np.arange(2)})["k"].dtype == hp.int64


def test_pin_memory_keeps_structure_and_values():
    P = collections.namedtuple("P", "x y")
    batch = {"a": hp.arange(3), "b": [P(hp.ones(2), "s"), (hp.zeros(1), 4)]}
    out = _collate.pin_memory(batch)
    assert out is not batch and out["a"] is not batch["a"] and _vals(out["a"]) == [0, 1, 2]
    assert type(out["b"][0]) is P and _vals(out["b"][0].x) == [1.0, 1.0] and out["b"][0].y == "s"
    assert isinstance(out["b"][1], tuple) and _vals(out["b"][1][0]) == [0.0] and out["b"][1][1] == 4


# ------------------------------------------------------------------------------------------------ DataLoader


def test_dataloader_batches_and_len():
    ds = _pairs(10)
    loader = DataLoader(ds, batch_size=3)
    batches = list(loader)
    assert len(loader) == 4 and [_vals(b[0]) for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert _vals(batches[1][1]) == [6, 8, 10] and isinstance(batches[0], list)
    dropped = DataLoader(ds, batch_size=3, drop_last=True)
    assert len(dropped) == 3 and [_vals(b[0]) for b in dropped] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    one = list(DataLoader(range(3)))  # the default batch_size=1 adds a batch dimension
    assert [_vals(b) for b in one] == [[0], [1], [2]] and one[0].dtype == hp.int64
    assert [_vals(b) for b in DataLoader(range(5), batch_size=2)] == [[0, 1], [2, 3], [4]]
    it = iter(loader)
    assert len(it) == 4 and iter(it) is it


def test_dataloader_defaults_and_attributes():
    ds = _pairs(4)
    loader = DataLoader(ds)
    assert isinstance(loader.sampler, SequentialSampler) and isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_size == 1 and loader.drop_last is False and loader.num_workers == 0
    assert loader.collate_fn is default_collate and loader.prefetch_factor is None and loader.timeout == 0
    assert isinstance(DataLoader(ds, shuffle=True).sampler, RandomSampler)
    unbatched = DataLoader(ds, batch_size=None)
    assert unbatched.collate_fn is default_convert and unbatched.batch_sampler is None and len(unbatched) == 4
    first = next(iter(unbatched))
    assert isinstance(first, list) and _vals(first[0]) == 0 and _vals(first[1]) == 0  # default_convert: a list
    with pytest.raises(ValueError, match="batch_size attribute should not be set after DataLoader is initialized"):
        loader.batch_size = 3
    with pytest.raises(ValueError, match="sampler attribute should not be set after DataLoader is initialized"):
        loader.sampler = None
    loader.num_workers = 0  # others may change


def test_dataloader_shuffle_covers_every_sample_once_per_epoch():
    ds = _pairs(11)
    loader = DataLoader(ds, batch_size=4, shuffle=True, generator=np.random.default_rng(2))
    epochs = [[v for b in loader for v in _vals(b[0])] for _ in range(2)]
    assert all(sorted(e) == list(range(11)) for e in epochs) and epochs[0] != epochs[1]
    again = DataLoader(ds, batch_size=4, shuffle=True, generator=np.random.default_rng(2))
    assert [v for b in again for v in _vals(b[0])] == epochs[0]
    assert [len(b[0]) for b in loader] == [4, 4, 3]
    hp.manual_seed(0)
    a = [_vals(b[0]) for b in DataLoader(ds, batch_size=4, shuffle=True)]
    hp.manual_seed(0)
    assert [_vals(b[0]) for b in DataLoader(ds, batch_size=4, shuffle=True)] == a


def test_dataloader_sampler_batch_sampler_and_getitems():
    ds = _pairs(6)
    assert [_vals(b[0]) for b in DataLoader(ds, sampler=[5, 0, 3], batch_size=2)] == [[5, 0], [3]]
    loader = DataLoader(ds, batch_sampler=[[1, 2, 3], [0]])
    assert loader.batch_size is None and loader.drop_last is False and len(loader) == 2
    assert [_vals(b[1]) for b in loader] == [[2, 4, 6], [0]]
    assert len(DataLoader(ds, batch_sampler=BatchSampler(range(6), 4, False))) == 2

    class Batched(Dataset):
        calls = []

        def __getitem__(self, i):
            raise AssertionError("the DataLoader fetches whole batches through __getitems__")

        def __getitems__(self, indices):
            self.calls.append(list(indices))
            return [i * 10 for i in indices]

        def __len__(self):
            return 5

    assert [_vals(b) for b in DataLoader(Batched(), batch_size=2)] == [[0, 10], [20, 30], [40]]
    assert Batched.calls == [[0, 1], [2, 3], [4]]
    custom = DataLoader(range(4), batch_size=2, collate_fn=lambda batch: sum(batch))
    assert list(custom) == [1, 5]


@pytest.mark.parametrize("kwargs,message", [
    (dict(shuffle=True, sampler=[1, 2]), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[1]], batch_size=2), "batch_sampler option is mutually exclusive with batch_size, "
                                              "shuffle, sampler, and drop_last"),
    (dict(batch_sampler=[[1]], drop_last=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[1]], shuffle=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[1]], sampler=[1]), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching and is mutually "
                                            "exclusive with drop_last"),
    (dict(num_workers=-1), "num_workers option should be non-negative; use num_workers=0 to disable "
                           "multiprocessing."),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified in multiprocessing.let "
                              "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None."),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(num_workers=2, prefetch_factor=-1), "prefetch_factor option should be non-negative"),
    (dict(multiprocessing_context="fork"), "multiprocessing_context can only be used with multi-process loading "
                                           "\\(num_workers > 0\\), but got num_workers=0"),
    (dict(num_workers=1, multiprocessing_context="nope"), "multiprocessing_context option should specify a valid "
                                                          "start method in"),
])
def test_dataloader_argument_errors(kwargs, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=message):
            DataLoader(_pairs(4), **kwargs)


def test_dataloader_allowed_combinations():
    ds = _pairs(4)
    assert len(DataLoader(ds, batch_sampler=[[0]], shuffle=False)) == 1
    assert len(DataLoader(ds, sampler=[1], shuffle=False)) == 1
    with pytest.raises(TypeError, match="multiprocessing_context option should be a valid context object"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            DataLoader(ds, num_workers=1, multiprocessing_context=3)


def test_dataloader_iterable_dataset():
    assert [_vals(b) for b in DataLoader(Stream(5), batch_size=2)] == [[0, 1], [2, 3], [4]]
    assert [_vals(b) for b in DataLoader(Stream(5), batch_size=2, drop_last=True)] == [[0, 1], [2, 3]]
    assert len(DataLoader(Stream(5), batch_size=2)) == 3 and len(DataLoader(Stream(5), batch_size=2, drop_last=True)) == 2
    assert list(DataLoader(Stream(3), batch_size=None)) == [0, 1, 2]
    assert [_vals(b) for b in DataLoader(Stream(3))] == [[0], [1], [2]]
    for kwargs, what in [(dict(shuffle=True), "shuffle option, but got shuffle=True"),
                         (dict(sampler=[1]), "sampler option, but got sampler=\\[1\\]"),
                         (dict(batch_sampler=[[1]]), "batch_sampler option, but got batch_sampler=\\[\\[1\\]\\]")]:
        with pytest.raises(ValueError, match=f"DataLoader with IterableDataset: expected unspecified {what}"):
            DataLoader(Stream(3), **kwargs)
    assert len(list(DataLoader(Stream(3), shuffle=False))) == 3
    loader = DataLoader(Stream(4, reported=2), batch_size=1)
    assert len(loader) == 2
    with pytest.warns(UserWarning, match="was reported to be 2\\(when accessing len\\(dataloader\\)\\), but") as rec:
        assert len(list(loader)) == 4
    assert ["but 3 samples" in str(w.message) for w in rec] == [True, False]  # one warning per extra sample


def test_num_workers_load_in_the_main_process_with_one_warning(monkeypatch):
    monkeypatch.setattr(dataloader_module, "_warned_workers", False)
    seen, inits = [], []

    class Recording(Dataset):
        def __getitem__(self, i):
            seen.append(get_worker_info())
            return i

        def __len__(self):
            return 5

    with pytest.warns(UserWarning, match="DataLoader\\(num_workers=2\\): hpcfsdp starts no worker processes") as rec:
        loader = DataLoader(Recording(), batch_size=2, num_workers=2, worker_init_fn=inits.append,
                            persistent_workers=True, timeout=5)
    assert len(rec) == 1 and loader.prefetch_factor == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shown once per process
        DataLoader(Recording(), num_workers=4, prefetch_factor=3)
        batches = [_vals(b) for b in loader]
    assert batches == [[0, 1], [2, 3], [4]] and seen == [None] * 5 and inits == []


def test_timeout_without_workers_fails_on_iteration_as_pytorch():
    loader = DataLoader(range(3), timeout=5)
    with pytest.raises(AssertionError, match="_SingleProcessDataLoaderIter requires timeout == 0"):
        iter(loader)


def test_pin_memory_without_accelerator_warns_and_loads():
    if hp.accelerator.is_available():
        batches = list(DataLoader(_pairs(4), batch_size=2, pin_memory=True))
    else:
        with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
            batches = list(DataLoader(_pairs(4), batch_size=2, pin_memory=True))
    assert [_vals(b[0]) for b in batches] == [[0, 1], [2, 3]]


def test_pin_memory_and_cuda_batches_on_the_simulated_device():
    """With a GPU (here the simulated one), pin_memory=True gives batches in page-locked host memory, and
    CUDA tensors collate on their device."""
    code = ("import warnings\n"
            "import hpcfsdp as hp\n"
            "from hpcfsdp import _backend\n"
            "from hpcfsdp.utils.data import DataLoader, TensorDataset, default_collate\n"
            "assert hp.accelerator.is_available()\n"
            "warnings.simplefilter('error')\n"
            "ds = TensorDataset(hp.arange(6), hp.ones(6, 2))\n"
            "for xb, yb in DataLoader(ds, batch_size=4, pin_memory=True):\n"
            "    print(xb.tolist(), tuple(yb.shape), _backend.is_pinned(xb._data), _backend.is_pinned(yb._data))\n"
            "for xb, yb in DataLoader(ds, batch_size=4):\n"
            "    assert not _backend.is_pinned(xb._data)\n"
            "b = default_collate([hp.ones(3, device='cuda'), hp.zeros(3, device='cuda')])\n"
            "print(b.device, tuple(b.shape), b.tolist())\n")
    env = dict(os.environ, HPCFSDP_CUDA_SIM="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[0, 1, 2, 3] (4, 2) True True", "[4, 5] (2, 2) True True",
                                     "cuda:0 (2, 3) [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]"]


def test_a_training_loop_as_pytorch_writes_it():
    """The PyTorch idiom: TensorDataset + random_split + DataLoader(shuffle) feeding a model and an optimizer."""
    from hpcfsdp import nn

    hp.manual_seed(0)
    x = hp.randn(64, 3)
    y = x @ hp.tensor([[1.0], [-2.0], [0.5]]) + 0.1
    train, val = random_split(TensorDataset(x, y), [0.75, 0.25], generator=np.random.default_rng(0))
    assert (len(train), len(val)) == (48, 16)
    model = nn.Linear(3, 1)
    opt = hp.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(train, batch_size=8, shuffle=True)

    def val_loss():
        with hp.no_grad():
            return sum(float(((model(xb) - yb) ** 2).mean().item()) for xb, yb in DataLoader(val, batch_size=8))

    before = val_loss()
    for _ in range(20):
        for xb, yb in loader:
            assert xb.shape[1:] == (3,) and yb.shape[1:] == (1,)
            opt.zero_grad()
            loss = ((model(xb) - yb) ** 2).mean()
            loss.backward()
            opt.step()
    assert val_loss() < 1e-3 * before
