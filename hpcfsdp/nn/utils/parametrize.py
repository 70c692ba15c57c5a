"""Parametrizations: a module tensor that is computed, on every read, by small modules from unconstrained
tensors stored under ``module.parametrizations.<name>``.

``register_parametrization(m, "weight", p)`` moves ``m.weight`` into a :class:`ParametrizationList` as
``original`` (or ``original0``, ``original1``, ... when ``p.right_inverse`` returns several tensors) and makes
``m.weight`` a property of the module's class: reading it runs the chain, assigning to it runs the chain's
``right_inverse`` backwards and rebinds the originals. The state-dict keys are PyTorch's
(``parametrizations.weight.original``).
"""
from __future__ import annotations

import collections.abc
import contextlib
import copy
import copyreg

from hpcfsdp._tensor import Tensor
from hpcfsdp.autograd.grad_mode import no_grad
from hpcfsdp.nn.modules.container import ModuleDict, ModuleList
from hpcfsdp.nn.parameter import Parameter

__all__ = ["cached", "ParametrizationList", "register_parametrization", "is_parametrized", "remove_parametrizations",
           "type_before_parametrizations", "transfer_parametrizations_and_params"]

# [Note: The swapped class]
# A parametrized tensor is a property, and properties live on classes, so the first registration on a module
# gives that one module a class of its own: ``Parametrized<Name>``, a direct subclass of its class, created for
# it alone (two parametrized Linears have two such classes). Its namespace refuses pickling (the properties
# cannot be restored from a pickle; state_dict() is the supported way to save) and, unless the class already
# has one, carries a __deepcopy__ that copies the instance dict without going through __reduce_ex__, which
# __getstate__ would refuse. Removing the last parametrization drops the attribute ``parametrizations`` and
# puts the original class back.


class _Cache(contextlib.ContextDecorator):
    """What ``cached()`` returns: while at least one block is open, each parametrized tensor is computed once
    per module and name; the values are dropped when the outermost block closes."""

    depth = 0
    values: dict = {}

    def __enter__(self):
        _Cache.depth += 1
        return self

    def __exit__(self, *exc_info):
        _Cache.depth -= 1
        if _Cache.depth == 0:
            _Cache.values.clear()
        return False


def cached():
    """Context manager (and decorator) under which a parametrized tensor is computed on its first read only.

    Useful when a parametrization is costly and the tensor is read several times in one step (a recurrent
    layer's weight in every time step). Blocks nest; the cache lives until the outermost one ends. Values
    are not invalidated by assignments inside the block.
    """
    return _Cache()


def _store(owner, name, tensor):
    """Register ``tensor`` on ``owner`` as a parameter when it is a Parameter, else as a buffer."""
    if isinstance(tensor, Parameter):
        owner.register_parameter(name, tensor)
    else:
        owner.register_buffer(name, tensor)


def _rebind(target, value):
    """Make ``target`` hold ``value``'s data while staying the same object (optimizers keep a reference)."""
    target.data = value


def _apply_right_inverse(step, value, required):
    """``step.right_inverse(value)``. When ``step`` has none: RuntimeError if ``required``, else ``value``."""
    inverse = getattr(step, "right_inverse", None)
    if inverse is not None:
        return inverse(value)
    if required:
        raise RuntimeError(f"parametrization {type(step).__name__} does not implement right_inverse.")
    return value


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor, in the order they apply, with the tensors they start from.

    Calling the list computes the parametrized tensor: the first module takes the originals (``original``,
    or ``original0``, ``original1``, ...), each later module the previous result. ``right_inverse`` goes the
    other way and writes the originals in place.

    Attributes:
        is_tensor: True when the chain starts from one tensor (``original``), False for a sequence.
        ntensors: how many originals there are.
        unsafe: whether the dtype and shape checks are skipped.

    Raises:
        ValueError: ``modules`` is empty; the first module's ``right_inverse`` returns neither a Tensor nor a
            sequence of Tensors, or one Tensor of another dtype or device than ``original``; without
            ``unsafe``, the chain changes the dtype or shape of ``original`` or does not return a Tensor.
    """

    def __init__(self, modules, original, unsafe=False):
        modules = list(modules)
        if not modules:
            raise ValueError("ParametrizationList requires one or more modules.")
        super().__init__(modules)
        want_dtype, want_shape = original.dtype, original.shape
        # Where the chain should start so that it reproduces ``original``: right_inverse from the last module
        # to the first; a module without one (or one raising NotImplementedError) counts as the identity.
        start = original
        with no_grad():
            for step in reversed(self):
                try:
                    start = _apply_right_inverse(step, start, required=False)
                except NotImplementedError:
                    pass
        if isinstance(start, Tensor):
            self._adopt_one(original, start)
        elif isinstance(start, collections.abc.Sequence):
            self._adopt_many(original, start)
        else:
            raise ValueError("'right_inverse' must return a Tensor or a Sequence of tensors (list, tuple...). "
                             f"Got {type(start).__name__}")
        self.unsafe = unsafe
        if not unsafe:
            _check_result(self(), want_dtype, want_shape)

    def _adopt_one(self, original, start):
        """Keep ``original`` (the same object, so optimizers holding it still work) with ``start``'s data."""
        for what in ("dtype", "device"):
            before, after = getattr(original, what), getattr(start, what)
            if before != after:
                raise ValueError(f"When `right_inverse` outputs one tensor, it may not change the {what}.\n"
                                 f"original.{what}: {before}\nright_inverse(original).{what}: {after}")
        self.is_tensor, self.ntensors = True, 1
        with no_grad():
            _rebind(original, start)
        _store(self, "original", original)

    def _adopt_many(self, original, parts):
        """Register ``parts`` as ``original0``, ``original1``, ...: Parameters when ``original`` was one, with
        its ``requires_grad`` either way."""
        for i, part in enumerate(parts):
            if not isinstance(part, Tensor):
                raise ValueError("'right_inverse' must return a Tensor or a Sequence of tensors (list, tuple...). "
                                 f"Got element {i} of the sequence with type {type(part).__name__}.")
        self.is_tensor, self.ntensors = False, len(parts)
        grad = original.requires_grad
        for i, part in enumerate(parts):
            if isinstance(original, Parameter):
                part = Parameter(part, grad)
            else:
                part.requires_grad_(grad)
            _store(self, f"original{i}", part)

    def _originals(self):
        """The tensors the first module is called with."""
        if self.is_tensor:
            return (self.original,)
        return tuple(getattr(self, f"original{i}") for i in range(self.ntensors))

    def right_inverse(self, value):
        """Set the originals so that the chain returns ``value``: each module's ``right_inverse``, last first.

        Raises:
            RuntimeError: a module of the chain has no ``right_inverse``.
            ValueError: the result does not match the originals (a Tensor for ``original``, a sequence of
                ``ntensors`` Tensors otherwise) or has another dtype than the tensor it replaces.
        """
        with no_grad():
            for step in reversed(self):
                value = _apply_right_inverse(step, value, required=True)
            if self.is_tensor:
                self._assign_one(value)
            else:
                self._assign_many(value)

    def _assign_one(self, value):
        if not isinstance(value, Tensor):
            raise ValueError(f"`right_inverse` should return a tensor. Got {type(value).__name__}")
        target = self.original
        if value.dtype != target.dtype:
            raise ValueError(f"The tensor returned by `right_inverse` has dtype {value.dtype} while `original` "
                             f"has dtype {target.dtype}")
        _rebind(target, value)

    def _assign_many(self, values):
        if not isinstance(values, collections.abc.Sequence):
            raise ValueError(f"'right_inverse' must return a sequence of tensors. Got {type(values).__name__}.")
        if len(values) != self.ntensors:
            raise ValueError(f"'right_inverse' must return a sequence of tensors of length {self.ntensors}. "
                             f"Got a sequence of length {len(values)}.")
        targets = self._originals()
        for i, (value, target) in enumerate(zip(values, targets)):
            if not isinstance(value, Tensor):
                raise ValueError(f"'right_inverse' must return a sequence of tensors. Got element {i} of type "
                                 f"{type(value).__name__}.")
            if value.dtype != target.dtype:
                raise ValueError(f"Tensor {i} returned by `right_inverse` has dtype {value.dtype} while "
                                 f"`original{i}` has dtype {target.dtype}")
        for value, target in zip(values, targets):
            _rebind(target, value)

    def forward(self):
        """The parametrized tensor, computed from the originals (differentiable in them)."""
        head, *rest = self
        result = head(*self._originals())
        for step in rest:
            result = step(result)
        return result


def _check_result(result, dtype, shape):
    """The first registration's check: the chain gives a Tensor of the unparametrized dtype and shape."""
    if not isinstance(result, Tensor):
        raise ValueError(f"A parametrization must return a tensor. Got {type(result).__name__}.")
    for what, before, after in (("dtype", dtype, result.dtype), ("shape", shape, result.shape)):
        if before != after:
            raise ValueError(f"Registering a parametrization may not change the {what} of the tensor, unless "
                             f"`unsafe` flag is enabled.\nunparametrized {what}: {before}\n"
                             f"parametrized {what}: {after}")


def _check_appended(module, tensor_name, parametrization):
    """A later registration's check: ``parametrization`` keeps the current value's dtype and shape, and so
    does its ``right_inverse`` (when it has one that is implemented)."""
    here = f"module.{tensor_name}"
    with no_grad():
        current = getattr(module, tensor_name)
        out = parametrization(current)
        if not isinstance(out, Tensor):
            raise ValueError(f"A parametrization must return a tensor. Got {type(out).__name__}.")
        _check_kept(current, out, lambda what, before, after: (
            f"Registering a parametrization may not change the {what} of the tensor, unless the `unsafe` flag is "
            f"enabled.\n{here}.{what}: {before}\nparametrization({here}).{what}: {after}"))
        if not hasattr(parametrization, "right_inverse"):
            return
        try:
            back = parametrization.right_inverse(out)
        except NotImplementedError:
            return
    if not isinstance(back, Tensor):
        raise ValueError(f"parametrization.right_inverse must return a tensor. Got: {type(back).__name__}")
    _check_kept(current, back, lambda what, before, after: (
        f"The tensor returned by parametrization.right_inverse must have the same {what} as {here}, unless the "
        f"`unsafe` flag is enabled.\n{here}.{what}: {before}\nreturned {what}: {after}"))


def _check_kept(before_t, after_t, message):
    """ValueError(message(what, before, after)) unless ``after_t`` has ``before_t``'s dtype and shape."""
    for what in ("dtype", "shape"):
        before, after = getattr(before_t, what), getattr(after_t, what)
        if before != after:
            raise ValueError(message(what, before, after))


def _refuse_pickle(self):
    raise RuntimeError("Serialization of parametrized modules is only supported through state_dict().")


def _deepcopy_parametrized(self, memo):
    """deepcopy of a module of a swapped class: a new instance of the same class with the dict (and any
    slots) deep-copied; ``memo`` keeps shared submodules shared."""
    known = memo.get(id(self))
    if known is not None:
        return known
    twin = type(self).__new__(type(self))
    memo[id(self)] = twin
    vars(twin).update(copy.deepcopy(vars(self), memo))
    for slot in copyreg._slotnames(type(self)):
        if hasattr(self, slot):
            object.__setattr__(twin, slot, copy.deepcopy(getattr(self, slot), memo))
    return twin


def _swap_class(module):
    """Give ``module`` its own subclass ``Parametrized<Name>`` (see the note above)."""
    base = type(module)
    namespace = {"__getstate__": _refuse_pickle}
    if not hasattr(base, "__deepcopy__"):
        namespace["__deepcopy__"] = _deepcopy_parametrized
    module.__class__ = type(f"Parametrized{base.__name__}", (base,), namespace)


def _class_before(module):
    """The class ``_swap_class`` replaced (the swapped class's only base)."""
    return type(module).__bases__[0]


def _tensor_property(tensor_name):
    """The property that stands for the parametrized tensor ``tensor_name`` on a swapped class."""

    def read(self):
        chain = self.parametrizations[tensor_name]
        if _Cache.depth == 0:
            return chain()
        key = (id(self), tensor_name)
        if key not in _Cache.values:
            _Cache.values[key] = chain()
        return _Cache.values[key]

    def write(self, value):
        self.parametrizations[tensor_name].right_inverse(value)

    return property(read, write, doc=f"``{tensor_name}``, computed by ``parametrizations.{tensor_name}``.")


def register_parametrization(module, tensor_name, parametrization, *, unsafe=False):
    """Compute ``module.<tensor_name>`` through ``parametrization`` from now on; returns ``module``.

    The first registration on a tensor moves the parameter or buffer into a new :class:`ParametrizationList`
    at ``module.parametrizations[tensor_name]``. If ``parametrization`` has a ``right_inverse``, it is used
    to compute the stored originals from the current value (it may return a sequence of tensors, stored as
    ``original0``, ``original1``, ...); otherwise the current value is stored as is. Registering again on the
    same tensor appends to the chain; the stored originals are not changed. ``parametrization`` is put in
    the module's training mode.

    Args:
        module: the module that owns the tensor.
        tensor_name: a parameter, a buffer, or an already parametrized tensor of ``module``.
        parametrization: a Module whose ``forward`` maps the originals (or the previous parametrization's
            result) to the tensor; ``right_inverse`` optional.
        unsafe: skip the checks that the parametrization keeps the tensor's dtype and shape. Once a chain is
            unsafe it stays so.

    Raises:
        ValueError: ``module`` has no parameter, buffer or parametrized tensor ``tensor_name``; without
            ``unsafe``, the parametrization (or its ``right_inverse``) changes the dtype or shape or does not
            return a Tensor; see :class:`ParametrizationList` for the first registration's checks.
    """
    parametrization.train(module.training)
    if not is_parametrized(module, tensor_name):
        _start_chain(module, tensor_name, parametrization, unsafe)
        return module
    if not unsafe:
        _check_appended(module, tensor_name, parametrization)
    chain = module.parametrizations[tensor_name]
    chain.append(parametrization)
    chain.unsafe = chain.unsafe or unsafe
    return module


def _start_chain(module, tensor_name, parametrization, unsafe):
    """The first registration on ``tensor_name``: move the parameter or buffer into a new ParametrizationList
    and replace it by a property of the (swapped) class."""
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"Module '{module}' does not have a parameter, a buffer, or a parametrized element with "
                         f"name '{tensor_name}'")
    chain = ParametrizationList([parametrization], getattr(module, tensor_name), unsafe=unsafe)
    delattr(module, tensor_name)
    if not is_parametrized(module):
        _swap_class(module)
        module.parametrizations = ModuleDict()
    module.parametrizations[tensor_name] = chain
    setattr(type(module), tensor_name, _tensor_property(tensor_name))


def is_parametrized(module, tensor_name=None):
    """Whether ``module`` has any parametrized tensor, or, given ``tensor_name``, whether that one is."""
    table = getattr(module, "parametrizations", None)
    if not isinstance(table, ModuleDict):
        return False
    return tensor_name in table if tensor_name is not None else len(table) > 0


def remove_parametrizations(module, tensor_name, leave_parametrized=True):
    """Turn ``module.<tensor_name>`` back into a plain parameter or buffer; returns ``module``.

    With ``leave_parametrized`` the tensor keeps its current (parametrized) value, else it gets the stored
    ``original``. A tensor stored as one ``original`` gets that very object back (a Parameter stays the
    same Parameter). One stored as a sequence of originals becomes a new tensor: a Parameter when the
    computed value requires grad, a buffer otherwise. When no parametrized tensor is left the module gets
    its original class back and loses ``parametrizations``.

    Raises:
        ValueError: ``tensor_name`` is not parametrized, or ``leave_parametrized=False`` for a tensor stored
            as a sequence of originals.
    """
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    chain = module.parametrizations[tensor_name]
    if chain.is_tensor:
        restored = chain.original
        if leave_parametrized:
            with no_grad():
                _rebind(restored, getattr(module, tensor_name))
    elif leave_parametrized:
        value = getattr(module, tensor_name)
        restored = Parameter(value.detach()) if value.requires_grad else value.detach()
    else:
        raise ValueError("Cannot leave unparametrized (`leave_parametrized=False`) a tensor that is parametrized "
                         "in terms of a sequence of tensors.")
    delattr(type(module), tensor_name)
    del module.parametrizations[tensor_name]
    _store(module, tensor_name, restored)
    if not is_parametrized(module):
        delattr(module, "parametrizations")
        module.__class__ = _class_before(module)
    return module


def type_before_parametrizations(module):
    """The class ``module`` had before its first parametrization (its class when it has none)."""
    return _class_before(module) if is_parametrized(module) else type(module)


def transfer_parametrizations_and_params(from_module, to_module, tensor_name=None):
    """Give ``to_module`` the parametrizations of ``from_module`` (all, or ``tensor_name``'s), sharing the
    parametrization modules and the original tensors; returns ``to_module``.

    A tensor that ``to_module`` lacks is first created as a Parameter holding ``from_module``'s parametrized
    value. The parametrizations are then registered on ``to_module`` with the usual checks, and the originals
    of ``from_module`` replace the ones the registration computed. Nothing happens when ``from_module`` is
    not parametrized.

    Raises:
        AttributeError: ``tensor_name`` is neither an attribute of ``to_module`` nor of ``from_module``.
        ValueError: a parametrization does not fit ``to_module``'s tensor (see register_parametrization).
    """
    if not is_parametrized(from_module):
        return to_module
    names = list(from_module.parametrizations) if tensor_name is None else [tensor_name]
    for name in names:
        if not hasattr(to_module, name):
            setattr(to_module, name, Parameter(getattr(from_module, name).detach()))
        source = from_module.parametrizations[name]
        for parametrization in source:
            register_parametrization(to_module, name, parametrization)
        target = to_module.parametrizations[name]
        labels = ["original"] if source.is_tensor else [f"original{i}" for i in range(source.ntensors)]
        for label in labels:
            setattr(target, label, getattr(source, label))
    return to_module
