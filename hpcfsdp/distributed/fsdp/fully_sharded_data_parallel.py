"""FullyShardedDataParallel (FSDP1-style entry point) built on fully_shard: strategies, auto-wrap, precision,
offload, prefetch, no_sync, summon_full_params, clip_grad_norm_ and the state-dict type API."""

import contextlib
import itertools
import warnings
import weakref
from typing import Any, Callable, Iterable

from ... import _backend
from ..._tensor import Tensor
from ...nn import Module
from ...nn.utils import clip_grad_norm_ as _clip_grad_norm
from ..tensor import DTensor
from . import _fsdp1_optim_state as _osd
from . import _state_dict_utils as sdu
from ._fully_shard import (
    CPUOffloadPolicy,
    ReduceScatter,
    FSDPModule,
    OffloadPolicy,
)
from ._fsdp1_init import (
    _cast_buffers,
    _check_args,
    _configure_units,
    _ignored_modules,
    _ignored_params,
    _materialize_meta,
    _mesh_from_process_group,
    _move_to_device,
    _resolve_device,
    _select_units,
    _shard,
    _sync_module_states,
    _warn_on_overridden_mixed_precision,
)
from ._fsdp1_state import _FSDPState, fsdp1_instances, fsdp1_root, state_dict_settings
from ._fully_shard._fsdp_common import get_module_fsdp_state
from ._fully_shard._fsdp_state_dict import clean_fqn, fsdp_groups
from ._strategy import strategy_kwargs, strategy_mesh
from ._unshard_params import summon_full_params as _summon_full_params
from .api import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    OptimStateDictConfig,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)

__all__ = ["FullyShardedDataParallel", "FSDP"]

_DEFAULT_CONFIGS = {
    StateDictType.FULL_STATE_DICT: (FullStateDictConfig, FullOptimStateDictConfig),
    StateDictType.LOCAL_STATE_DICT: (LocalStateDictConfig, LocalOptimStateDictConfig),
    StateDictType.SHARDED_STATE_DICT: (ShardedStateDictConfig, ShardedOptimStateDictConfig),
}


# [Note: FSDP1 on fully_shard]
# FullyShardedDataParallel is a thin wrapper: every auto-wrapped submodule and then the wrapped module
# itself become fully_shard units, and the wrapped module keeps its own parameter names (no
# ``_fsdp_wrapped_module.`` prefix). Parameters are always the original ones, sharded as DTensors (what
# PyTorch calls use_orig_params=True); ``use_orig_params=False`` is accepted and behaves the same,
# since there is no flat parameter to expose. ``limit_all_gathers`` is accepted: an unit's all-gather
# is only issued one unit ahead (prefetch) and every collective of a process runs in order on one
# communication thread, so at most two units are unsharded at once either way. ``sync_module_states``
# broadcasts rank 0's parameters and buffers before sharding, on CPU too (PyTorch needs a GPU for it).


# [Note: Nested FSDP1 wrappers]
# The wrapper holds the module as its child `_fsdp_wrapped_module` (PyTorch's name; `.module` reads it). A
# wrapper nested inside another one's module (wrapped by hand or with enable_wrap/wrap) would put that
# component into every name seen from outside; as in PyTorch, state dicts drop it (a post hook) and
# load_state_dict puts it back (a pre hook), and the wrappers' named_parameters/named_buffers drop it, so
# names are the unwrapped model's. The outer wrapper's state dict takes the inner ones' entries as a plain
# module's (DTensors), and turns every DTensor into the state-dict type's form in one place.
_WRAPPED = "_fsdp_wrapped_module"
_WRAPPED_PREFIX = _WRAPPED + "."


def _drop_wrapper_prefix(module, state_dict, prefix, *args):
    for key in list(state_dict.keys()):
        if key.startswith(prefix + _WRAPPED_PREFIX):
            state_dict[prefix + key[len(prefix) + len(_WRAPPED_PREFIX):]] = state_dict.pop(key)
    return state_dict


def _add_wrapper_prefix(module, state_dict, prefix, *args):
    for key in list(state_dict.keys()):
        if key.startswith(prefix) and not key.startswith(prefix + _WRAPPED_PREFIX):
            state_dict[prefix + _WRAPPED_PREFIX + key[len(prefix):]] = state_dict.pop(key)


def _clean_incompatible_keys(module, incompatible_keys):
    """load_state_dict's missing and unexpected keys under the names state dicts use (PyTorch's post hook: in
    place, so a strict load's error names them so too)."""
    for keys in incompatible_keys:
        keys[:] = [clean_fqn(k) for k in keys]


class FullyShardedDataParallel(Module, _FSDPState):
    """Wraps ``module`` and shards it with :func:`fully_shard`: each auto-wrapped submodule becomes a unit,
    then the root. Parameter and state-dict names are the wrapped module's own (no prefix); attributes
    and items the wrapper lacks are looked up on the wrapped module. See [Note: FSDP1 on fully_shard].

    ``process_group``: a ProcessGroup to shard over, or for HYBRID_SHARD a pair ``(shard_group,
    replicate_group)`` (intra-node, inter-node); not together with ``device_mesh``. ``device_id``: the
    device (int: CUDA ordinal) the module is moved to before sharding. ``param_init_fn(module)`` is
    called on every submodule holding meta parameters or buffers (without it, such modules are
    ``to_empty``'d and ``reset_parameters()``'d). ``sync_module_states``: parameters and buffers start
    equal to rank 0's on every rank (a broadcast at wrap time; works on CPU, unlike PyTorch's).
    """

    def __init__(
        self,
        module: Module,
        process_group: Any = None,
        sharding_strategy: ShardingStrategy | None = None,
        cpu_offload: CPUOffload | None = None,
        auto_wrap_policy: Any = None,
        backward_prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE,
        mixed_precision: MixedPrecision | None = None,
        ignored_modules: Iterable[Module] | None = None,
        param_init_fn: Callable[[Module], None] | None = None,
        device_id: Any = None,
        sync_module_states: bool = False,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
        use_orig_params: bool = False,
        ignored_states: Iterable[Any] | None = None,
        device_mesh: Any = None,
    ):
        super().__init__()
        prev = module.__dict__.get("_hp_fsdp1_wrapper") if isinstance(module, FSDPModule) else None
        prev = prev() if prev is not None else None
        if prev is not None and prev._fsdp_wrapped_module is module:  # wrapped again (PyTorch allows it)
            settings = (process_group, sharding_strategy, cpu_offload, auto_wrap_policy, mixed_precision,
                        ignored_modules, param_init_fn, device_mesh, ignored_states)
            if (any(x is not None for x in settings) or sync_module_states or forward_prefetch or use_orig_params
                    or not limit_all_gathers or backward_prefetch is not BackwardPrefetch.BACKWARD_PRE):
                raise RuntimeError(
                    f"{type(module).__name__} is already the module of a FullyShardedDataParallel instance; wrapping "
                    "it again reuses that instance's sharding, so pass no other settings than device_id (or build "
                    "the model anew to shard it differently)")
            _adopt_wrapper(self, prev, module)
            return
        sharding_strategy = ShardingStrategy.FULL_SHARD if sharding_strategy is None else sharding_strategy
        # read once: a generator (PyTorch's tests pass one) would be empty the second time, and the ignored
        # parameters then sharded like the others
        ignored_modules = _as_list(ignored_modules, "ignored_modules")
        ignored_states = _as_list(ignored_states, "ignored_states")
        _check_args(module, mixed_precision, cpu_offload, backward_prefetch, param_init_fn, process_group,
                    device_mesh, sharding_strategy)
        if (sharding_strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
                and process_group is None and device_mesh is None and auto_wrap_policy is None):
            # PyTorch's check: hand-wrapped instances could not be sure to share one pair of groups
            raise ValueError(f"Manual wrapping with {sharding_strategy} requires explicit specification of process "
                             "group or device_mesh.")
        ignored = _ignored_params(module, ignored_modules, ignored_states)
        device = _resolve_device(device_id)
        _materialize_meta(module, param_init_fn, device, ignored)
        if device is not None:
            _move_to_device(module, device, ignored, _ignored_modules(ignored_modules, ignored_states))
        device_type = "cuda" if any(p.device.type == "cuda" for p in module.parameters()) else "cpu"
        mesh = _mesh_from_process_group(process_group, sharding_strategy, device_type) \
            if process_group is not None else device_mesh
        mesh, dims = strategy_mesh(sharding_strategy, device_type, mesh)
        if sync_module_states:
            _sync_module_states(module, mesh, ignored)
        offload: OffloadPolicy = CPUOffloadPolicy() if cpu_offload and cpu_offload.offload_params else OffloadPolicy()
        common = dict(mesh=mesh, dp_mesh_dims=dims, offload_policy=offload, ignored_params=ignored or None,
                      **strategy_kwargs(sharding_strategy))
        units = _select_units(module, auto_wrap_policy, ignored, _ignored_modules(ignored_modules, ignored_states))
        if mixed_precision is not None and auto_wrap_policy is not None:
            _warn_on_overridden_mixed_precision(module, mixed_precision)
        _shard(module, units, mixed_precision, common)
        for m in module.modules():  # the units made here (nested instances tagged theirs): see no_sync
            if isinstance(m, FSDPModule) and "_hp_fsdp1_strategy" not in m.__dict__:
                m.__dict__["_hp_fsdp1_strategy"] = sharding_strategy
        self._buffer_dtypes = _cast_buffers(module, mixed_precision, _ignored_modules(ignored_modules, ignored_states))
        self._fsdp_wrapped_module = module
        for inner in fsdp1_instances(module, required=False):  # hand-nested instances: not roots (check_is_root)
            inner.__dict__["_hp_wrapped_by_fsdp"] = True
        self._register_state_dict_hook(_drop_wrapper_prefix)
        self._register_load_state_dict_pre_hook(_add_wrapper_prefix, with_module=True)
        self.register_load_state_dict_post_hook(_clean_incompatible_keys)
        self.sharding_strategy = sharding_strategy
        self.mixed_precision = mixed_precision
        self.cpu_offload = cpu_offload or CPUOffload()
        self.backward_prefetch = backward_prefetch
        self.forward_prefetch = bool(forward_prefetch)
        self.limit_all_gathers = bool(limit_all_gathers)
        self.use_orig_params = bool(use_orig_params)
        self.compute_device = device if device is not None else _backend.device(device_type)
        self._device_mesh = mesh
        # PyTorch's attributes: the shard group (HYBRID_SHARD: inside the node), this rank in it, its size
        self.process_group = mesh.get_group(mesh.ndim - 1)
        self.rank, self.world_size = self.process_group.rank(), self.process_group.size()
        _configure_units(module, mixed_precision, forward_prefetch, backward_prefetch)
        self._state_dict_settings = StateDictSettings(StateDictType.FULL_STATE_DICT, FullStateDictConfig(),
                                                      FullOptimStateDictConfig())
        module.__dict__["_hp_fsdp1_wrapper"] = weakref.ref(self)  # a second FSDP(module) adopts this one

    # -- module plumbing: names are the wrapped module's; see [Note: Nested FSDP1 wrappers] --------------
    @property
    def module(self) -> Module:
        """The wrapped module."""
        return self._fsdp_wrapped_module

    def __getattr__(self, name: str) -> Any:
        """Attributes the wrapper lacks come from the wrapped module (``fsdp_model.blocks``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            wrapped = self.__dict__.get("_modules", {}).get(_WRAPPED)
            if wrapped is None:
                raise
            return getattr(wrapped, name)

    def __getitem__(self, key: int) -> Any:
        """Indexing reaches the wrapped module (an ``nn.Sequential`` or ``nn.ModuleList``)."""
        return self.module.__getitem__(key)

    def forward(self, *args, **kwargs):
        """Run the wrapped module (FSDP's hooks gather and free the parameters around it)."""
        if not self.__dict__.get("_hp_checked_homogeneous"):  # PyTorch's lazy-init check, once per root
            _check_homogeneous(self)
            self.__dict__["_hp_checked_homogeneous"] = True
        return self.module(*args, **kwargs)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """The wrapped module's named parameters, under their original names (no wrapper prefix); always the
        sharded parameters, whether or not a unit is unsharded now (PyTorch's FSDP1 hands out the same objects
        at any time, so an optimizer built between a forward and its backward trains them)."""
        sharded = {id(fp.unsharded_param): fp.sharded_param
                   for g in fsdp_groups(self.module) for fp in g.fsdp_params if fp.unsharded_param is not None}
        for name, p in self._own_then_wrapped("named_parameters", prefix, recurse, remove_duplicate):
            yield name, sharded.get(id(p), p)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """The wrapped module's named buffers, under their original names (no wrapper prefix)."""
        yield from self._own_then_wrapped("named_buffers", prefix, recurse, remove_duplicate)

    def _own_then_wrapped(self, call: str, prefix: str, recurse: bool, remove_duplicate: bool):
        """As PyTorch's (Module's walk with the wrapper component dropped): the instance's own entries (one
        registered on the FSDP instance itself), then with ``recurse`` the wrapped module's."""
        seen = set()
        own = getattr(super(), call)(prefix=prefix, recurse=False, remove_duplicate=remove_duplicate)
        inner = getattr(self.module, call)(prefix=prefix, recurse=True, remove_duplicate=remove_duplicate) \
            if recurse else ()
        for name, t in itertools.chain(own, inner):
            if remove_duplicate:
                if id(t) in seen:
                    continue
                seen.add(id(t))
            yield name.replace(_WRAPPED_PREFIX, ""), t

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The wrapped module's state dict of the current state-dict type; buffers that MixedPrecision's
        ``buffer_dtype`` cast come back in their original dtype, as PyTorch's FSDP returns them. Inside an
        outer wrapper's state dict (``destination`` given) this one adds its entries as a plain module."""
        if args or destination is not None:
            if _STATE_DICT_DEPTH[0] or args:  # inside an outer wrapper's state dict: that one converts
                return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
            # a plain module holds this instance: its entries, converted by its own state-dict type
            for k, v in self.state_dict(prefix=prefix, keep_vars=keep_vars).items():
                destination[k] = v
            return destination
        s = self._state_dict_settings
        _STATE_DICT_DEPTH[0] += 1
        try:
            sd = sdu.model_state_dict(self.module, s.state_dict_type, s.state_dict_config)
        finally:
            _STATE_DICT_DEPTH[0] -= 1
        for name, dtype in self._buffer_dtypes.items():
            v = sd.get(name)
            if isinstance(v, Tensor) and v.dtype != dtype:
                sd[name] = v.to(dtype=dtype)
        if prefix:  # every key under ``prefix``, as Module.state_dict (it was dropped: a silent rename)
            sd = type(sd)((prefix + k, v) for k, v in sd.items())
        return sd

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict of the current state-dict type (see ``state_dict_type``).

        Args:
            state_dict: FULL: full tensors; SHARDED: DTensors; LOCAL: this rank's flat pieces.
            strict: raise on missing or unexpected keys.
            assign: accepted for signature compatibility; values are always copied into the sharded parameters.

        Returns:
            A named tuple of ``missing_keys`` and ``unexpected_keys``.
        """
        s = self._state_dict_settings
        result = sdu.load_model_state_dict(self.module, state_dict, s.state_dict_type, strict=strict)
        _cast_buffers(self.module, self.mixed_precision)  # loaded buffers take the compute buffer dtype again
        return result

    # -- FSDP1 controls -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally, unsharded and unreduced, inside this context. As PyTorch's FSDP1, the
        units of strategies that keep their parameters after forward (SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2) keep
        them after a backward run here too, so the next forward gathers nothing."""
        keep = [m for m in self.module.modules() if isinstance(m, FSDPModule) and m.__dict__.get(
            "_hp_fsdp1_strategy") in (ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy._HYBRID_SHARD_ZERO2)]
        self.module.set_requires_gradient_sync(False)
        for m in keep:
            m.set_reshard_after_backward(False, recurse=False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)
            for m in keep:
                m.set_reshard_after_backward(True, recurse=False)

    def apply(self, fn):
        """``fn`` on every submodule with the full parameters summoned and written back (PyTorch's FSDP1
        ``apply``: an initialisation sees whole weights); not inside ``summon_full_params``."""
        if _APPLY_DEPTH[0]:  # reached by an outer instance's apply, which summoned this tree already
            return super().apply(fn)
        with FullyShardedDataParallel.summon_full_params(self, writeback=True):
            _APPLY_DEPTH[0] += 1
            try:
                return super().apply(fn)
            finally:
                _APPLY_DEPTH[0] -= 1

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Reduce every unit's gradients with ``hook(state, grad, output)`` instead of the built-in reduce-scatter
        (the hook divides; see hpcfsdp.distributed.algorithms._comm_hooks); under NO_SHARD ``hook(state, grad)``
        with the unit's whole flat gradient, which the hook all-reduces in place (``allreduce_hook``). Root only,
        once, not hybrid strategies: PyTorch's checks."""
        if not self.check_is_root():
            raise AssertionError("register_comm_hook can only be called on a root instance.")
        wrappers = [self] + [w for w in fsdp1_instances(self.module, required=False) if w is not self]
        for w in wrappers:
            if w.sharding_strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
                raise AssertionError(f"Communication hook is not supported for hybrid strategies: {w.sharding_strategy}")
            if w.__dict__.get("_comm_hook") is not None:
                raise AssertionError("A communication hook is already registered")
            if not callable(hook):
                raise ValueError(f"The communication hook must be callable but got {hook}")
        for w in wrappers:
            w.__dict__["_comm_hook"], w.__dict__["_comm_hook_state"] = hook, state
        no_shard = {id(g) for m in self.module.modules() if isinstance(m, FSDPModule)
                    and m.__dict__.get("_hp_fsdp1_strategy") == ShardingStrategy.NO_SHARD
                    for g in m._get_fsdp_state()._all_param_groups()}
        for group in fsdp_groups(self.module):  # the hook reduces and divides: the unit only sums
            group.reduce_scatter_comm = _HookReduceScatter(state, hook, all_reduce=id(group) in no_shard)
            group.replicas_reduced_by_comm = id(group) in no_shard
            group.gradient_divide_factor = 1.0
            group.force_sum_reduction_for_comms = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """Clip the sharded gradients by their global norm (one all-reduce); returns the total norm as a
        plain (full) tensor, as PyTorch's FSDP1 does."""
        state = get_module_fsdp_state(self.module)
        if state is not None and state._is_root is False:  # nested in another instance (PyTorch's check)
            raise RuntimeError("`clip_grad_norm_()` should only be called on the root FSDP instance")
        if not any(p.grad is not None for p in self.parameters()):  # PyTorch's warning (this rank)
            warnings.warn(f"Called FSDP.clip_grad_norm_() on rank {self.rank} with no gradients -- returning the "
                          "total norm in the default dtype float32", stacklevel=2)
        total = _clip_grad_norm(list(self.parameters()), max_norm, norm_type=norm_type)
        return total.full_tensor() if isinstance(total, DTensor) else total

    @staticmethod
    def summon_full_params(module, recurse: bool = True, writeback: bool = True, rank0_only: bool = False,
                           offload_to_cpu: bool = False, with_grads: bool = False):
        """A context in which module attributes are the full (unsharded, full-precision) parameters.

        ``recurse``: every FSDP unit under ``module`` (else only ``module``'s own). ``writeback``: changes
        to the full parameters are copied into the shards on exit. ``rank0_only``: only global rank 0
        holds the full parameters; the others keep seeing their shards (not with ``writeback``).
        ``offload_to_cpu``: the full parameters live in host memory. ``with_grads``: the full gradients
        are gathered too and visible as ``param.grad``, written back as the parameters are. Under NO_SHARD changes persist
        even with ``writeback=False`` (PyTorch's FSDP1 exposes the unit's own storage then), unless ``offload_to_cpu``.
        Collective: every rank must enter it.
        """
        if with_grads and isinstance(module, FullyShardedDataParallel) and not module.use_orig_params:
            raise NotImplementedError(f"with_grads={with_grads}, use_orig_params={module.use_orig_params}, "
                                      f"offload_to_cpu={offload_to_cpu} is not supported yet")
        return _summon_full_params(fsdp1_root(module), recurse=recurse, writeback=writeback, rank0_only=rank0_only,
                                   offload_to_cpu=offload_to_cpu, with_grads=with_grads)

    # -- state-dict type API ----------------------------------------------------------------------------
    @staticmethod
    def set_state_dict_type(module, state_dict_type: StateDictType, state_dict_config: StateDictConfig | None = None,
                            optim_state_dict_config: OptimStateDictConfig | None = None) -> StateDictSettings:
        """Set how ``module.state_dict()`` (and FSDP.optim_state_dict) work; returns the previous settings."""
        if not isinstance(state_dict_type, StateDictType):
            raise TypeError(f"state_dict_type must be a StateDictType, got {state_dict_type!r}")
        sd_cls, osd_cls = _DEFAULT_CONFIGS[state_dict_type]
        state_dict_config = state_dict_config if state_dict_config is not None else sd_cls()
        optim_state_dict_config = optim_state_dict_config if optim_state_dict_config is not None else osd_cls()
        if type(state_dict_config) is not sd_cls and not isinstance(state_dict_config, sd_cls):
            raise RuntimeError(f"Expected state_dict_config of type {sd_cls.__name__} for {state_dict_type.name}, "
                               f"got {type(state_dict_config).__name__}")
        if not isinstance(optim_state_dict_config, osd_cls):
            raise RuntimeError(f"Expected optim_state_dict_config of type {osd_cls.__name__} for "
                               f"{state_dict_type.name}, got {type(optim_state_dict_config).__name__}")
        wrappers = fsdp1_instances(module)
        prev = wrappers[0]._state_dict_settings
        new = StateDictSettings(state_dict_type, state_dict_config, optim_state_dict_config)
        for w in wrappers:
            w._state_dict_settings = new
        return prev

    @staticmethod
    def get_state_dict_type(module) -> StateDictSettings:
        """The state-dict settings shared by every FSDP instance under ``module``.

        Raises:
            ValueError: the instances under ``module`` have different settings.
        """
        return state_dict_settings(module)

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type: StateDictType, state_dict_config: StateDictConfig | None = None,
                        optim_state_dict_config: OptimStateDictConfig | None = None):
        """Context manager: ``set_state_dict_type`` on entry, the previous settings restored on exit.

        Args:
            module: the root FSDP module (every FSDP instance under it is set).
            state_dict_type: FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT.
            state_dict_config: options of the model state dict (default: the type's default config).
            optim_state_dict_config: options of the optimizer state dict.
        """
        prev = FullyShardedDataParallel.set_state_dict_type(module, state_dict_type, state_dict_config,
                                                            optim_state_dict_config)
        try:
            yield
        finally:
            FullyShardedDataParallel.set_state_dict_type(module, prev.state_dict_type, prev.state_dict_config,
                                                         prev.optim_state_dict_config)

    # -- optimizer state: see _fsdp1_optim_state.py -------------------------------------------------------------
    @staticmethod
    def optim_state_dict(model, optim, optim_state_dict: dict | None = None, group=None) -> dict:
        """The optimizer's state keyed by parameter name (FULL: gathered tensors, on ``group``'s rank 0 only with
        ``rank0_only``; SHARDED: DTensors). ``optim_state_dict``: convert this one instead of
        ``optim.state_dict()`` (without "param_groups", the result has none)."""
        return _osd.optim_state_dict(model, optim, optim_state_dict, group)

    @staticmethod
    def optim_state_dict_to_load(model, optim, optim_state_dict: dict, is_named_optimizer: bool = False,
                                 load_directly: bool = False, group=None) -> dict:
        """Turn a name-keyed optimizer state dict (FULL or SHARDED) into ``optim.load_state_dict`` input (FULL with
        ``rank0_only``: read on ``group``'s rank 0 and broadcast)."""
        return _osd.optim_state_dict_to_load(model, optim, optim_state_dict, load_directly, group)

    # -- FSDP1's older optimizer-state API (deprecated in PyTorch, still in its tutorials) -----------------------
    @staticmethod
    def full_optim_state_dict(model, optim, optim_input=None, rank0_only: bool = True, group=None) -> dict:
        """The whole optimizer state, gathered, keyed by parameter name as PyTorch's (every rank of ``group``
        takes part; with ``rank0_only`` the others get ``{}``). ``optim_input`` (deprecated, warns): what the
        optimizer was built from. Deprecated in PyTorch for ``optim_state_dict``."""
        return _osd.full_optim_state_dict(model, optim, optim_input, rank0_only, group)

    @staticmethod
    def sharded_optim_state_dict(model, optim, group=None) -> dict:
        """This rank's optimizer state as DTensors, keyed by parameter name (``optim_state_dict`` under
        SHARDED_STATE_DICT). Deprecated in PyTorch."""
        return _osd.sharded_optim_state_dict(model, optim, group)

    @staticmethod
    def shard_full_optim_state_dict(full_optim_state_dict: dict, model, optim_input=None, optim=None) -> dict:
        """``optim.load_state_dict`` input from a ``full_optim_state_dict`` result held by every rank. The indices
        are ``optim_input``'s, else ``optim``'s, else those of ``model.parameters()``, as PyTorch's."""
        return _osd.load_full_optim_state_dict(full_optim_state_dict, model, optim_input, optim)

    @staticmethod
    def scatter_full_optim_state_dict(full_optim_state_dict: dict | None, model, optim_input=None, optim=None,
                                      group=None) -> dict:
        """As ``shard_full_optim_state_dict``, with the full state dict on ``group``'s rank 0 only (the others
        pass None): it broadcasts it (collective)."""
        return _osd.load_full_optim_state_dict(full_optim_state_dict, model, optim_input, optim, broadcast=True,
                                               group=group)

    @staticmethod
    def flatten_sharded_optim_state_dict(sharded_optim_state_dict: dict, model, optim) -> dict:
        """``optim.load_state_dict`` input from a ``sharded_optim_state_dict`` result. Deprecated in PyTorch."""
        return _osd.flatten_sharded_optim_state_dict(sharded_optim_state_dict, model, optim)

    @staticmethod
    def rekey_optim_state_dict(optim_state_dict: dict, optim_state_key_type: OptimStateKeyType, model,
                               optim_input=None, optim=None) -> dict:
        """The same optimizer state dict keyed by parameter name (PARAM_NAME) or index (PARAM_ID), each group's
        keys sorted; indices are ``optim_input``'s, else ``optim``'s, else those of ``model.parameters()``."""
        return _osd.rekey_optim_state_dict(optim_state_dict, optim_state_key_type, model, optim_input, optim)

    @staticmethod
    def fsdp_modules(module, root_only: bool = False) -> list:
        """Every FullyShardedDataParallel instance in ``module``'s tree (itself included), in ``modules()``
        order; with ``root_only``, those without an FSDP ancestor."""
        found = fsdp1_instances(module, required=False)
        if not root_only:
            return found
        inner = {id(m) for w in found for m in w.module.modules() if m is not w}
        return [w for w in found if id(w) not in inner]

    def check_is_root(self) -> bool:
        """Whether this instance is the root: no FullyShardedDataParallel instance wraps it."""
        st = self._get_fsdp_state()
        if st._is_root is not None:  # settled by the first forward
            return bool(st._is_root)
        return not self.__dict__.get("_hp_wrapped_by_fsdp", False)


FSDP = FullyShardedDataParallel


class _HookReduceScatter(ReduceScatter):
    """A unit's gradient reduction through an FSDP1 communication hook: ``hook(state, grad, output)`` with this
    rank's flat gradient (every rank's piece back to back) and its own piece; under NO_SHARD (``all_reduce``: the
    shard group is this rank alone and the unit does not all-reduce) ``hook(state, grad)`` with the unit's whole
    flat gradient, reduced in place. It runs at once (done on return)."""

    def __init__(self, state, hook, all_reduce: bool = False):
        self.state, self.hook, self.all_reduce = state, hook, all_reduce

    def allocate(self, size, *, dtype, device):
        return super().allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        if self.all_reduce:
            output_tensor._data[...] = input_tensor._data.reshape(output_tensor._data.shape)
            self.hook(self.state, output_tensor)
        else:
            self.hook(self.state, input_tensor, output_tensor)
        return None


def _check_homogeneous(root: "FullyShardedDataParallel") -> None:
    """The settings every instance under a root must share (PyTorch's ValueError at lazy init; here they change
    nothing, but a script mixing them is refused as there)."""
    wrappers = [root] + [w for w in fsdp1_instances(root.module, required=False) if w is not root]
    for attr, name in (("use_orig_params", "_use_orig_params"), ("limit_all_gathers", "limit_all_gathers")):
        values = {getattr(w, attr) for w in wrappers}
        if len(values) != 1:
            raise ValueError(f"Expects one homogeneous value for {name} but got {values}")


# what a second FullyShardedDataParallel around the same module takes from the first (the same sharded module)
_ADOPTED = ("_buffer_dtypes", "sharding_strategy", "mixed_precision", "cpu_offload", "backward_prefetch",
            "forward_prefetch", "limit_all_gathers", "use_orig_params", "compute_device", "_device_mesh",
            "process_group", "rank", "world_size", "_state_dict_settings")


def _adopt_wrapper(new: "FullyShardedDataParallel", prev: "FullyShardedDataParallel", module: Module) -> None:
    """``new`` wraps ``module`` as ``prev`` does: the same units, settings and state-dict type (PyTorch's test
    wraps a trained model's module again for inference and expects the same outputs)."""
    new._fsdp_wrapped_module = module
    new._register_state_dict_hook(_drop_wrapper_prefix)
    new._register_load_state_dict_pre_hook(_add_wrapper_prefix, with_module=True)
    new.register_load_state_dict_post_hook(_clean_incompatible_keys)
    for name in _ADOPTED:
        object.__setattr__(new, name, prev.__dict__[name])
    module.__dict__["_hp_fsdp1_wrapper"] = weakref.ref(new)


_APPLY_DEPTH = [0]  # > 0 while an instance's apply() runs ``fn`` over its summoned tree
_STATE_DICT_DEPTH = [0]  # > 0 while an instance's state_dict() converts its tree (nested instances add raw entries)


def _as_list(items, what: str):
    if items is None or isinstance(items, Module):  # a Module: the checks name it as PyTorch's do
        return items
    try:
        return list(items)
    except TypeError as e:
        raise TypeError(f"`{what}` should be an iterable of `torch.nn.Module`s but got {type(items)}") from e



