"""The error-feedback residual of QuantizedReduceScatter as state: a state dict of DTensors laid out like the
parameters' gradients, saved with checkpoints and resharded like optimizer state.

[Note: Residual state]
A rank's error-feedback residual is what its quantization rounded away: for the cross-host hop, rows it sent
to the ranks of other hosts (See [Note: Quantized gradient reduction]); for HSDP's replicate hop, rows it
sent to its replicas and its own chunk's sum. That form belongs to one world layout. Reading the state moves
it (one exchange per hop, in float32) to the ranks whose gradient elements it is owed to, summed and
divided as the reduction divides: the residual owed to each element of a rank's reduced output, the
output's units before FSDP's post-divide. The comm keeps that as owed (``pending``), and the next reduction
of the unit adds it to its output in full precision (finish_reduce), so a run that read its state and a run
resumed from that state continue alike, bit for bit at the same world size. Split by the reduction's
layouts, the owed residual is one piece per parameter, laid out as its sharded gradient: a DTensor of the
parameter's global shape that a checkpoint reshards as it reshards ``exp_avg``. At another world size
each rank loads its new piece and owes it to its own next output. (Where FSDP post-divides by a factor
that changes with the world size, fp16 reductions or a custom divide factor, the residual keeps the old
factor: off by that ratio, a fraction of one quantization step.)
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .... import _backend
from ....nn import Module
from ._fsdp_quantized import QuantizedReduceScatter
from ._fully_shard import FSDPModule

__all__ = ["get_residual_state_dict", "set_residual_state_dict"]


def _units(module: Module):
    """(names, parameters, layouts, total, comm) of every FSDP group under ``module`` whose gradients reduce
    through a QuantizedReduceScatter with error feedback, in module order (the same on every rank); names
    are the parameters' under ``module``."""
    names = {id(p): n for n, p in module.named_parameters()}
    for m in module.modules():
        if not isinstance(m, FSDPModule):
            continue
        for group in m._get_fsdp_state()._all_param_groups():
            comm = group.reduce_scatter_comm
            if isinstance(comm, QuantizedReduceScatter) and comm.error_feedback:
                params, layouts, total = group._reduce_plan()
                yield [names[id(p.sharded_param)] for p in params], params, layouts, total, comm


def get_residual_state_dict(module: Module) -> Dict[str, Any]:
    """``{parameter name: DTensor}``: the error-feedback residual owed to each parameter's gradient, sharded
    like it (See [Note: Residual state]). Collective: every rank of ``module``'s mesh calls it."""
    out = {}
    for names, params, layouts, total, comm in _units(module):
        xp = _backend.array_module(params[0].sharded_param._data) if params else np
        owed = comm.take_residual(total, xp)
        for name, p, layout in zip(names, params, layouts):
            out[name] = p.sharded_grad(p.local_grad_from(owed, layout).copy())
    return out


def set_residual_state_dict(module: Module, state_dict: Dict[str, Any]) -> None:
    """Owe each parameter's residual in ``state_dict`` (as ``get_residual_state_dict`` returns, possibly
    loaded at another world size) to its gradient's next reduction. A parameter missing from it owes nothing.

    Raises:
        ValueError: a residual's shape is not its parameter's.
        KeyError: a name is no parameter of a unit with error feedback.
    """
    known = set()
    for names, params, layouts, total, comm in _units(module):
        xp = _backend.array_module(params[0].sharded_param._data) if params else np
        owed = xp.zeros(total, np.float32)
        for name, p, layout in zip(names, params, layouts):
            known.add(name)
            value = state_dict.get(name)
            if value is None:
                continue
            if tuple(value.shape) != tuple(p.global_shape):
                raise ValueError(f"residual of {name}: shape {tuple(value.shape)}, the parameter's is "
                                 f"{tuple(p.global_shape)}")
            local = value.to_local()._data if hasattr(value, "to_local") else value._data
            seg = layout.segment(owed)[:layout.stop - layout.start]
            seg[...] = p.to_front(xp.asarray(local, dtype=np.float32))
        comm.residuals = {key: v for key, v in comm.residuals.items() if key[1] != total}
        comm.pending[total] = owed
    unknown = sorted(set(state_dict) - known)
    if unknown:
        raise KeyError(f"residual state for {unknown[:3]}{' ...' if len(unknown) > 3 else ''}: no parameter of "
                       "a unit that reduces with QuantizedReduceScatter(error_feedback=True)")
