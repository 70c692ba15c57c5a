"""Optimizers (SGD, the Adam family, Adadelta, Adagrad, RMSprop, Rprop, ASGD, LBFGS) and learning-rate schedulers, as torch.optim."""
from hpcfsdp.optim import lr_scheduler
from hpcfsdp.optim.adadelta import Adadelta
from hpcfsdp.optim.adagrad import Adagrad
from hpcfsdp.optim.adam import Adam
from hpcfsdp.optim.adamax import Adamax
from hpcfsdp.optim.adamw import AdamW
from hpcfsdp.optim.asgd import ASGD
from hpcfsdp.optim.lbfgs import LBFGS
from hpcfsdp.optim.nadam import NAdam
from hpcfsdp.optim.optimizer import Optimizer
from hpcfsdp.optim.radam import RAdam
from hpcfsdp.optim.rmsprop import RMSprop
from hpcfsdp.optim.rprop import Rprop
from hpcfsdp.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam",
           "Rprop", "ASGD", "LBFGS", "lr_scheduler"]
