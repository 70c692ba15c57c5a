"""Tensor parallelism: parallelize_module with Colwise-, Rowwise- and SequenceParallel (communication in autograd)."""

from hpcfsdp.distributed.tensor.parallel.api import parallelize_module
from hpcfsdp.distributed.tensor.parallel.loss import loss_parallel, vocab_parallel_cross_entropy
from hpcfsdp.distributed.tensor.parallel.style import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                                      PrepareModuleOutput, RowwiseParallel, SequenceParallel)

__all__ = ["ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleOutput", "RowwiseParallel",
           "SequenceParallel", "loss_parallel", "parallelize_module", "vocab_parallel_cross_entropy"]
