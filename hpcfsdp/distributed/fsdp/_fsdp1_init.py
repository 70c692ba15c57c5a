"""FullyShardedDataParallel's construction steps, in the order its __init__ runs them: argument checks, ignored
modules, device and meta materialisation, process groups, rank-0 sync, auto-wrap units, sharding with mixed
precision per unit, buffer casts, per-unit settings."""

import warnings

from ... import _backend
from ..._tensor import Tensor
from ...nn import Module, ModuleDict, ModuleList
from ._fsdp1_state import _FSDPState
from ._fully_shard import FSDPModule, MixedPrecisionPolicy, fully_shard
from ._fully_shard._fsdp_common import get_module_fsdp_state
from ._fully_shard._fsdp_state_dict import clean_fqn
from ._fully_shard._fully_shard import shard_container
from .api import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from .wrap import select_units


_HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)


def _check_args(module, mixed_precision, cpu_offload, backward_prefetch, param_init_fn, process_group,
                device_mesh, sharding_strategy):
    if not isinstance(module, Module):
        raise TypeError(f"FullyShardedDataParallel expects an nn.Module, got {type(module).__name__}")
    if isinstance(module, FSDPModule):
        raise RuntimeError("module is already managed by fully_shard / FullyShardedDataParallel")
    if not isinstance(sharding_strategy, ShardingStrategy):
        raise TypeError(f"sharding_strategy must be a ShardingStrategy, got {sharding_strategy!r}")
    if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"mixed_precision must be a MixedPrecision, got {type(mixed_precision).__name__}")
    if cpu_offload is not None and not isinstance(cpu_offload, CPUOffload):
        raise TypeError(f"cpu_offload must be a CPUOffload, got {type(cpu_offload).__name__}")
    if backward_prefetch is not None and not isinstance(backward_prefetch, BackwardPrefetch):
        raise TypeError(f"backward_prefetch must be a BackwardPrefetch or None, got {backward_prefetch!r}")
    if param_init_fn is not None and not callable(param_init_fn):  # PyTorch's ValueError and words
        raise ValueError(f"Expected {param_init_fn} to be callable but got {type(param_init_fn)}")
    if process_group is not None and device_mesh is not None:
        raise ValueError("Cannot pass both process_group and device_mesh at the same time. "
                         "Please just pass only one of them.")


def _ignored_params(root, ignored_modules, ignored_states) -> set:
    """Parameters FSDP leaves alone: those of ``ignored_modules`` and ``ignored_states`` (parameters or modules).
    PyTorch's checks and words: ``ignored_modules`` holds modules only, none of them FSDP instances; ignoring the
    root itself warns."""
    if ignored_modules is not None and ignored_states is not None:
        raise ValueError("Cannot pass both ignored_modules and ignored_states at the same time. "
                         "Please just pass ignored_states.")
    prefix = "`ignored_modules` should be an iterable of `torch.nn.Module`s "
    try:
        modules = list(ignored_modules) if ignored_modules is not None else []
    except TypeError as e:
        raise TypeError(prefix + f"but got {type(ignored_modules)}") from e
    if not all(isinstance(m, Module) for m in modules):  # PyTorch's ValueError and words
        kinds = sorted({type(m) for m in modules}, key=repr)
        raise ValueError(f"ignored_modules expects nn.Module list elements but got types {kinds}")
    states = list(ignored_states or ())
    if states and not (all(isinstance(x, Module) for x in states) or all(isinstance(x, Tensor) for x in states)):
        kinds = sorted({type(x) for x in states}, key=repr)
        raise ValueError(f"ignored_states expects all nn.Parameter or all nn.Module list elements but got types "
                         f"{kinds}")
    for m in modules:
        if isinstance(m, (FSDPModule, _FSDPState)):
            raise ValueError("`ignored_modules` should not include FSDP modules")
    if any(m is root for m in modules + [s for s in (ignored_states or ()) if isinstance(s, Module)]):
        warnings.warn("Trying to ignore the top-level module passed into the FSDP constructor itself will result "
                      f"in all parameters being ignored and is not well-supported: {root}", stacklevel=3)
    ignored = set()
    for item in modules + list(ignored_states or ()):
        if isinstance(item, Module):
            ignored.update(item.parameters())
        elif isinstance(item, Tensor):
            ignored.add(item)
        else:
            raise TypeError(f"ignored modules/states must be nn.Modules or Parameters, got {type(item).__name__}")
    return ignored


def _resolve_device(device_id):
    """``device_id`` as a device: an int is a CUDA ordinal (PyTorch's meaning); None keeps the module's."""
    if device_id is None:
        return None
    if isinstance(device_id, bool):
        raise TypeError(f"device_id must be an int or a device, got {device_id!r}")
    dev = _backend.device("cuda", device_id) if isinstance(device_id, int) else _backend.device(device_id)
    if dev.type == "cuda":
        from ... import accelerator

        n = accelerator.device_count()
        if dev.index is not None and not 0 <= dev.index < n:
            raise RuntimeError(f"device_id={device_id!r}: this process sees {n} CUDA device(s)")
    return dev


def _move_to_device(module: Module, device, ignored: set, ignored_modules: set) -> None:
    """``module.to(device)`` but for the ignored parameters and the ignored modules' tensors, which stay where
    they are (PyTorch's _move_module_to_device: an ignored meta module stays on meta, an ignored CPU one on CPU)."""
    skip = {id(x) for m in module.modules() if id(m) in ignored_modules for x in m.modules()}
    ignored_ids = {id(p) for p in ignored}

    def convert(t):
        return t if id(t) in ignored_ids else t.to(device=device)

    for m in module.modules():
        if id(m) not in skip:
            m._apply(convert, recurse=False)


def _has_meta(module: Module) -> bool:
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return any(_backend.is_meta_array(t._data) for t in tensors)


def _materialize_meta(module: Module, param_init_fn, device, ignored: set) -> None:
    """Give modules built on the meta device real storage: ``param_init_fn(m)`` on each module holding meta
    tensors, or else ``to_empty(device)`` and ``reset_parameters()`` (PyTorch's default)."""
    def wanted(m):
        own = list(m.parameters(recurse=False))
        return _has_meta(m) and not (own and all(p in ignored for p in own))

    todo = [m for m in module.modules() if wanted(m)]
    if not todo:
        return
    if param_init_fn is not None:
        for m in todo:
            param_init_fn(m)
    else:
        target = device if device is not None else _backend.device("cpu")
        for m in todo:
            m.to_empty(device=target, recurse=False)
            reset = getattr(m, "reset_parameters", None)
            if callable(reset):
                reset()
    still = [type(m).__name__ for m in module.modules() if wanted(m)]
    if still:
        raise RuntimeError(f"FSDP: modules {still} still hold meta tensors after "
                           f"{'param_init_fn' if param_init_fn else 'to_empty/reset_parameters'}")


def _group_rows(group):
    """Every rank's ``group`` as the rows of a rank array (collective over the default group): one row
    per distinct group, ordered by first rank; groups must be disjoint and of equal size."""
    import numpy as np

    from .. import distributed_c10d as c10d

    gathered = [None] * c10d.get_world_size()
    c10d.all_gather_object(gathered, c10d.get_process_group_ranks(group))
    rows = sorted({tuple(sorted(r)) for r in gathered})
    if len({len(r) for r in rows}) != 1 or len({x for r in rows for x in r}) != sum(len(r) for r in rows):
        raise ValueError(f"process_group: the ranks' groups must be disjoint and of equal size, got "
                         f"{[list(r) for r in rows]}")
    return np.array(rows)


def _mesh_from_process_group(process_group, strategy: ShardingStrategy, device_type: str):
    """A DeviceMesh over ``process_group`` (a pair ``(shard_group, replicate_group)`` for HYBRID_SHARD).

    One ProcessGroup: a 1-d mesh over it, without communication. The HYBRID_SHARD pair: collective over the
    default group (all ranks construct FSDP together, each with its own pair)."""
    import numpy as np

    from .. import distributed_c10d as c10d
    from ..device_mesh import DeviceMesh
    from ..process_group import ProcessGroup

    if strategy in _HYBRID:
        if not (isinstance(process_group, tuple) and len(process_group) == 2
                and all(isinstance(g, ProcessGroup) for g in process_group)):
            raise ValueError(f"{strategy.name} expects process_group to be None or a pair (intra-node shard "
                             f"group, inter-node replicate group), got {process_group!r}")
        shard_pg, replicate_pg = process_group
        mesh = _group_rows(shard_pg)  # (replicas, shard size)
        _, j = np.argwhere(mesh == c10d.get_rank())[0]
        if sorted(mesh[:, j].tolist()) != sorted(c10d.get_process_group_ranks(replicate_pg)):
            raise ValueError(f"process_group: the replicate group {c10d.get_process_group_ranks(replicate_pg)} "
                             f"must hold this rank's position in every shard group {mesh.tolist()}")
        return DeviceMesh(device_type, mesh, mesh_dim_names=("replicate", "shard"))
    if not isinstance(process_group, ProcessGroup):
        raise ValueError(f"{strategy.name} expects process_group to be a ProcessGroup or None, got "
                         f"{process_group!r}")
    name = "replicate" if strategy == ShardingStrategy.NO_SHARD else "shard"
    # this rank's group itself, no collective (as PyTorch's): the ranks outside it need not construct anything
    # (PyTorch's tests shard a model over half the ranks while the others return)
    mesh = DeviceMesh(device_type, np.array(c10d.get_process_group_ranks(process_group)), mesh_dim_names=(name,),
                      _init_backend=False)
    mesh._groups = [process_group]
    return mesh


def _sync_module_states(module: Module, mesh, ignored: set) -> None:
    """Broadcast the first mesh rank's parameters and buffers to every rank of the mesh (collective)."""
    from .. import distributed_c10d as c10d

    tensors = [p for p in module.parameters() if p not in ignored] + list(module.buffers())
    for dim in reversed(range(mesh.ndim)):  # inside each shard group, then across the replicas
        group = mesh.get_group(dim)
        if group.size() == 1:
            continue
        for t in tensors:
            if _backend.is_meta_array(t._data):
                raise ValueError("sync_module_states=True needs materialized tensors: pass param_init_fn or "
                                 "build the module off the meta device")
            c10d.broadcast(t, group=group, group_src=0)


def _select_units(module: Module, auto_wrap_policy, ignored: set, ignored_modules: set = frozenset()) -> list:
    """The submodules ``auto_wrap_policy`` makes units of, never an ignored module or one inside it (PyTorch's
    recursive wrap skips them)."""
    if auto_wrap_policy is None:
        return []
    for name, m in module.named_modules():  # PyTorch's check and words (ValueError)
        if isinstance(m, (FSDPModule, _FSDPState)):
            raise ValueError(f"FSDP auto wrapping requires modules to not already have FSDP applied but found "
                             f"{name} in\n{module}")
    units = select_units(module, auto_wrap_policy, {id(p) for p in ignored})
    inside = {id(x) for m in module.modules() if id(m) in ignored_modules for x in m.modules()}
    units = [u for u in units if id(u) not in inside]
    if not units:
        warnings.warn(f"auto_wrap_policy {auto_wrap_policy!r} wrapped no submodule of "
                      f"{type(module).__name__}: the whole model is one FSDP unit, so every rank "
                      "all-gathers all parameters at once", stacklevel=3)
    return units


def _mp_policy(mp: MixedPrecision | None, cast_inputs: bool) -> MixedPrecisionPolicy | None:
    if mp is None:
        return None
    return MixedPrecisionPolicy(param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype,
                                cast_forward_inputs=bool(cast_inputs and mp.param_dtype is not None))


def _shard(module: Module, units: list, mp: MixedPrecision | None, common: dict) -> None:
    """fully_shard every unit, children first, then the root; modules of the classes MixedPrecision ignores
    become full-precision units of their own."""
    mp_ignore = tuple(mp._module_classes_to_ignore) if mp else ()
    if mp is not None:
        fp32 = MixedPrecisionPolicy(param_dtype=_backend.float32, cast_forward_inputs=True)
        for m in module.modules():
            if isinstance(m, mp_ignore) and any(True for _ in m.parameters(recurse=False)):
                fully_shard(m, mp_policy=fp32, **common)
                _cast_output_to_input_dtype(m)
        if get_module_fsdp_state(module) is not None:  # the root itself is of an ignored class: it is that unit
            return
    for unit in units:
        if not isinstance(unit, mp_ignore):
            fully_shard(unit, mp_policy=_mp_policy(mp, mp is not None and mp.cast_forward_inputs), **common)
    root_policy = _mp_policy(mp, mp is not None and mp.cast_root_forward_inputs)
    if isinstance(module, (ModuleList, ModuleDict)) and type(module).forward is Module.forward:
        shard_container(module, mp_policy=root_policy, **common)  # PyTorch wraps containers too
    else:
        fully_shard(module, mp_policy=root_policy, **common)
    if mp is not None:  # an instance that turns out nested in another casts as a non-root (PyTorch decides then)
        get_module_fsdp_state(module)._nonroot_cast_forward_inputs = bool(mp.cast_forward_inputs
                                                                          and mp.param_dtype is not None)


def _cast_buffers(module: Module, mp: MixedPrecision | None, ignored_modules: set = frozenset()) -> dict:
    """Cast floating buffers to ``buffer_dtype`` (not those of the classes MixedPrecision ignores, nor of ignored
    modules); returns {buffer name as state dicts spell it: original dtype} for the ones cast here or by an
    instance nested inside (whose buffers are already cast), so a FULL state dict gives them back as they were."""
    ignored_modules = set(ignored_modules)
    for m in module.modules():  # as PyTorch: the modules nested instances ignore are ignored here too
        ignored_modules |= m.__dict__.get("_hp_fsdp1_ignored_modules", frozenset())
    module.__dict__["_hp_fsdp1_ignored_modules"] = frozenset(ignored_modules)
    original = {}
    for prefix, m in module.named_modules():  # nested instances' records, under this tree's names
        if isinstance(m, _FSDPState) and m is not module:
            for name, dtype in m.__dict__.get("_buffer_dtypes", {}).items():
                original[clean_fqn(f"{prefix}.{name}")] = dtype
    if mp is None or mp.buffer_dtype is None:
        return original
    bdt = _backend.to_dtype(mp.buffer_dtype)
    skip = tuple(mp._module_classes_to_ignore)
    skipped = {id(x) for m in module.modules() if isinstance(m, skip) or id(m) in ignored_modules
               for x in m.modules()}
    for prefix, m in module.named_modules():
        if id(m) in skipped:
            continue
        for name, b in m._buffers.items():
            if b is not None and _backend.is_floating_dtype(b.dtype) and b.dtype != bdt:
                original[clean_fqn(f"{prefix}.{name}" if prefix else name)] = b.dtype
                m._buffers[name] = b.to(dtype=bdt)
    return original


def _ignored_modules(ignored_modules, ignored_states) -> set:
    """Ids of the modules FSDP leaves alone (their buffers too)."""
    items = list(ignored_modules or ()) + [x for x in (ignored_states or ()) if isinstance(x, Module)]
    return {id(m) for m in items}


def _warn_on_overridden_mixed_precision(module: Module, mp: MixedPrecision) -> None:
    """PyTorch's warning: with an auto_wrap_policy, submodules of the classes MixedPrecision ignores become
    instances of their own without mixed precision."""
    classes = {type(m) for m in module.modules() if isinstance(m, tuple(mp._module_classes_to_ignore))}
    if classes:
        warnings.warn("Both mixed precision and an auto_wrap_policy were specified to FSDP, where the wrapped "
                      f"module has submodules of type:\n{classes}\nThese modules will be wrapped as separate FSDP "
                      "instacnes with mixed precision disabled.", stacklevel=3)


def _configure_units(module: Module, mp: MixedPrecision | None, forward_prefetch: bool, backward_prefetch) -> None:
    """Per-unit settings: prefetch directions, and low-precision gradients when MixedPrecision keeps them."""
    keep_low = bool(mp is not None and mp.keep_low_precision_grads)
    for m in module.modules():
        if not isinstance(m, FSDPModule):
            continue
        if not forward_prefetch:
            m.set_modules_to_forward_prefetch([])
        if backward_prefetch is None:
            m.set_modules_to_backward_prefetch([])
        elif backward_prefetch == BackwardPrefetch.BACKWARD_POST:
            m._get_fsdp_state()._backward_prefetch_post = True
        if keep_low:
            for group in m._get_fsdp_state()._all_param_groups():
                group.keep_low_precision_grads = True


def _cast_output_to_input_dtype(module):
    """A full-precision unit inside a low-precision model (a norm layer MixedPrecision ignores) computes in
    float32 and hands its output back in the dtype its input came in, as PyTorch's FSDP does."""
    seen = []

    def remember(mod, args, kwargs):
        ts = [a for a in args if isinstance(a, Tensor)]
        seen.append(ts[0].dtype if ts else None)

    def cast_back(mod, args, output):
        dt = seen.pop() if seen else None
        if dt is not None and isinstance(output, Tensor) and output.dtype != dt:
            return output.to(dtype=dt)
        return output

    module.register_forward_pre_hook(remember, prepend=True, with_kwargs=True)
    module.register_forward_hook(cast_back)
