"""summon_full_params: full parameters (and gradients) of FSDP units as module attributes inside a context."""

import contextlib
import warnings

from ... import _backend
from ..._tensor import Tensor
from ...nn import Parameter
from ..tensor import DTensor
from ._fully_shard import FSDPModule
from ._fully_shard._fsdp_common import TrainingState, get_module_fsdp_state
from ._fully_shard._fsdp_state_dict import local_chunk

__all__ = ["summon_full_params"]

# [Note: Summoning full parameters]
# Every unit is resharded first, so each managed module attribute is its sharded DTensor parameter. Each
# one is then gathered with ``full_tensor()`` (in module order, the same on every rank: the all-gathers
# match up) in the sharded parameter's own dtype, so full precision even under MixedPrecision, and the
# module attribute is swapped to a new Parameter holding the full tensor. Tied parameters are gathered
# once and stay tied. On exit the sharded parameters go back; with ``writeback`` each rank first copies
# its rows of the (possibly modified) full tensor into its shard, in place, so the unit's flat buffer
# and the optimizer's references stay valid. Full gradients (``with_grads``) are gathered from the
# sharded ones and written back the same way. Under NO_SHARD (Replicate placements) changes persist even
# without ``writeback`` (unless offloaded), as in PyTorch, whose FSDP1 then exposes the unit's own storage.


def _states(module, recurse: bool) -> list:
    if not recurse:
        state = get_module_fsdp_state(module) if isinstance(module, FSDPModule) else None
        return [state] if state is not None else []
    found = []
    for m in module.modules():
        state = get_module_fsdp_state(m) if isinstance(m, FSDPModule) else None
        if state is not None and state not in found:
            found.append(state)
    return found


def _check_idle(states) -> None:
    for state in states:
        for group in state._all_param_groups():
            if group.training_state != TrainingState.IDLE:  # PyTorch's AssertionError and words
                raise AssertionError(f"Cannot manually unshard parameters during forward/backward (an FSDP unit is "
                                     f"in {group.training_state.name}); call summon_full_params between iterations")


def _host(t: Tensor) -> Tensor:
    return t if t.device.type == "cpu" else Tensor._wrap(_backend.to_numpy(t._data))


def _replicated(p) -> bool:
    from ..tensor import Replicate

    return all(isinstance(pl, Replicate) for pl in p.placements)


SUMMONED: set = set()  # ids of the FSDP states whose full parameters are summoned now


@contextlib.contextmanager
def summon_full_params(module, *, recurse: bool = True, writeback: bool = True, rank0_only: bool = False,
                       offload_to_cpu: bool = False, with_grads: bool = False):
    """See FullyShardedDataParallel.summon_full_params and [Note: Summoning full parameters]."""
    from .. import distributed_c10d as c10d

    if writeback and rank0_only:
        raise NotImplementedError("writeback=True and rank0_only=True is not supported yet: parameter shapes "
                                  "would differ across ranks (pass writeback=False)")
    if with_grads and offload_to_cpu:
        raise NotImplementedError(f"with_grads={with_grads}, offload_to_cpu={offload_to_cpu} is not supported yet")
    if offload_to_cpu and not rank0_only:
        warnings.warn("offload_to_cpu=True and rank0_only=False may result in the unsharded parameters being "
                      "redundantly copied to CPU memory for ranks sharing the same CPU memory, which risks CPU "
                      "OOM. We recommend using offload_to_cpu=True with rank0_only=True.", stacklevel=3)
    states = _states(module, recurse)
    _check_idle(states)
    if any(id(st) in SUMMONED for st in states):
        raise ValueError("expected to be in states [<TrainingState.IDLE: 1>] but current state is "
                         "TrainingState.SUMMON_FULL_PARAMS (hpcfsdp: summon_full_params is already active on "
                         "these FSDP units)")
    for m in module.modules():
        if isinstance(m, FSDPModule) and get_module_fsdp_state(m) in states:
            m.reshard()
    show = not rank0_only or c10d.get_rank() == 0
    full_of: dict = {}  # id(sharded param) -> (sharded param, full Parameter)
    swapped = []  # (module, name, sharded param)
    for m in module.modules():
        if get_module_fsdp_state(m) not in states:
            continue
        for name, p in list(m._parameters.items()):
            if not isinstance(p, DTensor):
                continue  # ignored parameters are plain tensors: nothing to gather
            if id(p) not in full_of:
                full = p.detach().full_tensor()
                full = _host(full) if offload_to_cpu else full
                new = Parameter(full, requires_grad=p.requires_grad)
                if with_grads and p.grad is not None:
                    g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                    new._grad = g  # as the sharded grad: low precision under keep_low_precision_grads
                full_of[id(p)] = (p, new)
            if show:
                m._parameters[name] = full_of[id(p)][1]
                swapped.append((m, name, p))
    shown = {id(p) for _, _, p in swapped}
    SUMMONED.update(id(st) for st in states)
    try:
        yield
    finally:
        SUMMONED.difference_update(id(st) for st in states)
        for m, name, p in swapped:
            m._parameters[name] = p
        for p, new in full_of.values():
            # NO_SHARD (every placement Replicate): the summoned tensors stand for the ones the unit holds, so
            # changes persist whatever ``writeback`` says, as PyTorch's FSDP1 exposes that storage itself
            if not (writeback or (_replicated(p) and not offload_to_cpu)) or id(p) not in shown:
                continue
            piece = local_chunk(Tensor._wrap(new._data), p)
            p._data[...] = piece._data.astype(p._data.dtype, copy=False)
            g, full_g = p.grad, new._grad
            if with_grads and isinstance(g, DTensor) and full_g is not None and full_g is not g:
                piece = local_chunk(Tensor._wrap(full_g._data), g)  # gradients too (PyTorch writes them back)
                g._data[...] = piece._data.astype(g._data.dtype, copy=False)
