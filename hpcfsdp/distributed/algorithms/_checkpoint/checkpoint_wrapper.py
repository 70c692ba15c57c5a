"""checkpoint_wrapper / apply_activation_checkpointing: wrap submodules so their forward is recomputed in backward."""
from enum import Enum, auto
from functools import partial

from hpcfsdp.nn import Module
from hpcfsdp.utils.checkpoint import checkpoint as _checkpoint

__all__ = ["CheckpointImpl", "ActivationWrapper", "CheckpointWrapper", "checkpoint_wrapper",
           "apply_activation_checkpointing", "apply_block_checkpointing"]

_CHECKPOINT_WRAPPED_MODULE = "_checkpoint_wrapped_module"
_CHECKPOINT_PREFIX = _CHECKPOINT_WRAPPED_MODULE + "."


class CheckpointImpl(Enum):
    REENTRANT = auto()
    NO_REENTRANT = auto()


# [Note: Checkpoint wrapper names]
# The wrapper holds the module as its child `_checkpoint_wrapped_module`, so parameter names seen from
# a parent gain that component (`h.0._checkpoint_wrapped_module.attn.c_attn.weight`), as in PyTorch.
# state_dict() drops it (a post hook) and load_state_dict() puts it back (a pre hook), so checkpoints
# saved with and without activation checkpointing are interchangeable; the wrapper's own
# named_parameters() drops it too. Attributes the wrapper lacks are looked up on the wrapped module.
class ActivationWrapper(Module):
    """Base of the wrappers: holds the module, forwards attribute lookups, keeps state-dict keys unchanged."""

    def __init__(self, mod):
        super().__init__()
        self._checkpoint_wrapped_module = mod
        self._register_state_dict_hook(self._post_state_dict_hook)
        self._register_load_state_dict_pre_hook(self._pre_load_state_dict_hook, with_module=True)

    def forward(self, *args, **kwargs):
        raise ValueError("Subclasses should implement forward().")

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == _CHECKPOINT_WRAPPED_MODULE:
                raise
            return getattr(self._checkpoint_wrapped_module, name)

    def __getitem__(self, key):
        return self._checkpoint_wrapped_module.__getitem__(key)

    def named_parameters(self, *args, **kwargs):
        for name, param in super().named_parameters(*args, **kwargs):
            yield name.replace(_CHECKPOINT_PREFIX, ""), param

    @staticmethod
    def _post_state_dict_hook(module, state_dict, prefix, *args):
        for key in list(state_dict.keys()):
            if key.startswith(prefix) and _CHECKPOINT_PREFIX in key[len(prefix):]:
                state_dict[prefix + key[len(prefix):].replace(_CHECKPOINT_PREFIX, "", 1)] = state_dict.pop(key)
        return state_dict

    @staticmethod
    def _pre_load_state_dict_hook(module, state_dict, prefix, *args):
        for key in list(state_dict.keys()):
            if key.startswith(prefix) and not key[len(prefix):].startswith(_CHECKPOINT_PREFIX):
                state_dict[prefix + _CHECKPOINT_PREFIX + key[len(prefix):]] = state_dict.pop(key)


class CheckpointWrapper(ActivationWrapper):
    """Runs the wrapped module through ``hpcfsdp.utils.checkpoint.checkpoint``."""

    def __init__(self, mod, checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=None, **checkpoint_fn_kwargs):
        super().__init__(mod)
        if not isinstance(checkpoint_impl, CheckpointImpl):
            raise TypeError(f"checkpoint_impl must be a CheckpointImpl, got {checkpoint_impl!r}")
        self.checkpoint_impl = checkpoint_impl
        if checkpoint_fn is None:
            self.checkpoint_fn = partial(_checkpoint, use_reentrant=checkpoint_impl == CheckpointImpl.REENTRANT,
                                         **checkpoint_fn_kwargs)
        else:
            self.checkpoint_fn = partial(checkpoint_fn, **checkpoint_fn_kwargs)

    def forward(self, *args, **kwargs):
        if self.checkpoint_impl == CheckpointImpl.REENTRANT and kwargs:
            raise ValueError("CheckpointImpl.REENTRANT does not take keyword arguments; use NO_REENTRANT")
        return self.checkpoint_fn(self._checkpoint_wrapped_module, *args, **kwargs)


def checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=None,
                       **checkpoint_fn_kwargs):
    """Wrap ``module`` so its forward keeps no activations and is recomputed during backward."""
    return CheckpointWrapper(module, checkpoint_impl, checkpoint_fn, **checkpoint_fn_kwargs)


def apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda _: True,
                                   auto_wrap_policy=None):
    """Replace, in place, every submodule of ``model`` for which ``check_fn(submodule)`` is true by
    ``checkpoint_wrapper_fn(submodule)``; ``model`` itself is never wrapped.

    Children are visited before their parents, so nested matches are wrapped at every level that
    matches; modules that already are wrappers are left as they are.
    """
    if auto_wrap_policy is not None:
        raise NotImplementedError("apply_activation_checkpointing(): auto_wrap_policy is not supported by "
                                  "hpcfsdp; pass check_fn")
    if not isinstance(model, Module):
        raise TypeError(f"apply_activation_checkpointing expects an nn.Module, got {type(model).__name__}")
    _wrap_children(model, checkpoint_wrapper_fn, check_fn)


def _wrap_children(module, wrapper_fn, check_fn):
    for name, child in list(module._modules.items()):
        if child is None or isinstance(child, ActivationWrapper):
            continue
        _wrap_children(child, wrapper_fn, check_fn)
        if check_fn(child):
            setattr(module, name, wrapper_fn(child))


def apply_block_checkpointing(model):
    """Wrap each of ``model.blocks`` (the GPT's and Llama's transformer blocks) with ``checkpoint_wrapper``."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError(f"apply_block_checkpointing expects a model with a .blocks ModuleList, got {type(model).__name__}")
    for i in range(len(blocks)):
        if not isinstance(blocks[i], ActivationWrapper):
            blocks[i] = checkpoint_wrapper(blocks[i])
    return model
