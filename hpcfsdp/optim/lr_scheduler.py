"""Learning-rate schedulers (torch.optim.lr_scheduler): LambdaLR, CosineAnnealingLR, LinearLR and SequentialLR here;
the base class and the others in _lr_scheduler_base.py, _lr_schedulers_more.py and _lr_schedulers_cyclic.py."""
import math
from bisect import bisect_right
from typing import List

from hpcfsdp.optim._lr_scheduler_base import LRScheduler, _LambdaScheduler
from hpcfsdp.optim._lr_schedulers_cyclic import CyclicLR, OneCycleLR
from hpcfsdp.optim._lr_schedulers_more import (ChainedScheduler, ConstantLR, CosineAnnealingWarmRestarts, ExponentialLR,
                                               MultiplicativeLR, MultiStepLR, PolynomialLR, ReduceLROnPlateau, StepLR)
from hpcfsdp.optim.optimizer import Optimizer

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
           "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR"]


class LambdaLR(_LambdaScheduler):
    """lr = base_lr * lr_lambda(epoch) (one lambda, or one per param group)."""

    @staticmethod
    def _not_callable(fn) -> str:
        return f"lr_lambda must be a callable (or one per param group), got {fn!r}"

    def get_lr(self) -> List[float]:
        return [base_lr * lmbda(self.last_epoch) for lmbda, base_lr in zip(self.lr_lambdas, self.base_lrs)]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (closed form)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        if T_max <= 0:
            raise ValueError(f"T_max must be a positive number of steps, got {T_max}")
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    # [Note: Closed-form cosine]
    # PyTorch's get_lr is a recurrence on the current group lr that equals this closed form when the
    # scheduler alone drives the lr. The closed form is used for both, so resuming, SequentialLR's
    # step(0) and float rounding over long runs give the same values as the formula.
    def get_lr(self) -> List[float]:
        return self._get_closed_form_lr()

    def _get_closed_form_lr(self) -> List[float]:
        return [self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """lr = base_lr * factor, factor going linearly from start_factor to end_factor over total_iters steps."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1, "
                             f"got {start_factor}.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(f"Ending multiplicative factor expected to be between 0 and 1, got {end_factor}.")
        if total_iters <= 0:
            raise ValueError(f"total_iters must be a positive number of steps, got {total_iters}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        return self._get_closed_form_lr()

    def _get_closed_form_lr(self) -> List[float]:
        frac = min(self.total_iters, self.last_epoch) / self.total_iters
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor) * frac)
                for base_lr in self.base_lrs]


class SequentialLR(LRScheduler):
    """Runs ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``; each restarts at its epoch 0."""

    def __init__(self, optimizer: Optimizer, schedulers: List[LRScheduler], milestones: List[int],
                 last_epoch: int = -1) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{self.__class__.__name__} expects at least one scheduler, but got no scheduler.")
        for idx, scheduler in enumerate(schedulers):
            if not hasattr(scheduler, "optimizer"):
                raise TypeError(f"{self.__class__.__name__} at index {idx} should have `optimizer` as its attribute.")
            if isinstance(scheduler, ReduceLROnPlateau):
                raise ValueError(f"{self.__class__.__name__} does not support `ReduceLROnPlateau` scheduler as it "
                                 "requires additional kwargs to be specified when calling `step`, but got one at "
                                 f"index {idx} in the given schedulers sequence.")
            if optimizer is not scheduler.optimizer:
                raise ValueError(f"{self.__class__.__name__} expects all schedulers to belong to the same optimizer, "
                                 f"but got scheduler {scheduler.__class__.__name__} at index {idx} has "
                                 f"{scheduler.optimizer}, which is different from {optimizer.__class__.__name__}.")
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
        state_dict = {key: value for key, value in self.__dict__.items() if key not in ("optimizer", "_schedulers")}
        state_dict["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state_dict

    def load_state_dict(self, state_dict) -> None:
        state_dict = dict(state_dict)
        _schedulers = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        for idx, s in enumerate(_schedulers):
            self._schedulers[idx].load_state_dict(s)
