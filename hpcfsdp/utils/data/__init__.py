"""Datasets, samplers and the DataLoader on hpcfsdp Tensors: PyTorch's ``torch.utils.data``
(``hpcfsdp.utils.data`` after ``import hpcfsdp``, as ``torch.utils.data`` after ``import torch``).

``import hpcfsdp`` imports this package; its submodules load on the first use of one of their names, so
that ``import hpcfsdp`` does not pay for them."""
import importlib

# public name -> the submodule defining it
_SUBMODULE_OF = {
    "BatchSampler": "sampler",
    "ChainDataset": "dataset",
    "ConcatDataset": "dataset",
    "DataLoader": "dataloader",
    "Dataset": "dataset",
    "DistributedSampler": "distributed",
    "IterableDataset": "dataset",
    "RandomSampler": "sampler",
    "Sampler": "sampler",
    "SequentialSampler": "sampler",
    "StackDataset": "dataset",
    "Subset": "dataset",
    "SubsetRandomSampler": "sampler",
    "TensorDataset": "dataset",
    "WeightedRandomSampler": "sampler",
    "_DatasetKind": "dataloader",
    "default_collate": "dataloader",
    "default_convert": "dataloader",
    "get_worker_info": "dataloader",
    "random_split": "dataset",
}
_SUBMODULES = ("dataset", "sampler", "distributed", "dataloader")

__all__ = [
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "_DatasetKind",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
]


def __getattr__(name):
    if name in _SUBMODULE_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_SUBMODULE_OF[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
