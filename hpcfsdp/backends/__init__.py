"""hpcfsdp.backends: PyTorch's ``torch.backends`` switches (cudnn, cuda.matmul, mps), kept for portability.

[Note: Backend switches]
Scripts set ``torch.backends.cudnn.benchmark = True`` or ``torch.backends.cuda.matmul.allow_tf32 = True``
before training. hpcfsdp keeps them as plain attributes with PyTorch's defaults and never reads them: its
kernels are NumPy's and CuPy's (no cuDNN, no TF32 or reduced-precision GEMM switch, no MPS).
``backends.cuda.matmul.allow_tf32`` is the exception in form, not in effect: as in PyTorch it reads and
writes the float32 matmul precision of ``hp.set_float32_matmul_precision``.
"""
from . import cuda, cudnn, mps

__all__ = ["cuda", "cudnn", "mps"]
