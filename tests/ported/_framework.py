"""The one switch of the ported PyTorch FSDP2 tests: HPCFSDP_PORT_FRAMEWORK=hpcfsdp (default) or torch.

Every name the ported tests use comes from here, imported with PyTorch's module paths (for hpcfsdp the
same paths with ``torch`` replaced by ``hpcfsdp``), so that one test body runs on both frameworks.
``init_world()`` creates the default process group: for PyTorch, gloo over loopback with the rank and size
of MPI's COMM_WORLD (the tests run under ``hpcfsdp launch -n N``); for hpcfsdp, MPI itself.
"""
import os

FRAMEWORK = os.environ.get("HPCFSDP_PORT_FRAMEWORK", "hpcfsdp")
if FRAMEWORK not in ("hpcfsdp", "torch"):
    raise ValueError(f"HPCFSDP_PORT_FRAMEWORK must be 'hpcfsdp' or 'torch', got {FRAMEWORK!r}")
IS_TORCH = FRAMEWORK == "torch"

if IS_TORCH:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.nn.utils import clip_grad_norm_
    from torch.utils.checkpoint import checkpoint
else:
    import hpcfsdp as torch
    import hpcfsdp.distributed as dist
    import hpcfsdp.nn as nn
    import hpcfsdp.nn.functional as F
    from hpcfsdp.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
        set_state_dict,
    )
    from hpcfsdp.distributed.device_mesh import DeviceMesh, init_device_mesh
    from hpcfsdp.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )
    from hpcfsdp.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from hpcfsdp.nn.utils import clip_grad_norm_
    from hpcfsdp.utils.checkpoint import checkpoint

__all__ = [
    "FRAMEWORK", "IS_TORCH", "torch", "dist", "nn", "F", "fully_shard", "FSDPModule", "MixedPrecisionPolicy",
    "OffloadPolicy", "CPUOffloadPolicy", "register_fsdp_forward_method", "DTensor", "Shard", "Replicate",
    "distribute_tensor", "DeviceMesh", "init_device_mesh", "checkpoint", "clip_grad_norm_", "StateDictOptions",
    "get_model_state_dict", "set_model_state_dict", "get_optimizer_state_dict", "set_optimizer_state_dict",
    "get_state_dict", "set_state_dict", "init_world",
]


def _mpi_rank_size():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _free_loopback_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_world() -> None:
    """Create the default process group once (collective over MPI's COMM_WORLD)."""
    if dist.is_initialized():
        return
    if not IS_TORCH:
        dist.init_process_group()
        return
    from mpi4py import MPI

    rank, size = _mpi_rank_size()
    port = MPI.COMM_WORLD.bcast(_free_loopback_port() if rank == 0 else None, root=0)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # N ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=size)

# ---- FSDP1 names (the ported FSDP1 tests, tests/ported/test_fsdp1_*.py) ------------------------------------
if IS_TORCH:
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        CPUOffload,
        FullOptimStateDictConfig,
        FullStateDictConfig,
        FullyShardedDataParallel,
        LocalStateDictConfig,
        MixedPrecision,
        OptimStateKeyType,
        ShardedOptimStateDictConfig,
        ShardedStateDictConfig,
        ShardingStrategy,
        StateDictType,
    )
    from torch.distributed.fsdp.wrap import (
        CustomPolicy,
        ModuleWrapPolicy,
        always_wrap_policy,
        enable_wrap,
        lambda_auto_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
        wrap,
    )
else:
    from hpcfsdp.distributed.fsdp import (  # noqa: F401
        BackwardPrefetch,
        CPUOffload,
        FullOptimStateDictConfig,
        FullStateDictConfig,
        FullyShardedDataParallel,
        LocalStateDictConfig,
        MixedPrecision,
        OptimStateKeyType,
        ShardedOptimStateDictConfig,
        ShardedStateDictConfig,
        ShardingStrategy,
        StateDictType,
    )
    from hpcfsdp.distributed.fsdp.wrap import (  # noqa: F401
        CustomPolicy,
        ModuleWrapPolicy,
        always_wrap_policy,
        enable_wrap,
        lambda_auto_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
        wrap,
    )
FSDP = FullyShardedDataParallel

__all__ += [
    "BackwardPrefetch", "CPUOffload", "FullOptimStateDictConfig", "FullStateDictConfig", "FullyShardedDataParallel",
    "FSDP", "LocalStateDictConfig", "MixedPrecision", "OptimStateKeyType", "ShardedOptimStateDictConfig",
    "ShardedStateDictConfig", "ShardingStrategy", "StateDictType", "CustomPolicy", "ModuleWrapPolicy",
    "always_wrap_policy", "enable_wrap", "lambda_auto_wrap_policy", "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy", "wrap",
]

# -- names of the FSDP2 ports of the second pass (comm, grad scaler, dtensor, 2d, compose, conversion)
if IS_TORCH:
    from torch.amp import GradScaler
    from torch.distributed.fsdp import DataParallelMeshDims
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
else:
    from hpcfsdp.amp import GradScaler
    from hpcfsdp.distributed.fsdp import DataParallelMeshDims
    from hpcfsdp.distributed.tensor import distribute_module
    from hpcfsdp.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

__all__ += ["GradScaler", "DataParallelMeshDims", "distribute_module", "ColwiseParallel", "RowwiseParallel",
            "parallelize_module"]

# -- names of the third FSDP1 pass (activation-checkpoint wrappers, ShardedGradScaler)
if IS_TORCH:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
else:
    from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from hpcfsdp.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

__all__ += ["CheckpointImpl", "checkpoint_wrapper", "ShardedGradScaler"]

# -- names of the state-dict / optimizer-state FSDP1 pass
if IS_TORCH:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
else:
    from hpcfsdp.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

__all__ += ["apply_activation_checkpointing"]
