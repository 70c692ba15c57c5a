"""fully_shard, FSDPModule and its controls, UnshardHandle, on hpcfsdp's autograd and MPI comm layer."""

import contextlib
import functools
import warnings
from typing import Any, Callable, Iterable

from ...tensor import Shard
from ._fsdp_api import AllGather, DataParallelMeshDims, MixedPrecisionPolicy, OffloadPolicy, ReduceScatter
from ._fsdp_common import DDPMeshInfo, FSDPMeshInfo, HSDPMeshInfo, get_module_fsdp_state, registry
from ._fsdp_init import (
    check_param_devices,
    get_device_from_mesh,
    get_managed_modules_and_params,
    get_mesh_info,
    get_post_forward_mesh_info,
    get_root_modules,
    init_default_mesh,
    validate_mesh,
    validate_module,
)
from ._fsdp_param import FSDPParam
from ._fsdp_param_group import FSDPParamGroup
from ._fsdp_state import FSDPState

__all__ = [
    "fully_shard",
    "FSDPModule",
    "UnshardHandle",
    "register_fsdp_forward_method",
    "get_cls_to_fsdp_cls",
    "disable_fsdp_module_new_init",
    "share_comm_ctx",
]

_cls_to_fsdp_cls: dict[type, type] = {}
_FULLY_SHARD_STATE_KEY = "fully_shard"
_enable_fsdp_module_new_init = True


def get_cls_to_fsdp_cls() -> dict[type, type]:
    """The cache mapping each original module class to its dynamically created ``FSDP<Class>`` subclass."""
    return _cls_to_fsdp_cls


def _as_fsdp_module(module: Any) -> Any:
    if isinstance(module, FSDPModule):
        return module
    original_cls = type(module)
    fsdp_cls = _cls_to_fsdp_cls.get(original_cls)
    if fsdp_cls is None:
        fsdp_cls = type(f"FSDP{original_cls.__name__}", (FSDPModule, original_cls),
                        {"__deepcopy__": _unimplemented_deepcopy})
        _cls_to_fsdp_cls[original_cls] = fsdp_cls
    module.__class__ = fsdp_cls
    return module


def _mesh_device_type(modules) -> str:
    for m in modules:
        for p in m.parameters():
            if p.device.type == "cuda":
                return "cuda"
    return "cpu"


def _ddp_as_hsdp(info: DDPMeshInfo) -> HSDPMeshInfo:
    """Replicate-only (NO_SHARD): shard over a group of one, all-reduce across the replicas."""
    pg = info.replicate_process_group
    self_group = pg.split(pg.rank(), 0)
    out = HSDPMeshInfo(info.mesh, None, self_group, 1, 0, replicate_mesh_dim=info.replicate_mesh_dim,
                       replicate_process_group=pg, replicate_world_size=info.replicate_world_size,
                       replicate_mesh_rank=info.replicate_mesh_rank)
    return out


def fully_shard(
    module: Any,
    *,
    mesh: Any = None,
    reshard_after_forward: bool | int | None = None,
    shard_placement_fn: Callable[[Any], Any] | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload_policy: OffloadPolicy | None = None,
    ignored_params: set[Any] | None = None,
    dp_mesh_dims: DataParallelMeshDims | None = None,
) -> Any:
    """Shard ``module``'s parameters over ``mesh`` (FSDP2); see [Note: Group lifecycle] and [Note: Hook order]."""
    input_is_list = isinstance(module, list)
    input_modules = tuple(module) if input_is_list else (module,)
    if not input_modules:
        raise ValueError("fully_shard expects at least one module")
    if len({id(item) for item in input_modules}) != len(input_modules):
        raise ValueError("fully_shard cannot receive the same module twice")
    for item in input_modules:
        validate_module(item)
        reg = registry(item)
        if _FULLY_SHARD_STATE_KEY in reg:
            raise AssertionError(  # PyTorch's composable contract asserts (AssertionError), in these words
                "Each distinct composable distributed API can only be applied to a module once. fully_shard has "
                f"already been applied to the following module:\n{item}")
        if "__replicate_state_key__" in reg or "__replicate_with_fsdp_state__" in reg:
            raise RuntimeError("fully_shard cannot be applied to a replicated module")
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, (bool, int)):
        raise ValueError(
            "reshard_after_forward should be a bool or an int representing the group size to reshard to, "
            f"not {reshard_after_forward!r}")
    if mp_policy is not None and not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    if offload_policy is not None and not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"offload_policy must be an OffloadPolicy, got {type(offload_policy).__name__}")
    if mesh is None:
        mesh = init_default_mesh(_mesh_device_type(input_modules))
    validate_mesh(mesh, dp_mesh_dims)
    mp_policy = mp_policy or MixedPrecisionPolicy()
    offload_policy = offload_policy or OffloadPolicy()
    mesh_info = get_mesh_info(mesh, dp_mesh_dims)
    auto_reshard_after_forward = reshard_after_forward is None
    if isinstance(mesh_info, DDPMeshInfo):
        mesh_info = _ddp_as_hsdp(mesh_info)
    if (mesh_info.is_spmd_mesh and not auto_reshard_after_forward
            and not isinstance(reshard_after_forward, bool) and isinstance(reshard_after_forward, int)):
        raise NotImplementedError("reshard_after_forward as int is not supported with an SPMD mesh")
    post_forward_mesh_info = get_post_forward_mesh_info(
        True if auto_reshard_after_forward else reshard_after_forward, mesh_info)
    device = get_device_from_mesh(mesh)
    root_modules = get_root_modules(input_modules)  # a list is one unit: hooks on its outermost modules
    managed, params = get_managed_modules_and_params(root_modules, ignored_params)
    check_param_devices(params, device)
    converted = tuple(_as_fsdp_module(item) for item in root_modules)
    state = FSDPState(list(converted), mp_policy)
    state._auto_reshard_after_forward = auto_reshard_after_forward
    state.mesh_info = mesh_info
    if params:
        fsdp_params = []
        for p, infos in params:
            dim = 0
            if shard_placement_fn is not None:
                placement = shard_placement_fn(p)
                if placement is not None:
                    if not isinstance(placement, Shard):
                        raise ValueError(f"shard_placement_fn must return a Shard or None, got {placement!r}")
                    dim = placement.dim
            fsdp_params.append(FSDPParam(p, infos, mesh_info, post_forward_mesh_info, dim, mp_policy))
        group = FSDPParamGroup(fsdp_params, mesh_info, post_forward_mesh_info, device, offload_policy)
        for fp in fsdp_params:
            fp.set_on_modules(fp.sharded_param)
        state._param_group = group
    state.register_hooks()
    state.register_state_dict_hooks()
    for m in list(converted) + [m for m in managed if m not in converted]:
        registry(m)[_FULLY_SHARD_STATE_KEY] = state
    return module if input_is_list else converted[0]


def shard_container(container: Any, **kwargs: Any) -> Any:
    """FSDP1's instance over an ``nn.ModuleList``/``nn.ModuleDict`` (no forward of its own, so fully_shard
    refuses it): its children that are not units yet form one unit (``fully_shard([...])``, whose hooks run when
    those children run), and the container carries that unit's state, or an empty one when an auto-wrap
    policy made every child a unit. Returns the container, now an FSDPModule."""
    kids = [c for c in container.children() if get_module_fsdp_state(c) is None]
    if kids:
        fully_shard(kids, **kwargs)
        state = get_module_fsdp_state(kids[0])
    else:
        state = FSDPState([], kwargs.get("mp_policy") or MixedPrecisionPolicy())
    converted = _as_fsdp_module(container)
    registry(converted)[_FULLY_SHARD_STATE_KEY] = state
    return converted


def _fully_shard_state(module: Any) -> FSDPState:
    state = get_module_fsdp_state(module)
    if state is None:
        raise RuntimeError("module is not managed by fully_shard")
    return state


fully_shard.state = _fully_shard_state


def _unimplemented_deepcopy(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("FSDP does not support deepcopy. Please use state dict for serialization.")


class FSDPModule:
    """Methods mixed into modules managed by :func:`fully_shard`."""

    _orig_cls_mro_index = 2

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        orig_cls = cls.__mro__[cls._orig_cls_mro_index]
        self = orig_cls.__new__(orig_cls, *args, **kwargs)
        if _enable_fsdp_module_new_init:
            self.__init__(*args, **kwargs)
        return self

    def reshard(self) -> None:
        """Free the unsharded parameters; module attributes become the sharded DTensor parameters."""
        for group in self._get_fsdp_state()._all_param_groups():
            group.reshard()

    def unshard(self, async_op: bool = False) -> "UnshardHandle | None":
        """All-gather the parameters; with ``async_op`` return a handle to wait on."""
        state = self._get_fsdp_state()
        groups = state._all_param_groups()
        for group in groups:
            group.lazy_init()
            group.unshard(async_op=async_op)
        handle = _UnshardHandleImpl(groups or None)
        if async_op:
            return handle
        handle.wait()
        return None

    def reset_iter_state(self) -> None:
        """Forget the current iteration's backward bookkeeping.

        Clears which units have run their pre-backward hook, the order in which units finished forward
        (the basis of backward prefetch) and the queued end-of-backward callback. Call it after an
        iteration that stopped part-way (an exception in forward or backward), so the next one starts clean.
        """
        self._get_fsdp_state()._reset_iter_state()

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """When false, the end of backward does not wait for the gradient reductions in flight. Set on the
        state's context: before the root's lazy init that is this module's own, which the root's replaces."""
        self._get_fsdp_state()._ctx.is_last_backward = bool(is_last_backward)

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: accumulate unsharded gradients locally, without communication (gradient accumulation)."""
        for module in _selected_modules(self, recurse):
            for group in module._get_fsdp_state()._all_param_groups():
                group.reduce_grads = bool(requires_gradient_sync)
                group.all_reduce_grads = bool(requires_gradient_sync)

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """HSDP: False skips the all-reduce across replicas (reduce-scatter only) for gradient accumulation."""
        for module in _selected_modules(self, recurse):
            for group in module._get_fsdp_state()._all_param_groups():
                group.all_reduce_grads = bool(requires_all_reduce)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """Choose whether the parameters are freed after forward and re-gathered in backward.

        Args:
            reshard_after_forward: True frees the unsharded parameters after forward (less memory, one more
                all-gather in backward); False keeps them until backward.
            recurse: also apply the setting to every ``FSDPModule`` under this one.

        Raises:
            ValueError: ``reshard_after_forward`` is not a bool.
        """
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward should be a bool, got {type(reshard_after_forward)}")
        for module in _selected_modules(self, recurse):
            state = module._get_fsdp_state()
            if not isinstance(state.mesh_info, FSDPMeshInfo):
                raise AssertionError("reshard_after_forward requires FSDP mesh info")
            state._auto_reshard_after_forward = False
            for group in state._all_param_groups():
                group.post_forward_mesh_info = get_post_forward_mesh_info(reshard_after_forward, group.mesh_info)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """Choose whether the parameters are freed after backward.

        False keeps them unsharded into the next forward, which saves an all-gather when gradients are
        accumulated over several micro-batches, at the cost of the unsharded parameters' memory.

        Args:
            reshard_after_backward: whether to reshard at the end of this module's backward.
            recurse: also apply the setting to every ``FSDPModule`` under this one.
        """
        for module in _selected_modules(self, recurse):
            for group in module._get_fsdp_state()._all_param_groups():
                group.reshard_after_backward = bool(reshard_after_backward)

    def set_modules_to_forward_prefetch(self, modules: Iterable[Any]) -> None:
        """Explicit forward prefetch: when this module's forward starts, also start gathering ``modules``.

        Args:
            modules: modules managed by ``fully_shard`` to all-gather early, in order (replaces any
                previous list).

        Raises:
            TypeError: an element is not a module managed by ``fully_shard``.
        """
        states = []
        for module in modules:
            if not isinstance(module, FSDPModule):
                raise TypeError(f"prefetch targets must be modules managed by fully_shard, got {type(module).__name__}")
            states.append(module._get_fsdp_state())
        self._get_fsdp_state()._states_to_forward_prefetch = states

    def set_modules_to_backward_prefetch(self, modules: Iterable[Any]) -> None:
        """Explicit backward prefetch: when this module's backward starts, also start gathering ``modules``.

        Args:
            modules: modules managed by ``fully_shard`` to all-gather early in backward, in order (replaces
                the default, which prefetches the module that ran before this one in forward).

        Raises:
            TypeError: an element is not a module managed by ``fully_shard``.
        """
        states = []
        for module in modules:
            if not isinstance(module, FSDPModule):
                raise TypeError(f"prefetch targets must be modules managed by fully_shard, got {type(module).__name__}")
            states.append(module._get_fsdp_state())
        self._get_fsdp_state()._states_to_backward_prefetch = states

    def set_custom_all_gather(self, comm: AllGather) -> None:
        """Use ``comm`` instead of the built-in all-gather for this module's parameter group.

        Raises:
            TypeError: ``comm`` is not an ``AllGather``.
            ValueError: the module has more than one parameter group.
        """
        if not isinstance(comm, AllGather):
            raise TypeError(f"custom all-gather must be an AllGather, got {type(comm).__name__}")
        state = self._get_fsdp_state()
        if len(state._all_param_groups()) > 1:
            raise ValueError("custom all-gather is unavailable with multiple parameter groups")
        for group in state._all_param_groups():
            group.all_gather_comm = comm

    def set_custom_reduce_scatter(self, comm: ReduceScatter) -> None:
        """Use ``comm`` instead of the built-in reduce-scatter for this module's gradients.

        Raises:
            TypeError: ``comm`` is not a ``ReduceScatter``.
            ValueError: the module has more than one parameter group.
        """
        if not isinstance(comm, ReduceScatter):
            raise TypeError(f"custom reduce-scatter must be a ReduceScatter, got {type(comm).__name__}")
        state = self._get_fsdp_state()
        if len(state._all_param_groups()) > 1:
            raise ValueError("custom reduce-scatter is unavailable with multiple parameter groups")
        for group in state._all_param_groups():
            bind = getattr(comm, "_bind", None)  # a comm with per-unit state serves one unit
            if bind is not None:
                bind(group)
            group.reduce_scatter_comm = comm

    def set_all_reduce_hook(self, hook: Any, *, stream: Any = None) -> None:
        """``hook(output)`` runs on each reduced gradient buffer (after the HSDP all-reduce)."""
        state = self._get_fsdp_state()
        if len(state._all_param_groups()) > 1:
            raise ValueError("all-reduce hooks are unavailable with multiple parameter groups")
        for group in state._all_param_groups():
            if stream is not None and group.mesh_info.is_hsdp:
                raise ValueError("stream cannot be set when using native HSDP")
            group.all_reduce_hook = hook

    def set_post_optim_event(self, event: Any) -> None:
        """The next all-gather waits on ``event`` (a CuPy event recorded after the optimizer step)."""
        state = self._get_fsdp_state()
        for group in state._all_param_groups():
            group.post_optim_event = event

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        """Older name of [set_gradient_divide_factor][hpcfsdp.distributed.fsdp.FSDPModule.set_gradient_divide_factor]."""
        self.set_gradient_divide_factor(factor)

    def set_gradient_divide_factor(self, factor: float) -> None:
        """Divide reduced gradients by ``factor`` instead of the data-parallel world size."""
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
            raise ValueError(f"gradient divide factor must be a positive number, got {factor!r}")
        for group in self._get_fsdp_state()._all_param_groups():
            group.gradient_divide_factor = factor

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        """True: the gradient reduction is a plain sum and the division by the data-parallel size (or the
        divide factor) happens locally after it, instead of inside the collective (AVG / pre-multiplied sum)."""
        for group in self._get_fsdp_state()._all_param_groups():
            group.force_sum_reduction_for_comms = bool(enable)

    def set_reduce_scatter_unused_params(self, reduce_scatter_unused_params: bool, *, recurse: bool = True) -> None:
        """True: parameters that got no gradient on this rank still receive the reduced (zero-padded) one."""
        for module in _selected_modules(self, recurse):
            for group in module._get_fsdp_state()._all_param_groups():
                group.reduce_scatter_unused_params = bool(reduce_scatter_unused_params)

    def set_reduce_scatter_max_input_buffers(self, max_input_buffers: int, *, recurse: bool = True) -> None:
        """At most this many gradient reductions in flight per group before the oldest is waited for."""
        if isinstance(max_input_buffers, bool) or not isinstance(max_input_buffers, int):
            raise TypeError(f"max_input_buffers must be an int, got {type(max_input_buffers).__name__}")
        if max_input_buffers < 1:
            raise ValueError(f"max_input_buffers must be a positive int, got {max_input_buffers}")
        for module in _selected_modules(self, recurse):
            for group in module._get_fsdp_state()._all_param_groups():
                group.reduce_scatter_max_input_buffers = max_input_buffers

    def set_separate_reduce_scatter_group(self, enable: bool = True, *, recurse: bool = True) -> None:
        """Reduce-scatter on a duplicate of the shard communicator (collective: call on every rank)."""
        new_groups: dict = {}
        for module in _selected_modules(self, recurse):
            for group in module._get_fsdp_state()._all_param_groups():
                if not enable:
                    group.reduce_scatter_group = None
                    continue
                pg = group.mesh_info.shard_process_group
                key = tuple(pg.world_ranks)
                if key not in new_groups:
                    new_groups[key] = pg.split(0, pg.rank())
                group.reduce_scatter_group = new_groups[key]

    def set_unshard_in_backward(self, unshard_in_backward: bool) -> None:
        """Whether backward all-gathers this module's parameters.

        False is for modules whose parameters take no part in the gradient computation of backward
        (their gradients are still reduced); it saves the all-gather.
        """
        for group in self._get_fsdp_state()._all_param_groups():
            group.unshard_in_backward = bool(unshard_in_backward)

    def set_allocate_memory_from_process_group_for_comm(self, enable: bool) -> None:
        """NCCL-specific in PyTorch. On MPI, communication buffers come from the array module's allocator
        (NumPy, or CuPy's pool); enabling it changes nothing, and a warning says so."""
        self._get_fsdp_state()
        if enable:
            warnings.warn("set_allocate_memory_from_process_group_for_comm has no effect on MPI: buffers come "
                          "from NumPy/CuPy allocators", stacklevel=2)

    def set_symm_mem_for_comm(self, backend: Any = "NCCL") -> None:
        """Symmetric memory is an NCCL/NVSHMEM feature; MPI collectives here do not use it. Warns."""
        self._get_fsdp_state()
        warnings.warn(f"set_symm_mem_for_comm({backend!r}) has no effect on MPI: collectives use ordinary "
                      "buffers", stacklevel=2)

    def _set_unshard_async_op(self, async_op: bool) -> None:
        for module in _selected_modules(self, True):
            for group in module._get_fsdp_state()._all_param_groups():
                group.unshard_async_op = bool(async_op)

    def _get_fsdp_state(self) -> FSDPState:
        state = get_module_fsdp_state(self)
        if state is None:
            raise RuntimeError("module is not managed by fully_shard")
        return state

    def _apply(self, fn, recurse=True):
        """``to()``, ``to_empty()`` and friends apply ``fn`` to each rank's shard, never to a full parameter."""
        state = self._get_fsdp_state()
        group = state._param_group
        if group is None or self is not state._modules[0]:
            return super()._apply(fn, recurse)
        self.reshard()
        hidden = [(m, name) for fp in group.fsdp_params for m, name in fp.module_infos]
        for m, name in hidden:
            m._parameters[name] = None
        try:
            result = super()._apply(fn, recurse)
            group.reallocate(fn)
        finally:
            for fp in group.fsdp_params:
                fp.set_on_modules(fp.sharded_param)
        return result


class UnshardHandle:
    """Returned by ``unshard(async_op=True)``; ``wait()`` blocks until the parameters are unsharded."""

    def wait(self) -> None:
        """Block until the all-gather the handle stands for has finished and the parameters are unsharded."""
        return None


class _UnshardHandleImpl(UnshardHandle):
    def __init__(self, fsdp_param_groups: list[FSDPParamGroup] | None) -> None:
        self._param_groups = fsdp_param_groups

    def wait(self) -> None:
        if self._param_groups is not None:
            for group in self._param_groups:
                group.wait_for_unshard()
            self._param_groups = None


def register_fsdp_forward_method(module: Any, method_name: str) -> None:
    """Run FSDP's forward hooks around ``module.method_name`` (e.g. ``generate``) as around ``forward``."""
    if not isinstance(module, FSDPModule):
        return
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module)} does not have a method {method_name}")
    orig_method = getattr(module, method_name)

    @functools.wraps(orig_method)
    def wrapped_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = self._get_fsdp_state()
        args, kwargs = state._pre_forward(self, args, kwargs)
        output = orig_method(*args, **kwargs)
        return state._post_forward(self, args, output)

    setattr(module, method_name, wrapped_method.__get__(module, type(module)))


def share_comm_ctx(modules: list[FSDPModule]) -> None:
    """Share one communication context among ``modules``. On MPI every collective of a process already
    runs on its one communication thread, in issue order, so the context is shared by construction;
    this only checks that every module is managed by fully_shard."""
    for module in modules:
        if not isinstance(module, FSDPModule):
            raise ValueError(f"expected managed module, got {module}")


def _selected_modules(module: Any, recurse: bool) -> list[Any]:
    if not recurse:
        return [module]
    return [item for item in module.modules() if isinstance(item, FSDPModule)]


@contextlib.contextmanager
def disable_fsdp_module_new_init():
    """Context manager: while active, constructing an ``FSDP<Class>`` does not call ``__init__``.

    Used when code builds a new instance of a converted class (``type(m)(...)``) and initializes it itself.
    """
    global _enable_fsdp_module_new_init
    previous = _enable_fsdp_module_new_init
    _enable_fsdp_module_new_init = False
    try:
        yield
    finally:
        _enable_fsdp_module_new_init = previous
