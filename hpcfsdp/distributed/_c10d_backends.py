"""torch.distributed's queries of what is available and how this process was launched (distributed_c10d re-exports
them): is_available, is_mpi_available, is_nccl_available, is_gloo_available, get_default_backend_for_device,
is_torchelastic_launched and get_node_local_rank."""

from __future__ import annotations

import os

__all__ = ["is_available", "is_mpi_available", "is_nccl_available", "is_gloo_available",
           "get_default_backend_for_device", "is_torchelastic_launched", "get_node_local_rank"]


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return True


def is_nccl_available() -> bool:
    """Whether CuPy loads the NCCL library (``cupy.cuda.nccl.available``; PyTorch: built with NCCL), GPU or not.
    Where it is, CUDA arrays of groups whose ranks each have a GPU move over NCCL ([Note: GPU collectives] in
    _nccl.py); ``init_process_group`` takes every backend name either way."""
    try:
        from cupy.cuda import nccl  # noqa: PLC0415
    except Exception:  # no CuPy, or a broken CUDA install
        return False
    return bool(getattr(nccl, "available", False))


def is_gloo_available() -> bool:
    """True: the name "gloo" works everywhere PyTorch takes it (``init_process_group("gloo")``,
    ``get_default_backend_for_device("cpu")``, ``monitored_barrier``), running on MPI."""
    return True


def get_default_backend_for_device(device) -> str:
    """PyTorch's default backend name for ``device``: "gloo" for "cpu", "nccl" for "cuda".

    The names are PyTorch's, so that ported scripts branching on them take the same branch;
    ``init_process_group`` accepts either: host arrays go over MPI, CUDA arrays over NCCL where every
    rank has its own GPU, else CUDA-aware MPI or host staging (HPCFSDP_GPU_COMM, [Note: GPU collectives]
    in _nccl.py), and ``get_backend()`` then reports the name given. Other device types have no
    backend: ValueError, as PyTorch.
    """
    from hpcfsdp import _backend

    try:
        dev = _backend.device("cuda", device) if isinstance(device, int) else _backend.device(device)
    except (TypeError, ValueError):
        raise ValueError(f"Default backend not registered for device : {device}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Default backend not registered for device : {device}")
    return "nccl" if dev.type == "cuda" else "gloo"


def is_torchelastic_launched() -> bool:
    """Whether torchelastic (torchrun) started this process: TORCHELASTIC_RUN_ID is set. ``hpcfsdp launch``,
    mpiexec and srun do not set it."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node, from LOCAL_RANK (which hpcfsdp sets from the MPI launcher's variables),
    else ``fallback_rank``; RuntimeError when neither is there."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow `get_node_local_rank` to "
        "work, assuming you are not running in a multi-device context and want the code to run locally instead.")
