"""Optimizers (SGD, Adam, AdamW) and learning-rate schedulers, with torch.optim semantics."""
from hpcfsdp.optim import lr_scheduler
from hpcfsdp.optim.adam import Adam
from hpcfsdp.optim.adamw import AdamW
from hpcfsdp.optim.optimizer import Optimizer
from hpcfsdp.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
