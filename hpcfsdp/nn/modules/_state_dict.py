"""Module state-dict machinery (saving, loading, and the hooks FSDP uses), as PyTorch's nn.Module."""
import itertools
import warnings
from collections import OrderedDict, namedtuple
from typing import Any, Callable, Mapping

import numpy as np

from hpcfsdp import _backend
from hpcfsdp._tensor import Tensor
from hpcfsdp.nn.modules.hooks import RemovableHandle, _WrappedHook
from hpcfsdp.nn.parameter import Parameter

__all__ = ["StateDictMixin"]

_EXTRA_STATE_KEY_SUFFIX = "_extra_state"


def _no_grad():
    import hpcfsdp

    return hpcfsdp.no_grad()


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


# [Note: State-dict hooks]
# ``state_dict`` runs, per module: pre-hooks (module, prefix, keep_vars); ``_save_to_state_dict`` for the
# module's own parameters and persistent buffers; the children recursively; then post-hooks
# (module, state_dict, prefix, local_metadata). A hook from the private ``_register_state_dict_hook``
# may return a replacement dict (FSDP uses that to rewrite keys/values); public post-hooks must edit in
# place. ``load_state_dict`` calls ``_load_from_state_dict`` on every module with the keys under its
# prefix; that method first runs the load pre-hooks, so FSDP can convert incoming values (or
# override the method in the swapped class), then copies with ``param.copy_`` under no_grad.


class StateDictMixin:
    """state_dict / load_state_dict and their hooks; mixed into Module (kept apart for file size)."""

    def register_state_dict_pre_hook(self, hook: Callable):
        """hook(module, prefix, keep_vars) -> None, run before the module's entries are saved."""
        handle = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_state_dict_post_hook(self, hook: Callable):
        """hook(module, state_dict, prefix, local_metadata) -> None, may edit state_dict in place."""
        hook._from_public_api = True
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def _register_state_dict_hook(self, hook: Callable):
        """Private variant: hook(module, state_dict, prefix, local_metadata) may return a new state_dict."""
        if getattr(hook, "_from_public_api", False):
            raise RuntimeError("Cannot register the same function as the state dict post hook that was "
                               "previously registered via register_state_dict_post_hook")
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def _register_load_state_dict_pre_hook(self, hook: Callable, with_module: bool = False):
        """hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        (with the module prepended when ``with_module``)."""
        handle = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[handle.id] = _WrappedHook(hook, self) if with_module else hook
        return handle

    def register_load_state_dict_pre_hook(self, hook: Callable):
        """hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)."""
        return self._register_load_state_dict_pre_hook(hook, with_module=True)

    def register_load_state_dict_post_hook(self, hook: Callable):
        """hook(module, incompatible_keys) -> None; may edit the key lists in place."""
        handle = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[handle.id] = hook
        return handle

    def get_extra_state(self) -> Any:
        """Extra (non-tensor) state for the state dict; override together with ``set_extra_state``."""
        raise RuntimeError("Module.get_extra_state() is reached only when a subclass overrides it")

    def set_extra_state(self, state: Any) -> None:
        """Restore what ``get_extra_state`` returned; override together with it."""
        raise RuntimeError("Module.set_extra_state() is reached only when a subclass overrides it")

    def _has_extra_state(self) -> bool:
        return getattr(type(self), "get_extra_state", None) is not StateDictMixin.get_extra_state

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if self._has_extra_state():
            destination[prefix + _EXTRA_STATE_KEY_SUFFIX] = self.get_extra_state()

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """Parameters and persistent buffers by dotted name, detached, in an OrderedDict (PyTorch's format)."""
        if args:  # PyTorch's deprecated positional form state_dict(destination, prefix, keep_vars)
            if len(args) > 3:
                raise TypeError(f"state_dict() takes at most 3 positional arguments but {len(args)} were given")
            destination = args[0]
            if len(args) > 1:
                prefix = args[1]
            if len(args) > 2:
                keep_vars = args[2]
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = dict(version=self._version)
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            hook_result = hook(self, destination, prefix, local_metadata)
            if getattr(hook, "_from_public_api", False):
                if hook_result is not None:
                    raise RuntimeError("state_dict post-hook must return None")
            elif hook_result is not None:
                destination = hook_result
        return destination

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        """Copy this module's own entries (not its children's) from ``state_dict``; override point for FSDP."""
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        persistent_buffers = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local_state = {
            k: v for k, v in itertools.chain(self._parameters.items(), persistent_buffers.items()) if v is not None
        }
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            input_param = state_dict[key]
            if isinstance(input_param, np.ndarray) or _backend.is_cupy_array(input_param):
                input_param = Tensor._wrap(input_param)  # NumPy/CuPy arrays load as tensors do
            if not isinstance(input_param, Tensor):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected hpcfsdp.Tensor or Tensor-like object '
                    f"from checkpoint but received {type(input_param)}"
                )
                continue
            if param.ndim == 0 and input_param.ndim == 1 and tuple(input_param.shape) == (1,):
                input_param = input_param[0]  # a 1-element 1-dim value loads into a 0-dim one (PyTorch's rule)
            if tuple(input_param.shape) != tuple(param.shape):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(input_param.shape)} from "
                    f"checkpoint, the shape in current model is {tuple(param.shape)}."
                )
                continue
            if _backend.is_meta_array(param._data) and not _backend.is_meta_array(input_param._data) and not assign:
                warnings.warn(
                    f"for {key}: copying from a non-meta parameter in the checkpoint to a meta parameter in the "
                    "current model, which is a no-op. (Did you mean to pass `assign=True` to assign items in the "
                    "state dictionary to their corresponding key in the module instead of copying them in place?)",
                    stacklevel=3)
            try:
                with _no_grad():
                    if assign:
                        if isinstance(param, Parameter):
                            if not isinstance(input_param, Parameter):
                                input_param = Parameter(input_param, requires_grad=param.requires_grad)
                            else:
                                input_param.requires_grad_(param.requires_grad)
                        setattr(self, name, input_param)
                    else:
                        param.copy_(input_param)
            except Exception as ex:
                error_msgs.append(
                    f'While copying the parameter named "{key}", whose dimensions in the model are '
                    f"{tuple(param.shape)} and whose dimensions in the checkpoint are {tuple(input_param.shape)}, "
                    f"an exception occurred : {ex.args}."
                )
        extra_key = prefix + _EXTRA_STATE_KEY_SUFFIX
        if self._has_extra_state():
            if extra_key in state_dict:
                self.set_extra_state(state_dict[extra_key])
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict.keys():
                if key.startswith(prefix) and key != extra_key:
                    input_name = key[len(prefix):].split(".", 1)
                    if len(input_name) > 1:
                        if input_name[0] not in self._modules:
                            unexpected_keys.append(key)
                    elif input_name[0] not in local_state:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """Copy parameters and buffers from ``state_dict`` in place; returns ``(missing_keys, unexpected_keys)``."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing_keys: list = []
        unexpected_keys: list = []
        error_msgs: list = []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)
        if metadata is not None:
            state_dict._metadata = metadata

        def load(module, local_state_dict, prefix=""):
            local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_metadata["assign_to_params_buffers"] = assign
            module._load_from_state_dict(
                local_state_dict, prefix, local_metadata, True, missing_keys, unexpected_keys, error_msgs
            )
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    child_state_dict = {k: v for k, v in local_state_dict.items() if k.startswith(child_prefix)}
                    load(child, child_state_dict, child_prefix)
            incompatible_keys = _IncompatibleKeys(missing_keys, unexpected_keys)
            for hook in module._load_state_dict_post_hooks.values():
                out = hook(module, incompatible_keys)
                if out is not None:
                    raise RuntimeError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not expected to "
                        f"return new values, but got {out!r}."
                    )

        load(self, state_dict)
        if strict:
            if unexpected_keys:
                error_msgs.insert(
                    0, "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected_keys))
                )
            if missing_keys:
                error_msgs.insert(
                    0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing_keys))
                )
        if error_msgs:
            raise RuntimeError(
                "Error(s) in loading state_dict for {}:\n\t{}".format(self.__class__.__name__, "\n\t".join(error_msgs))
            )
        return _IncompatibleKeys(missing_keys, unexpected_keys)
