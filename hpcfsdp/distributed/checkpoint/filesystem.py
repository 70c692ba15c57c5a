"""PyTorch's ``FileSystemWriter``/``FileSystemReader`` and default planners, as arguments of save and load.

hpcfsdp has one storage layout (the sharded format of ``_format.py``) and one planner, so these objects
carry only what selects it: the directory and, for loading, whether keys absent from the checkpoint are
allowed. Anything else PyTorch's planners and storage classes customise is refused by save/load rather
than ignored.
"""
import os

__all__ = ["FileSystemWriter", "FileSystemReader", "DefaultSavePlanner", "DefaultLoadPlanner"]


class FileSystemWriter:
    """Write a checkpoint into directory ``path``. ``sync_files``: fsync before the commit (always done
    here); the other arguments tune PyTorch's writer threads and are accepted for portability."""

    def __init__(self, path, single_file_per_rank: bool = True, sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True, _extensions=None, serialization_format=None):
        self.path = os.fspath(path)
        self.overwrite = bool(overwrite)

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)


class FileSystemReader:
    """Read a checkpoint from directory ``path``."""

    def __init__(self, path, _extension_registry=None):
        self.path = os.fspath(path)

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)


class DefaultSavePlanner:
    """The default (and only) save plan: every rank writes its own pieces, replicated data once."""

    def __init__(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 dedup_replicated_tensors=None, dedup_save_to_lowest_rank: bool = False,
                 enable_plan_caching: bool = False):
        """PyTorch's arguments, accepted for portability: hpcfsdp's one plan already does what they tune."""


class DefaultLoadPlanner:
    """The default (and only) load plan: each rank reads the pieces it holds. ``allow_partial_load``:
    keys of the state dict that the checkpoint lacks keep their values instead of raising."""

    def __init__(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 allow_partial_load: bool = False):
        self.allow_partial_load = bool(allow_partial_load)


def resolve(what: str, checkpoint_id, storage, planner, storage_cls, planner_cls):
    """The checkpoint directory and the planner of a save/load call, or a clear error for what hpcfsdp
    cannot honour (another storage backend or planner would otherwise be silently ignored)."""
    kind = "storage_writer" if storage_cls is FileSystemWriter else "storage_reader"
    if storage is not None and not isinstance(storage, storage_cls):
        raise TypeError(f"{what}: {kind}={storage!r} is not supported; hpcfsdp writes its own sharded format "
                        f"to a directory: pass checkpoint_id=DIR or {kind}={storage_cls.__name__}(DIR)")
    if planner is not None and not isinstance(planner, planner_cls):
        raise TypeError(f"{what}: planner={planner!r} is not supported; expected None or {planner_cls.__name__}")
    if storage is not None:
        storage.reset(checkpoint_id)
        return storage.path, planner
    if checkpoint_id is None:
        raise ValueError(f"{what}: `checkpoint_id` must be specified if {kind} is None.")
    return os.fspath(checkpoint_id), planner
