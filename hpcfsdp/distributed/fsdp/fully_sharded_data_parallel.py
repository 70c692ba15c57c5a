"""FullyShardedDataParallel (FSDP1-style entry point) built on fully_shard: strategies, auto-wrap, precision,
offload, prefetch, no_sync, summon_full_params, clip_grad_norm_ and the state-dict type API."""

import contextlib
import warnings
from typing import Any, Iterable

from ... import _backend
from ..._tensor import Tensor
from ...nn import Module
from ...nn.utils import clip_grad_norm_ as _clip_grad_norm
from . import _state_dict_utils as sdu
from ._fully_shard import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from ._fully_shard._fsdp_common import get_module_fsdp_state
from ._strategy import strategy_kwargs, strategy_mesh
from .api import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from .wrap import select_units

__all__ = ["FullyShardedDataParallel", "FSDP"]

_DEFAULT_CONFIGS = {
    StateDictType.FULL_STATE_DICT: (FullStateDictConfig, FullOptimStateDictConfig),
    StateDictType.LOCAL_STATE_DICT: (LocalStateDictConfig, LocalOptimStateDictConfig),
    StateDictType.SHARDED_STATE_DICT: (ShardedStateDictConfig, ShardedOptimStateDictConfig),
}


def _mp_policy(mp: MixedPrecision | None, cast_inputs: bool) -> MixedPrecisionPolicy | None:
    if mp is None:
        return None
    if not isinstance(mp, MixedPrecision):
        raise TypeError(f"mixed_precision must be a MixedPrecision, got {type(mp).__name__}")
    return MixedPrecisionPolicy(param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype,
                                cast_forward_inputs=bool(cast_inputs and mp.param_dtype is not None))


class FullyShardedDataParallel(Module):
    """Wraps ``module`` and shards it with :func:`fully_shard`: each auto-wrapped submodule becomes a unit,
    then the root. Parameter and state-dict names are the wrapped module's own (no prefix)."""

    def __init__(
        self,
        module: Module,
        *,
        sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD,
        auto_wrap_policy: Any = None,
        mixed_precision: MixedPrecision | None = None,
        cpu_offload: CPUOffload | None = None,
        backward_prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE,
        forward_prefetch: bool = False,
        device_mesh: Any = None,
        ignored_modules: Iterable[Module] | None = None,
    ):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"FullyShardedDataParallel expects an nn.Module, got {type(module).__name__}")
        if isinstance(module, FSDPModule):
            raise RuntimeError("module is already managed by fully_shard / FullyShardedDataParallel")
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
            raise TypeError(f"mixed_precision must be a MixedPrecision, got {type(mixed_precision).__name__}")
        if cpu_offload is not None and not isinstance(cpu_offload, CPUOffload):
            raise TypeError(f"cpu_offload must be a CPUOffload, got {type(cpu_offload).__name__}")
        if backward_prefetch is not None and not isinstance(backward_prefetch, BackwardPrefetch):
            raise TypeError(f"backward_prefetch must be a BackwardPrefetch or None, got {backward_prefetch!r}")
        device_type = "cuda" if any(p.device.type == "cuda" for p in module.parameters()) else "cpu"
        mesh, dims = strategy_mesh(sharding_strategy, device_type, device_mesh)
        ignored = set()
        for m in ignored_modules or ():
            ignored.update(m.parameters())
        offload: OffloadPolicy = CPUOffloadPolicy() if cpu_offload and cpu_offload.offload_params else OffloadPolicy()
        common = dict(mesh=mesh, dp_mesh_dims=dims, offload_policy=offload, ignored_params=ignored or None,
                      **strategy_kwargs(sharding_strategy))
        units = []
        if auto_wrap_policy is not None:
            units = select_units(module, auto_wrap_policy, {id(p) for p in ignored})
            if not units:
                warnings.warn(f"auto_wrap_policy {auto_wrap_policy!r} wrapped no submodule of "
                              f"{type(module).__name__}: the whole model is one FSDP unit, so every rank "
                              "all-gathers all parameters at once", stacklevel=2)
        mp_ignore = tuple(mixed_precision._module_classes_to_ignore) if mixed_precision else ()
        if mixed_precision is not None:
            # Modules of the ignored classes (normalisation layers) keep full precision: units of their own.
            fp32 = MixedPrecisionPolicy(param_dtype=_backend.float32, cast_forward_inputs=True)
            for m in module.modules():
                if isinstance(m, mp_ignore) and m not in units and any(True for _ in m.parameters(recurse=False)):
                    fully_shard(m, mp_policy=fp32, **common)
                    _cast_output_to_input_dtype(m)
        for unit in units:
            if not isinstance(unit, mp_ignore):
                fully_shard(unit, mp_policy=_mp_policy(mixed_precision, mixed_precision and
                                                       mixed_precision.cast_forward_inputs), **common)
        fully_shard(module, mp_policy=_mp_policy(mixed_precision, mixed_precision and
                                                 mixed_precision.cast_root_forward_inputs), **common)
        if mixed_precision is not None and mixed_precision.buffer_dtype is not None:
            bdt = _backend.to_dtype(mixed_precision.buffer_dtype)
            for m in module.modules():
                for name, b in m._buffers.items():
                    if b is not None and _backend.is_floating_dtype(b.dtype):
                        m._buffers[name] = b.to(dtype=bdt)
        self.module = module
        self.sharding_strategy = sharding_strategy
        self.mixed_precision = mixed_precision
        self.cpu_offload = cpu_offload or CPUOffload()
        self.backward_prefetch = backward_prefetch
        self.forward_prefetch = forward_prefetch
        self._device_mesh = mesh
        fsdp_modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
        for m in fsdp_modules:
            if not forward_prefetch:
                m.set_modules_to_forward_prefetch([])
            if backward_prefetch is None:
                m.set_modules_to_backward_prefetch([])
            elif backward_prefetch == BackwardPrefetch.BACKWARD_POST:
                m._get_fsdp_state()._backward_prefetch_post = True
        self._state_dict_settings = StateDictSettings(StateDictType.FULL_STATE_DICT, FullStateDictConfig(),
                                                      FullOptimStateDictConfig())

    # -- module plumbing: names are the wrapped module's ------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.module.named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.module.named_buffers(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def state_dict(self, *args, **kwargs):
        s = self._state_dict_settings
        return sdu.model_state_dict(self.module, s.state_dict_type, s.state_dict_config)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        s = self._state_dict_settings
        return sdu.load_model_state_dict(self.module, state_dict, s.state_dict_type, strict=strict)

    @property
    def _fsdp_root(self) -> FSDPModule:
        return self.module

    # -- FSDP1 controls -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally, unsharded and unreduced, inside this context."""
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0):
        """Clip the sharded gradients by their global norm (one all-reduce); returns the total norm."""
        return _clip_grad_norm(list(self.parameters()), max_norm, norm_type=norm_type)

    @staticmethod
    @contextlib.contextmanager
    def summon_full_params(module, recurse: bool = True, writeback: bool = True, rank0_only: bool = False,
                           offload_to_cpu: bool = False, with_grads: bool = False):
        """Inside the context, module attributes are the full parameters; with ``writeback`` changes to them
        are copied back into the shards on exit."""
        if rank0_only and writeback:
            raise ValueError("summon_full_params: rank0_only=True and writeback=True cannot be combined")
        if with_grads:
            raise NotImplementedError("summon_full_params(with_grads=True) is not supported")
        root = module.module if isinstance(module, FullyShardedDataParallel) else module
        fsdp_mods = [m for m in root.modules() if isinstance(m, FSDPModule)] if recurse else [root]
        groups = [g for m in fsdp_mods if get_module_fsdp_state(m) is not None
                  for g in m._get_fsdp_state()._all_param_groups()]
        seen = []
        for g in groups:
            if g not in seen:
                seen.append(g)
        for g in seen:
            g.reshard()
            g.lazy_init()
            g.unshard()
        try:
            yield
        finally:
            for g in seen:
                if writeback:
                    g.write_back_unsharded()
                g.reshard()

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
        wrappers = _wrappers(module)
        prev = wrappers[0]._state_dict_settings
        new = StateDictSettings(state_dict_type, state_dict_config, optim_state_dict_config)
        for w in wrappers:
            w._state_dict_settings = new
        return prev

    @staticmethod
    def get_state_dict_type(module) -> StateDictSettings:
        wrappers = _wrappers(module)
        first = wrappers[0]._state_dict_settings
        for w in wrappers[1:]:
            if w._state_dict_settings != first:
                raise ValueError("FSDP instances under this module have different state-dict settings")
        return first

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type: StateDictType, state_dict_config: StateDictConfig | None = None,
                        optim_state_dict_config: OptimStateDictConfig | None = None):
        prev = FullyShardedDataParallel.set_state_dict_type(module, state_dict_type, state_dict_config,
                                                            optim_state_dict_config)
        try:
            yield
        finally:
            FullyShardedDataParallel.set_state_dict_type(module, prev.state_dict_type, prev.state_dict_config,
                                                         prev.optim_state_dict_config)

    @staticmethod
    def optim_state_dict(model, optim, optim_state_dict: dict | None = None, group=None) -> dict:
        """The optimizer's state keyed by parameter name (FULL: gathered tensors; SHARDED: DTensors)."""
        settings = FullyShardedDataParallel.get_state_dict_type(model) if _wrappers(model, required=False) \
            else StateDictSettings(StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig())
        return sdu.optim_state_dict(_root(model), optim, settings.state_dict_type, settings.optim_state_dict_config,
                                    optim_state_dict)

    @staticmethod
    def optim_state_dict_to_load(model, optim, optim_state_dict: dict, is_named_optimizer: bool = False,
                                 load_directly: bool = False, group=None) -> dict:
        """Turn a name-keyed optimizer state dict (FULL or SHARDED) into ``optim.load_state_dict`` input."""
        result = sdu.optim_state_dict_to_load(_root(model), optim, optim_state_dict)
        if load_directly:
            optim.load_state_dict(result)
        return result


FSDP = FullyShardedDataParallel


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


def _root(model):
    return model.module if isinstance(model, FullyShardedDataParallel) else model


def _wrappers(module, required: bool = True):
    found = [m for m in module.modules() if isinstance(m, FullyShardedDataParallel)]
    if not found and required:
        raise ValueError(f"{type(module).__name__} contains no FullyShardedDataParallel instance")
    return found
