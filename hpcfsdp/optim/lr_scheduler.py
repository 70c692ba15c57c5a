"""Learning-rate schedulers (torch.optim.lr_scheduler, which holds them all). The base class is in
_lr_scheduler_base.py, the schedules by kind in _lr_schedulers_factor.py (a factor of the epoch),
_lr_schedulers_cosine.py (cosine annealing), _lr_schedulers_cyclic.py (cycling lr and momentum),
_lr_schedulers_plateau.py (driven by a metric) and _lr_schedulers_composite.py (made of other schedulers)."""
from hpcfsdp.optim._lr_scheduler_base import LRScheduler
from hpcfsdp.optim._lr_schedulers_composite import ChainedScheduler, SequentialLR
from hpcfsdp.optim._lr_schedulers_cosine import CosineAnnealingLR, CosineAnnealingWarmRestarts
from hpcfsdp.optim._lr_schedulers_cyclic import CyclicLR, OneCycleLR
from hpcfsdp.optim._lr_schedulers_factor import (ConstantLR, ExponentialLR, LambdaLR, LinearLR, MultiplicativeLR,
                                                 MultiStepLR, PolynomialLR, StepLR)
from hpcfsdp.optim._lr_schedulers_plateau import ReduceLROnPlateau

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
           "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR"]
