"""What marks an FSDP1 instance, and the instances under a module: what the modules FullyShardedDataParallel is
built from (_fsdp1_init, _fsdp1_optim_state) need of it without importing fully_sharded_data_parallel (which
imports them)."""

from .api import StateDictSettings

__all__ = ["_FSDPState", "fsdp1_root", "fsdp1_instances", "state_dict_settings"]


class _FSDPState:
    """A base of FullyShardedDataParallel (as PyTorch's, from ``torch.distributed.fsdp._common_utils``): being one
    is being an FSDP1 instance."""


def fsdp1_root(model):
    """The module an FSDP1 instance wraps, or ``model`` itself."""
    return model.module if isinstance(model, _FSDPState) else model


def fsdp1_instances(module, required: bool = True) -> list:
    """The FSDP1 instances in ``module`` (itself included); ValueError when there is none and one is ``required``."""
    found = [m for m in module.modules() if isinstance(m, _FSDPState)]
    if not found and required:
        raise ValueError(f"{type(module).__name__} contains no FullyShardedDataParallel instance")
    return found


def state_dict_settings(module) -> StateDictSettings:
    """The state-dict settings shared by every FSDP1 instance under ``module`` (FSDP.get_state_dict_type).

    Raises:
        ValueError: the instances under ``module`` have different settings, or there is none.
    """
    wrappers = fsdp1_instances(module)
    first = wrappers[0]._state_dict_settings
    for w in wrappers[1:]:
        if w._state_dict_settings != first:
            raise ValueError("FSDP instances under this module have different state-dict settings")
    return first
