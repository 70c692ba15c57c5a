"""hpcfsdp.utils.tensorboard: PyTorch's ``torch.utils.tensorboard`` (SummaryWriter) on the tensorboard package.

The package itself imports without tensorboard installed; creating a SummaryWriter then raises ImportError
naming ``pip install tensorboard``.
"""
from .writer import FileWriter, SummaryWriter

__all__ = ["FileWriter", "SummaryWriter"]
