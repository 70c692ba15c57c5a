"""The learning-rate scheduler base class (torch.optim.lr_scheduler.LRScheduler) and helpers its subclasses share."""
import types
import warnings
from typing import Any, Callable, Dict, List, Sequence, Union

from hpcfsdp.optim.optimizer import Optimizer

__all__ = ["LRScheduler"]


def _check_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


def _group_lrs(optimizer: Optimizer) -> List[float]:
    return [group["lr"] for group in optimizer.param_groups]


def _state_dict_without(scheduler, *skip) -> Dict[str, Any]:
    """A scheduler's attributes but the optimizer and ``skip`` (what its state_dict saves)."""
    return {key: value for key, value in scheduler.__dict__.items() if key not in ("optimizer", *skip)}


class LRScheduler:
    """Base class: sets ``group["lr"]`` for every param group of ``optimizer`` at each ``step()``.

    Construction performs the initial step (epoch 0), as PyTorch does; ``last_epoch`` counts steps.
    See [Note: Chainable and closed-form schedules].
    """

    _get_lr_called_within_step: bool = False
    _is_initial: bool = False  # True during the step made at construction

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming an "
                                   "optimizer")
        self.base_lrs: List[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def state_dict(self):
        """Every attribute except the optimizer."""
        return _state_dict_without(self)

    def load_state_dict(self, state_dict) -> None:
        """Restore the attributes saved by ``state_dict()``."""
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> List[float]:
        """The learning rates set by the last ``step()``."""
        return self._last_lr

    def get_lr(self) -> List[float]:
        """The lrs of the epoch ``step()`` has just entered (subclasses implement it; use ``get_last_lr()``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def step(self, epoch=None) -> None:
        """Advance one epoch and set every group's lr (``epoch=`` is deprecated: it jumps by the closed form)."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn("The epoch parameter in `scheduler.step()` is deprecated (as in PyTorch)", UserWarning,
                          stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None) -> None:
        self._get_lr_called_within_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                values = self._get_closed_form_lr() if hasattr(self, "_get_closed_form_lr") else self.get_lr()
        finally:
            self._get_lr_called_within_step = False
        for param_group, lr in zip(self.optimizer.param_groups, values):
            param_group["lr"] = lr
        self._last_lr = _group_lrs(self.optimizer)


# [Note: Chainable and closed-form schedules]
# PyTorch's schedulers compute the next lr in one of two ways. The chainable ``get_lr`` multiplies the
# group's *current* lr by a per-step factor (StepLR: gamma at each step_size; ExponentialLR: gamma), so
# several schedulers on one optimizer compose (ChainedScheduler) and a manual change of group["lr"]
# persists; during the construction step (``_is_initial``) most return the current lr unchanged.
# ``_get_closed_form_lr`` computes the lr from ``base_lrs`` and ``last_epoch`` alone; ``step(epoch)``
# and SequentialLR's switch to the next scheduler use it. The schedulers follow PyTorch 2.13 exactly, but
# for CosineAnnealingLR and LinearLR, which use their closed form for both (See [Note: Closed-form cosine]
# in _lr_schedulers_cosine.py).


def _warn_get_lr_called_within_step(scheduler: LRScheduler) -> None:
    if not scheduler._get_lr_called_within_step:
        warnings.warn("To get the last learning rate computed by the scheduler, please use `get_last_lr()`.",
                      UserWarning, stacklevel=3)


class _LambdaScheduler(LRScheduler):
    """LambdaLR and MultiplicativeLR: one lambda of the epoch per param group (one given: shared), saved in
    state dicts only when it is a callable object (its ``__dict__``), as PyTorch's."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Union[Callable[[int], float], Sequence[Callable]],
                 last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        if not isinstance(lr_lambda, (list, tuple)):
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        else:
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(self._not_callable(fn))
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _not_callable(fn) -> str:
        raise NotImplementedError

    def state_dict(self) -> Dict[str, Any]:
        state_dict = _state_dict_without(self, "lr_lambdas")
        state_dict["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else fn.__dict__.copy()
                                    for fn in self.lr_lambdas]
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        lr_lambdas = state_dict.pop("lr_lambdas")
        self.__dict__.update(state_dict)
        for idx, fn in enumerate(lr_lambdas):
            if fn is not None:
                self.lr_lambdas[idx].__dict__.update(fn)
