"""FSDP1 communication hooks (PyTorch's torch.distributed.algorithms._comm_hooks): the default and low-precision ones."""
from . import default_hooks as default

__all__ = ["default", "LOW_PRECISION_HOOKS"]

LOW_PRECISION_HOOKS = [default.fp16_compress_hook, default.bf16_compress_hook]
