"""distribute_module: turn a module's parameters and buffers into DTensors and hook its inputs and outputs."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

from hpcfsdp.distributed.device_mesh import DeviceMesh
from hpcfsdp.distributed.tensor._dtensor import DTensor, distribute_tensor
from hpcfsdp.distributed.tensor.placement_types import Replicate
from hpcfsdp.nn.modules.module import Module
from hpcfsdp.nn.parameter import Parameter

__all__ = ["distribute_module"]


def _replicate_params_buffers(m: Module, mesh: DeviceMesh) -> None:
    """Every parameter and buffer of ``m`` itself that is not a DTensor yet, replicated over ``mesh``."""
    full_replicate = [Replicate()] * mesh.ndim
    for key, param in m._parameters.items():
        if param is not None and not isinstance(param, DTensor):
            m.register_parameter(key, Parameter(distribute_tensor(param.detach(), mesh, full_replicate),
                                                requires_grad=param.requires_grad))
    for key, buffer in m._buffers.items():
        if buffer is not None and not isinstance(buffer, DTensor):
            m._buffers[key] = distribute_tensor(buffer, mesh, full_replicate)


def _hook_arity(fn: Callable, what: str) -> int:
    n = len(inspect.signature(fn).parameters)
    if n == 2:
        warnings.warn(f"Deprecating {what} that takes two arguments (inputs, device_mesh), please use {what} that "
                      "takes in (module, inputs, device_mesh) instead!", FutureWarning, stacklevel=3)
    elif n != 3:
        raise ValueError(f"{what} should take in 3 arguments, but got {n} arguments!")
    return n


def distribute_module(module: Module, device_mesh: DeviceMesh | None = None,
                      partition_fn: Callable[[str, Module, DeviceMesh], None] | None = None,
                      input_fn: Callable[[Module, Any, DeviceMesh], Any] | None = None,
                      output_fn: Callable[[Module, Any, DeviceMesh], Any] | None = None) -> Module:
    """PyTorch's distribute_module: ``partition_fn(name, submodule, mesh)`` for every submodule (in
    ``named_modules`` order), then every parameter and buffer not made a DTensor by it is replicated over the
    mesh (all of them when ``partition_fn`` is None; collective). ``input_fn(module, inputs, mesh)`` becomes a
    forward pre-hook and ``output_fn(module, outputs, mesh)`` a forward hook (their return values replace the
    inputs/outputs). Once per module. Returns ``module``."""
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module should only be called once on a module, but it has already been "
                           "called on this module!")
    if device_mesh is None:
        raise ValueError("distribute_module: device_mesh is required (hpcfsdp has no current-mesh context); "
                         "pass init_device_mesh(...)")
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"distribute_module: device_mesh must be a DeviceMesh, got {type(device_mesh).__name__}")
    if partition_fn is None:
        for sub in module.modules():
            _replicate_params_buffers(sub, device_mesh)
    else:
        for name, sub in module.named_modules():
            partition_fn(name, sub, device_mesh)
            _replicate_params_buffers(sub, device_mesh)
    if input_fn is not None:
        if _hook_arity(input_fn, "input_fn") == 2:
            module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, device_mesh))
        else:
            module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        if _hook_arity(output_fn, "output_fn") == 2:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(outputs, device_mesh))
        else:
            module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    module._distribute_module_applied = True
    return module
