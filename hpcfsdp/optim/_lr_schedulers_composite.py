"""Schedulers made of other schedulers (torch.optim.lr_scheduler): SequentialLR, one after the other at milestones,
and ChainedScheduler, all of them at every step."""
from bisect import bisect_right
from typing import Any, Dict, List, Optional, Sequence

from hpcfsdp.optim._lr_scheduler_base import LRScheduler, _group_lrs, _state_dict_without
from hpcfsdp.optim._lr_schedulers_plateau import ReduceLROnPlateau
from hpcfsdp.optim.optimizer import Optimizer

__all__ = ["SequentialLR", "ChainedScheduler"]


def _check_composable(owner: str, optimizer, schedulers) -> None:
    """PyTorch's checks of the schedulers SequentialLR and ChainedScheduler are made of, in its words."""
    for idx, scheduler in enumerate(schedulers):
        if not hasattr(scheduler, "optimizer"):
            raise TypeError(f"{owner} at index {idx} should have `optimizer` as its attribute.")
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(f"{owner} does not support `ReduceLROnPlateau` scheduler as it requires additional "
                             "kwargs to be specified when calling `step`, but got one at index "
                             f"{idx} in the given schedulers sequence.")
        if optimizer is not scheduler.optimizer:
            raise ValueError(f"{owner} expects all schedulers to belong to the same optimizer, but got scheduler "
                             f"{scheduler.__class__.__name__} at index {idx} has {scheduler.optimizer}, which is "
                             f"different from {optimizer.__class__.__name__}.")


def _composed_state_dict(owner) -> Dict[str, Any]:
    """Own attributes and each scheduler's state_dict under ``_schedulers``."""
    state_dict = _state_dict_without(owner, "_schedulers")
    state_dict["_schedulers"] = [s.state_dict() for s in owner._schedulers]
    return state_dict


def _load_composed_state_dict(owner, state_dict: Dict[str, Any]) -> None:
    state_dict = dict(state_dict)
    schedulers = state_dict.pop("_schedulers")
    owner.__dict__.update(state_dict)
    for idx, s in enumerate(schedulers):
        owner._schedulers[idx].load_state_dict(s)


class SequentialLR(LRScheduler):
    """Runs ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``; each restarts at its epoch 0."""

    def __init__(self, optimizer: Optimizer, schedulers: List[LRScheduler], milestones: List[int],
                 last_epoch: int = -1) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{self.__class__.__name__} expects at least one scheduler, but got no scheduler.")
        _check_composable(self.__class__.__name__, optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError("Sequential Schedulers expects number of schedulers provided to be one more than the "
                             f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                             f"number of milestones to be equal to {len(milestones)}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in self.optimizer.param_groups:  # reset to the initial lrs
            group["lr"] = group["initial_lr"]
        self.recursive_undo()  # undo the step each scheduler did at construction
        idx = bisect_right(self._milestones, 0)  # the scheduler that drives epoch 0
        self._schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def recursive_undo(self, sched=None) -> None:
        """Take back the construction step of every scheduler, nested ones (ChainedScheduler's) included."""
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self.recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self) -> None:  # type: ignore[override]
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)  # restart at epoch 0 by the closed form
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        return _composed_state_dict(self)

    def load_state_dict(self, state_dict) -> None:
        _load_composed_state_dict(self, state_dict)


class ChainedScheduler(LRScheduler):
    """Steps every scheduler of the list at each ``step()``, in order: their chainable factors multiply."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optional[Optimizer] = None) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{self.__class__.__name__} expects at least one scheduler to be chained, but got no "
                             "scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        _check_composable(self.__class__.__name__, optimizer, schedulers)
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = _group_lrs(self._schedulers[-1].optimizer)

    def step(self) -> None:  # type: ignore[override]
        """Step every scheduler once."""
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = _group_lrs(self._schedulers[-1].optimizer)

    def state_dict(self) -> Dict[str, Any]:
        """Own attributes and each scheduler's state_dict under ``_schedulers``."""
        return _composed_state_dict(self)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore own attributes and each scheduler's state."""
        _load_composed_state_dict(self, state_dict)
