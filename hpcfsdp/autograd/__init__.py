"""Autograd: Function, the backward engine, grad mode."""
from . import engine, function, grad_mode, ops  # noqa: F401
from .engine import backward, grad, is_in_backward, queue_callback
from .function import Function, FunctionCtx, once_differentiable
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled

__all__ = ["Function", "FunctionCtx", "once_differentiable", "backward", "grad", "queue_callback",
           "is_in_backward", "inference_mode", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled"]
