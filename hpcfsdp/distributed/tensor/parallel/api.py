"""parallelize_module: apply tensor-parallel styles to a module's submodules by name."""

from __future__ import annotations

import fnmatch

from hpcfsdp.distributed.tensor.parallel.style import ParallelStyle

__all__ = ["parallelize_module"]


def parallelize_module(module, device_mesh=None, parallelize_plan=None):
    """Apply ``parallelize_plan`` ({submodule name or fnmatch pattern per dotted segment: ParallelStyle},
    or one ParallelStyle for ``module`` itself) over the 1-D tensor-parallel ``device_mesh``."""
    if device_mesh is None:
        raise ValueError("parallelize_module: device_mesh is required (the 1-D tensor-parallel mesh)")
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan._apply(module, device_mesh)
        return module
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict, got "
                        f"{type(parallelize_plan).__name__}")
    names = [n for n, _ in module.named_modules() if n]
    for key, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: plan entry {key!r} is {style!r}, expected a ParallelStyle")
        pat = key.split(".")
        hits = [n for n in names if len(n.split(".")) == len(pat)
                and all(fnmatch.fnmatchcase(a, b) for a, b in zip(n.split("."), pat))]
        if not hits:
            raise ValueError(f"parallelize_module: plan entry {key!r} matches no submodule of "
                             f"{type(module).__name__}")
        for n in hits:
            style._apply(module.get_submodule(n), device_mesh)
    return module
